"""The documented package map of a recognised node, for when the link tables cannot say which
GCDs share a package. Pure logic.

[Note: documented node map]
``rocm-smi --showtopo`` does not identify packages on MI250X nodes ([Note: packages from link
weights] in ``rocm_topo``). Frontier and LUMI-G nodes are all the same machine: one 64-core EPYC
7A53 and 4 MI250X, 8 gfx90a GCDs, the two GCDs of one MI250X numbered consecutively (GPU 0 and
1 on one package, 2 and 3 on the next, ...; OLCF Frontier user guide, "Frontier compute nodes"
node diagram and its NUMA note, https://docs.olcf.ornl.gov/systems/frontier_user_guide.html;
LUMI-G hardware page, https://docs.lumi-supercomputer.eu/hardware/lumig/). ``srun
--gpu-bind=closest`` hands each task one of those GCDs by index. So on a node recognised as
Frontier or LUMI, package = GCD index // 2.

Recognised means: Slurm names the cluster ``frontier`` or ``lumi`` (``SLURM_CLUSTER_NAME``), or
the host is named ``frontierNNNNN`` (OLCF's own job output shows ``Node frontier00256``). On such
a node, once rocm-smi or the amdgpu link counts were read at all (so the GPUs are AMD's), the map
is the documented one whatever the signals say; where a signal is missing (no rocm-smi, no XGMI
link counts, a table that lists only the GCDs the task may see) or disagrees
(link counts that pair GCDs otherwise, a pair that is not a direct XGMI link or spans two NUMA
nodes), the reason goes into the one line that rank 0 logs (``Detected.describe``), so a node
that is not as documented shows there. A node that is not recognised gets no map from here: the
error names the explicit topology to give instead.
"""

from __future__ import annotations

import re
from typing import Mapping

from ..core.errors import HierTopologyError
from .rocm_topo import ShowTopo, is_xgmi

GCDS_PER_MI250X = 2
GCDS_PER_NODE = 8
CLUSTERS = ("frontier", "lumi")
_FRONTIER_HOST = re.compile(r"^frontier\d+$")
OVERRIDE = '"topology": {"gcds_per_gpu": 2, "gpus_per_node": 4}'
SOURCE = "the documented Frontier/LUMI node map (GCD pairs 0-1, 2-3, 4-5, 6-7 per MI250X; OLCF Frontier user guide)"


def recognised_node(env: Mapping[str, str], hostname: str) -> str | None:
    """The cluster this node is recognised as (``frontier`` / ``lumi``), or None."""
    cluster = env.get("SLURM_CLUSTER_NAME", "").strip().lower()
    if cluster in CLUSTERS:
        return cluster
    host = env.get("SLURMD_NODENAME") or hostname
    if _FRONTIER_HOST.match(host.split(".")[0]):
        return "frontier"
    return None


def table_mismatch(topo: ShowTopo) -> str | None:
    """How a ``rocm-smi --showtopo`` table departs from the documented node, or None."""
    n, w = len(topo.gpus), topo.weights
    if topo.gpus != tuple(range(GCDS_PER_NODE)):
        return f"it lists GPUs {list(topo.gpus)}, not the 8 GCDs 0..7"
    if any(w[i][j] != w[j][i] for i in range(n) for j in range(n)):
        return "its weights are not symmetric"
    if not all(is_xgmi(topo, i, j) for i in range(n) for j in range(n) if i != j):
        return "not every pair of GCDs is joined over XGMI"
    closest = min(topo.weights[i][j] for i in range(n) for j in range(n) if i != j)
    for k in range(0, n, GCDS_PER_MI250X):
        if topo.weights[k][k + 1] != closest:
            weight = topo.weights[k][k + 1]
            return f"GPU{k} and GPU{k + 1} are not directly linked (weight {weight}, smallest {closest})"
        if topo.numa is not None and topo.numa.get(k) != topo.numa.get(k + 1):
            return f"GPU{k} and GPU{k + 1} sit on NUMA nodes {topo.numa.get(k)} and {topo.numa.get(k + 1)}"
    return None


def documented_map() -> dict[int, int]:
    """GPU index -> package id of the documented node ([Note: documented node map])."""
    return {g: g // GCDS_PER_MI250X * GCDS_PER_MI250X for g in range(GCDS_PER_NODE)}


def refuse_unrecognised(what: str, value: object, env: Mapping[str, str], hostname: str) -> HierTopologyError:
    """The error for a node whose packages no signal settles and that is not recognised."""
    return HierTopologyError(
        what,
        value,
        f"{what} does not say which GCDs share a package, and this node "
        f"({env.get('SLURMD_NODENAME') or hostname}) is not recognised as Frontier or LUMI "
        f"(SLURM_CLUSTER_NAME); give the topology explicitly, e.g. {OVERRIDE} for 4 MI250X per node",
    )
