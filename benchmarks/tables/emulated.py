"""Reading an emulated-cluster run (benchmarks.compare's record): its shape, the rows of a phase,
the issue mode each configuration ran and what ``auto`` chose. Shared by the renderers of the
emulated cluster's tables."""

from __future__ import annotations

from typing import Any

from . import fmt

MODE = {"one_lane": "one lane", "ticks": "ticks", "lanes": "lanes", "inline": "inline"}


def shape(run: dict) -> tuple[int, int, int]:
    """(emulated nodes, packages per node, GCDs per package)."""
    t = run["plan"]["topology"]
    per_node = t["gpus_per_node"] * t["gcds_per_gpu"]
    return run["plan"]["world"] // per_node, t["gpus_per_node"], t["gcds_per_gpu"]


def shape_label(run: dict) -> str:
    return fmt.shape_label(*shape(run))


def auto_choice(row: dict) -> tuple[str, int] | None:
    """What ``auto`` chose in a summary row: (preset, chunks), or None for a fixed configuration."""
    picks = row.get("auto")
    if not picks:
        return None
    return picks[0]["chosen"], int(picks[0].get("chunks") or 1)


def issue_mode(run: dict, name: str, row: dict) -> str:
    """The issue mode a configuration ran, with its chunks where it ran ticks: our configurations
    in the GPU issue mode run ticks where every hop spans one tier (frontier), one lane otherwise."""
    choice = auto_choice(row)
    preset = choice[0] if choice else run["plan"]["configs"][name].get("preset", name)
    if run["plan"].get("issue_mode") != "gpu":
        return run["plan"].get("issue_mode", "?")
    if preset != "frontier":
        return "one lane"
    chunks = choice[1] if choice else run["plan"]["configs"][name].get("pipeline", {}).get("chunks")
    chunks = chunks or run["plan"].get("tick_chunks", 8)
    return f"ticks, {chunks} chunk{'s' if chunks != 1 else ''}"


def config_label(name: str, row: dict) -> str:
    choice = auto_choice(row)
    return f"`{name}` → `{choice[0]}`" if choice else f"`{name}`"


def phase(run: dict, name: str) -> dict[str, Any]:
    return run["summary"][name]
