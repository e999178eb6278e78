"""The tick schedule agreed at start-up at any world size ([Note: tick agreement]).

[Note: tick agreement]
Before the first tick every rank must run the same schedule: the same pieces (hops), chunk
count, hop-step rule, topology and schedule code. Each rank's sequence of transfers is a pure
function of exactly those inputs and of its rank, so agreeing on the inputs is agreeing on every
rank's sequence. The check therefore has two parts, neither of which grows with the world:

* **One digest of the inputs, agreed in one all-reduce.** Each rank hashes the inputs (and the
  source of comm/tick/plan.py with the package version, so two installs that would compute
  different schedules differ) into a 60-bit integer ``d`` and the world all-reduces
  ``[bad, d, -d]`` with MAX: the world agrees when ``max(d) == -max(-d)`` and no rank's own check
  failed. Three int64 per rank on the wire, O(1) memory, whatever the world.
* **Each rank checks its own transfers by symmetry**, pure: it computes its own sequence and
  those of its actual peers (the ranks it sends to or receives from: at most a few dozen with
  log-step hops, [Note: log-step hops] in comm/tick/plan.py), never the members of its hop groups
  (every node, for the node hop), and checks each of its transfers has the mirror transfer in the
  peer's sequence (``tick_plan.unmatched`` restricted to this rank). Cost O(peers x transfers per
  rank). The whole-world matcher stays in the unit tests, where it runs over whole small worlds.

Only on a failure does a second round run: every rank's digest and verdict are gathered
(``agree_local``, O(world), once, on the way to stopping) so that every rank raises the same
``HierRankError`` naming the ranks whose inputs differ from the majority's, or whose own check
failed. Shown at 9,408 nodes x 4 x 2 (pure, one core: tests/unit/test_tick_agree.py bounds the
number of sequence items computed) and on 8 and 16 gloo ranks (tests/dist/test_ticks.py).
"""

from __future__ import annotations

import hashlib
import pathlib
from collections import Counter
from typing import Mapping, NamedTuple, Sequence

import torch
import torch.distributed as dist

from ...core.topology import Topology
from ..agree import agree_local, digest
from . import plan as tick_plan

DIGEST_BITS = 60  # fits an int64 with room for its negation


class Agreement(NamedTuple):
    """What the start-up check returns: the agreed digest (hex, the same on every rank) and this
    rank's distinct tick peers, which the connection warm-up opens (comm/tick/connect.py)."""

    digest: str
    peers: tuple[int, ...]


class TickScheduleError(RuntimeError):
    """A peer's tick schedule is not the one this rank expects of it ([Note: ticks])."""


def _code_digest() -> str:
    """The schedule code this rank runs: the source of comm/tick/plan.py and the version."""
    from ... import __version__

    src = pathlib.Path(tick_plan.__file__).read_bytes()
    return hashlib.sha256(src + __version__.encode()).hexdigest()[:16]


def inputs_digest(topo: Topology, pieces: Mapping[str, Sequence[tuple[str, ...]]], chunks: int, steps: str) -> int:
    """A ``DIGEST_BITS`` integer of everything a rank's tick sequence depends on."""
    summary = {
        "code": _code_digest(),
        "topology": [topo.num_nodes, topo.gpus_per_node, topo.gcds_per_gpu, list(topo.rank_map or ())],
        "pieces": {k: [list(h) for h in v] for k, v in sorted(pieces.items())},
        "chunks": chunks,
        "steps": steps,
        "bound": tick_plan.MAX_OPS_PER_CALL,
    }
    return int(digest(summary)[: DIGEST_BITS // 4], 16)


def own_transfers_matched(
    topo: Topology, rank: int, pieces: Mapping[str, Sequence[tuple[str, ...]]], chunks: int, steps: str
) -> tuple[list[str], int, tuple[int, ...]]:
    """Pure: this rank's transfers of every piece checked against its actual peers' sequences.
    Returns (problems, sequence items computed, this rank's distinct peers ascending)."""
    problems: list[str] = []
    computed = 0
    peers: set[int] = set()
    for name, hops in pieces.items():
        kind = tick_plan.EXCHANGE if name == "reduce" else tick_plan.GATHER
        mine = tick_plan.rank_sequence(topo, rank, hops, kind, chunks, steps)
        seqs = {rank: mine}
        peers.update(x.peer for x in mine)
        for q in sorted({x.peer for x in mine}):
            seqs[q] = tick_plan.rank_sequence(topo, q, hops, kind, chunks, steps)
        computed += sum(len(s) for s in seqs.values())
        problems += [f"{name}: {b}" for b in tick_plan.unmatched(seqs, only=rank)[:3]]
    return problems, computed, tuple(sorted(peers - {rank}))


def _device() -> torch.device:
    # NCCL/RCCL collectives take device tensors; gloo takes host ones
    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree_schedule(
    topo: Topology, rank: int, pieces: dict[str, list[tuple[str, ...]]], chunks: int, steps: str = tick_plan.AUTO
) -> Agreement:
    """Collective on the world, before any tick ([Note: tick agreement]): the schedule's inputs
    agreed by one all-reduce and this rank's own transfers checked by symmetry. Returns the
    agreed digest (hex), the same on every rank, and this rank's tick peers; on a difference every rank raises
    ``HierRankError`` naming the ranks that differ, and no tick is issued."""
    d = inputs_digest(topo, pieces, chunks, steps)
    problems, _, peers = own_transfers_matched(topo, rank, pieces, chunks, steps)
    agreed = not problems
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([int(bool(problems)), d, -d], dtype=torch.int64, device=_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        bad, hi, neg_lo = (int(x) for x in t.tolist())
        agreed = not bad and hi == -neg_lo
        if not agreed:
            _name_the_ranks(rank, d, problems, chunks, pieces)
    elif problems:
        raise AssertionError(f"zeropp_hier internal: the tick schedule is not matched: {problems}")
    return Agreement(f"{d:0{DIGEST_BITS // 4}x}", peers)


def _name_the_ranks(rank: int, d: int, problems: list[str], chunks: int, pieces: Mapping[str, object]) -> None:
    """The failure path: every rank's digest and verdict gathered once, every rank raises."""
    mine = (d, problems)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    usual = Counter(x[0] for x in everyone).most_common(1)[0][0]
    odd = [q for q, x in enumerate(everyone) if x[0] != usual]

    def check() -> None:
        if problems:  # the pure schedule itself is wrong: a bug in this rank's code
            raise AssertionError(f"zeropp_hier internal: rank {rank}'s tick schedule is not matched: {problems}")
        if rank in odd:
            raise TickScheduleError(
                f'the tick schedule (overlap "ticks") of rank {rank} differs from the one most ranks run '
                f"(pipeline.chunks = {chunks}, hops {dict(pieces)}): every rank must run the same zeropp_hier "
                "config, topology and code; no tick was issued"
            )

    agree_local("tick schedule", check)
    raise TickScheduleError(  # unreachable unless the gathered verdicts and the reduction disagree
        "zeropp_hier internal: the tick schedule's digests differed but no rank was found to differ"
    )


__all__ = ["Agreement", "TickScheduleError", "agree_schedule", "inputs_digest", "own_transfers_matched"]
