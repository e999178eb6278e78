"""The dry run's report: one dict (written as JSON) and its table for a terminal."""

from __future__ import annotations

import json
import os
from typing import Any

from .meters import Meters
from .mirror import LIMITS
from .world import DryWorld

STARTUP = ("process_group", "plan_and_memory_table", "data", "engine", "job_start")
MiB = 1 << 20


def build(spec: Any, world: DryWorld, meters: Meters, memory: dict, result: dict, seconds: float) -> dict[str, Any]:
    phases = {name: p.as_dict() for name, p in meters.phases.items()}
    steps = [phases[n] for n in phases if n.startswith("step")]
    later = steps[1:] or steps  # the first step builds caches: later steps are the steady cost
    per_step = {
        "host_seconds": round(sum(s["seconds"] for s in later) / max(len(later), 1), 4),
        "split": {k: round(sum(s["split"].get(k, 0.0) for s in later) / len(later), 4) for k in later[0]["split"]}
        if later
        else {},
        # of host_seconds, the mirror's answers: the harness's stand-in for peers and wire
        "mirror_seconds": round(sum(s["mirror_seconds"] for s in later) / max(len(later), 1), 4),
        # this process's CPU seconds (all threads), steadier than host_seconds on a busy machine
        "cpu_seconds": round(sum(s["cpu_seconds"] for s in later) / max(len(later), 1), 4),
        "collectives": later[-1]["collectives"] if later else {},
        "collective_calls": later[-1]["collective_calls"] if later else 0,
        "largest_payload_bytes": max((s["largest_payload_bytes"] for s in later), default=0),
        "object_collectives": later[-1]["object_collectives"] if later else {},
        "object_bytes": later[-1]["object_bytes"] if later else 0,
        # the most device memory a step after the first held (None: a CPU dry run)
        "device_peak_bytes": max((s["device_peak_bytes"] or 0 for s in later), default=0)
        if later and later[0].get("device_peak_bytes") is not None
        else None,
    }
    return {
        "world": {"nodes": world.nodes, "gpus": world.gpus, "gcds": world.gcds, "ranks": world.world_size},
        "rank": world.rank,
        "preset": spec.preset,
        "device": _device_name(),
        # fp32 subnormals flushed to zero ([Note: subnormals in a CPU dry run] in dryrun/world.py)
        "subnormals_flushed": bool(result.pop("subnormals_flushed", False)),
        "model": {"hidden": spec.model.hidden, "layers": spec.model.layers, "params": result.get("params")},
        "startup_seconds": {n: phases[n]["seconds"] for n in STARTUP if n in phases},
        "per_step": per_step,
        "phases": phases,
        # host peaks; with the job's dry run, what the engine holds by part and the planner's
        # table for the same job (holdings.py, app/memory_check.parts)
        "memory": {
            **memory,
            **{k: result.pop(k) for k in ("engine_memory", "planner_memory") if k in result},
        },
        "result": result,
        "seconds": round(seconds, 2),
        "limits": list(LIMITS),
    }


def _device_name() -> str:
    """Where the engine's tensors lived: the GPU's name, or "cpu"."""
    from .meters import cuda_in_use

    if not cuda_in_use():
        return "cpu"
    import torch

    return torch.cuda.get_device_name()


def write(rep: dict, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rep, f, indent=1, default=str)
    return path


def _files(p: dict | None) -> str:
    if p is None:
        return "-"
    return f"{p['files_opened']} opened, {p['files_listed']} listed, {p['files_stated']} stat'ed"


def _objects(p: dict) -> str:
    if not p["object_collectives"]:
        return "none"
    kinds = ", ".join(f"{k} x{v}" for k, v in p["object_collectives"].items())
    return f"{kinds} ({p['object_bytes']} B sent, largest buffer {p['object_buffer_bytes']} B)"


def lines(rep: dict) -> list[str]:
    """The report as a terminal table."""
    w, s, m = rep["world"], rep["per_step"], rep["memory"]
    ph = rep["phases"]
    out = [
        f"dry run: rank {rep['rank']} of {w['nodes']} nodes x {w['gpus']} x {w['gcds']} = {w['ranks']} ranks, "
        f"preset {rep['preset']}, {rep['model']['params']} parameters (fake process group, SPMD mirror"
        + ("; fp32 subnormals flushed to zero on the CPU)" if rep.get("subnormals_flushed") else ")"),
        "start-up (host s): " + ", ".join(f"{k} {v:.2f}" for k, v in rep["startup_seconds"].items()),
        f"host s per step: {s['host_seconds']:.3f} ("
        + ", ".join(f"{k} {v:.3f}" for k, v in s["split"].items())
        + f"; of it the mirror's answers {s['mirror_seconds']:.3f}; process CPU s {s['cpu_seconds']:.3f})",
        f"collectives per step: {s['collective_calls']} ("
        + ", ".join(f"{k} {v}" for k, v in s["collectives"].items())
        + f"); largest payload {s['largest_payload_bytes']} B",
    ]
    for name in [n for n in ph if n.startswith("step")][:1]:
        out.append(f"object collectives per step: {_objects(ph[name])}")
    for name in ("data", "engine", "job_start", "save", "load"):
        if name in ph:
            p = ph[name]
            out.append(
                f"{name}: {p['seconds']:.2f} s; {p['collective_calls']} collectives; objects: {_objects(p)}; "
                f"files: {_files(p)}"
            )
    out.append(
        f"peak host memory: RSS {m['peak_rss_bytes'] / MiB:.0f} MiB, "
        f"tracemalloc {m['tracemalloc_peak_bytes'] / MiB:.0f} MiB"
    )
    if m.get("device_peak_allocated_bytes") is not None:
        by_phase = ", ".join(
            f"{name} {p['device_peak_bytes'] / 1e9:.3g}" for name, p in ph.items() if p.get("device_peak_bytes")
        )
        out.append(
            f"peak device memory ({rep.get('device')}): allocated {m['device_peak_allocated_bytes'] / 1e9:.3g} GB, "
            f"reserved {m['device_peak_reserved_bytes'] / 1e9:.3g} GB; allocated by phase (GB): {by_phase}"
        )
    if m.get("engine_memory"):
        out.append(
            "held by the engine (GB, what a GPU rank would hold): "
            + ", ".join(f"{k} {v / 1e9:.3g}" for k, v in m["engine_memory"].items())
        )
    for layout, parts in (m.get("planner_memory") or {}).items():
        out.append(
            f"planner's memory table, {layout} (GB): " + ", ".join(f"{k} {v / 1e9:.3g}" for k, v in parts.items())
        )
    unmatched = sum(p["unmatched_receives"] for p in ph.values())
    foreign = sum(p["foreign_object_broadcasts"] for p in ph.values())
    out.append(
        f"mirror: {unmatched} receives without a matching send, "
        f"{foreign} objects from another rank kept as this rank's"
    )
    out.append("not shown (the mirror cannot stand in for): " + "; ".join(rep["limits"]))
    return out


__all__ = ["build", "lines", "write"]
