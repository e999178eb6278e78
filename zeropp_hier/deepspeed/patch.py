"""Make plain ``deepspeed.initialize`` honour the ``zeropp_hier`` section.

Hugging Face Trainer / Accelerate and Megatron-DeepSpeed call ``deepspeed.initialize``
themselves (Accelerate looks the name up on the module at call time). After
``zeropp_hier.patch_deepspeed()`` that call goes through ``zeropp_hier.initialize``, so those
scripts need only the import, the patch and the section in their DeepSpeed JSON; a config
without the section still gets stock DeepSpeed.

The patch keeps no state of its own: the wrapper carries the original function
(``__wrapped__``), so patching twice is a no-op and ``unpatch_deepspeed`` restores exactly what
was there.
"""

from __future__ import annotations

import functools

import deepspeed

_MARK = "_zeropp_hier_patch"


def is_patched() -> bool:
    return getattr(deepspeed.initialize, _MARK, False)


def patch_deepspeed() -> None:
    """Route ``deepspeed.initialize`` through ``zeropp_hier.initialize`` (idempotent)."""
    if is_patched():
        return
    original = deepspeed.initialize

    @functools.wraps(original)
    def initialize(*args, **kwargs):
        from .engine import _rebound
        from .engine import initialize as hier_initialize

        # zeropp_hier.initialize ends in deepspeed.initialize: give it the original, not us
        with _rebound(deepspeed, "initialize", original):
            return hier_initialize(*args, **kwargs)

    setattr(initialize, _MARK, True)
    deepspeed.initialize = initialize


def unpatch_deepspeed() -> None:
    """Restore the ``deepspeed.initialize`` found by ``patch_deepspeed`` (no-op if unpatched)."""
    if is_patched():
        deepspeed.initialize = deepspeed.initialize.__wrapped__
