"""Rendering every marked table of the docs, or reporting the ones whose text differs from what
their renderer gives now (drift)."""

from __future__ import annotations

from pathlib import Path

from . import markers, registry
from .sources import ROOT


def doc_paths(root: Path = ROOT) -> list[Path]:
    return sorted({p for pattern in registry.DOCS for p in root.glob(pattern)})


def _rendered(cache: dict[str, str], name: str, where: str) -> str:
    if name not in registry.TABLES:
        known = ", ".join(sorted(registry.TABLES))
        raise markers.MarkerError(
            f"{where}: no renderer for table {name!r}; use one of {known} or add one to registry.TABLES"
        )
    if name not in cache:
        cache[name] = registry.TABLES[name]()
    return cache[name]


def run(write: bool, root: Path = ROOT) -> list[str]:
    """Re-render every marked table; with ``write`` update the files. Returns what differs
    ("FILE: table NAME"), and every registered table that no file marks ("table NAME: not
    marked in any file")."""
    cache: dict[str, str] = {}
    drift, used = [], set()
    for path in doc_paths(root):
        text = path.read_text()
        where = str(path.relative_to(root))
        bodies = {}
        for r in markers.regions(text, where):
            used.add(r.name)
            bodies[r.name] = _rendered(cache, r.name, where)
            if text[r.start : r.end] != bodies[r.name]:
                drift.append(f"{where}: table {r.name}")
        new = markers.replace(text, bodies, where)
        if write and new != text:
            path.write_text(new)
    drift += [f"table {n}: not marked in any file" for n in sorted(set(registry.TABLES) - used)]
    return drift
