"""Measure each tier's links with a few all-gathers: what ``zeropp-hier probe`` writes and what
``"preset": "auto"`` decides from. Collective: every rank of the world calls it alike."""

from __future__ import annotations

import functools
import math
import time
from typing import Callable, Mapping

import torch
import torch.distributed as dist

from ..core.vocab import TIERS

# [Note: timing a collective]
# NCCL and RCCL return to the host as soon as a collective is queued on a stream; a host clock
# read around the call times the launch, not the transfer, and makes every link look infinitely
# fast. So the device is synchronised before the clock starts (nothing queued earlier counts)
# and after every timed call (the call's completion counts). On the CPU (gloo) a collective is
# complete when it returns and the synchronisation is nothing. ``timed`` takes the
# synchronisation as a step of its own, so a test can hand it a collective whose completion is
# only visible through that step.
WARMUP = 1  # untimed calls first: connections, buffers, kernel selection


def device_sync(device: torch.device) -> Callable[[], None]:
    """Wait until ``device`` has finished everything queued on it (CUDA and HIP builds alike)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def timed(fn: Callable[[], object], sync: Callable[[], None], reps: int, warmup: int = WARMUP) -> float:
    """Seconds per call of ``fn`` from a synchronised start to each call's completion as ``sync``
    observes it ([Note: timing a collective]); ``warmup`` untimed calls first."""
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
        sync()
    return (time.perf_counter() - t0) / reps


def slowest(seconds: float, device: torch.device) -> float:
    """The slowest rank's time (collective on the default group)."""
    t = torch.tensor([seconds], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def measure_tiers(
    groups: Mapping, device: torch.device, sizes: list[int], reps: int, target_s: float | None = None
) -> dict:
    """{tier: {"bandwidth": bytes/s per GCD, "latency": s per ring step, "group_size": k,
    "all_gather_s": {bytes: s}}} for every tier with more than one rank. ``groups``: hop groups
    keyed by (tier,) (comm.groups.build_hop_groups); ``sizes``: two or more message sizes in
    bytes; the time of a collective is the slowest rank's (one all-reduce per size), from a
    synchronised start to its completion on the device ([Note: timing a collective]).

    ``target_s``: the larger sizes of a tier are cut so that one all-gather is expected to take
    about that long, judged from the smallest size's rate (a lower bound on the link's rate, so
    the cut is never too deep), and never below 4x the smallest size. On real links nothing is
    cut; on a slow link the probe stays short. Every rank cuts alike (the times are agreed)."""

    sync = device_sync(device)
    out = {}
    for tier in TIERS:
        hg = groups.get((tier,))
        if hg is None:
            continue  # a tier of one rank has no link to measure
        k = len(hg.peers)
        ag: dict = {}
        for i, nbytes in enumerate(sizes):
            if i > 0 and target_s is not None:
                floor_rate = (k - 1) * sizes[0] / ag[sizes[0]]  # bytes/s, latency included
                cut = int(floor_rate * target_s / (k - 1)) // 4096 * 4096
                nbytes = min(nbytes, max(4 * sizes[0], cut))
                if nbytes in ag:
                    continue
            x = torch.ones(nbytes // 4, device=device)
            y = torch.empty(k * x.numel(), device=device)
            # the first size warms the group's connections up; later sizes need no warm-up
            ag[nbytes] = slowest(
                timed(functools.partial(dist.all_gather_into_tensor, y, x, group=hg.group), sync, reps, int(i == 0)),
                device,
            )
        lo, hi = min(ag), max(ag)
        # a ring all-gather of k members sends (k-1) blocks per rank, one per step
        slope = (ag[hi] - ag[lo]) / ((k - 1) * (hi - lo))
        bw = 1 / slope if slope > 0 else float("inf")
        alpha = max(0.0, (ag[lo] - (k - 1) * lo / bw) / (k - 1)) if math.isfinite(bw) else ag[lo]
        out[tier] = {
            "bandwidth": bw,
            "latency": alpha,
            "group_size": k,
            "all_gather_s": {str(s): t for s, t in ag.items()},
        }
    return out
