"""Loading a committed result and its record of the run: the ``meta`` a run wrote beside its
figures (provenance.run_meta), or, for a file recorded before runs carried one, its entry in
``benchmarks/results/provenance.json``, established from git history (the commit that recorded
the file's current content, ``git log --follow``). A table cites what this returns."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from .provenance import differing_defaults

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "benchmarks/results"
PROVENANCE = f"{RESULTS}/provenance.json"


class SourceError(ValueError):
    pass


@functools.cache
def _read(path: str) -> Any:
    p = ROOT / path
    if not p.is_file():
        raise SourceError(f"{path}: no such result file; commit it or fix the renderer that names it")
    return json.loads(p.read_text())


def load(path: str) -> Any:
    """The parsed JSON at ``path`` (relative to the repository root)."""
    return _read(path)


def result(name: str) -> Any:
    """``benchmarks/results/<name>``."""
    return _read(f"{RESULTS}/{name}")


def meta(path: str) -> dict:
    """The run's record: ``recorded_in`` (commit), ``date``, ``defaults`` ("today", or what was
    different), ``conditions``. A file without either source is refused, naming it."""
    doc = _read(path)
    if isinstance(doc, dict) and isinstance(doc.get("meta"), dict) and "defaults" in doc["meta"]:
        return doc["meta"]
    files = _read(PROVENANCE)["files"]  # and files whose own meta (deepspeed_unit's) predates run_meta
    if path not in files:
        raise SourceError(
            f"{path}: no 'meta' in the file and no entry in {PROVENANCE}; add one (the commit that "
            "recorded it, from git log --follow, and the defaults it ran under)"
        )
    return files[path]


def cite(paths: list[str]) -> str:
    """One sentence naming each source file with the commit that recorded it, its date, and whether
    it ran under today's defaults (what differed, where not); files of one record are named together."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for p in paths:
        m = meta(p)
        commit = (m.get("recorded_in") or m.get("commit") or "?")[:7] + (
            " with uncommitted changes" if m.get("dirty") else ""
        )
        when = m.get("date") or (m.get("recorded_utc") or "?")[:10]
        defaults = m.get("defaults", "?")
        if isinstance(defaults, dict):
            other = differing_defaults(defaults)
            note = f"other defaults than today's: {', '.join(other)}" if other else "today's defaults"
        else:
            note = "today's defaults" if defaults == "today" else str(defaults)
        groups.setdefault((commit, when, note), []).append(f"`{Path(p).name}`")
    return "Source: " + "; ".join(f"{', '.join(names)} ({c}, {w}; {n})" for (c, w, n), names in groups.items()) + "."
