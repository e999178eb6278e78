"""One training step's hop collectives laid out in time, in an issue mode. Pure.

[Note: step schedule]
``ranking.predict`` prices each collective alone and bounds the step by its busiest link
([Note: busiest-link bound] in planner/pipeline.py); neither says how far the step's dependencies
keep the links from that bound. This follows the step as the runtime runs it, in one of three
issue modes ([Note: one issuing thread on GPUs] in comm/issue.py; ``MODES``):

* ``"lanes"`` (gloo's default): a FIFO lane per hop group, so the hops of different jobs and of
  one job's chunks run on their links at once;
* ``"one_lane"`` (what NCCL/RCCL run by default): one lane for every hop of every job, so every
  hop collective runs after the previous one has ended, in submission order;
* ``"ticks"``: one lane of *ticks*; a job's chunks advance in ticks (tick ``t`` holds hop 0 of
  chunk ``t``, hop 1 of chunk ``t - 1``, hop 2 of chunk ``t - 2``: [Note: ticks] in
  comm/tick/plan.py), a tick's hops run at once sharing their links, the tick ends with its
  slowest hop, and the next tick (or the next job's first) starts then. Jobs one after another,
  except the gathers one prefetch submits together: they are one stream, their chunks numbered
  in submission order ([Note: one tick stream per call] in comm/tick/executor.py).

In every mode:

* a *job* per layer and pass ([Note: a job per layer] in deepspeed/inflight.py), its hops in
  order; a gradient bucket is a job of the reduce hops; with ``chunks`` > 1 each job is that many
  chunk jobs of ``1/chunks`` of its bytes, each paying every hop's latency;
* the training thread submits them in program order. Forward: before layer k runs it waits for
  layer k's gather, then DeepSpeed's prefetch submits the gathers up to ``window`` layers ahead
  (0: each gather when its layer needs it), and layer k computes. Backward is the same, last
  layer first, from the backward hops, at most ``backward_window`` layers ahead where
  ``pipeline.backward_layers_ahead`` holds the rest back ([Note: backward window] in
  deepspeed/inflight.py), and its first ``held_at_turn`` layers need no gather ([Note: the
  turn] in planner/workload.py); after a layer's backward its gradients join the bucket and a full
  bucket is submitted (the rest at the end);
* each lane takes its work strictly in submission order (a hop, or in the tick mode a tick), and
  a job's hop starts once its previous hop has ended ([Note: one order of hop collectives] rule 1);
* a hop first pays its fixed costs (latency, quantization), then moves its bytes over the
  physical links it crosses, sharing them with every other hop on them at that moment
  ([Note: shared links]);
* the step ends when the last job has ended and the thread has finished, plus ``tail_s``
  (the optimizer step, outside every collective).

The simulation is event by event: the training thread runs until it waits (for a job, or while
a layer computes), lanes start what they can, and time moves to the next hop or compute end,
the hops on links progressing at their shares meanwhile.

What it leaves out, and where that shows: it lays out one rank, every rank alike, so a hop ends
on all ranks at once. In the runtime a rank waits only for its hop's group (a pair across the
nodes, a package's pair, a ring of four packages), and what it sends is on its way before its
peers are ready. So ranks drift apart in the one-lane mode, and a hop of one rank's group runs
beside another group's hop of a different tier; the schedule has no such overlap there. It shows
where the groups are small: ``frontier/one-lane`` in the link-bound GPU-mode run at node 0.33
Mbit/s (its table is in the CHANGELOG) spent 8.1 s per step and rank in node hops while each
node uplink carried 12.6 s of bytes at its rate (wire counters), the rest beside the gpu and gcd
hops, and ran 31.1 s where this schedules 35.3 s (in today's
benchmarks/results/compare_link_bound_gpu_mode.json 48.7 s against 53.4 s). All but one of ``zeropp``'s hops
join a whole node or the world (one ring or all-to-all), which brings its ranks back in step:
there the one lane is 1-10% off, with the probe's per-tier rates (``python -m
benchmarks.compare.planner`` prints each tier's hop seconds beside the measured busy seconds).
How far ranks drift depends on how the links serve flows that arrive apart (TCP, the queues,
the hosts' scheduling), which these inputs do not give.

[Note: shared links]
Two tiers' hops cross one physical link: a package's link out carries the gpu tier's ring and
the node tier's traffic on its way to the uplink. A hop that crosses links ``k`` keeps each
busy ``W_k`` seconds when alone (its bytes on that link over the link's capacity); its slowest
link sets its time alone, ``max_k W_k``. Hops on the links at once share them as TCP flows do:
max-min fair in the throughput of each flow (one flow per rank, ``Hop.rate`` when alone: its
tier's per-GCD rate), found by progressive filling: every unsettled hop's flows speed up
together until a link they cross is full or the hop runs as fast as alone; those hops are
settled, the rest go on. So a node hop, held to a quarter of the package link by its uplink,
leaves the other three quarters to a gpu hop beside it, where an equal split would take half.
No link then carries more than its capacity, so the schedule cannot undercut the busiest link;
``StepSchedule.step_s`` still takes the larger of the two, for hops given without links (each
then has a link of its own, and the schedule is a list schedule of the lanes).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Generator, Hashable, NamedTuple, Sequence

from .clusters import ISSUE_MODES, PHASES, ClusterModel
from .pipeline import phase_jobs
from .ranking import Prediction
from .workload import Workload


class Hop(NamedTuple):
    lane: Hashable  # the hop group (its axes): one lane each
    seconds: float  # the hop's time alone for the whole pass (all layers), latency excluded
    latency: float  # fixed cost of one collective of this hop
    # (link kind, seconds the whole pass keeps one such link busy when alone) for every physical
    # link the hop crosses ([Note: shared links]); () : a link of its own, busy ``seconds``
    links: tuple[tuple[str, float], ...] = ()
    rate: float = 1.0  # one flow's throughput alone (any unit the step's hops share)


MODES = ISSUE_MODES  # [Note: step schedule]
ONE_LANE = "one lane"  # the lane of every hop in the one-lane and tick modes


class StepSchedule(NamedTuple):
    schedule_s: float  # when the last job and the training thread are done, plus the tail
    link_bound_s: float  # the busiest link's time ([Note: busiest-link bound])
    forward_s: float  # when the forward pass ended
    lane_busy_s: dict  # lane -> seconds with work on it (one lane, ``ONE_LANE``, but in "lanes")
    mode: str = "lanes"  # the issue mode it models ([Note: step schedule])

    @property
    def step_s(self) -> float:
        return max(self.schedule_s, self.link_bound_s)


_EPS = 1e-12


class _Task:
    """One hop of one chunk of a job: ``fixed`` seconds, then ``work`` on its links."""

    __slots__ = ("lane", "fixed", "demand", "span", "rate", "after", "job", "start", "left", "done", "share")

    def __init__(self, hop: Hop, share: float, after: _Task | None, job: _Job, lane: Hashable):
        self.lane = lane
        links = dict(hop.links) if hop.links else {("own", hop.lane): hop.seconds}
        self.span = max(links.values(), default=0.0) * share  # seconds on its links alone
        self.demand = {k: (w * share) / self.span for k, w in links.items() if w > 0} if self.span > 0 else {}
        # what is not link time (quantization) and the collective's latency come first
        self.fixed = hop.latency + max(0.0, hop.seconds * share - self.span)
        self.rate = hop.rate
        self.after, self.job = after, job
        self.start = 0.0  # set when its lane starts it
        self.left = 1.0  # part of its link work still to move
        self.share = 0.0  # its speed now, as a part of its speed alone
        self.done = False


class _Job:
    __slots__ = ("tasks", "end")

    def __init__(self):
        self.tasks: list[_Task] = []
        self.end: float | None = None


def _fair_shares(moving: Sequence[_Task]) -> None:
    """[Note: shared links]: each moving task's ``share`` by progressive filling."""
    room: dict = {}
    for t in moving:
        t.share = 0.0
        for k in t.demand:
            room[k] = 1.0
    open_ = list(moving)
    level = 0.0  # every open task's flows run at this throughput
    while open_:
        slope: dict = {}  # link use per unit of throughput, over the open tasks
        for t in open_:
            for k, d in t.demand.items():
                slope[k] = slope.get(k, 0.0) + d / t.rate
        step = min(t.rate for t in open_) - level
        for k, s in slope.items():
            if s > 0:
                step = min(step, room[k] / s)
        level += max(0.0, step)
        for k, s in slope.items():
            room[k] -= step * s
        full = {k for k, r in room.items() if r <= 1e-9}
        still = []
        for t in open_:
            t.share = min(1.0, level / t.rate)
            if t.share < 1.0 - 1e-9 and not full.intersection(t.demand):
                still.append(t)
        open_ = still


class _Lanes:
    """The lanes and the links under them, moved on event by event. A lane runs one *batch* at a
    time, in order: a hop (lanes, one lane) or a tick's hops (ticks), ended with its last hop."""

    def __init__(self, chunks: int, mode: str = "lanes"):
        if mode not in MODES:
            raise ValueError(f"planner.schedule: mode {mode!r}: use one of {list(MODES)}")
        self.chunks, self.mode = chunks, mode
        self.now = 0.0
        self.queues: dict[Hashable, deque[list[_Task]]] = {}
        self.running: dict[Hashable, list[_Task]] = {}  # lane -> its batch's hops not yet done
        self.started: dict[Hashable, float] = {}
        self.busy: dict[Hashable, float] = {}
        # the tick stream that a fused submission may join: (its hops, its ticks, its chunks)
        self._stream: tuple[tuple, list[list[_Task]], int] | None = None

    def close_stream(self) -> None:
        """The thread did something other than a fused submission: the next job starts a stream."""
        self._stream = None

    def submit(self, hops: Sequence[Hop], share: float, fuse: bool = False) -> _Job:
        """A job of ``share`` of each hop's pass, cut into the chunks, queued on its lanes (in
        the tick mode as ``chunks + len(hops) - 1`` ticks on the one lane; with ``fuse``, as the
        next chunks of the tick stream that the submission before opened, if it had these hops
        and was fused too: [Note: one tick stream per call] in comm/tick/executor.py)."""
        job = _Job()
        grid: list[list[_Task]] = []  # [chunk][hop]
        for _ in range(self.chunks):
            prev = None
            row = []
            for h in hops:
                prev = _Task(h, share / self.chunks, prev, job, h.lane if self.mode == "lanes" else ONE_LANE)
                row.append(prev)
            grid.append(row)
            job.tasks += row
        if self.mode == "ticks":
            key = tuple(hops)
            joined = self._stream if fuse and self._stream is not None and self._stream[0] == key else None
            ticks, base = (joined[1], joined[2]) if joined is not None else ([], 0)
            for c, row in enumerate(grid):
                for i, task in enumerate(row):  # hop i of chunk base + c: tick base + c + i
                    while len(ticks) <= base + c + i:  # a new tick, queued after the stream's others
                        ticks.append([])
                        self.queues.setdefault(ONE_LANE, deque()).append(ticks[-1])
                    ticks[base + c + i].append(task)
            self._stream = (key, ticks, base + self.chunks) if fuse and hops else None
        else:
            for task in job.tasks:
                self.queues.setdefault(task.lane, deque()).append([task])
        if not job.tasks:
            job.end = self.now
        return job

    @property
    def idle(self) -> bool:
        return not self.running and not any(self.queues.values())

    def _start_ready(self) -> None:
        for lane, q in self.queues.items():
            if lane not in self.running and q and all(t.after is None or t.after.done for t in q[0]):
                batch = self.running[lane] = q.popleft()
                self.started[lane] = self.now
                for t in batch:
                    t.start = self.now

    def _finish(self, t: _Task) -> None:
        t.done = True
        batch = self.running[t.lane]
        batch.remove(t)
        if not batch:
            del self.running[t.lane]
            self.busy[t.lane] = self.busy.get(t.lane, 0.0) + self.now - self.started[t.lane]
        if all(x.done for x in t.job.tasks):
            t.job.end = self.now

    def step(self, until: float) -> None:
        """Move on to the next event: a task's fixed costs or link work ending, or ``until``."""
        self._start_ready()
        running = [t for batch in self.running.values() for t in batch]
        moving, nxt = [], until
        for t in running:
            if t.start + t.fixed > self.now + _EPS:
                nxt = min(nxt, t.start + t.fixed)
            elif t.span > 0:
                moving.append(t)
            else:
                nxt = self.now
        _fair_shares(moving)
        for t in moving:
            nxt = min(nxt, self.now + t.left * t.span / t.share)
        if nxt == math.inf:
            raise RuntimeError("planner.schedule: the training thread waits on a job that no lane can start")
        for t in moving:
            t.left -= (nxt - self.now) * t.share / t.span
        self.now = max(self.now, nxt)
        for t in running:
            if t.start + t.fixed <= self.now + _EPS and (t.span <= 0 or t.left <= 1e-9):
                self._finish(t)


_Op = tuple  # ("submit", hops, share[, fuse]) -> _Job; ("wait", job); ("compute", seconds); ("forward_end",)


def _run(lanes: _Lanes, thread: Generator[_Op, _Job | None, None]) -> tuple[float, float]:
    """Run the training thread against the lanes until both are done; returns when the thread
    ended and when it marked the end of forward."""
    reply: _Job | None = None
    blocked: _Job | None = None
    wake: float | None = None
    ended: float | None = None
    forward_end = 0.0
    while True:
        while ended is None and blocked is None and wake is None:
            try:
                op = thread.send(reply)
            except StopIteration:
                ended = lanes.now
                break
            reply = None
            fused = op[0] == "submit" and len(op) > 3 and op[3]
            if not fused:  # a stream is the submissions of one call, nothing between them
                lanes.close_stream()
            if op[0] == "submit":
                reply = lanes.submit(op[1], op[2], fused)
            elif op[0] == "wait":
                blocked = op[1] if op[1].end is None else None
            elif op[0] == "compute":
                wake = lanes.now + op[1]
            else:
                forward_end = lanes.now
        if ended is not None and lanes.idle:
            return ended, forward_end
        lanes.step(wake if wake is not None else math.inf)
        if wake is not None and lanes.now >= wake - _EPS:
            wake = None
        if blocked is not None and blocked.end is not None:
            blocked = None


def _pass(
    hops: Sequence[Hop], layers: int, window: int, compute_s: float, held: int = 0, after=None
) -> Generator[_Op, _Job | None, None]:
    """One pass over ``layers`` layers as the training thread runs it. The first ``held`` layers
    are still gathered ([Note: the turn] in planner/workload.py): no job; the others take equal
    shares of ``hops``. ``after(k)``: the thread's ops once layer k has computed."""
    jobs: list[_Job | None] = []
    gathered = layers - held

    def fetch(k: int, fuse: bool = False) -> Generator[_Op, _Job | None, _Job | None]:
        if not hops or k < held:
            return None
        return (yield ("submit", hops, 1.0 / gathered, fuse))

    for k in range(layers):
        if len(jobs) <= k:  # not prefetched: fetched now
            jobs.append((yield from fetch(k)))
        job = jobs[k]
        if job is not None:
            yield ("wait", job)
        while hops and len(jobs) <= min(layers - 1, k + window):  # DeepSpeed's prefetch: one call
            jobs.append((yield from fetch(len(jobs), fuse=True)))
        yield ("compute", compute_s / layers)
        if after is not None:
            yield from after(k)


def simulate(
    forward: Sequence[Hop],
    backward: Sequence[Hop],
    reduce: Sequence[Hop],
    layers: int,
    window: int,
    buckets: int,
    forward_compute_s: float,
    backward_compute_s: float,
    tail_s: float = 0.0,
    chunks: int = 1,
    link_bound_s: float = 0.0,
    backward_window: int | None = None,
    held_at_turn: int = 0,
    mode: str = "lanes",
) -> StepSchedule:
    """[Note: step schedule], in issue mode ``mode`` (``MODES``). ``layers``: jobs per pass;
    ``window``: layers DeepSpeed's prefetch runs ahead; ``buckets``: gradient buckets per step
    (jobs of the ``reduce`` hops); ``backward_window``: at most this many layers ahead in
    backward ([Note: backward window] in deepspeed/inflight.py; None: ``window``);
    ``held_at_turn``: backward's first layers still gathered from forward, which backward does
    not gather ([Note: the turn] in planner/workload.py)."""
    if layers < 1 or buckets < 1 or chunks < 1 or window < 0 or not 0 <= held_at_turn <= layers:
        raise ValueError(
            f"layers={layers}, buckets={buckets}, chunks={chunks}, window={window}, "
            f"held_at_turn={held_at_turn}: out of range"
        )
    per_bucket = layers / buckets
    bwin = window if backward_window is None else min(window, backward_window)

    def step() -> Generator[_Op, _Job | None, None]:
        yield from _pass(forward, layers, window, forward_compute_s)
        yield ("forward_end",)
        submitted, held = 0, 0.0

        def gradients_ready(k: int) -> Generator[_Op, _Job | None, None]:
            nonlocal submitted, held
            held += 1
            while held >= per_bucket - 1e-9 and submitted < buckets:
                yield ("submit", reduce, 1.0 / buckets)
                submitted, held = submitted + 1, held - per_bucket

        yield from _pass(backward, layers, bwin, backward_compute_s, held_at_turn, gradients_ready)
        while submitted < buckets:  # DeepSpeed reduces what is left at the end of backward
            yield ("submit", reduce, 1.0 / buckets)
            submitted += 1

    lanes = _Lanes(chunks, mode)
    thread_end, forward_end = _run(lanes, step())
    return StepSchedule(max(thread_end, lanes.now) + tail_s, link_bound_s, forward_end, dict(lanes.busy), mode)


def for_prediction(
    pred: Prediction,
    wl: Workload,
    window: int,
    compute_s: float,
    link_bound_s: float | None = None,
    forward_share: float = 1 / 3,
    backward_window: int | None = None,
    shared_links: bool = True,
    mode: str = "lanes",
    cluster: ClusterModel | None = None,
) -> StepSchedule:
    """The schedule of a planner prediction's collectives ([Note: step schedule]): a job per
    layer (``wl.layers``), ``ceil(params / reduce_bucket)`` gradient buckets, the prediction's
    chunks; compute split ``forward_share`` : rest between the passes (a backward pass costs
    about twice a forward); backward's first layers held from forward as ``wl.kept_at_turn``
    says. ``link_bound_s``: the busiest link at its physical capacity (default: the prediction's
    own). ``shared_links``: hops share the physical links they cross ([Note: shared links]);
    False gives each lane links of its own. ``mode``: the issue mode laid out (``MODES``);
    ``cluster``: in ticks, each hop as its sub-hops on it ([Note: tick latency] in pipeline.py)."""
    buckets = max(1, math.ceil(wl.params / wl.reduce_bucket))
    layers = max(1, wl.layers)
    # whole layers held at the turn; the bytes of the rest are in the backward hops already
    held = min(layers, round(wl.kept_at_turn / (wl.params / layers))) if wl.params > 0 else 0
    hops: dict[str, list[Hop]] = {ph: [] for ph in PHASES}
    # per job; the schedule takes a pass's time per hop
    for job in phase_jobs(pred.costs, wl, cluster if mode == "ticks" else None):
        hops[job.phase] = [
            Hop(
                lane,
                # the framing of every call's messages in each chunk: time off the shared links'
                # fair shares, paid per chunk ([Note: per-message framing] in clusters.py)
                (t + f * pred.chunks) * job.calls,
                a,
                tuple((k, sec * job.calls) for k, sec in links) if shared_links else (),
                rate if shared_links else 1.0,
            )
            for lane, t, a, f, links, rate in zip(
                job.lanes,
                job.hop_s,
                # in ticks a hop pays one exchange step ([Note: tick latency] in pipeline.py)
                job.tick_latency_s if mode == "ticks" and job.tick_latency_s else job.latency_s,
                job.frame_s or (0.0,) * len(job.hop_s),
                job.links,
                job.rates,
            )
        ]
    return simulate(
        hops["forward_gather"],
        hops["backward_gather"],
        hops["grad_reduce"],
        layers,
        window,
        buckets,
        compute_s * forward_share,
        compute_s * (1 - forward_share),
        chunks=pred.chunks,
        link_bound_s=pred.link_bound_s if link_bound_s is None else link_bound_s,
        backward_window=backward_window,
        held_at_turn=held,
        mode=mode,
    )
