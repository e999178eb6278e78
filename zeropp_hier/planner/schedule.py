"""One training step's hop collectives laid out on the executor's lanes, in time. Pure.

[Note: step schedule]
``model.predict`` prices each collective alone and bounds the step by its busiest link
([Note: busiest-link bound] in planner/model.py); neither says how far the step's dependencies
keep the links from that bound. This follows the step as the runtime runs it on lanes (gloo):

* a *job* per layer and pass ([Note: a job per layer] in deepspeed/inflight.py), its hops in
  order; a gradient bucket is a job of the reduce hops; with ``chunks`` > 1 each job is that many
  chunk jobs of ``1/chunks`` of its bytes, each paying every hop's latency;
* the training thread submits them in program order. Forward: before layer k runs it waits for
  layer k's gather, then DeepSpeed's prefetch submits the gathers up to ``window`` layers ahead
  (0: each gather when its layer needs it), and layer k computes. Backward is the same, last
  layer first, from the backward hops, at most ``backward_window`` layers ahead where
  ``pipeline.backward_layers_ahead`` holds the rest back ([Note: backward window] in
  deepspeed/inflight.py); after a layer's backward its gradients join the bucket
  and a full bucket is submitted (the rest at the end);
* each lane takes its collectives strictly in submission order, and a job's hop starts once its
  previous hop has ended ([Note: one order of hop collectives] rule 1). So the start of every
  collective follows from the collectives submitted before it, in one pass in submission order;
* the step ends when the last job has ended and the thread has finished, plus ``tail_s``
  (the optimizer step, outside every collective).

Each hop takes its tier's time from the cost model (its bytes over its own link, quantization,
latency). Two tiers' hops that cross one physical link at once (a package's link carries the
gpu tier and the node tier) are not slowed by each other here, so the schedule can undercut the
busiest link: the step is the larger of the two (``StepSchedule.step_s``).
"""

from __future__ import annotations

import math
from typing import Callable, Hashable, NamedTuple, Sequence

from . import model


class Hop(NamedTuple):
    lane: Hashable  # the hop group (its axes): one lane each
    seconds: float  # the hop's time for the whole pass (all layers), latency excluded
    latency: float  # fixed cost of one collective of this hop


class StepSchedule(NamedTuple):
    schedule_s: float  # when the last job and the training thread are done, plus the tail
    link_bound_s: float  # the busiest link's time ([Note: busiest-link bound])
    forward_s: float  # when the forward pass ended
    lane_busy_s: dict  # lane -> seconds with a collective on it

    @property
    def step_s(self) -> float:
        return max(self.schedule_s, self.link_bound_s)


class _Lanes:
    def __init__(self, chunks: int):
        self.free: dict[Hashable, float] = {}
        self.busy: dict[Hashable, float] = {}
        self.chunks = chunks

    def submit(self, hops: Sequence[Hop], share: float, at: float) -> float:
        """A job of ``share`` of each hop's pass, submitted at ``at``; returns when it ends."""
        end = at
        for _ in range(self.chunks):
            prev = at
            for h in hops:
                start = max(self.free.get(h.lane, 0.0), prev)
                took = h.seconds * share / self.chunks + h.latency
                prev = self.free[h.lane] = start + took
                self.busy[h.lane] = self.busy.get(h.lane, 0.0) + took
            end = prev  # chunks end in order on the last hop's lane
        return end


def _pass(
    lanes: _Lanes,
    hops: Sequence[Hop],
    layers: int,
    window: int,
    compute_s: float,
    t: float,
    after: Callable[[int, float], None] | None = None,
) -> float:
    """One pass over ``layers`` layers; ``after(k, t)`` runs once layer k has computed."""
    ends: list[float] = []
    per_layer = compute_s / layers
    for k in range(layers):
        if len(ends) <= k:  # not prefetched: fetched now
            ends.append(lanes.submit(hops, 1.0 / layers, t) if hops else t)
        t = max(t, ends[k])
        while hops and len(ends) <= min(layers - 1, k + window):  # DeepSpeed's prefetch
            ends.append(lanes.submit(hops, 1.0 / layers, t))
        t += per_layer
        if after is not None:
            after(k, t)
    return t


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
) -> StepSchedule:
    """[Note: step schedule]. ``layers``: jobs per pass; ``window``: layers DeepSpeed's prefetch
    runs ahead; ``buckets``: gradient buckets per step (jobs of the ``reduce`` hops);
    ``backward_window``: at most this many layers ahead in backward ([Note: backward window] in
    deepspeed/inflight.py; None: ``window``)."""
    if layers < 1 or buckets < 1 or chunks < 1 or window < 0:
        raise ValueError(f"layers={layers}, buckets={buckets}, chunks={chunks}, window={window}: out of range")
    lanes = _Lanes(chunks)
    t = _pass(lanes, forward, layers, window, forward_compute_s, 0.0)
    forward_end = t
    reduce_ends: list[float] = []
    held = {"layers": 0.0}
    per_bucket = layers / buckets

    def gradients_ready(k: int, at: float) -> None:
        held["layers"] += 1
        while held["layers"] >= per_bucket - 1e-9 and len(reduce_ends) < buckets:
            reduce_ends.append(lanes.submit(reduce, 1.0 / buckets, at))
            held["layers"] -= per_bucket

    bwin = window if backward_window is None else min(window, backward_window)
    t = _pass(lanes, backward, layers, bwin, backward_compute_s, t, gradients_ready)
    while len(reduce_ends) < buckets:  # DeepSpeed reduces what is left at the end of backward
        reduce_ends.append(lanes.submit(reduce, 1.0 / buckets, t))
    end = max([t, *reduce_ends, *lanes.free.values()]) + tail_s
    return StepSchedule(end, link_bound_s, forward_end, dict(lanes.busy))


def for_prediction(
    pred: model.Prediction,
    wl: model.Workload,
    window: int,
    compute_s: float,
    link_bound_s: float | None = None,
    forward_share: float = 1 / 3,
    backward_window: int | None = None,
) -> StepSchedule:
    """The schedule of a planner prediction's collectives ([Note: step schedule]): a job per
    layer (``wl.layers``), ``ceil(params / reduce_bucket)`` gradient buckets, the prediction's
    chunks; compute split ``forward_share`` : rest between the passes (a backward pass costs
    about twice a forward). ``link_bound_s``: the busiest link at its physical capacity (default:
    the prediction's own)."""
    buckets = max(1, math.ceil(wl.params / wl.reduce_bucket))
    hops: dict[str, list[Hop]] = {ph: [] for ph in model.PHASES}
    for job in model.phase_jobs(pred.costs, wl):  # per job; the schedule takes a pass's time per hop
        hops[job.phase] = [Hop(lane, t * job.calls, a) for lane, t, a in zip(job.lanes, job.hop_s, job.latency_s)]
    return simulate(
        hops["forward_gather"],
        hops["backward_gather"],
        hops["grad_reduce"],
        max(1, wl.layers),
        window,
        buckets,
        compute_s * forward_share,
        compute_s * (1 - forward_share),
        chunks=pred.chunks,
        link_bound_s=pred.link_bound_s if link_bound_s is None else link_bound_s,
        backward_window=backward_window,
    )
