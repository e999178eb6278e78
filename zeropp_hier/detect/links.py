"""Measure each tier's links with a few all-gathers: what ``zeropp-hier probe`` writes and what
``"preset": "auto"`` decides from. Collective: every rank of the world calls it alike."""

from __future__ import annotations

import math
import time
from typing import Mapping

import torch
import torch.distributed as dist

from ..core.topology import TIERS


def measure_tiers(groups: Mapping, device: torch.device, sizes: list[int], reps: int) -> dict:
    """{tier: {"bandwidth": bytes/s per GCD, "latency": s per ring step, "group_size": k,
    "all_gather_s": {bytes: s}}} for every tier with more than one rank. ``groups``: hop groups
    keyed by (tier,) (comm.groups.build_hop_groups); ``sizes``: two or more message sizes in
    bytes; the time of a collective is the slowest rank's (one all-reduce per size)."""

    def timed(fn) -> float:
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
        ag = {}
        for nbytes in sizes:
            x = torch.ones(nbytes // 4, device=device)
            y = torch.empty(k * x.numel(), device=device)
            ag[nbytes] = timed(lambda x=x, y=y: dist.all_gather_into_tensor(y, x, group=hg.group))
        lo, hi = sizes[0], sizes[-1]
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
