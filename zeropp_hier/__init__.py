"""zeropp-hier: three-level hierarchical ZeRO-3 for clusters whose links come in three speeds."""
from . import deepspeed as _integration  # noqa: F401  (first: its import checks the DeepSpeed version)
from .comm.failures import HierCommError
from .core.config import HierConfig, parse_section
from .core.errors import DeepSpeedVersionError, HierConfigError, HierNonFiniteError, HierTopologyError
from .core.topology import Topology
from .deepspeed.checkpoint import HierCheckpointError
from .deepspeed.engine import HierEngine, initialize
from .deepspeed.partition import Init
from .deepspeed.patch import is_patched, patch_deepspeed, unpatch_deepspeed

__version__ = "0.1.0"


def comm_stats(engine) -> dict:
    """Bytes this rank sent and collectives it issued, per phase and tier, and the numerics of
    its compressed traffic, since the engine was built (or since ``reset_comm_stats``)::

        {"bytes": {"forward_gather": {"gcd": .., "gpu": .., "node": ..}, "backward_gather": ..,
                   "grad_reduce": .., "other_gather": ..},
         "calls": {same shape},
         "numerics": {"relative_error": {phase: {tier: {"mean", "max", "last", "samples"}}},
                      "sample_every": N,
                      "error_feedback": {"stages": [...], "buffers": n, "bytes": n},
                      "nonfinite": {"policy": "skip", "skipped_steps": [...], "events": [...]}}}

    ``relative_error`` holds only the (phase, tier) pairs that compress: ||x - deq(q(x))|| / ||x||
    of this rank's payloads, sampled every N-th call ([Note: compression telemetry] in
    ``zeropp_hier/comm/numerics.py``). See [Note: byte accounting] in ``zeropp_hier/comm/stats.py``
    for how bytes are attributed.
    """
    rt = getattr(engine, "hier_runtime", None)
    if rt is None:
        raise ValueError("comm_stats needs an engine from zeropp_hier.initialize with an enabled "
                         "zeropp_hier section; this engine is stock DeepSpeed")
    return {**rt.stats.snapshot(), "numerics": rt.numerics.snapshot()}


def reset_comm_stats(engine) -> None:
    engine.hier_runtime.stats.reset()
    engine.hier_runtime.numerics.reset_stats()


__all__ = ["initialize", "Init", "comm_stats", "reset_comm_stats", "patch_deepspeed", "unpatch_deepspeed",
           "is_patched", "HierConfig", "parse_section", "HierConfigError", "HierTopologyError",
           "HierNonFiniteError", "DeepSpeedVersionError", "HierEngine", "Topology", "HierCommError",
           "HierCheckpointError"]
