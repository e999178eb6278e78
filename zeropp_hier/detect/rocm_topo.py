"""Which GCDs share a GPU package, read from ``rocm-smi --showtopo`` output. Pure text parsing.

``rocm-smi --showtopo`` prints square matrices between banner lines, e.g.::

    ================================ Weight between two GPUs =================================
           GPU0         GPU1         GPU2 ...
    GPU0   0            15           30   ...
    ========================== Link Type between two GPUs ==========================
           GPU0         GPU1  ...
    GPU0   0            XGMI  ...

[Note: packages from link weights]
The weight of a link is the driver's cost metric (lower is closer): each XGMI hop adds 15 and
each PCIe segment 20. On an MI250X the two GCDs of one package are joined by the in-package
Infinity Fabric; every other pair sits at a larger weight (a longer XGMI route) or on PCIe. So
a package is a group of GPUs joined to each other at the smallest XGMI weight in the matrix,
and nothing else. We accept the grouping only when it is a clean partition (every GPU joined at
that weight to exactly the other members of its group, all groups the same size); anything else
(a chain, a lone pair next to bigger cliques, an asymmetric matrix) is refused, because
guessing a package wrong puts the "fast" tier on a slow link. GPUs with no XGMI link at all
(a PCIe-only machine) are packages of one GCD each.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..core.errors import HierTopologyError

_FIELD = "rocm-smi --showtopo"
_BANNER = re.compile(r"^=+\s*(.*?)\s*=+\s*$")
_GPU = re.compile(r"^GPU\[?(\d+)\]?$")


class ShowTopo(NamedTuple):
    gpus: tuple[int, ...]  # GPU indices as printed, in order
    weights: tuple[tuple[int, ...], ...]  # weights[i][j] between gpus[i] and gpus[j]
    link_types: tuple[tuple[str, ...], ...] | None  # "XGMI" / "PCIE" / ..., None if not printed


def _sections(text: str) -> dict[str, list[str]]:
    """Banner title -> the non-empty lines under it."""
    out: dict[str, list[str]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _BANNER.match(line.strip())
        if m:
            current = m.group(1)
            out.setdefault(current, [])
            continue
        if current is not None and line.strip():
            out[current].append(line)
    return out


def _matrix(lines: list[str], title: str) -> tuple[tuple[int, ...], list[list[str]]]:
    if not lines:
        raise HierTopologyError(
            _FIELD,
            title,
            "the table is empty; run `rocm-smi --showtopo` on the node and check that it lists every GPU",
        )
    header = lines[0].split()
    cols = []
    for h in header:
        m = _GPU.match(h)
        if not m:
            raise HierTopologyError(
                _FIELD, lines[0].strip(), f"unreadable header of '{title}'; expected GPU0 GPU1 ..."
            )
        cols.append(int(m.group(1)))
    rows: dict[int, list[str]] = {}
    for line in lines[1:]:
        parts = line.split()
        m = _GPU.match(parts[0]) if parts else None
        if not m:
            continue  # not a matrix row (a note or footer line)
        if len(parts) - 1 != len(cols):
            raise HierTopologyError(
                _FIELD,
                line.strip(),
                f"row of '{title}' has {len(parts) - 1} "
                f"entries for {len(cols)} GPUs; the output is truncated or garbled",
            )
        rows[int(m.group(1))] = parts[1:]
    if sorted(rows) != sorted(cols):
        raise HierTopologyError(
            _FIELD,
            sorted(rows),
            f"'{title}' has rows for GPUs {sorted(rows)} but columns for {cols}; the output is truncated or garbled",
        )
    return tuple(cols), [rows[g] for g in cols]


def parse_showtopo(text: str) -> ShowTopo:
    """Parse the weight table (required) and the link-type table (optional)."""
    sec = _sections(text)
    wkey = next((k for k in sec if k.lower().startswith("weight between")), None)
    if wkey is None:
        raise HierTopologyError(
            _FIELD,
            (text.strip().splitlines() or [""])[0][:80],
            "no 'Weight between two GPUs' table found; pass the output of "
            "`rocm-smi --showtopo` (ROCm 5 or 6), or give the topology explicitly",
        )
    gpus, cells = _matrix(sec[wkey], wkey)
    try:
        weights = tuple(tuple(int(c) for c in row) for row in cells)
    except ValueError:
        raise HierTopologyError(_FIELD, cells, "weights must be integers") from None
    link_types = None
    lkey = next((k for k in sec if k.lower().startswith("link type between")), None)
    if lkey is not None:
        lgpus, lcells = _matrix(sec[lkey], lkey)
        if lgpus != gpus:
            raise HierTopologyError(
                _FIELD,
                lgpus,
                f"link-type table lists GPUs {list(lgpus)}, the weight table {list(gpus)}; the output is garbled",
            )
        link_types = tuple(tuple(c.upper() for c in row) for row in lcells)
    return ShowTopo(gpus, weights, link_types)


def packages_from_showtopo(topo: ShowTopo) -> dict[int, int]:
    """GPU index -> package id (the smallest GPU index in its package). See
    [Note: packages from link weights]."""
    n = len(topo.gpus)
    w = topo.weights
    for i in range(n):
        for j in range(n):
            if w[i][j] != w[j][i]:
                raise HierTopologyError(
                    _FIELD,
                    {f"GPU{topo.gpus[i]}-GPU{topo.gpus[j]}": w[i][j], f"GPU{topo.gpus[j]}-GPU{topo.gpus[i]}": w[j][i]},
                    "the weight matrix is not symmetric; the output is garbled or "
                    "the node is misconfigured: give the topology explicitly",
                )

    def is_xgmi(i: int, j: int) -> bool:
        return topo.link_types is None or topo.link_types[i][j] == "XGMI"

    off = [w[i][j] for i in range(n) for j in range(n) if i != j and is_xgmi(i, j)]
    if not off:  # no XGMI link: every GPU is its own package
        return {g: g for g in topo.gpus}
    closest = min(off)
    groups: list[set[int]] = []
    for i in range(n):
        members = {i} | {j for j in range(n) if j != i and is_xgmi(i, j) and w[i][j] == closest}
        groups.append(members)
    for i in range(n):  # a clean partition: my group's members all see exactly the same group
        for j in groups[i]:
            if groups[j] != groups[i]:
                names = lambda s: sorted(topo.gpus[k] for k in s)  # noqa: E731
                raise HierTopologyError(
                    _FIELD,
                    {f"GPU{topo.gpus[i]}": names(groups[i]), f"GPU{topo.gpus[j]}": names(groups[j])},
                    f"GPUs joined at the smallest XGMI weight ({closest}) do not form separate packages "
                    "(a chain or overlapping groups); give the topology explicitly (gcds_per_gpu, "
                    "gpus_per_node, rank_map)",
                )
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise HierTopologyError(
            _FIELD,
            sorted({tuple(sorted(topo.gpus[k] for k in g)) for g in groups}),
            f"packages of different sizes {sorted(sizes)}; zeropp_hier needs every "
            "package to hold the same number of GCDs: give the topology explicitly",
        )
    return {topo.gpus[i]: min(topo.gpus[k] for k in groups[i]) for i in range(n)}
