"""The tick schedule: which hop of which chunk runs in which tick, and what each rank sends and
receives there. Pure: no tensors, no process groups (comm/ticks.py runs it).

[Note: ticks]
With ``zeropp_hier.overlap: "ticks"`` a piece of work (one gather bucket's chunks, or one
gradient bucket's chunks: [Note: chunked gathers] in comm/gather.py) advances in *ticks*. Chunk
``c`` runs its hop ``h`` in tick ``c + h``, so tick ``t`` carries hop 0 of chunk ``t``, hop 1 of
chunk ``t - 1``, hop 2 of chunk ``t - 2`` (for ``frontier``'s forward gather: the node, gpu and
gcd hops of three chunks; for its gradients the gcd, gpu and node stages, the reverse order of
links); a chunk's hop needs only its own previous hop, done one tick earlier. Every hop of a
tick is one all-gather or all-to-all over its hop group, written as point-to-point transfers
to each other member of the group (``rank_sequence``), and the whole tick is *one* grouped call
(``torch.distributed.batch_isend_irecv``) on *one* process group that spans the world, followed
by a wait for its transfers. Between ticks the chunks do their local work on the one issuing
thread: encode, decode, merge, the stage sums and (re)quantization.

Why the GPU rules hold by construction:

* One communicator. Every hop transfer of every tick goes through the one tick group; the hop
  groups carry nothing in this mode. So two communicators of this package can never have work
  in flight at once: the rule that RCCL on gfx90a needs (it hangs with several communicators in
  flight even in one order, ROCm/rccl#2191) holds without the host wait that ``one_lane/serial``
  puts before every collective, and without relying on NCCL's implicit launch order across
  communicators (``NCCL_LAUNCH_ORDER_IMPLICIT``, which rccl#2191 reports does not hold for three
  communicators on gfx90a). DeepSpeed's own collectives (its gradient-norm all-reduce and
  checkpoint barriers, on its own group, from the training thread) stay outside this rule, as
  in every issue mode.
* One program order. One host thread (the executor's single lane) issues every tick, in the
  order the training thread submitted the work, and the schedule of a piece of work depends
  only on its hops and chunk count, which every rank has alike (agreed at start-up:
  ``world_digests``). So every rank issues the same sequence of group calls on the one
  communicator, which is NCCL's launch-order rule for one communicator; a tick's transfers
  between one pair of ranks are at most one per direction (the hops of one piece of work span
  disjoint axes), so no two messages of a call can be matched in the wrong order.
* The tiers overlap inside the one call: the transfers of a tick cross different links (node
  uplink, package link, in-package link) at the same time, which is the overlap the gloo lanes
  get from one thread per hop group.

Same bytes per link as today's collectives: an all-gather over ``k`` ranks sends this rank's
block to each of the ``k - 1`` others and an all-to-all sends block ``j`` to peer ``j`` (direct
transfers: [Note: byte accounting] in comm/stats.py counts exactly this), and the values moved
are the same tensors the collectives would move, so the results are bit for bit the same.
Fill and drain: a piece of ``C`` chunks over ``H`` hops takes ``C + H - 1`` ticks.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

from ..core.topology import Topology, normalize_axes

GATHER, EXCHANGE = "gather", "exchange"  # an all-gather, an all-to-all


class Slot(NamedTuple):
    """One hop of one chunk in a tick."""

    chunk: int
    hop: int


def ticks(hops_per_chunk: Sequence[int]) -> list[list[Slot]]:
    """Tick ``t`` holds hop ``h`` of chunk ``c`` for every ``c + h == t`` (chunk order). A chunk
    may have a different number of hops (a gradient job streams several column chunks through
    its stages in one sequence: it is one "chunk" of ``chunks x stages`` hops)."""
    if any(h < 1 for h in hops_per_chunk):
        raise ValueError(f"zeropp_hier internal: a chunk without hops in {list(hops_per_chunk)}")
    n = max((c + h for c, h in enumerate(hops_per_chunk)), default=0)
    out: list[list[Slot]] = [[] for _ in range(n)]
    for c, h_count in enumerate(hops_per_chunk):
        for h in range(h_count):
            out[c + h].append(Slot(c, h))
    return out


class Transfer(NamedTuple):
    """What one rank does with one peer in one tick: ``send`` and ``recv`` rows (a row is one
    rank's block of the hop's payload; bytes = rows x the chunk's row bytes)."""

    tick: int
    peer: int
    send: int
    recv: int


def hop_transfers(topo: Topology, rank: int, axes: Sequence[str], kind: str) -> list[tuple[int, int, int]]:
    """(peer, rows sent, rows received) for one hop: an all-gather sends this rank's block to
    every other member and receives one from each; an all-to-all sends each member its own
    block and receives one from each. One row either way, in peer (coordinate) order."""
    if kind not in (GATHER, EXCHANGE):
        raise ValueError(f"zeropp_hier internal: unknown hop kind {kind!r}")
    peers = topo.peers(rank, normalize_axes(axes))
    return [(p, 1, 1) for p in peers if p != rank]


def rank_sequence(
    topo: Topology, rank: int, hops: Sequence[tuple[str, ...]], kind: str, chunks: int
) -> list[Transfer]:
    """This rank's transfers for a piece of ``chunks`` chunks over ``hops``, tick by tick, in
    the order they are posted ([Note: ticks])."""
    out = []
    for t, slots in enumerate(ticks([len(hops)] * chunks)):
        for slot in slots:
            out += [Transfer(t, p, s, r) for p, s, r in hop_transfers(topo, rank, hops[slot.hop], kind)]
    return out


def unmatched(sequences: dict[int, list[Transfer]], only: int | None = None) -> list[str]:
    """Every transfer (of rank ``only``, or of every rank given) whose other end is missing or
    disagrees (rank a sends ``n`` rows to b in tick t iff b receives ``n`` rows from a in tick
    t); empty when every one is matched. ``sequences`` must hold the peers of those ranks."""
    index = {(r, x.tick, x.peer): x for r, seq in sequences.items() for x in seq}
    bad = []
    for (r, t, p), x in index.items():
        if only is not None and r != only:
            continue
        other = index.get((p, t, r))
        if other is None or (other.send, other.recv) != (x.recv, x.send):
            bad.append(f"rank {r} tick {t} peer {p}: {x.send} rows out, {x.recv} in; the peer has {other}")
    return bad


def world_sequences(
    topo: Topology, plan_hops: Mapping[str, Sequence[tuple[str, ...]]], chunks: int, ranks: Sequence[int]
) -> dict[int, list[tuple[str, int, int, int, int]]]:
    """For each of ``ranks``: its (piece, tick, peer, rows out, rows in) over every piece of
    work the plan runs (its forward and backward gathers and its reduce stages)."""
    out: dict[int, list[tuple[str, int, int, int, int]]] = {}
    for r in ranks:
        seq: list[tuple[str, int, int, int, int]] = []
        for name, hops in plan_hops.items():
            kind = EXCHANGE if name == "reduce" else GATHER
            seq += [(name, *x) for x in rank_sequence(topo, r, hops, kind, chunks)]
        out[r] = seq
    return out


__all__ = [
    "EXCHANGE",
    "GATHER",
    "Slot",
    "Transfer",
    "hop_transfers",
    "rank_sequence",
    "ticks",
    "unmatched",
    "world_sequences",
]
