"""The tick mode's side effects: the executor that runs pieces of work in ticks, the transport
that issues one grouped point-to-point call per tick, and the start-up agreement on the
schedule ([Note: ticks] in comm/tick_plan.py, which holds the schedule itself).

A job here is the same generator as on the lanes (comm/gather.py, comm/reduce.py), but with
``yields_wires`` set it yields each hop's transfer (``Wire``, [Note: collectives as steps] in
comm/collectives.py) after the hop's ``Move`` instead of issuing a collective. The tick driver
(``tick_job``) holds the chunks of one piece of work, collects the transfers of a tick in the
schedule's order, moves them in one call, and sends each chunk its received rows.

[Note: one tick stream per call]
Each piece of work alone pays its own fill and drain: ``C + H - 1`` ticks for ``C`` chunks over
``H`` hops, most of them with fewer than ``H`` hops at once. DeepSpeed's prefetch hands one
gather call several layers ([Note: a job per layer] in deepspeed/inflight.py), each a piece (or
one per bucket). Inside ``TickExecutor.fused()`` the pieces submitted are held and then run as
*one* tick stream: their chunks numbered in submission order, chunk ``c`` hop ``h`` in tick
``c + h`` as within a piece, so ``L`` pieces of ``C`` chunks take ``L * C + H - 1`` ticks and
layer k+1's node hop shares a call with layer k's gpu hop. Each piece keeps its own future,
settled on the lane the moment its last chunk ends (a device event recorded there, as at a
job's end), so a wait for layer k returns while the later layers are still in ticks. Only
pieces with one hop sequence whose hop groups are all different are fused (a piece of another
sequence starts a new stream), so a tick still carries at most one transfer per pair of ranks
and direction. What breaks a stream: leaving the context, a submission of other hops, a wait
(``result``), ``drain`` or ``close``, all at points of the one program order. Every chunk's
job is the same generator as alone, so values, kept copies and bytes are unchanged; the order
of local work between ticks changes only across pieces, which touch different tensors. The
start-up agreement covers each piece's sequence; the stream's is the same pure schedule over
more chunks, and the number of pieces per call follows DeepSpeed's prefetch in program order,
the same on every rank.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from typing import Any, Callable, Hashable, Iterator, NamedTuple, Sequence, TypeVar

import torch
import torch.distributed as dist

from ..core.plan import CommPlan, Hop
from ..core.topology import Topology
from ..core.vocab import AXES
from . import tick_plan
from .agree import agree_local, digest
from .busy import Several
from .collectives import Wire
from .executor import CommExecutor, Done, Job, JobOrderError, Move
from .failures import as_timedelta, collective_guard, slowest_tier
from .issue import backend_for
from .stats import CommStats

R = TypeVar("R")

TICK_LANE = ("ticks",)  # the executor's one slot name for a tick


class _End(NamedTuple):
    value: Any


class TickTransport:
    """Moves the transfers of one tick in one ``batch_isend_irecv`` on ``group`` (a group of
    every rank), then waits for them; counts bytes as the hop collectives do ([Note: byte
    accounting] in comm/stats.py). ``log``, when a list, gets (tick, hops in the tick, [(peer,
    bytes out, bytes in)]) per tick, in posting order."""

    def __init__(
        self, group: dist.ProcessGroup, rank: int, topo: Topology, stats: CommStats, timeout_s: float | None = None
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
        per_wire: list[list[tuple[int, int]]] = []  # (receiver, bytes) sent, per wire
        for slot, w in enumerate(wires):
            per_wire.append([])
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
                    per_wire[-1].append((peer, rows[j].numel() * rows[j].element_size()))
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
        for w, out, sent in zip(wires, outs, per_wire):  # the payload as the hop collective counts it
            per_peer = w.send.numel() * w.send.element_size() // (1 if w.kind == tick_plan.GATHER else len(out))
            self.stats.record_payload(w.phase, w.hg.peers, per_peer)
            # the link view from the messages themselves ([Note: bytes per link] in core/wire.py)
            self.stats.record_sent(w.phase, sent)
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


def tick_job(
    transport: TickTransport,
    jobs: Sequence[Job[object]],
    lanes: Sequence[Sequence[Hashable]],
    on_end: Callable[[int, object], None] | None = None,
) -> Job[object]:
    """One piece of work (``jobs[c]``: chunk ``c``, its hops on ``lanes[c]``) in ticks: before
    each tick a ``Move`` for the executor's one lane, then the tick's transfers in one call.
    Returns the last chunk's value (the others return None: [Note: chunked gathers]);
    ``on_end(c, value)`` is called as chunk ``c`` ends, on the lane ([Note: one tick stream per
    call])."""
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
                if on_end is not None:
                    on_end(s.chunk, nxt.value)
            else:
                waiting[s.chunk] = nxt
    return values[-1] if values else None


class _Piece(NamedTuple):
    """A piece of work held for a tick stream: its chunks' jobs, their hops, its future."""

    jobs: list[Job]
    lanes: tuple[Hashable, ...]
    fut: Future


class TickExecutor(CommExecutor):
    """The executor of the tick mode: one lane (one host thread, one stream), each piece of work
    run by ``tick_job`` on ``transport``. ``submit`` runs one job in ticks (its hops one per
    tick); ``submit_all`` runs the chunks of one piece together ([Note: ticks]); inside
    ``fused()`` the pieces submitted run as one tick stream ([Note: one tick stream per call])."""

    yields_wires = True

    def __init__(self, name: str, device: torch.device, transport: TickTransport, timeout_s: float | None = None):
        super().__init__(name, device, overlap=True, one_lane=True, timeout_s=timeout_s, serial=False)
        self.transport = transport
        self._fusing = 0  # depth of ``fused`` contexts
        self._held: list[_Piece] = []  # pieces of the stream being collected, in submission order
        # pieces of work submitted, and tick streams started (a piece alone is one): fewer
        # streams than pieces is what ``fused`` saved in fill and drain
        self.pieces = 0
        self.streams = 0

    @contextlib.contextmanager
    def fused(self) -> Iterator[None]:
        self._fusing += 1
        try:
            yield
        finally:
            self._fusing -= 1
            if not self._fusing:
                self._flush()

    def submit(
        self, job: Job[R], lanes: Sequence[Hashable], hops: Sequence[Hashable | None] | None = None
    ) -> Future[Done[R]]:
        if hops is not None or not lanes:  # drain's barrier; a job with no transfer
            self._flush()
            return super().submit(job, lanes, hops)
        return self._piece([job], tuple(lanes))

    def submit_all(self, jobs: Sequence[Job[R | None]], lanes: Sequence[Hashable]) -> Future[Done[R]]:
        return self._piece(list(jobs), tuple(lanes))

    def result(self, fut: Future[Done[R]], timeout: float | None = None) -> R:
        self._flush()  # a wait for a held piece would never end
        return super().result(fut, timeout)

    def drain(self) -> None:
        self._flush()
        super().drain()

    def close(self, timeout: float | None = None) -> list[str]:
        self._flush()
        return super().close(timeout)

    def _piece(self, jobs: list[Job], lanes: tuple[Hashable, ...]) -> Future:
        self.pieces += 1
        if not self._fusing or len(set(lanes)) != len(lanes):
            self._flush()
            return self._ticks(jobs, [lanes] * len(jobs))
        refusal = self._refusal()
        if refusal is not None:
            raise refusal
        if self._held and self._held[0].lanes != lanes:
            self._flush()
        fut: Future = Future()
        self._held.append(_Piece(jobs, lanes, fut))
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        return fut

    def _flush(self) -> None:
        """Run the held pieces as one tick stream; each piece's future is settled as its last
        chunk ends ([Note: one tick stream per call])."""
        pieces, self._held = self._held, []
        if not pieces:
            return
        jobs = [j for p in pieces for j in p.jobs]
        last: dict[int, Future] = {}
        end = -1
        for p in pieces:
            end += len(p.jobs)
            last[end] = p.fut
        cuda = self._cuda

        def settle(chunk: int, value: Any) -> None:
            fut = last.get(chunk)
            if fut is None:
                return
            event = None
            if cuda is not None:  # on the lane's stream: a waiter's stream waits for this chunk
                event = cuda.Event()
                event.record(cuda.current_stream(self.device))
            fut.set_result(Done(value, event))

        def rest(stream: Future) -> None:
            error = stream.exception()
            for fut in last.values():
                if not fut.done():
                    fut.set_exception(
                        error or JobOrderError("zeropp_hier internal: a tick stream ended before one of its pieces")
                    )

        try:
            stream = self._ticks(jobs, [pieces[0].lanes] * len(jobs), settle)
        except BaseException as e:  # noqa: B036 - refused: every held piece's waiter gets it
            for fut in last.values():
                fut.set_exception(e)
            return
        self.outstanding -= 1  # the stream's own future has no waiter: each piece has its own
        deadline = getattr(stream, "zeropp_deadline", None)
        for fut in last.values():
            if deadline is not None:
                fut.zeropp_deadline = deadline  # type: ignore[attr-defined]
        stream.add_done_callback(rest)

    def _ticks(
        self, jobs: list[Job], lanes: list[tuple[Hashable, ...]], on_end: Callable[[int, Any], None] | None = None
    ) -> Future:
        schedule = tick_plan.ticks([len(x) for x in lanes])
        busy = [Several(lanes[s.chunk][s.hop] for s in slots) for slots in schedule]
        self.streams += 1
        return CommExecutor.submit(
            self, tick_job(self.transport, jobs, lanes, on_end), [TICK_LANE] * len(schedule), busy
        )


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
