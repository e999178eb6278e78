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
the host is named ``frontierNNNNN`` (OLCF's own job output shows ``Node frontier00256``). The
table that rocm-smi printed must still fit the map: 8 GPUs, numbered 0..7, every pair joined
over XGMI, each pair (2k, 2k+1) at the table's smallest XGMI weight (a direct link) and, where
the NUMA section is printed, on one NUMA node (the NUMA note pairs them so). A recognised node
whose table does not fit is refused, as is any node not recognised: the error names the
explicit topology to give instead. The map used says so in the one line that rank 0 logs
(``Detected.describe``).
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
SOURCE = (
    "the documented Frontier/LUMI node map (GCD pairs 0-1, 2-3, 4-5, 6-7 per MI250X; OLCF Frontier "
    "user guide), as rocm-smi's link weights do not identify packages"
)
_FIELD = "rocm-smi --showtopo"


def recognised_node(env: Mapping[str, str], hostname: str) -> str | None:
    """The cluster this node is recognised as (``frontier`` / ``lumi``), or None."""
    cluster = env.get("SLURM_CLUSTER_NAME", "").strip().lower()
    if cluster in CLUSTERS:
        return cluster
    host = env.get("SLURMD_NODENAME") or hostname
    if _FRONTIER_HOST.match(host.split(".")[0]):
        return "frontier"
    return None


def _mismatch(topo: ShowTopo) -> str | None:
    """Why this table does not fit the documented map, or None when it does."""
    n = len(topo.gpus)
    if topo.gpus != tuple(range(GCDS_PER_NODE)):
        return f"it lists GPUs {list(topo.gpus)}, not the 8 GCDs 0..7 of a Frontier/LUMI node"
    if not all(is_xgmi(topo, i, j) for i in range(n) for j in range(n) if i != j):
        return "not every pair of GCDs is joined over XGMI, as on an MI250X node"
    closest = min(topo.weights[i][j] for i in range(n) for j in range(n) if i != j)
    for k in range(0, n, GCDS_PER_MI250X):
        if topo.weights[k][k + 1] != closest:
            return (
                f"GPU{k} and GPU{k + 1} are not directly linked (weight {topo.weights[k][k + 1]}, smallest {closest})"
            )
        if topo.numa is not None and topo.numa.get(k) != topo.numa.get(k + 1):
            return f"GPU{k} and GPU{k + 1} sit on NUMA nodes {topo.numa.get(k)} and {topo.numa.get(k + 1)}"
    return None


def documented_packages(topo: ShowTopo, env: Mapping[str, str], hostname: str) -> dict[int, int]:
    """GPU index -> package id on a recognised node whose table fits ([Note: documented node
    map]); otherwise a ``HierTopologyError`` that names the explicit topology to give."""
    cluster = recognised_node(env, hostname)
    if cluster is None:
        raise HierTopologyError(
            _FIELD,
            f"XGMI links among GPUs {list(topo.gpus)} on host {env.get('SLURMD_NODENAME') or hostname}",
            "rocm-smi's link weights do not say which GCDs share a package, and this node is not "
            "recognised as Frontier or LUMI (SLURM_CLUSTER_NAME); give the topology explicitly, "
            f"e.g. {OVERRIDE} for 4 MI250X per node",
        )
    why = _mismatch(topo)
    if why is not None:
        raise HierTopologyError(
            _FIELD,
            why,
            f"this {cluster} node does not look like the documented node (8 GCDs, pairs 0-1, 2-3, "
            f"4-5, 6-7 on one MI250X each); check the allocation, or give the topology explicitly, "
            f"e.g. {OVERRIDE}",
        )
    return {g: g // GCDS_PER_MI250X * GCDS_PER_MI250X for g in topo.gpus}
