"""Which GCDs share a GPU package, read from ``rocm-smi --showtopo`` output. Pure text parsing.

``rocm-smi --showtopo`` prints square matrices between banner lines, e.g.::

    ================================ Weight between two GPUs =================================
           GPU0         GPU1         GPU2 ...
    GPU0   0            15           30   ...
    ========================== Link Type between two GPUs ==========================
           GPU0         GPU1  ...
    GPU0   0            XGMI  ...

[Note: packages from link weights]
The weight table does not say which GCDs share a package. Its weight is the driver's cost
metric: 15 per XGMI hop, 20 per PCIe segment (ROCm/rocm-systems PR 7372, which documents it),
and every direct XGMI link is one hop. On an MI250X node the two GCDs of a package are joined by
four XGMI links and GCDs of different packages by one or two, yet every one of those is a single
hop: a published `rocm-smi --showtopo` from an EPYC 7A53 + 4x MI250X node (openmm/openmm issue
3940) has GPU0 at weight 15 to GPU1, GPU2 and GPU6. The hop table is no better (1 for every XGMI
pair, direct or not: ROCm/rocm-systems issue 5763, open-mpi/hwloc issue 775). So this module reads
packages from the table only where it settles them: with no XGMI link at all (a PCIe-only
machine) every GPU is a package of one GCD. Where XGMI links are present it answers "not known",
and the caller (``autodetect.node_packages``) takes the XGMI link counts ([Note: packages from
XGMI link counts] in ``xgmi_links``), the documented map of a recognised Frontier/LUMI node
([Note: documented node map] in ``node_maps``), or refuses. Guessing a package wrong would put
the "fast" tier on a slow link, so nothing here groups GCDs by weight.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..core.errors import HierTopologyError

_FIELD = "rocm-smi --showtopo"
_BANNER = re.compile(r"^=+\s*(.*?)\s*=+\s*$")
_GPU = re.compile(r"^GPU\[?(\d+)\]?$")
_NUMA = re.compile(r"^GPU\[?(\d+)\]?\s*:\s*\(Topology\)\s*Numa Node:\s*(-?\d+)", re.IGNORECASE)


class ShowTopo(NamedTuple):
    gpus: tuple[int, ...]  # GPU indices as printed, in order
    weights: tuple[tuple[int, ...], ...]  # weights[i][j] between gpus[i] and gpus[j]
    link_types: tuple[tuple[str, ...], ...] | None  # "XGMI" / "PCIE" / ..., None if not printed
    numa: dict[int, int] | None = None  # GPU -> NUMA node from the "Numa Nodes" section, if printed


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
    nkey = next((k for k in sec if k.lower().startswith("numa nodes")), None)
    numa = None
    if nkey is not None:
        numa = {int(m.group(1)): int(m.group(2)) for line in sec[nkey] if (m := _NUMA.match(line.strip()))}
    return ShowTopo(gpus, weights, link_types, numa or None)


def is_xgmi(topo: ShowTopo, i: int, j: int) -> bool:
    """Whether positions i and j of the table are joined over XGMI (a weight-only table counts
    weights below a PCIe segment's 20 as XGMI: the driver gives one XGMI hop 15)."""
    if topo.link_types is not None:
        return topo.link_types[i][j] == "XGMI"
    return 0 < topo.weights[i][j] < 20


def check_symmetric(topo: ShowTopo) -> None:
    n, w = len(topo.gpus), topo.weights
    for i in range(n):
        for j in range(n):
            if w[i][j] != w[j][i]:
                raise HierTopologyError(
                    _FIELD,
                    {f"GPU{topo.gpus[i]}-GPU{topo.gpus[j]}": w[i][j], f"GPU{topo.gpus[j]}-GPU{topo.gpus[i]}": w[j][i]},
                    "the weight matrix is not symmetric; the output is garbled or "
                    "the node is misconfigured: give the topology explicitly",
                )


def packages_from_showtopo(topo: ShowTopo) -> dict[int, int] | None:
    """GPU index -> package id (its own index) when the table settles it: no XGMI link, so one
    GCD per package. None when XGMI links are present: weights do not identify packages ([Note:
    packages from link weights]). A garbled (asymmetric) table is refused."""
    check_symmetric(topo)
    n = len(topo.gpus)
    if any(is_xgmi(topo, i, j) for i in range(n) for j in range(n) if i != j):
        return None
    return {g: g for g in topo.gpus}
