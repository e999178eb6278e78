"""What one collective puts on each link: the byte model that ``comm_stats`` and the planner share.

Pure: integer maths over a topology and a group's ranks, no torch.

[Note: bytes per link]
A link class is named by its tier: ``node`` (a node's uplink), ``gpu`` (a package's links to the
rest of its node) and ``gcd`` (the link inside a package). A message is counted once, under the
slowest link it crosses (``Topology.tier_between``), as the emulated cluster's counters count it
([Note: wire bytes] in benchmarks/cluster/spec.py): node = what leaves a node, gpu = what leaves
a package but not its node, gcd = what stays in a package. What a rank sends follows the
algorithm the library runs for the collective, not the collective's definition:

* ``ring``: all-gather on gloo (``gloo/allgather.cc``: every rank sends to rank + 1 of the group
  and receives from rank - 1, k - 1 steps of one shard each) and all-gather and reduce-scatter on
  NCCL/RCCL (their ring algorithm, k - 1 steps). A group's ring runs in its ranks' order in the
  process group, which torch sorts by global rank (``new_group``): this rank sends everything to
  the next member in that order. Ranks numbered node by node make the ring leave each node once
  per member block, as NCCL's and RCCL's topology search orders their rings (each ring channel
  has one head and one tail per node, ``ringRecv``/``ringSend`` in NCCL's src/graph/connect.cc,
  the GPUs of a node chained between them). So a flat all-gather puts (k - 1) shards on each node's uplink per member
  block, however many ranks the node holds: the direct count (every rank to every other) would
  put (k - k_node) shards per rank there.
* ``ring_allreduce``: torch's reduce-scatter on gloo, which gloo lacks and torch runs as an
  all-reduce (2 (k - 1) / k of the buffer per rank; measured on the emulated cluster, [Note:
  cost model] in planner/cost.py). Only stock DeepSpeed's flat gradient reduce issues it.
* ``direct``: all-to-all on gloo (``gloo/alltoall.cc``: each rank sends its block for rank
  r + i straight to it, i = 1..k-1) and on NCCL/RCCL (a point-to-point pair per peer), and the
  tick mode's transfers, which are point-to-point messages counted as sent ([Note: ticks] in
  comm/tick/plan.py): one block to each peer.

NCCL's trees serve all-reduce only, which the library does not issue. ``comm_stats`` keeps the
payload view beside this one ([Note: byte accounting] in comm/stats.py); the planner sums the
same per-edge and per-pair amounts in closed form ([Note: link loads per tier] in
planner/cost.py), and tests/unit/test_wire.py checks the two against each other. The messages
(``messages``) are counted by the same walk: ``comm_stats``' ``link_messages``, and the planner's
count of what each link carries beyond the payload ([Note: per-message framing] in
planner/clusters.py).
"""

from __future__ import annotations

from typing import Literal, Sequence, get_args

from .ranks_text import ranks_text
from .topology import Topology
from .vocab import TIERS

Algorithm = Literal["ring", "ring_allreduce", "direct"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
OPS = ("all_gather", "reduce_scatter", "all_to_all")


def algorithm_of(op: str, library: str, ticks: bool = False) -> Algorithm:
    """The algorithm ``library`` (gloo, nccl, rccl) runs for ``op``; the tick mode's transfers
    are direct whatever the op ([Note: bytes per link])."""
    if op not in OPS:
        raise ValueError(f"collective op {op!r}: expected one of {OPS}")
    if ticks or op == "all_to_all":
        return "direct"
    if op == "reduce_scatter" and library == "gloo":
        return "ring_allreduce"
    return "ring"


def edge_bytes(op: str, algorithm: Algorithm, k: int, block: float) -> float:
    """Bytes one rank sends to one receiver in a collective over ``k`` ranks. ``block``: this
    rank's shard (all_gather), its block for each peer (all_to_all), its whole buffer
    (reduce_scatter). A ring rank has one receiver; a direct one has k - 1."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r}: expected one of {ALGORITHMS}")
    if k < 2:
        return 0.0
    if algorithm == "direct":
        return block
    if op == "all_gather":
        return (k - 1) * block
    if algorithm == "ring_allreduce":
        return 2 * (k - 1) / k * block
    return (k - 1) / k * block


def messages(algorithm: Algorithm, library: str, k: int) -> int:
    """Messages one rank sends to each receiver per collective over ``k`` ranks: a ring step is
    one message on NCCL/RCCL and two on gloo (``gloo/allgather.cc`` sends each step's shard in
    two halves); direct, one. ``comm_stats`` counts these (``link_messages``) and the planner
    charges each its transport's framing (gloo's 48-byte op preambles, TCP/IP headers, ACKs:
    ``ClusterModel.message_overhead_bytes``, [Note: per-message framing] in
    planner/clusters.py); the bytes here are payload only."""
    if k < 2:
        return 0
    if algorithm == "direct":
        return 1
    return (k - 1) * (2 if library == "gloo" else 1)


def sends(me: int, members: Sequence[int], op: str, algorithm: Algorithm, block: float) -> list[tuple[int, float]]:
    """(receiver, bytes) of every message rank ``me`` sends in one collective over ``members``
    (any order: a ring runs in sorted rank order, torch's order within a group)."""
    if me not in members:
        raise ValueError(f"rank {me} is not a member of the group {ranks_text(members)}")
    k = len(members)
    if k < 2:
        return []
    each = edge_bytes(op, algorithm, k, block)
    if algorithm == "direct":
        return [(p, each) for p in members if p != me]
    ring = sorted(members)
    return [(ring[(ring.index(me) + 1) % k], each)]


def per_link(topo: Topology, me: int, messages: Sequence[tuple[int, float]]) -> dict[str, float]:
    """Bytes of ``messages`` (receiver, bytes) from rank ``me`` under the slowest link each
    crosses; every tier present."""
    out: dict[str, float] = dict.fromkeys(TIERS, 0.0)
    for peer, nbytes in messages:
        tier = topo.tier_between(me, peer)
        if tier is not None:
            out[tier] += nbytes
    return out
