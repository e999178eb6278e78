"""What a benchmark writes beside its figures (``run_meta``): the commit it ran (and whether the
tree had changes), when, the package defaults it ran under, and its conditions (shape, ranks,
emulated nodes, issue mode, link rate, load). The tables cite it (sources.cite), and compare the
defaults with today's, so a figure from a run under other defaults says so where it is shown."""

from __future__ import annotations

import datetime
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):  # not a checkout (an unpacked sdist): no commit to name
        return None
    return out.stdout.strip()


def current_defaults() -> dict[str, Any]:
    """The defaults a figure depends on, as the package states them now: each preset's compression
    and error feedback, the tick chunks, the tick hops' log-step thresholds and the issue mode a
    GPU backend resolves ``overlap`` true to."""
    from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS
    from zeropp_hier.comm.tick.plan import LOG_STEPS_ABOVE
    from zeropp_hier.core.policy import PRESET_COMPRESSION, PRESET_ERROR_FEEDBACK

    return {
        "preset_compression": {k: {kind: dict(t) for kind, t in v.items()} for k, v in PRESET_COMPRESSION.items()},
        "preset_error_feedback": {
            k: (dict(v) if isinstance(v, Mapping) else v) for k, v in PRESET_ERROR_FEEDBACK.items()
        },
        "tick_chunks": DEFAULT_TICK_CHUNKS,
        "log_steps_above": dict(LOG_STEPS_ABOVE),
        "gpu_issue_mode": "ticks where every hop spans one tier, else one lane",
    }


def run_meta(conditions: Mapping[str, Any]) -> dict[str, Any]:
    """The record a result file carries under ``"meta"``. ``conditions``: what the run held fixed
    (for the emulated cluster: shape, ranks, emulated nodes, issue mode, link rate; the writer's
    own arguments otherwise). The 1-minute load at the time of writing is added."""
    # the code's changes, not the results: a script writing several result files in one run
    # would otherwise mark every run after its first as changed
    status = _git(
        "status", "--porcelain", "--untracked-files=no", "--", "zeropp_hier", "benchmarks", ":!benchmarks/results"
    )
    return {
        "commit": _git("rev-parse", "HEAD") or "unknown (not a git checkout)",
        "dirty": bool(status) if status is not None else None,
        "recorded_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "defaults": current_defaults(),
        "conditions": {**conditions, "load_1min": os.getloadavg()[0], "cpus": os.cpu_count()},
    }


def emulated_conditions(plan: Mapping[str, Any], ratios: str | None = None) -> dict[str, Any]:
    """The conditions of a benchmarks.compare run, from its plan: shape, ranks, emulated nodes,
    issue mode, link rate (None where every phase ran unshaped) and the tier ratios."""
    topo = plan["topology"]
    per_node = topo["gpus_per_node"] * topo["gcds_per_gpu"]
    shaped = any(p["name"] == "shaped" for p in plan.get("phases", []))
    return {
        "model": plan.get("shape"),
        "params": plan.get("params"),
        "dtype": plan.get("dtype"),
        "micro_batch": plan.get("micro_batch"),
        "ranks": plan["world"],
        "emulated_nodes": plan["world"] // per_node,
        "packages_per_node": topo["gpus_per_node"],
        "gcds_per_package": topo["gcds_per_gpu"],
        "issue_mode": plan.get("issue_mode"),
        "tick_chunks": plan.get("tick_chunks"),
        "node_mbit_per_gcd": plan.get("node_mbit") if shaped else None,
        "ratios_gcd_gpu_node": ratios,
        "phases": [p["name"] for p in plan.get("phases", [])],
    }


def differing_defaults(recorded: Mapping[str, Any]) -> list[str]:
    """The keys of ``recorded`` (a run's ``meta["defaults"]``) whose value differs from today's."""
    now = current_defaults()
    return sorted(k for k in now if k in recorded and recorded[k] != now[k])
