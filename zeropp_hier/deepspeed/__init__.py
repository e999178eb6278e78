"""The DeepSpeed integration: ``initialize``, ``Init``, the stage-3 subclass, the per-engine
runtime, checkpoints and ``patch_deepspeed``. Importing this package (as any public entry point
that needs DeepSpeed does) checks the installed DeepSpeed version first."""

from ._compat import require_supported_deepspeed

require_supported_deepspeed()
