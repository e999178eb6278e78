"""Rank 0's host work per step in the gathers and the gradient reduce at any world size, in one
process.

    python -m benchmarks.cpu.flat_reduce --nodes 48 [--preset frontier] [--steps 3]

The world is N nodes x 4 packages x 2 GCDs on PyTorch's ``fake`` process-group backend (no
peer exists; every collective returns at once without data), so what is timed is this rank's
own bookkeeping: the forward gather of each layer's parameters (``comm.gather.gather_bucket``
from the primary partitions, no kept copies), packing the gradient rows, the stages' layouts
and (de)quantization, the byte counters and the per-step non-finite agreement
(``Numerics.agree``). The model is a GPT of about 3M parameters (fixed: it does not grow with
the world); its gradients are reduced as one bucket per step through
``comm.reduce.submit_reduce_scatter``, as ``deepspeed/stage3.py`` hands them in. Not covered:
DeepSpeed's own work, backward gathers, start-up (building the groups is timed apart). Prints
one JSON line: seconds per step (host, rank 0, one intra-op thread; wall and process CPU time,
the minimum over steps after the first) and the peak RSS of the process.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from zeropp_hier.comm import gather, reduce
from zeropp_hier.comm.collectives import HierCollectives
from zeropp_hier.comm.context import CommContext
from zeropp_hier.comm.executor import CommExecutor
from zeropp_hier.comm.groups import build_hop_groups
from zeropp_hier.comm.numerics import Numerics
from zeropp_hier.comm.stats import CommStats
from zeropp_hier.core import layout
from zeropp_hier.core.config import parse_section
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.topology import Topology


def gpt_shapes(vocab: int = 2048, d: int = 256, layers: int = 3, ctx: int = 256) -> list[tuple[int, ...]]:
    """Parameter shapes of a small GPT (about 3M parameters), in module order."""
    shapes: list[tuple[int, ...]] = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    return shapes + [(d,), (d,)]


def layers_of(shapes: list[tuple[int, ...]]) -> list[list[int]]:
    """Indices of the parameters gathered together: the embeddings, each block's 12, the last norm."""
    return [[0, 1], *[list(range(2 + 12 * i, 14 + 12 * i)) for i in range((len(shapes) - 4) // 12)], [38, 39]]


def slots_for(sizes: list[int], align: int, world: int) -> list[int]:
    try:  # bounded by the world since issue 59
        return gather.slots_of(sizes, align, world)  # type: ignore[call-arg]
    except TypeError:  # the code before it
        return gather.slots_of(sizes, align)  # type: ignore[call-arg]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=48)
    ap.add_argument("--preset", default="frontier")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)  # one core's work, comparable on a shared machine
    topo = Topology(a.nodes, 4, 2)
    rank = 0
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=topo.world_size)
    cfg = parse_section({"enabled": True, "preset": a.preset, "topology": {"gpus_per_node": 4}})
    plan = make_plan(a.preset, cfg.compression, topo)
    t0 = time.perf_counter()
    hops = gather.hops_for(plan, (), "forward_gather")
    groups = build_hop_groups(topo, [h.axes for h in (*hops, *plan.reduce)], rank)
    groups_s = time.perf_counter() - t0
    stats = CommStats(topo, rank)
    executor = CommExecutor("rank0", torch.device("cpu"), overlap=False)
    numerics = Numerics(cfg.numerics, plan, topo, rank)
    ctx = CommContext(topo, rank, plan, HierCollectives(topo, groups, stats), executor, hooks=numerics)
    gen = torch.Generator().manual_seed(0)
    shapes = gpt_shapes()
    grads = [torch.randn(s, generator=gen) for s in shapes]
    world = topo.world_size
    align = gather.slot_align(plan.forward)
    buckets = []
    for idx in layers_of(shapes):
        numels = [grads[i].numel() for i in idx]
        sizes = [-(-n // world) for n in numels]
        parts = [torch.randn(n, generator=gen) for n in sizes]
        buckets.append((numels, sizes, parts, slots_for(sizes, align, world)))
    lanes = [h.axes for h in hops]
    times, cpu = [], []
    for _ in range(a.steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        for numels, sizes, parts, slots in buckets:
            start = gather.primary_buffer(parts, sizes, numels, slots, rank)
            finish = gather.finish_bucket(ctx, torch.float32, sizes, slots, numels, None)
            valid = layout.valid_of(sizes, slots)
            job = gather.gather_bucket(ctx, hops, start, "forward_gather", finish, valid=valid)
            executor.result(executor.submit(job, lanes))
        executor.result(reduce.submit_reduce_scatter(ctx, grads, torch.float32, key=("bucket0",)))
        numerics.agree()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    executor.close()
    print(
        json.dumps(
            {
                "nodes": a.nodes,
                "world": topo.world_size,
                "preset": a.preset,
                "params": sum(g.numel() for g in grads),
                "tensors": len(grads),
                "groups_s": round(groups_s, 2),
                "first_step_s": round(times[0], 4),
                "step_s": round(min(times[1:]), 4),
                "step_cpu_s": round(min(cpu[1:]), 4),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
