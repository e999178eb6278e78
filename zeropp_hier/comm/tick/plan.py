"""The tick schedule: which hop of which chunk runs in which tick, and what each rank sends and
receives there. Pure: no tensors, no process groups (comm/tick/executor.py runs it).

[Note: ticks]
With ``zeropp_hier.overlap: "ticks"`` a piece of work (one gather bucket's chunks, or one
gradient bucket's chunks: [Note: chunked gathers] in comm/gather.py) advances in *ticks*. Chunk
``c`` runs its hop ``h`` in tick ``c + h``, so tick ``t`` carries hop 0 of chunk ``t``, hop 1 of
chunk ``t - 1``, hop 2 of chunk ``t - 2`` (for ``frontier``'s forward gather: the node, gpu and
gcd hops of three chunks; for its gradients the gcd, gpu and node stages, the reverse order of
links); a chunk's hop needs only its own previous hop, done one tick earlier. Every hop of a
tick is one all-gather or all-to-all over its hop group, written as point-to-point transfers
(``rank_sequence``): to each other member of a small group at once, or, in a large one, in
log steps over consecutive ticks of its chunk ([Note: log-step hops]). The whole tick is one
grouped call (``torch.distributed.batch_isend_irecv``), or a few where it would pass 64 ops
([Note: bounded calls]), on *one* process group that spans the world, each followed by a wait
for its transfers. Between ticks the chunks do their local work on the one issuing
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
  communicator, which is NCCL's launch-order rule for one communicator. A tick's messages
  between one pair of ranks are matched in posting order (NCCL's rule for a pair), and both
  ends post them in the tick's slot order (chunk order), so even two of one pair (log steps of
  two chunks) match; ``unmatched`` checks it, per grouped call.
* The tiers overlap inside one call: the transfers of a tick cross different links (node
  uplink, package link, in-package link) at the same time, which is the overlap the gloo lanes
  get from one thread per hop group.

Same bytes per link as the collectives for every gather and a direct exchange: an all-gather
over ``k`` ranks brings ``k - 1`` blocks in (direct or in log steps), a direct all-to-all sends
block ``j`` to peer ``j`` ([Note: byte accounting] in comm/stats.py counts exactly this); a
log-step all-to-all forwards more ([Note: log-step hops]). The values moved are the same
tensors the collectives would move, so the results are bit for bit the same.
Fill and drain: a piece of ``C`` chunks over ``H`` sub-hops takes ``C + H - 1`` ticks.
"""

from __future__ import annotations

import functools
from typing import Mapping, NamedTuple, Sequence

from ...core.topology import Topology, normalize_axes

GATHER, EXCHANGE = "gather", "exchange"  # an all-gather, an all-to-all
DIRECT, LOG, AUTO = "direct", "log", "auto"  # how a hop's transfers are laid out
STEP_MODES = (AUTO, DIRECT, LOG)
# the most point-to-point ops (sends and receives) in one grouped call ([Note: bounded calls])
MAX_OPS_PER_CALL = 64
# a hop group of more members than this runs in log steps under "auto" ([Note: log-step hops]):
# a gather, and an exchange (whose log steps forward more bytes)
LOG_STEPS_ABOVE = {"gather": 32, "exchange": 256}

# [Note: log-step hops]
# Direct, a hop sends this rank's rows to every other member of its group in one tick: at 48
# nodes the node hop talks to 47 nodes, at 9,408 to 9,407, and its tick is one grouped call of
# two ops per peer. Log-step, a group of ``N`` members runs the hop in ``L = ceil(log2 N)``
# steps, one send and one receive each, on ``L`` consecutive ticks of its chunk (the chunk's
# hop is ``L`` sub-hops: ``ticks`` already takes chunks of different hop counts):
#
# * all-gather (Bruck): member ``i`` holds blocks ``i, i+1, ...`` (mod N) at positions 0, 1, ...;
#   step ``s`` sends its first ``min(2^s, N - 2^s)`` blocks to member ``i - 2^s`` and receives as
#   many from ``i + 2^s`` into positions ``2^s ...``; a local rotation ends it. ``N - 1`` blocks
#   in, the same bytes as direct, any ``N``.
# * all-to-all (Bruck; the reduce stages' exchange, block ``j`` to member ``j``): position ``j``
#   holds the block for member ``i + j``; step ``s`` sends the blocks at positions with bit
#   ``s`` set to ``i + 2^s`` and receives theirs from ``i - 2^s`` into the same positions; a
#   local rotation ends it. Blocks are forwarded, never summed, so the receiver sums the very
#   rows direct exchange would hand it (bit for bit), but about ``N/2`` blocks cross the link
#   per step, about ``(N/2) ceil(log2 N)`` in all against ``N - 1`` direct (x2.7 at 48 members,
#   x6.4 at 9,408); the planner charges it (planner/tick_latency.py). A reduce-scatter in log steps with
#   partial sums would keep the bytes but change the sum order and re-encode partial sums.
#
# Values are moved, never computed on: log-step and direct give the same bits. On a group that
# spans one tier (frontier's hops) every link carries what it carries direct; on one that spans
# several (zero3's and zeropp's world hop) the offsets ``2^s`` wrap around the coordinate order,
# so some blocks a direct hop keeps inside a node cross the network (2 x 2 x 2, zero3's gather:
# 6 of 7 blocks over the network against 4 direct), same total.
#
# The rule of where each applies is the planner's (``step_mode``, priced in
# planner/tick_latency.py). Under ``"auto"`` a *gather* over more than 32 members runs in log
# steps: there a direct tick passes one grouped call's bound (32 peers, 64 ops) and needs
# ``ceil((N - 1) / 8)`` rounds of RCCL's p2p channels, >= 4, against 6 log steps at 33..64
# members, each a sixth of the bytes (Frontier, 20B GPT, 48 nodes: 0.69 s of communication per
# step against 0.87 s all direct). An *exchange* stays direct up to 256 members, since its log
# steps forward ~(N/2) log2 N blocks: at 48 nodes every hop in log steps costs 0.95 s, not 0.69.
# Above 256 it takes log steps for the peers a rank connects to (a connector pair per network
# peer; all-to-all failures at 256 GPUs, NVIDIA/nccl-tests#78, port exhaustion at 64+ MI200
# nodes, ROCm/rccl#577: as issue 49 cites them), though the latency model alone would keep it
# direct at 1,024 nodes (1.15 s against 1.45 s) and goes log only by 9,408 (1.78 against 2.31 s).
# Every smaller group (the gpu and gcd hops, a node group of 2 to 32) keeps one direct tick; a
# node group of 2 is the same one exchange either way. ``pipeline.hop_steps`` forces "direct"
# or "log" for every hop (core/config.py), to compare the two.
#
# [Note: bounded calls]
# A tick's transfers go out in grouped calls of at most ``MAX_OPS_PER_CALL`` ops (NCCL cuts a
# larger group into kernel plans at points that depend on each rank's own op list, so a send
# and its receive can land in different kernels and hang: pytorch/pytorch#174288,
# NVIDIA/Megatron-LM#7189; pytorch/pytorch#174942 proposes chunking above 256). The ops of a
# tick come in *units*, each matched whole by its peers: a direct hop's class of peer offset
# ``d`` (send and receive with ``i + d`` and ``i - d``: that peer's class ``d`` holds this rank),
# a log step's one send/receive pair. A unit's op count depends only on the group size and the
# step, alike on every rank, and every rank's tick holds the same slots in the same order, so
# packing the units greedily in that order cuts every rank's tick at the same units: a send and
# its receive are always in the same call, and the calls go out in the same order everywhere.


class Slot(NamedTuple):
    """One hop of one chunk in a tick."""

    chunk: int
    hop: int


def ticks(hops_per_chunk: Sequence[int]) -> list[list[Slot]]:
    """Tick ``t`` holds hop ``h`` of chunk ``c`` for every ``c + h == t`` (chunk order). A chunk
    may have a different number of hops (a gradient job streams several column chunks through
    its stages in one sequence: it is one "chunk" of ``chunks x stages`` hops; a log-step hop is
    several sub-hops: [Note: log-step hops])."""
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
    rank's block of the hop's payload; bytes = rows x the chunk's row bytes), in grouped call
    ``call`` of the tick ([Note: bounded calls])."""

    tick: int
    peer: int
    send: int
    recv: int
    call: int = 0


def step_mode(members: int, steps: str = AUTO, kind: str = GATHER) -> str:
    """How a hop of ``kind`` over a group of ``members`` runs: ``steps`` when forced, else the
    planner's rule ([Note: log-step hops])."""
    if steps not in STEP_MODES:
        raise ValueError(f"zeropp_hier internal: hop steps {steps!r}: use one of {list(STEP_MODES)}")
    if steps != AUTO:
        return steps
    return LOG if members > LOG_STEPS_ABOVE[kind] else DIRECT


def step_count(members: int, mode: str) -> int:
    """Sub-hops (ticks) of one hop: one direct, ``ceil(log2 members)`` in log steps."""
    return max(1, (members - 1).bit_length()) if mode == LOG else 1


def exchange_blocks(members: int, step: int) -> list[int]:
    """The positions a log-step all-to-all sends in ``step``: those with bit ``step`` set."""
    return [j for j in range(members) if j >> step & 1]


def exchange_block_count(members: int, step: int) -> int:
    """``len(exchange_blocks(members, step))`` in O(1): the schedule is computed for peers at
    start-up ([Note: tick agreement]), where a list of every member per step would grow with
    the world."""
    period, half = 1 << (step + 1), 1 << step
    return (members // period) * half + max(0, members % period - half)


Unit = list[tuple[int, int, int]]  # (member index, rows sent, rows received), matched whole


def step_units(members: int, me: int, kind: str, mode: str, step: int) -> list[Unit]:
    """The transfers of sub-hop ``step`` of a hop for member ``me`` of ``members``, in units
    ([Note: bounded calls]), in posting order."""
    if kind not in (GATHER, EXCHANGE):
        raise ValueError(f"zeropp_hier internal: unknown hop kind {kind!r}")
    n, i = members, me
    if n < 2:
        return []
    if mode == DIRECT:
        out = []
        for d in range(1, n // 2 + 1):
            up, down = (i + d) % n, (i - d) % n
            out.append([(up, 1, 1)] if up == down else [(up, 1, 1), (down, 1, 1)])
        return out
    k = 1 << step
    if kind == GATHER:  # send to i - k, receive from i + k
        rows = min(k, n - k)
        to, frm = (i - k) % n, (i + k) % n
    else:  # send to i + k, receive from i - k
        rows = exchange_block_count(n, step)
        to, frm = (i + k) % n, (i - k) % n
    return [[(to, rows, rows)]] if to == frm else [[(to, rows, 0), (frm, 0, rows)]]


def unit_ops(unit: Unit) -> int:
    return sum((s > 0) + (r > 0) for _, s, r in unit)


def pack_calls(ops: Sequence[int], bound: int = MAX_OPS_PER_CALL) -> list[int]:
    """The grouped call of each unit (``ops[u]`` ops each, in posting order): greedy, a new call
    when the next unit would pass ``bound`` ([Note: bounded calls])."""
    out, call, used = [], 0, 0
    for n in ops:
        if n > bound:
            raise ValueError(f"zeropp_hier internal: a unit of {n} ops over the bound of {bound} per call")
        if used and used + n > bound:
            call, used = call + 1, 0
        out.append(call)
        used += n
    return out


def hop_transfers(
    topo: Topology, rank: int, axes: Sequence[str], kind: str, steps: str = AUTO
) -> list[list[tuple[int, int, int]]]:
    """Per sub-hop of one hop: (peer, rows sent, rows received), in posting order."""
    peers = topo.peers(rank, normalize_axes(axes))
    mode = step_mode(len(peers), steps, kind)
    me = peers.index(rank)
    return [
        [(peers[j], s, r) for u in step_units(len(peers), me, kind, mode, k) for j, s, r in u]
        for k in range(step_count(len(peers), mode))
    ]


def sub_hops(sizes: Sequence[int], steps: str = AUTO, kind: str = GATHER) -> list[tuple[int, int]]:
    """(hop, step) of each sub-hop of a chunk of ``kind`` over hops of ``sizes`` members."""
    return [(h, k) for h, n in enumerate(sizes) for k in range(step_count(n, step_mode(n, steps, kind)))]


def place_in_group(topo: Topology, rank: int, axes: Sequence[str]) -> int:
    """``rank``'s index in ``topo.peers(rank, axes)`` (row-major over ``axes``), in O(1)."""
    c = topo.coord(rank)._asdict()
    place = 0
    for a in normalize_axes(axes):
        place = place * topo.axis_size(a) + c[a]
    return place


def hop_group(topo: Topology, rank: int, axes: Sequence[str]) -> tuple[int, ...]:
    """``topo.peers(rank, axes)``, shared by every rank of the group: the start-up check computes
    the sequences of a rank's peers, most of which share its hop groups ([Note: tick agreement])."""
    axes = normalize_axes(axes)
    c = topo.coord(rank)._asdict()
    return _group(topo, axes, tuple(c[a] for a in ("node", "gpu", "gcd") if a not in axes))


@functools.lru_cache(maxsize=64)
def _group(topo: Topology, axes: tuple[str, ...], fixed: tuple[int, ...]) -> tuple[int, ...]:
    others = [a for a in ("node", "gpu", "gcd") if a not in axes]
    c = dict(zip(others, fixed))
    c.update(dict.fromkeys(axes, 0))
    return topo.peers(topo.rank_of((c["node"], c["gpu"], c["gcd"])), axes)


def rank_sequence(
    topo: Topology,
    rank: int,
    hops: Sequence[tuple[str, ...]],
    kind: str,
    chunks: int,
    steps: str = AUTO,
    bound: int = MAX_OPS_PER_CALL,
) -> list[Transfer]:
    """This rank's transfers for a piece of ``chunks`` chunks over ``hops``, tick by tick, in
    the order they are posted ([Note: ticks]); ``steps``: "auto" (the planner's rule), "direct"
    or "log" ([Note: log-step hops]); at most ``bound`` ops per grouped call ([Note: bounded
    calls])."""
    groups = [hop_group(topo, rank, axes) for axes in hops]
    places = [place_in_group(topo, rank, axes) for axes in hops]
    modes = [step_mode(len(g), steps, kind) for g in groups]
    subs = sub_hops([len(g) for g in groups], steps, kind)
    out: list[Transfer] = []
    for t, slots in enumerate(ticks([len(subs)] * chunks) if subs else []):
        units: list[Unit] = []
        for slot in slots:
            h, k = subs[slot.hop]
            g = groups[h]
            for u in step_units(len(g), places[h], kind, modes[h], k):
                units.append([(g[j], s, r) for j, s, r in u])
        calls = pack_calls([unit_ops(u) for u in units], bound)
        out += [Transfer(t, p, s, r, c) for u, c in zip(units, calls) for p, s, r in u]
    return out


def unmatched(sequences: dict[int, list[Transfer]], only: int | None = None) -> list[str]:
    """Every transfer (of rank ``only``, or of every rank given) whose other end is missing or
    disagrees: the sends of rank a to b in call c of tick t must be, in order and rows, the
    receives of b from a in that call (NCCL matches a pair's messages in posting order; a tick
    may hold two of one pair in log steps, from different chunks). Empty when every one is
    matched. ``sequences`` must hold the peers of those ranks."""
    sends: dict[tuple[int, int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int, int], list[int]] = {}
    for r, seq in sequences.items():
        for x in seq:
            if x.send:
                sends.setdefault((r, x.tick, x.call, x.peer), []).append(x.send)
            if x.recv:
                recvs.setdefault((r, x.tick, x.call, x.peer), []).append(x.recv)
    bad = []
    for mine, theirs, what in ((sends, recvs, "out"), (recvs, sends, "in")):
        for (r, t, c, p), rows in mine.items():
            if only is not None and r != only:
                continue
            other = theirs.get((p, t, c, r))
            if other != rows:
                bad.append(f"rank {r} tick {t} peer {p} call {c}: rows {what} {rows}; the peer has {other}")
    return bad


def world_sequences(
    topo: Topology,
    plan_hops: Mapping[str, Sequence[tuple[str, ...]]],
    chunks: int,
    ranks: Sequence[int],
    steps: str = AUTO,
) -> dict[int, list[tuple[str, int, int, int, int, int]]]:
    """For each of ``ranks``: its (piece, tick, peer, rows out, rows in, call) over every piece
    of work the plan runs (its forward and backward gathers and its reduce stages)."""
    out: dict[int, list[tuple[str, int, int, int, int, int]]] = {}
    for r in ranks:
        seq: list[tuple[str, int, int, int, int, int]] = []
        for name, hops in plan_hops.items():
            kind = EXCHANGE if name == "reduce" else GATHER
            seq += [(name, *x) for x in rank_sequence(topo, r, hops, kind, chunks, steps)]
        out[r] = seq
    return out


__all__ = [
    "AUTO",
    "DIRECT",
    "EXCHANGE",
    "GATHER",
    "LOG",
    "LOG_STEPS_ABOVE",
    "MAX_OPS_PER_CALL",
    "STEP_MODES",
    "Slot",
    "Transfer",
    "exchange_blocks",
    "hop_transfers",
    "pack_calls",
    "rank_sequence",
    "step_count",
    "step_mode",
    "step_units",
    "sub_hops",
    "ticks",
    "unmatched",
    "world_sequences",
]
