"""Measure each tier's links with a few all-gathers: what ``zeropp-hier probe`` writes and what
``"preset": "auto"`` decides from. Collective: every rank of the world calls it alike."""

from __future__ import annotations

import math
import time
from typing import Mapping

import torch
import torch.distributed as dist

from ..core.topology import TIERS


def measure_tiers(
    groups: Mapping, device: torch.device, sizes: list[int], reps: int, target_s: float | None = None
) -> dict:
    """{tier: {"bandwidth": bytes/s per GCD, "latency": s per ring step, "group_size": k,
    "all_gather_s": {bytes: s}}} for every tier with more than one rank. ``groups``: hop groups
    keyed by (tier,) (comm.groups.build_hop_groups); ``sizes``: two or more message sizes in
    bytes; the time of a collective is the slowest rank's (one all-reduce per size).

    ``target_s``: the larger sizes of a tier are cut so that one all-gather is expected to take
    about that long, judged from the smallest size's rate (a lower bound on the link's rate, so
    the cut is never too deep), and never below 4x the smallest size. On real links nothing is
    cut; on a slow link the probe stays short. Every rank cuts alike (the times are agreed)."""

    def timed(fn, warm: bool = True) -> float:
        if warm:
            fn()  # warm-up (connections, buffers)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        t = torch.tensor([(time.perf_counter() - t0) / reps], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

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
            ag[nbytes] = timed(lambda x=x, y=y: dist.all_gather_into_tensor(y, x, group=hg.group), warm=i == 0)
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
