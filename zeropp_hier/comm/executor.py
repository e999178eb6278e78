"""Where the hop collectives run: one lane (a thread, and on a GPU a stream) per hop group.

[Note: one order of hop collectives]
Gathers are issued ahead of use (DeepSpeed's prefetch) and gradient stages run during backward,
on the same hop groups. A *job* (one gather, or one gradient bucket's stages) is a generator that
announces each collective before it issues it: ``yield Move(lane, carry)`` says "the next
collective is on hop group ``lane``". Three rules keep that safe and overlapped:

1. Every collective on a hop group runs on that group's lane, in the order in which the jobs were
   submitted. At ``submit`` a job declares the lanes of its collectives, and one slot per
   collective is queued on each lane then, on the training thread, in program order — which is
   the same on every rank. A lane takes its slots strictly in queue order and waits at a slot
   until the job's previous collective (on another lane) is done. So every group sees its
   collectives in the same order on every rank, and no communicator is driven from two threads
   or two streams (with NCCL/RCCL that can deadlock). No cycle of waits can form: a lane waits
   only for an earlier collective of the job at its head, and all slots of an earlier-submitted
   job come before the later job's on every lane.
2. Hops of different jobs overlap (pipelining across buckets): while bucket k's slow node hop
   runs, bucket k+1's gpu hop, or the backward re-gather of the next layer, proceeds on its own
   lane; a job's time on the links becomes the slowest tier's, not the sum of its tiers'. Within
   a job the hops stay in sequence (each needs the previous one's output).
3. The caller is not blocked: ``submit`` returns at once; ``result`` hands the outputs over (on a
   GPU the caller's stream waits for the job's last event; the host does not). On a GPU each lane
   has its own stream; a job's next collective waits for its previous one by an event, and the
   tensors a job carries from one lane to the next (``Move.carry``) are recorded on the next
   lane's stream so that the caching allocator does not hand their memory out early.

Which mode runs is chosen per backend in comm/issue.py ([Note: one issuing thread on GPUs]).
``overlap: false`` runs jobs inline on the caller, one after another. With one lane
(``"overlap": "one_lane"``, and NCCL/RCCL's default for a plan with a hop across tiers) every hop
group shares one lane: all collectives in one order on one thread and one stream, nothing
pipelined across jobs, which NCCL and RCCL need (the lanes keep each communicator's order but not
the order between them); ``serial`` (ROCm's default, ``"overlap": "serial"`` anywhere) also waits
for each collective to complete before the next, and counts the host seconds of those waits
(``serial_wait_s``). The tick mode (NCCL/RCCL's default otherwise; ``TickExecutor`` in
comm/tick/executor.py) is one lane whose slots are ticks: the chunks of one piece of work advance
together, each tick one grouped point-to-point call on one communicator ([Note: ticks] in
comm/tick/plan.py).

[Note: executor failure semantics]
A failed collective leaves the hop groups in an unknown state: its peers may have completed it,
be inside it, or have failed elsewhere, and the job's later collectives were never issued on this
rank. Issuing anything after that risks pairing collectives across ranks in the wrong order.
So the executor has two states, working and *broken*, and one way from the first to the second:

- The first job that raises (a failed collective, a job's own bug, a wait that ran past its
  bound, an interrupt while the caller waited) breaks the executor and keeps its own error.
  Every job not yet started fails at once with ``ExecutorBrokenError``, whose ``__cause__`` is
  that first error, and no collective is issued after it; ``submit`` after that fails the same
  way. Nothing repairs a broken executor: the process must exit (docs/reliability.md, "after
  an interrupt or a communication error"), and ``HierEngine.save_checkpoint`` refuses to save
  (the state on this rank may be out of step with its peers').
- Every wait is bounded. Each collective ends on its own within ``collective_timeout_s``
  (``timeout_s`` here; [Note: failure detection] in failures.py), so a job whose ``n``
  collectives were queued behind ``m`` others ends within ``(m + n) * timeout_s``; ``result``
  waits that long plus ``WAIT_SLACK_S`` (or its ``timeout`` argument) and then raises
  ``ExecutorTimeoutError`` and breaks the executor. That bound only fires when a lane is stuck
  outside a collective's own timeout (a device kernel that never ends, a backend without one).
- ``submit`` is atomic with respect to interrupts: it queues the whole job with one put on the
  dispatcher's queue (one call into C; Python raises ``KeyboardInterrupt`` only between
  bytecodes), and the dispatcher thread, which never receives it, puts the job's slots on its
  lanes. A Ctrl-C during ``submit`` leaves the job queued on all its lanes or on none.
- ``close`` stops every lane at once: it marks the executor closed (queued jobs are skipped,
  failing with ``ExecutorBrokenError``), wakes every lane, and joins all of them against one
  overall deadline (``timeout_s + WAIT_SLACK_S``), so it takes at most that long whatever the
  number of lanes. It returns the lanes still alive then (inside a collective that has not
  ended). It never destroys a group; ``HierRuntime.close`` leaves every hop group in place when
  a lane is still alive (destroying a communicator under a running collective can crash the
  process), says so, and leaves the groups to the process's exit.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Hashable, Sequence, cast

import torch

from .busy import BusyLog
from .job import Done, Job, Move, R, _advance, _End, _record_carry, _run_inline

ONE = ("one_lane",)  # the only lane with ``one_lane``
# added to every bound the executor derives from ``timeout_s``: a failed collective's error needs
# a moment to reach the waiter after the collective's own timeout ([Note: executor failure semantics])
WAIT_SLACK_S = 30.0
# how often a lane waiting for its turn looks whether the executor broke or closed meanwhile
_POLL_S = 0.5
# every executor not yet closed in this process ([Note: quiet boundaries] in comm/boundary.py)
_LIVE: weakref.WeakSet = weakref.WeakSet()


def live_executors() -> list[CommExecutor]:
    """The executors of this process that are not closed."""
    return [e for e in list(_LIVE) if not e._closed]


class ExecutorBrokenError(RuntimeError):
    """A job that was not run because an earlier one failed, or the executor was closed
    ([Note: executor failure semantics]); ``__cause__`` is the first error."""


class ExecutorTimeoutError(RuntimeError):
    """A job did not finish within its bound: a lane is stuck outside a collective's timeout."""


class _Running:
    """A job in flight: whose turn it is, and the event its next collective waits for."""

    def __init__(self, job: Job, lanes: Sequence[Hashable], fut: Future, ready: Any, hops: Sequence[Hashable] = ()):
        self.job = job
        self.lanes = tuple(lanes)
        # the hop group of each collective, as declared ([Note: busy intervals]); None: a slot that
        # issues no collective (``drain``'s barrier), not recorded
        self.hops = tuple(hops)
        self.fut = fut
        self.event = ready  # on a GPU: the previous step's end (the caller's stream at submit)
        self.turn = 0  # index of the slot that may run next
        self.failed = False
        self.cond = threading.Condition()


def _record_on(value: Any, stream: Any) -> None:
    """Tensors handed to the caller are used on its stream from now on (one level deep: a
    tensor, or a list/tuple/dict of them)."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
    for t in items:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            t.record_stream(stream)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else '(no message)'}"


class CommExecutor:
    """Runs jobs' collectives on per-hop-group lanes, each lane in submission order.

    ``timeout_s``: the collective timeout of the groups the jobs use (``collective_timeout_s``);
    it bounds every wait ([Note: executor failure semantics]). None: waits are unbounded."""

    # jobs issue their own collectives; the tick executor (comm/tick/executor.py) has them yield each
    # transfer instead ([Note: collectives as steps] in comm/collectives.py)
    yields_wires = False

    def __init__(
        self,
        name: str,
        device: torch.device,
        overlap: bool = True,
        one_lane: bool = False,
        timeout_s: float | None = None,
        serial: bool = False,
    ):
        self.name = name
        self.device = device
        self.overlap = overlap
        self.one_lane = one_lane
        self.timeout_s = timeout_s
        # on a device with ``one_lane``: issue a collective only once the previous one completed
        # (no two communicators in flight, [Note: one issuing thread on GPUs] in comm/issue.py)
        self.serial = serial and one_lane
        self._previous: Any = None  # the end of the last collective issued, when serial
        # host seconds the issuing thread spent in those waits (``serial_wait_s``): what the
        # serial mode costs; 0 on the CPU, where a collective has ended when its call returns
        self._serial_wait_s = 0.0
        self._cuda = torch.cuda if (overlap and device.type == "cuda") else None
        self._lanes: dict[Hashable, tuple[queue.SimpleQueue, threading.Thread, Any]] = {}
        self._lock = threading.Lock()
        # submit -> dispatcher: one put per job, the only thing submit does to shared state
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._dispatcher: threading.Thread | None = None
        self._known: dict[Hashable, None] = {}  # lanes of every job submitted (drain's barrier)
        self._broken: BaseException | None = None  # the first error; set once
        self._closed = False
        # collectives submitted / finished (or skipped): what a new job waits behind
        self._slots_submitted = 0
        self._slots_done = 0
        self._idle = threading.Condition(self._lock)  # notified as slots finish (``wait_idle``)
        # submitted but not yet taken by ``result``: more than one means work was issued ahead of
        # use (what DeepSpeed's prefetch is for); ``max_outstanding`` is the high-water mark
        self.outstanding = 0
        self.max_outstanding = 0
        # most jobs that held a lane at the same moment: above one, hops of different jobs ran
        # side by side (rule 2)
        self.max_lanes_busy = 0
        self._busy = 0
        self.busy_log: BusyLog | None = None  # [Note: busy intervals]; off unless record_busy()
        _LIVE.add(self)

    # -- state ---------------------------------------------------------------------------------
    @property
    def broken(self) -> BaseException | None:
        """The error that broke the executor, or None while it works."""
        return self._broken

    @property
    def serial_wait_s(self) -> float:
        """Host seconds the issuing thread has waited, in the serial mode, for each collective's
        predecessor to complete on the device, since the executor was built or
        ``reset_serial_wait``; 0 in every other mode and on the CPU (no events to wait for)."""
        with self._lock:
            return self._serial_wait_s

    def reset_serial_wait(self) -> None:
        with self._lock:
            self._serial_wait_s = 0.0

    @property
    def in_flight(self) -> int:
        """Collectives submitted and not yet finished (or skipped); 0 with ``overlap`` off."""
        return self._slots_submitted - self._slots_done

    def wait_idle(self, timeout: float) -> int:
        """Wait at most ``timeout`` seconds for ``in_flight`` to reach 0 (after ``drain`` only the
        last lanes' bookkeeping may still be behind); returns ``in_flight`` then."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self.in_flight > 0 and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
        return self.in_flight

    def owns_thread(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is one of this executor's lanes ([Note: foreign collectives])."""
        return any(t is thread for _, t, _ in list(self._lanes.values()))

    def mark_broken(self, error: BaseException) -> None:
        """Break the executor (the first error wins): no collective is issued after this."""
        with self._lock:
            if self._broken is None:
                self._broken = error

    def _refusal(self) -> ExecutorBrokenError | None:
        first = self._broken
        if first is not None:
            err = ExecutorBrokenError(
                f"zeropp_hier: executor {self.name}: this job was not run because an earlier "
                f"collective job failed ({_first_line(first)}); no collective is issued after a "
                "failure. Exit this process and resume from the last complete checkpoint."
            )
            err.__cause__ = first
            return err
        if self._closed:
            return ExecutorBrokenError(f"zeropp_hier: executor {self.name} is closed (its engine was destroyed)")
        return None

    # -- caller side ---------------------------------------------------------------------------
    def fused(self) -> contextlib.AbstractContextManager:
        """A context whose submissions may run as one piece of work: the tick executor runs the
        pieces submitted inside it as one tick stream ([Note: one tick stream per call] in
        comm/tick/executor.py); here, where each lane pipelines jobs anyway, nothing changes."""
        return contextlib.nullcontext()

    def submit(
        self,
        job: Job[R],
        lanes: Sequence[Hashable],
        hops: Sequence[Hashable | None] | None = None,
        *,
        kind: str = "gather",
    ) -> Future[Done[R]]:
        """Queue ``job``, whose collectives are on ``lanes`` in this order (one entry per
        collective). Must be called from one thread, in the same program order on every rank.
        ``hops``: the hop group each slot records as busy ([Note: busy intervals]; None in it:
        a slot that issues no collective); default ``lanes``. ``kind``: "gather" or "exchange"
        (the tick mode lays its hops out by it: comm/tick/plan.py). Raises
        ``ExecutorBrokenError`` once the executor is broken or closed."""
        hops = lanes if hops is None else hops
        refusal = self._refusal()
        if refusal is not None:
            raise refusal
        fut: Future[Done[R]] = Future()
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        if not self.overlap or not lanes:  # inline; a job with no collective has nothing to overlap
            try:
                fut.set_result(Done(_run_inline(job, lanes, self.busy_log if any(hops) else None), None))
            except BaseException as e:  # noqa: B036 - handed to the waiter, as a thread would
                if lanes:  # a failed collective (or an interrupt inside one) breaks the executor
                    self.mark_broken(e)
                fut.set_exception(e)
            return fut
        ready = None
        if self._cuda is not None:  # the job starts after what the caller queued so far
            ready = self._cuda.Event()
            ready.record(self._cuda.current_stream(self.device))
        running = _Running(job, [self.key(lane) for lane in lanes], fut, ready, hops)
        if self.timeout_s is not None:
            ahead = self._slots_submitted - self._slots_done
            bound = self.timeout_s * (ahead + len(lanes)) + WAIT_SLACK_S
            fut.zeropp_deadline = time.monotonic() + bound  # type: ignore[attr-defined]
        self._slots_submitted += len(lanes)
        self._known.update(dict.fromkeys(running.lanes))
        self._ensure_dispatcher()
        self._inbox.put(running)  # the job is queued whole from here ([Note: executor failure semantics])
        return fut

    def submit_all(
        self, jobs: Sequence[Job[R | None]], lanes: Sequence[Hashable], *, kind: str = "gather"
    ) -> Future[Done[R]]:
        """Queue ``jobs`` in order, each with ``lanes``, as one piece of work (the chunks of a
        pipelined bucket, [Note: chunked gathers] in comm/gather.py): one future, which gives the
        last job's value, or the first failed job's error. The last job must end after the
        others (its last collective on the same lane as theirs)."""
        if len(jobs) == 1:  # the last job: its value is the work's (None only where it failed)
            return cast("Future[Done[R]]", self.submit(jobs[0], lanes))
        high = self.max_outstanding
        futures: list[Future] = []
        try:
            for job in jobs:
                futures.append(self.submit(job, lanes))
        except BaseException:  # a refused submit: nothing of this work reaches the caller's result
            self.outstanding -= len(futures)
            self.max_outstanding = max(high, self.outstanding)
            raise
        self.outstanding -= len(jobs) - 1  # one piece of work for the caller's ``result``
        self.max_outstanding = max(high, self.outstanding)
        whole: Future[Done[R]] = Future()

        def settle(last: Future) -> None:
            for f in futures:  # every one done by now: the last ends after the others
                if f.exception() is not None:
                    whole.set_exception(f.exception())
                    return
            whole.set_result(last.result())

        futures[-1].add_done_callback(settle)
        # the last job's wait bound, where ``submit`` sets one, holds for the whole: it ends last
        deadline = getattr(futures[-1], "zeropp_deadline", None)
        if deadline is not None:
            whole.zeropp_deadline = deadline  # type: ignore[attr-defined]
        return whole

    def record_busy(self, on: bool = True) -> None:
        """Start (anew) or stop recording each collective's busy interval ([Note: busy
        intervals]); read them with ``busy_log.intervals()``. From the caller's thread; a
        collective already running goes to the log it started in."""
        # on a GPU events even inline (overlap off): the host clock would time launches only
        cuda = torch.cuda if self.device.type == "cuda" else None
        self.busy_log = BusyLog(cuda, self.device) if on else None

    def key(self, lane: Hashable) -> Hashable:
        """The lane that runs a hop group's collectives."""
        return ONE if self.one_lane else lane

    def result(self, fut: Future[Done[R]], timeout: float | None = None) -> R:
        """The job's outputs. Waits at most ``timeout`` seconds (default: the bound derived from
        ``timeout_s`` at submit); past it, raises ``ExecutorTimeoutError`` and breaks the
        executor. An interrupt while waiting breaks it too: the job runs on without a waiter."""
        self.outstanding -= 1
        deadline = getattr(fut, "zeropp_deadline", None)
        if timeout is None and deadline is not None:
            timeout = max(0.0, deadline - time.monotonic())
        try:
            done = fut.result(timeout)
        except FutureTimeout:
            err = ExecutorTimeoutError(
                f"zeropp_hier: executor {self.name}: a collective job did not finish within its "
                f"bound ({timeout:.0f} s more after it was awaited; each collective fails on its own "
                f"within collective_timeout_s = {self.timeout_s} s): a lane is stuck outside a "
                "collective's timeout (a device kernel that never ends, or a backend without a "
                "timeout). The executor is broken; exit this process and resume from the last "
                "complete checkpoint."
            )
            self.mark_broken(err)
            raise err from None
        except Exception:
            raise
        except BaseException as e:  # KeyboardInterrupt, SystemExit while waiting
            if not fut.done():
                self.mark_broken(e)
            raise
        if done.event is not None:
            cuda = self._cuda
            assert cuda is not None  # events exist only on a device executor
            current = cuda.current_stream(self.device)
            current.wait_event(done.event)
            _record_on(done.value, current)
        return done.value

    def drain(self) -> None:
        """Wait until everything submitted so far has run (errors stay with their futures)."""
        if not self.overlap:
            return
        lanes = list(self._known)  # lane keys: with one lane, the folded ``ONE``
        if not lanes:
            return

        def barrier() -> Job[None]:
            for lane in lanes:
                yield Move(lane)
            return None

        # a slot on each lane but no collective: nothing to record as a hop group's busy time
        self.result(self.submit(barrier(), lanes, hops=[None] * len(lanes)))

    def close(self, timeout: float | None = None) -> list[str]:
        """Stop every lane; wait for all of them together at most ``timeout`` seconds (default
        ``timeout_s + WAIT_SLACK_S``, or 60). Returns the names of lanes still alive then: they
        are inside a collective, so the caller must not destroy the groups ([Note: executor
        failure semantics])."""
        if timeout is None:
            timeout = 60.0 if self.timeout_s is None else self.timeout_s + WAIT_SLACK_S
        with self._lock:
            self._closed = True
            _LIVE.discard(self)
            lanes = dict(self._lanes)
            dispatcher = self._dispatcher
        if dispatcher is not None:
            self._inbox.put(None)
        for q, _, _ in lanes.values():
            q.put(None)
        deadline = time.monotonic() + timeout
        threads = [t for _, t, _ in lanes.values()] + ([dispatcher] if dispatcher is not None else [])
        for t in threads:  # the threads stop side by side: one deadline for all
            t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in threads if t.is_alive()]

    # -- dispatcher and lanes -------------------------------------------------------------------
    def _ensure_dispatcher(self) -> None:
        if self._dispatcher is None:
            with self._lock:
                if self._dispatcher is None:
                    t = threading.Thread(target=self._dispatch, name=f"zeropp_hier-{self.name}-dispatch", daemon=True)
                    self._dispatcher = t
                    t.start()

    def _dispatch(self) -> None:
        """Puts each submitted job's slots on its lanes, in submission order."""
        while True:
            running = self._inbox.get()
            if running is None:
                return
            refusal = self._refusal()
            if refusal is not None:
                self._skip(running, refusal, len(running.lanes))
                continue
            lanes = [self._lane(lane) for lane in running.lanes]
            if any(lane is None for lane in lanes):  # closed meanwhile: no lane takes new work
                self._skip(running, self._refusal(), len(running.lanes))
                continue
            for i, lane in enumerate(lanes):
                lane[0].put((running, i))

    def _skip(self, running: _Running, refusal: BaseException | None, slots: int) -> None:
        with running.cond:
            running.failed = True
            running.cond.notify_all()
        if refusal is not None and not running.fut.done():
            running.fut.set_exception(refusal)
        with self._lock:
            self._slots_done += slots
            self._idle.notify_all()

    def _lane(self, key: Hashable):
        """The lane of ``key``, started on first use; None once the executor is closed."""
        lane = self._lanes.get(key)
        if lane is None:
            with self._lock:
                lane = self._lanes.get(key)
                if lane is None and not self._closed:
                    q: queue.SimpleQueue = queue.SimpleQueue()
                    stream = self._cuda.Stream(device=self.device) if self._cuda is not None else None
                    label = "-".join(key) if isinstance(key, tuple) else str(key)
                    t = threading.Thread(
                        target=self._loop, args=(q, stream), name=f"zeropp_hier-{self.name}-{label}", daemon=True
                    )
                    lane = (q, t, stream)
                    self._lanes[key] = lane
                    t.start()
        return lane

    def _loop(self, q: queue.SimpleQueue, stream: Any) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            running, index = item
            with running.cond:
                while running.turn != index and not running.failed and self._refusal() is None:
                    running.cond.wait(_POLL_S)
            refusal = self._refusal()
            if running.failed or refusal is not None:
                # an earlier collective of this job raised (its future holds the error), or the
                # executor broke or closed: nothing more is issued
                self._skip(running, refusal, 1)
                continue
            with self._lock:
                self._busy += 1
                self.max_lanes_busy = max(self.max_lanes_busy, self._busy)
            try:
                self._step(stream, running, index)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._slots_done += 1
                    self._idle.notify_all()

    def _step(self, stream: Any, running: _Running, index: int) -> None:
        """Run the job from its collective ``index`` (on this lane) to its next Move or its end."""
        cuda = self._cuda
        try:
            with cuda.stream(stream) if cuda is not None else contextlib.nullcontext():
                if cuda is not None and running.event is not None:
                    stream.wait_event(running.event)
                if index == 0:  # its preparation, up to the first collective
                    first = _advance(running.job, running.lanes, 0, self.key)
                    assert isinstance(first, Move)  # a job with lanes ends only after its collectives
                    _record_carry(first, stream)
                # this collective, and what follows up to the next one or the end
                if self.serial and self._previous is not None:
                    waited = time.perf_counter()
                    self._previous.synchronize()  # one lane: only this thread sets it
                    waited = time.perf_counter() - waited
                    with self._lock:
                        self._serial_wait_s += waited
                hop = running.hops[index]
                busy = self.busy_log if hop is not None else None
                begun = busy.start(stream) if busy is not None else None
                nxt = _advance(running.job, running.lanes, index + 1, self.key)
                if busy is not None and begun is not None:  # begun whenever busy
                    busy.stop(begun, hop, stream)
                if self.serial and cuda is not None:
                    self._previous = cuda.Event()
                    self._previous.record(stream)
                if isinstance(nxt, _End):
                    self._end(running, nxt.value, stream)
                    return
                event = None
                if cuda is not None:
                    event = cuda.Event()
                    event.record(stream)
                    nxt_lane = self._lane(self.key(nxt.lane))
                    _record_carry(nxt, nxt_lane[2] if nxt_lane is not None else None)
            with running.cond:
                running.event = event
                running.turn = index + 1
                running.cond.notify_all()
        except BaseException as e:  # noqa: B036 - the waiter re-raises it
            self.mark_broken(e)  # before the job's other lanes wake: they must see it broken
            with running.cond:
                running.failed = True
                running.cond.notify_all()
            if not running.fut.done():
                running.fut.set_exception(e)

    def _end(self, running: _Running, value: Any, stream: Any) -> None:
        event = None
        if self._cuda is not None:
            event = self._cuda.Event()
            event.record(stream)
        running.fut.set_result(Done(value, event))
