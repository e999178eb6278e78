"""Which GCDs share a package, from the number of XGMI links between them. Pure text parsing.

[Note: packages from XGMI link counts]
The amdgpu driver counts the physical XGMI links between the GPUs of a hive and shows them in
``/sys/class/drm/cardN/device/xgmi_num_links``: one line per GPU, one two-digit count per peer.
The same count is what the KFD io_link ``max_bandwidth`` (and so ``rocm-smi --shownodesbw`` /
``amd-smi topology``'s bandwidth table) is derived from: links x 50 GB/s on MI200 (the amdgpu
source, ``amdgpu_amdkfd_get_xgmi_bandwidth_mbytes``). On an MI250X node the two GCDs of a
package are joined by 4 links, GCDs of different packages by 1 or 2 or none: a published capture
(ROCm/rocm-systems issue 5763, an AMD maintainer's comment) reads, row by row,
``00 04 01 00 00 00 02 00`` / ``04 00 00 01 00 01 00 00`` / ..., which matches the OLCF Frontier
node diagram. So a package is a group of GPUs that are each other's peers at their own largest
link count, and nothing else. The grouping is accepted only when it is a clean partition into
groups of one size >= 2, every count inside a group is larger than every count leaving it, and
some link does leave each group; anything else is "not known" (``None``), never a guess. The last
rule keeps a hive of single-die GPUs joined all-to-all (MI100s on an XGMI bridge: one group, no
link leaving it) from being taken for one package.

Rows are in card order (card0, card1, ...); the matrix must be square, symmetric and zero on the
diagonal, which also catches rows and columns listed in different orders. Card order is taken to
be the GPU index order of rocm-smi and of ``ROCR_VISIBLE_DEVICES`` (both follow the PCI order on
Frontier: OLCF's hello_jobstep output lists GPU_ID 0..7 at bus ids c1..de, ascending); on a
recognised Frontier/LUMI node the result must also agree with the documented map
(``autodetect.local_record``).
"""

from __future__ import annotations

from ..core.errors import HierTopologyError

FIELD = "xgmi_num_links"


def parse_link_counts(text: str) -> tuple[tuple[int, ...], ...]:
    """Rows of link counts (lines starting with '#' and blank lines ignored)."""
    rows = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            rows.append(tuple(int(c) for c in s.split()))
        except ValueError:
            raise HierTopologyError(FIELD, s[:80], "expected whole numbers, one per peer GPU") from None
    n = len(rows)
    if n == 0 or any(len(r) != n for r in rows):
        raise HierTopologyError(
            FIELD, [len(r) for r in rows], f"expected a square table ({n} rows of {n}); the output is truncated"
        )
    for i in range(n):
        if rows[i][i] != 0 or any(rows[i][j] != rows[j][i] for j in range(n)):
            raise HierTopologyError(
                FIELD,
                {f"card{i}": list(rows[i])},
                "the link counts are not symmetric with a zero diagonal; rows and columns are in "
                "different orders or the output is garbled: give the topology explicitly",
            )
    return tuple(rows)


def packages_from_link_counts(counts: tuple[tuple[int, ...], ...]) -> dict[int, int] | None:
    """GPU index -> package id (lowest index in the package), or None when the counts do not
    form clean packages ([Note: packages from XGMI link counts])."""
    n = len(counts)
    groups = []
    for i in range(n):
        top = max(counts[i][j] for j in range(n) if j != i) if n > 1 else 0
        if top == 0:
            return None
        groups.append(frozenset({i} | {j for j in range(n) if j != i and counts[i][j] == top}))
    for i in range(n):
        if any(groups[j] != groups[i] for j in groups[i]):
            return None  # a chain or overlapping groups
    if len({len(g) for g in groups}) != 1 or len(groups[0]) < 2:
        return None
    for g in set(groups):
        inside = min(counts[i][j] for i in g for j in g if i != j)
        leaving = max((counts[i][j] for i in g for j in range(n) if j not in g), default=0)
        if leaving == 0 or inside <= leaving:
            return None
    return {i: min(groups[i]) for i in range(n)}
