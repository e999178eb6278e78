"""zeropp-hier: three-level hierarchical ZeRO-3 for clusters whose links come in three speeds.

The public names resolve lazily (PEP 562), so that ``import zeropp_hier.core.topology`` (or any
module of ``core``) imports neither DeepSpeed nor process groups. The first name that needs
DeepSpeed (``initialize``, ``Init``, ``patch_deepspeed``, ...) imports ``zeropp_hier.deepspeed``,
which checks the installed DeepSpeed version first.

Layers: ``core`` (pure model of the job) < ``planner`` (pure cost model, ranking, tables) and
``comm`` (process groups, collectives) < ``deepspeed`` (the integration); ``detect`` (topology
auto-detection), ``app`` (the main job and its models), ``launch`` (local CPU worlds), ``tools``
(the subcommands), ``quant`` (kernels).
"""

from __future__ import annotations

import importlib


def _version() -> str:
    """The one version is pyproject.toml's; installed, it is in the package metadata. A
    checkout used without installing (PYTHONPATH) reads pyproject.toml itself."""
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if pyproject.is_file():  # a checkout: its own version, even if another copy is installed
        import re

        m = re.search(r'(?m)^version = "([^"]+)"', pyproject.read_text())
        if m:
            return m.group(1)
    try:
        from importlib.metadata import version

        return version("zeropp-hier")
    except Exception:
        return "unknown"


__version__ = _version()

# public name -> module that defines it
_LAZY = {
    "initialize": "zeropp_hier.deepspeed.engine",
    "HierEngine": "zeropp_hier.deepspeed.engine",
    "Init": "zeropp_hier.deepspeed.partition",
    "patch_deepspeed": "zeropp_hier.deepspeed.patch",
    "unpatch_deepspeed": "zeropp_hier.deepspeed.patch",
    "is_patched": "zeropp_hier.deepspeed.patch",
    "HierCheckpointError": "zeropp_hier.core.errors",
    "HierCommError": "zeropp_hier.comm.failures",
    "HierConfig": "zeropp_hier.core.config",
    "parse_section": "zeropp_hier.core.config",
    "Topology": "zeropp_hier.core.topology",
    "DeepSpeedVersionError": "zeropp_hier.core.errors",
    "HierConfigError": "zeropp_hier.core.errors",
    "HierNonFiniteError": "zeropp_hier.core.errors",
    "HierSkippedStepsError": "zeropp_hier.core.errors",
    "HierUnsafeSaveError": "zeropp_hier.core.errors",
    "ExecutorBrokenError": "zeropp_hier.comm.executor",
    "HierTopologyError": "zeropp_hier.core.errors",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def comm_stats(engine) -> dict:
    """Bytes this rank sent and collectives it issued, per phase and tier, and the numerics of
    its compressed traffic, since the engine was built (or since ``reset_comm_stats``)::

        {"bytes": {"forward_gather": {"gcd": .., "gpu": .., "node": ..}, "backward_gather": ..,
                   "grad_reduce": .., "other_gather": ..},
         "calls": {same shape},
         "kept_bytes_peak": n,   # most bytes of kept copies held at once (encoded: their size)
         "kept_levels": None, or under a memory budget {"count": {level: layers},
                        "planned_bytes": n, "by_layer": {layer: level}},
         "auto": None, or for "preset": "auto" {"chosen", "runner_up", "ranking", "rates_gbps", ...},
         "serial_wait_s": s,     # host seconds the issuing thread waited in overlap "serial"
                                 # (RCCL's one lane too): cumulative, per step a difference;
                                 # 0 in other modes and on the CPU
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
        raise ValueError(
            "comm_stats needs an engine from zeropp_hier.initialize with an enabled "
            "zeropp_hier section; this engine is stock DeepSpeed"
        )
    lp = rt.level_plan
    levels = None if lp is None else {"count": lp.counts(), "planned_bytes": lp.kept_bytes, "by_layer": lp.levels}
    return {
        **rt.stats.snapshot(),
        "numerics": rt.numerics.snapshot(),
        "kept_levels": levels,
        "auto": rt.auto_choice,
        "serial_wait_s": rt.executor.serial_wait_s,
    }


def reset_comm_stats(engine) -> None:
    engine.hier_runtime.stats.reset()
    engine.hier_runtime.numerics.reset_stats()
    engine.hier_runtime.executor.reset_serial_wait()


__all__ = [
    "initialize",
    "Init",
    "comm_stats",
    "reset_comm_stats",
    "patch_deepspeed",
    "unpatch_deepspeed",
    "is_patched",
    "HierConfig",
    "parse_section",
    "HierConfigError",
    "HierTopologyError",
    "HierNonFiniteError",
    "HierSkippedStepsError",
    "HierUnsafeSaveError",
    "ExecutorBrokenError",
    "DeepSpeedVersionError",
    "HierEngine",
    "Topology",
    "HierCommError",
    "HierCheckpointError",
]
