"""The tick mode's side effects: the executor that runs pieces of work in ticks, the transport
that issues one grouped point-to-point call per tick, and the start-up agreement on the
schedule ([Note: ticks] in comm/tick_plan.py, which holds the schedule itself).

A job here is the same generator as on the lanes (comm/gather.py, comm/reduce.py), but with
``yields_wires`` set it yields each hop's transfer (``Wire``, [Note: collectives as steps] in
comm/collectives.py) after the hop's ``Move`` instead of issuing a collective. The tick driver
(``tick_job``) holds the chunks of one piece of work, collects the transfers of a tick in the
schedule's order, moves them in one call, and sends each chunk its received rows.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Hashable, NamedTuple, Sequence

import torch
import torch.distributed as dist

from ..core.plan import CommPlan, Hop
from ..core.topology import AXES, Topology
from . import tick_plan
from .agree import agree_local, digest
from .busy import Several
from .collectives import Wire
from .executor import CommExecutor, Job, JobOrderError, Move
from .failures import as_timedelta, collective_guard, slowest_tier
from .issue import backend_for
from .stats import CommStats

TICK_LANE = ("ticks",)  # the executor's one slot name for a tick


class _End(NamedTuple):
    value: Any


class TickTransport:
    """Moves the transfers of one tick in one ``batch_isend_irecv`` on ``group`` (a group of
    every rank), then waits for them; counts bytes as the hop collectives do ([Note: byte
    accounting] in comm/stats.py). ``log``, when a list, gets (tick, hops in the tick, [(peer,
    bytes out, bytes in)]) per tick, in posting order."""

    def __init__(
        self, group: Any, rank: int, topo: Topology, stats: CommStats, timeout_s: float | None = None
    ) -> None:
        self.group = group
        self.rank = rank
        self.topo = topo
        self.stats = stats
        self.timeout_s = timeout_s
        self.log: list | None = None

    def _on_host(self, tensor: torch.Tensor) -> bool:
        """Whether this group's transfers of ``tensor`` run on the host (gloo)."""
        return backend_for(dist.get_backend(self.group), tensor.device.type) == "gloo"

    def run(self, tick: int, wires: Sequence[Wire]) -> list[torch.Tensor]:
        """The received rows of each wire (as the hop group's collective returns them)."""
        ops: list[dist.P2POp] = []
        outs: list[torch.Tensor] = []
        moved: list[tuple[int, int, int]] = []
        for slot, w in enumerate(wires):
            peers = w.hg.peers
            me = peers.index(self.rank)
            if w.kind == tick_plan.GATHER:
                send = w.send.reshape(-1)
                out = send.new_empty((len(peers), send.numel()))
                rows = [send] * len(peers)
            else:
                send = w.send.contiguous()
                out = torch.empty_like(send)
                rows = list(send)
            out[me].copy_(rows[me])
            for j, peer in enumerate(peers):
                if peer == self.rank:
                    continue
                # slot order is the schedule's, the same on every rank: the tag tells gloo which
                # of a tick's transfers a message belongs to
                if rows[j].numel():
                    ops.append(dist.P2POp(dist.isend, rows[j], peer, self.group, slot))
                    ops.append(dist.P2POp(dist.irecv, out[j], peer, self.group, slot))
                moved.append((peer, rows[j].numel() * rows[j].element_size(), out[j].numel() * out[j].element_size()))
            outs.append(out)
        axes = tuple(a for a in AXES if any(a in w.hg.axes for w in wires))
        with collective_guard(
            rank=self.rank,
            phase=wires[0].phase if wires else "tick",
            tier=slowest_tier(self.topo, axes),
            axes=axes,
            peers=sorted({p for w in wires for p in w.hg.peers}),
            timeout_s=self.timeout_s,
        ):
            if ops:
                # on gloo the wait is the host's, bounded here; on NCCL/RCCL ``wait()`` makes the
                # stream wait (a timeout argument would make the host wait instead), and the
                # group's own timeout bounds the transfer
                timeout = as_timedelta(self.timeout_s) if self._on_host(ops[0].tensor) else None
                for work in dist.batch_isend_irecv(ops):
                    work.wait() if timeout is None else work.wait(timeout)
        for w, out in zip(wires, outs):  # as the hop collective counts it
            per_peer = w.send.numel() * w.send.element_size() // (1 if w.kind == tick_plan.GATHER else len(out))
            self.stats.record(w.phase, w.hg.peers, per_peer)
        if self.log is not None:
            self.log.append((tick, len(wires), moved))
        return outs


def _to_wire(job: Job, lanes: Sequence[Hashable], index: int, got: Any) -> Wire | _End:
    """Send ``got`` (the received rows of the job's previous transfer; None to start it) and run
    the job to its next transfer, which must follow a ``Move`` on ``lanes[index]``; or to its
    end, which must come after ``len(lanes)`` transfers."""
    try:
        move = job.send(got)
    except StopIteration as stop:
        if index != len(lanes):
            raise JobOrderError(
                f"zeropp_hier internal: a job declared {len(lanes)} hops {tuple(lanes)} but made {index}"
            ) from None
        return _End(stop.value)
    if not isinstance(move, Move) or index >= len(lanes) or move.lane != lanes[index]:
        want = lanes[index] if index < len(lanes) else "nothing more"
        raise JobOrderError(
            f"zeropp_hier internal: a job declared hop {want!r} for its transfer {index} but moved to "
            f"{getattr(move, 'lane', move)!r}"
        )
    wire = next(job)
    if not isinstance(wire, Wire):
        raise JobOrderError(f"zeropp_hier internal: a job yielded {wire!r} where its hop's transfer was due")
    return wire


def tick_job(transport: TickTransport, jobs: Sequence[Job], lanes: Sequence[Sequence[Hashable]]) -> Job:
    """One piece of work (``jobs[c]``: chunk ``c``, its hops on ``lanes[c]``) in ticks: before
    each tick a ``Move`` for the executor's one lane, then the tick's transfers in one call.
    Returns the last chunk's value (the others return None: [Note: chunked gathers])."""
    schedule = tick_plan.ticks([len(x) for x in lanes])
    waiting: dict[int, Wire] = {}
    values: list[Any] = [None] * len(jobs)
    for t, slots in enumerate(schedule):
        for s in slots:
            if s.hop == 0:  # the chunk starts: its local work up to its first transfer
                first = _to_wire(jobs[s.chunk], lanes[s.chunk], 0, None)
                assert isinstance(first, Wire)  # a chunk has at least one hop
                waiting[s.chunk] = first
        yield Move(TICK_LANE)
        got = transport.run(t, [waiting[s.chunk] for s in slots])
        for s, rows in zip(slots, got):  # chunk order: chunk c ends before chunk c + 1
            nxt = _to_wire(jobs[s.chunk], lanes[s.chunk], s.hop + 1, rows)
            if isinstance(nxt, _End):
                values[s.chunk] = nxt.value
                del waiting[s.chunk]
            else:
                waiting[s.chunk] = nxt
    return values[-1] if values else None


class TickExecutor(CommExecutor):
    """The executor of the tick mode: one lane (one host thread, one stream), each piece of work
    run by ``tick_job`` on ``transport``. ``submit`` runs one job in ticks (its hops one per
    tick); ``submit_all`` runs the chunks of one piece together ([Note: ticks])."""

    yields_wires = True

    def __init__(self, name: str, device: torch.device, transport: TickTransport, timeout_s: float | None = None):
        super().__init__(name, device, overlap=True, one_lane=True, timeout_s=timeout_s, serial=False)
        self.transport = transport

    def submit(self, job: Job, lanes: Sequence[Hashable], hops: Sequence[Hashable | None] | None = None) -> Future:
        if hops is not None or not lanes:  # drain's barrier; a job with no transfer
            return super().submit(job, lanes, hops)
        return self._ticks([job], [tuple(lanes)])

    def submit_all(self, jobs: Sequence[Job], lanes: Sequence[Hashable]) -> Future:
        return self._ticks(list(jobs), [tuple(lanes)] * len(jobs))

    def _ticks(self, jobs: list[Job], lanes: list[tuple[Hashable, ...]]) -> Future:
        schedule = tick_plan.ticks([len(x) for x in lanes])
        busy = [Several(lanes[s.chunk][s.hop] for s in slots) for slots in schedule]
        return super().submit(tick_job(self.transport, jobs, lanes), [TICK_LANE] * len(schedule), busy)


def plan_pieces(plan: CommPlan, backward: Sequence[Hop]) -> dict[str, list[tuple[str, ...]]]:
    """The hop sequences a plan runs in ticks: its forward gather, each kept level's backward
    gather, its reduce stages."""
    out = {"forward": [h.axes for h in plan.forward], "reduce": [h.axes for h in plan.reduce]}
    for axes, hops in plan.by_level:
        if any(h in backward for h in hops):
            out[f"backward from {','.join(axes)}"] = [h.axes for h in hops]
    return out


class TickScheduleError(RuntimeError):
    """A peer's tick schedule is not the one this rank expects of it ([Note: ticks])."""


def agree_schedule(topo: Topology, rank: int, pieces: dict[str, list[tuple[str, ...]]], chunks: int) -> str:
    """Collective on the world, before any tick: every rank's sequence of (tick, peer, rows out,
    rows in) over ``pieces`` agreed by digest ([Note: ticks]). Each rank recomputes the
    sequences of the ranks it exchanges with (the members of its hop groups), checks that each
    of its own transfers is matched by its peer's, and compares their digests with the ones
    they sent; then every rank learns every verdict (``agree_local``), so a difference stops
    every rank with ``HierRankError`` naming the ranks that found it. Returns one digest of all
    ranks' sequences. Cost: the peers' sequences, O(peers x transfers per rank)."""
    hop_axes = {axes for hops in pieces.values() for axes in hops}
    near = sorted({p for axes in hop_axes for p in topo.peers(rank, axes)} | {rank})
    expected: dict[int, list] = {q: [] for q in near}
    for name, hops in pieces.items():
        kind = tick_plan.EXCHANGE if name == "reduce" else tick_plan.GATHER
        seqs = {q: tick_plan.rank_sequence(topo, q, hops, kind, chunks) for q in near}
        bad = tick_plan.unmatched(seqs, only=rank)
        if bad:  # the pure schedule itself is wrong: a bug, the same on every rank
            raise AssertionError(f"zeropp_hier internal: the {name} tick schedule is not matched: {bad[:3]}")
        for q in near:
            expected[q] += [(name, *x) for x in seqs[q]]
    want = {q: digest(expected[q]) for q in near}
    got: list = [want[rank]]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        got = [None] * dist.get_world_size()
        dist.all_gather_object(got, want[rank])

    def check() -> None:
        wrong = [q for q in near if got[q] != want[q]]
        if wrong:
            raise TickScheduleError(
                f'the tick schedule (overlap "ticks") of ranks {wrong} is not the one rank {rank} computed for '
                f"them (pipeline.chunks = {chunks}, hops {pieces}): every rank must run the same zeropp_hier "
                "config, topology and code; no tick was issued"
            )

    agree_local("tick schedule", check)
    return digest(got)


__all__ = [
    "TICK_LANE",
    "TickExecutor",
    "TickScheduleError",
    "TickTransport",
    "agree_schedule",
    "plan_pieces",
    "tick_job",
]
