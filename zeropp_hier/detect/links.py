"""Measure each tier's links with a few all-gathers: what ``zeropp-hier probe`` writes and what
``"preset": "auto"`` decides from. Collective: every rank of the world calls it alike."""

from __future__ import annotations

import functools
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

# [Note: latency from a tiny message]
# A tier's latency (seconds per ring step) is read off an all-gather of ``TINY_BYTES`` per rank,
# timed after the larger sizes have warmed the group's connections up, less its bytes at the
# measured bandwidth; the bandwidth is the slope between the two larger sizes. Both larger
# messages are bandwidth-bound, so the intercept of a line through them is the difference of two
# large, noisy times: on the emulated cluster's shaped node links (0.22 Mbit/s per GCD, messages
# of 16 and 64 KB) it read 0.111 s per step where another run's read 0.018 s, and in ticks, which
# pay a step per tick, the planner's step for ``frontier`` moved by 3.6 s (+18% against +7%).
# Where the two sizes' times do not grow (noise on fast links), the bandwidth is the larger
# size's bytes over its time less its latency, never infinite.
TINY_BYTES = 256


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


def fit_tier(all_gather_s: Mapping[int, float], tiny_s: float, k: int) -> tuple[float, float]:
    """(bytes/s per GCD, seconds per ring step) of a tier of ``k`` ranks from its all-gather
    times by bytes per rank and its ``TINY_BYTES`` all-gather's ([Note: latency from a tiny
    message]). A ring all-gather of k members sends (k - 1) blocks per rank, one per step. Pure."""
    lo, hi = min(all_gather_s), max(all_gather_s)
    slope = (all_gather_s[hi] - all_gather_s[lo]) / ((k - 1) * (hi - lo)) if hi > lo else 0.0
    if slope > 0:
        bw = 1 / slope
        return bw, max(0.0, (tiny_s - (k - 1) * TINY_BYTES / bw) / (k - 1))
    # the sizes' noise hid the slope: the latency is the tiny message's, the bandwidth the
    # larger size's bytes over its time less that
    alpha = tiny_s / (k - 1)
    return (k - 1) * hi / max(all_gather_s[hi] - (k - 1) * alpha, 1e-12), alpha


def measure_tiers(
    groups: Mapping, device: torch.device, sizes: list[int], reps: int, target_s: float | None = None
) -> dict:
    """{tier: {"bandwidth": bytes/s per GCD, "latency": s per ring step, "group_size": k,
    "all_gather_s": {bytes: s}, "tiny_all_gather_s": s}} for every tier with more than one rank
    ([Note: latency from a tiny message]). ``groups``: hop groups
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
        # [Note: latency from a tiny message]
        x = torch.ones(TINY_BYTES // 4, device=device)
        y = torch.empty(k * x.numel(), device=device)
        gather_tiny = functools.partial(dist.all_gather_into_tensor, y, x, group=hg.group)
        tiny = slowest(timed(gather_tiny, sync, reps, 0), device)
        bw, alpha = fit_tier(ag, tiny, k)
        out[tier] = {
            "bandwidth": bw,
            "latency": alpha,
            "group_size": k,
            "all_gather_s": {str(s): t for s, t in ag.items()},
            "tiny_all_gather_s": tiny,
        }
    return out
