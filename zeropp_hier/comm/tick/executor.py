"""The tick mode's side effects: the executor that runs pieces of work in ticks, the transport
that issues one grouped point-to-point call per tick ([Note: ticks] in comm/tick/plan.py, which
holds the schedule itself; the start-up agreement on it is comm/tick/agree.py).

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
*one* tick stream: their chunks numbered in submission order, chunk ``c`` hop ``h`` in tick ``c
+ h`` as within a piece, so ``L`` pieces of ``C`` chunks take ``L * C + H - 1`` ticks and layer
k+1's node hop shares a call with layer k's gpu hop. Each piece keeps its own future, settled on
the lane the moment its last chunk ends (a device event recorded there, as at a job's end), so a
wait for layer k returns while the later layers are still in ticks. Only pieces with one hop
sequence whose hop groups are all different are fused (a piece of another sequence, or of the
other kind, starts a new stream), so a stream is the same pure schedule as one piece of more
chunks (a pair's messages in a tick, two where log steps of two chunks meet, posted in slot
order at both ends: [Note: ticks] in comm/tick/plan.py). What breaks a stream: leaving the
context, a submission of other hops, a wait (``result``), ``drain`` or ``close``, all at points
of the one program order. Every chunk's job is the same generator as alone, so values, kept
copies and bytes are unchanged; the order of local work between ticks changes only across
pieces, which touch different tensors. The start-up agreement covers each piece's sequence; the
stream's is the same pure schedule over more chunks, and the number of pieces per call follows
DeepSpeed's prefetch in program order, the same on every rank.
"""

from __future__ import annotations

import contextlib
import functools
from concurrent.futures import Future
from typing import Any, Callable, Hashable, Iterator, NamedTuple, Sequence, TypeVar

import torch
import torch.distributed as dist

from ...core.plan import CommPlan, Hop
from ...core.topology import Topology
from ...core.vocab import AXES
from ..busy import Several
from ..collectives import Wire
from ..executor import CommExecutor
from ..failures import as_timedelta, collective_guard, slowest_tier
from ..issue import backend_for
from ..job import Done, Job, JobOrderError, Move
from ..stats import CommStats
from . import plan as tick_plan

R = TypeVar("R")

TICK_LANE = ("ticks",)  # the executor's one slot name for a tick


class _End(NamedTuple):
    value: Any


@functools.lru_cache(maxsize=256)
def _exchange_index(members: int, step: int, device: torch.device) -> torch.Tensor:
    """The positions a log-step exchange sends in ``step`` (``tick_plan.exchange_blocks``) as an
    index tensor on ``device``, made once per (members, step, device): a log-step exchange reads
    the same blocks at every call, and a list moved to a GPU inside a tick is a copy from
    pageable memory that synchronises the host ([Note: no host traffic in the hot path] in
    core/layout.py). Built by tensor ops, keyed by two numbers: no Python list of the members
    per call, nor one held per key ([Note: per-rank costs flat in the world] in core/layout.py).
    A few hops x log2(members) steps: bounded, small."""
    every = torch.arange(members, dtype=torch.long)
    return every[(every >> step) & 1 == 1].to(device)


@functools.lru_cache(maxsize=64)
def _from_member_index(members: int, me: int, device: torch.device) -> torch.Tensor:
    """For each member m, the position of a log-step exchange's buffer that holds member m's
    block once its steps are done: ``(me - m) % members`` ([Note: log-step hops]), as
    ``_exchange_index`` makes its index (once per key, by tensor ops)."""
    return ((me - torch.arange(members, dtype=torch.long)) % members).to(device)


class HopRun:
    """One hop of one chunk in ticks: its transfer (``Wire``) and, in log steps, the blocks held
    between its sub-hops ([Note: log-step hops] in comm/tick/plan.py). ``units(step)`` gives the
    sub-hop's (peer, tensor sent, tensor received) in units, posting order; ``after(step)``
    places what it received; ``result()`` the received rows as the hop group's collective
    returns them (peer order)."""

    def __init__(self, wire: Wire, rank: int, steps: str):
        self.wire = wire
        peers = wire.hg.peers
        self.n, self.me = len(peers), peers.index(rank)
        self.mode = tick_plan.step_mode(self.n, steps, wire.kind)
        self.steps = tick_plan.step_count(self.n, self.mode)
        n, i = self.n, self.me
        self._recv: torch.Tensor | None = None
        if wire.kind == tick_plan.GATHER:
            send = wire.send.reshape(-1)
            self.buf = send.new_empty((n, send.numel()))
            # direct: rows in peer order; log: position j holds member i + j's block
            self.buf[0 if self.mode == tick_plan.LOG else i].copy_(send)
        else:
            send = wire.send.contiguous()
            if self.mode == tick_plan.LOG:  # position j: the block for member i + j
                self.buf = torch.roll(send, -i, 0).contiguous()
            else:
                self.buf = torch.empty_like(send)
                self.buf[i].copy_(send[i])

    def units(self, step: int) -> list[list[tuple[int, torch.Tensor | None, torch.Tensor | None]]]:
        peers, buf, kind = self.wire.hg.peers, self.buf, self.wire.kind
        units = tick_plan.step_units(self.n, self.me, kind, self.mode, step)
        if self.mode == tick_plan.DIRECT:
            sent = [self.wire.send.reshape(-1)] * self.n if kind == tick_plan.GATHER else self.wire.send.contiguous()
            return [[(peers[j], sent[j], buf[j]) for j, _, _ in u] for u in units]
        k = 1 << step
        if kind == tick_plan.GATHER:
            rows = min(k, self.n - k)
            out, got = buf[:rows], buf[k : k + rows]
        else:
            out = buf.index_select(0, _exchange_index(self.n, step, buf.device))
            got = self._recv = torch.empty_like(out)
        return [[(peers[j], out if s else None, got if r else None) for j, s, r in u] for u in units]

    def after(self, step: int) -> None:
        if self._recv is not None:
            idx = _exchange_index(self.n, step, self.buf.device)
            self.buf.index_copy_(0, idx, self._recv)
            self._recv = None

    def result(self) -> torch.Tensor:
        if self.mode == tick_plan.DIRECT:
            return self.buf
        n, i = self.n, self.me
        if self.wire.kind == tick_plan.GATHER:  # member m's block is at position m - i
            return torch.roll(self.buf, i, 0)
        # position j holds the block from member i - j
        return self.buf.index_select(0, _from_member_index(n, i, self.buf.device))


class TickTransport:
    """Moves the transfers of one tick in grouped calls of at most ``bound`` ops
    (``batch_isend_irecv`` on ``group``, a group of every rank; [Note: bounded calls] in
    comm/tick/plan.py), each waited for before the next; counts bytes as the hop collectives
    do ([Note: byte accounting] in comm/stats.py). ``steps``: how hops run ("auto", "direct",
    "log": [Note: log-step hops]). ``log``, when a list, gets (tick, hops in the tick, [(peer,
    bytes out, bytes in)]) per tick, in posting order; ``calls``, grouped calls issued."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        rank: int,
        topo: Topology,
        stats: CommStats,
        timeout_s: float | None = None,
        steps: str = tick_plan.AUTO,
        bound: int = tick_plan.MAX_OPS_PER_CALL,
    ) -> None:
        self.group = group
        self.rank = rank
        self.topo = topo
        self.stats = stats
        self.timeout_s = timeout_s
        self.steps = steps
        self.bound = bound
        self.log: list | None = None
        self.calls = 0

    def _on_host(self, tensor: torch.Tensor) -> bool:
        """Whether this group's transfers of ``tensor`` run on the host (gloo)."""
        return backend_for(dist.get_backend(self.group), tensor.device.type) == "gloo"

    def sub_hops(self, lanes: Sequence[Hashable], kind: str) -> list[tuple[int, int]]:
        """(hop, step) of each sub-hop of a chunk of ``kind`` over hop groups ``lanes`` (axes)."""
        sizes = [self.topo.axes_size(axes) for axes in lanes]  # type: ignore[arg-type]
        return tick_plan.sub_hops(sizes, self.steps, kind)

    def start(self, wire: Wire) -> HopRun:
        return HopRun(wire, self.rank, self.steps)

    def post(self, wires: Sequence[Wire], batches: Sequence[list[dist.P2POp]]) -> None:
        """The network part of a tick: its grouped calls, each waited for before the next (the
        only part that a stand-in replaces to time the rest: benchmarks/gpu/tick_work.py)."""
        axes = tuple(a for a in AXES if any(a in w.hg.axes for w in wires))
        with collective_guard(
            rank=self.rank,
            phase=wires[0].phase if wires else "tick",
            tier=slowest_tier(self.topo, axes),
            axes=axes,
            # the ranks this tick's calls wait on: its messages' peers, a few per hop (every
            # member of every hop group would be a list of the world per tick at scale)
            peers=sorted({op.peer for ops in batches for op in ops}),
            timeout_s=self.timeout_s,
        ):
            for ops in batches:
                if not ops:
                    continue
                # on gloo the wait is the host's, bounded here; on NCCL/RCCL ``wait()`` makes the
                # stream wait (a timeout argument would make the host wait instead), and the
                # group's own timeout bounds the transfer
                timeout = as_timedelta(self.timeout_s) if self._on_host(ops[0].tensor) else None
                self.calls += 1
                for work in dist.batch_isend_irecv(ops):
                    work.wait() if timeout is None else work.wait(timeout)

    def run(self, tick: int, runs: Sequence[tuple[HopRun, int]]) -> list[torch.Tensor | None]:
        """Sub-hop ``step`` of each run; the received rows of each run whose last step this was
        (as the hop group's collective returns them), None for the others."""
        units: list[list[tuple[int, int, torch.Tensor | None, torch.Tensor | None]]] = []
        for slot, (hop, step) in enumerate(runs):
            units += [[(slot, peer, out, got) for peer, out, got in u] for u in hop.units(step)]
        calls = tick_plan.pack_calls([sum((o is not None) + (g is not None) for _, _, o, g in u) for u in units])
        batches: list[list[dist.P2POp]] = [[] for _ in range(calls[-1] + 1 if calls else 0)]
        moved: list[tuple[int, int, int]] = []
        sent: list[list[tuple[int, int]]] = [[] for _ in runs]  # (receiver, bytes) sent, per run
        for u, call in zip(units, calls):
            for slot, peer, out, got in u:
                # slot order is the schedule's, the same on every rank: the tag tells gloo which
                # of a tick's transfers a message belongs to
                if out is not None and out.numel():
                    batches[call].append(dist.P2POp(dist.isend, out, peer, self.group, slot))
                    sent[slot].append((peer, _nbytes(out)))
                if got is not None and got.numel():
                    batches[call].append(dist.P2POp(dist.irecv, got, peer, self.group, slot))
                moved.append((peer, _nbytes(out), _nbytes(got)))
        self.post([hop.wire for hop, _ in runs], batches)
        results: list[torch.Tensor | None] = []
        for (hop, step), messages in zip(runs, sent):
            hop.after(step)
            # the link view from the messages themselves, step by step ([Note: bytes per link] in core/wire.py)
            self.stats.record_sent(hop.wire.phase, messages)
            if step < hop.steps - 1:
                results.append(None)
                continue
            w = hop.wire
            out = hop.result()
            # the payload as the hop collective counts it
            per_peer = w.send.numel() * w.send.element_size() // (1 if w.kind == tick_plan.GATHER else len(out))
            self.stats.record_payload(w.phase, w.hg.peers, per_peer)
            results.append(out)
        if self.log is not None:
            self.log.append((tick, len(runs), moved))
        return results


class LocalTickTransport(TickTransport):
    """A ``TickTransport`` whose network part fills each receive buffer on the rank itself: a
    copy of what the rank sends in the same slot (the same tag, size and dtype), zeros where it
    sends none. Nothing is sent, so a tick run through it is the tick mode's local work alone
    (the slot copies, encodes, decodes, sums and the driver's Python): what ``auto``'s host probe
    times per element ([Note: host probe] in deepspeed/auto_host.py) and
    benchmarks/gpu/tick_work.py times per tick. The received values are not the collective's."""

    def post(self, wires: Sequence[Wire], batches: Sequence[list[dist.P2POp]]) -> None:
        for ops in batches:
            if not ops:
                continue
            self.calls += 1
            sends = {(op.tag, op.tensor.numel(), op.tensor.dtype): op.tensor for op in ops if op.op is dist.isend}
            for op in ops:
                if op.op is dist.irecv:
                    src = sends.get((op.tag, op.tensor.numel(), op.tensor.dtype))
                    op.tensor.copy_(src) if src is not None else op.tensor.zero_()


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def record_carry(carry: Sequence[torch.Tensor]) -> None:
    """The tensors a chunk's hop reads that were made on another stream (a ``Move``'s carry: the
    gradient rows packed on the caller's stream, kept copies), recorded on the stream the tick
    driver runs on (the tick lane's, current inside ``CommExecutor._step``), as a lane records
    them on its own (``_record_carry`` in comm/job.py). Without it the caching allocator may
    hand their memory to the caller's stream as soon as the job drops them, while this
    stream's kernels that read them are still queued."""
    for t in carry:
        if t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))


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
    record_carry(move.carry)
    wire = next(job)
    if not isinstance(wire, Wire):
        raise JobOrderError(f"zeropp_hier internal: a job yielded {wire!r} where its hop's transfer was due")
    return wire


def tick_job(
    transport: TickTransport,
    jobs: Sequence[Job[object]],
    lanes: Sequence[Sequence[Hashable]],
    on_end: Callable[[int, object], None] | None = None,
    kind: str = tick_plan.GATHER,
) -> Job[object]:
    """One piece of work (``jobs[c]``: chunk ``c``, its hops of ``kind`` on ``lanes[c]``) in ticks: before
    each tick a ``Move`` for the executor's one lane, then the tick's transfers in its grouped
    calls; a log-step hop runs over consecutive ticks ([Note: log-step hops] in
    comm/tick/plan.py). Returns the last chunk's value (the others return None: [Note: chunked
    gathers]); ``on_end(c, value)`` is called as chunk ``c`` ends, on the lane ([Note: one tick
    stream per call])."""
    subs = [transport.sub_hops(x, kind) for x in lanes]
    schedule = tick_plan.ticks([len(x) for x in subs])
    waiting: dict[int, Wire] = {}
    running: dict[int, HopRun] = {}
    values: list[Any] = [None] * len(jobs)
    for t, slots in enumerate(schedule):
        for s in slots:
            hop, step = subs[s.chunk][s.hop]
            if s.hop == 0:  # the chunk starts: its local work up to its first transfer
                first = _to_wire(jobs[s.chunk], lanes[s.chunk], 0, None)
                assert isinstance(first, Wire)  # a chunk has at least one hop
                waiting[s.chunk] = first
            if step == 0:
                running[s.chunk] = transport.start(waiting.pop(s.chunk))
        yield Move(TICK_LANE)
        got = transport.run(t, [(running[s.chunk], subs[s.chunk][s.hop][1]) for s in slots])
        for s, rows in zip(slots, got):  # chunk order: chunk c ends before chunk c + 1
            if rows is None:  # more steps of this hop to come
                continue
            del running[s.chunk]
            nxt = _to_wire(jobs[s.chunk], lanes[s.chunk], subs[s.chunk][s.hop][0] + 1, rows)
            if isinstance(nxt, _End):
                values[s.chunk] = nxt.value
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
    kind: str = tick_plan.GATHER


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
        self,
        job: Job[R],
        lanes: Sequence[Hashable],
        hops: Sequence[Hashable | None] | None = None,
        *,
        kind: str = tick_plan.GATHER,
    ) -> Future[Done[R]]:
        if hops is not None or not lanes:  # drain's barrier; a job with no transfer
            self._flush()
            return super().submit(job, lanes, hops)
        return self._piece([job], tuple(lanes), kind)

    def submit_all(
        self, jobs: Sequence[Job[R | None]], lanes: Sequence[Hashable], *, kind: str = tick_plan.GATHER
    ) -> Future[Done[R]]:
        if not lanes:  # no transfer (every hop group of one member): the jobs alone, on the lane
            return super().submit_all(jobs, lanes)
        return self._piece(list(jobs), tuple(lanes), kind)

    def result(self, fut: Future[Done[R]], timeout: float | None = None) -> R:
        self._flush()  # a wait for a held piece would never end
        return super().result(fut, timeout)

    def drain(self) -> None:
        self._flush()
        super().drain()

    def close(self, timeout: float | None = None) -> list[str]:
        self._flush()
        return super().close(timeout)

    def _piece(self, jobs: list[Job], lanes: tuple[Hashable, ...], kind: str) -> Future:
        self.pieces += 1
        if not self._fusing or len(set(lanes)) != len(lanes):
            self._flush()
            return self._ticks(jobs, [lanes] * len(jobs), kind)
        refusal = self._refusal()
        if refusal is not None:
            raise refusal
        if self._held and (self._held[0].lanes, self._held[0].kind) != (lanes, kind):
            self._flush()
        fut: Future = Future()
        self._held.append(_Piece(jobs, lanes, fut, kind))
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
            stream = self._ticks(jobs, [pieces[0].lanes] * len(jobs), pieces[0].kind, settle)
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
        self,
        jobs: list[Job],
        lanes: list[tuple[Hashable, ...]],
        kind: str,
        on_end: Callable[[int, Any], None] | None = None,
    ) -> Future:
        subs = [self.transport.sub_hops(x, kind) for x in lanes]
        schedule = tick_plan.ticks([len(x) for x in subs])
        busy = [Several(lanes[s.chunk][subs[s.chunk][s.hop][0]] for s in slots) for slots in schedule]
        self.streams += 1
        return CommExecutor.submit(
            self, tick_job(self.transport, jobs, lanes, on_end, kind), [TICK_LANE] * len(schedule), busy
        )


def plan_pieces(plan: CommPlan, backward: Sequence[Hop]) -> dict[str, list[tuple[str, ...]]]:
    """The hop sequences a plan runs in ticks: its forward gather, each kept level's backward
    gather, its reduce stages."""
    out = {"forward": [h.axes for h in plan.forward], "reduce": [h.axes for h in plan.reduce]}
    for axes, hops in plan.by_level:
        if any(h in backward for h in hops):
            out[f"backward from {','.join(axes)}"] = [h.axes for h in hops]
    return out


__all__ = [
    "TICK_LANE",
    "HopRun",
    "LocalTickTransport",
    "TickExecutor",
    "TickTransport",
    "plan_pieces",
    "tick_job",
]
