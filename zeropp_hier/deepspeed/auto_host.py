"""``auto``'s host probe: the issuing thread's seconds per collective call and per point-to-point
op, and the device's quantize + dequantize rate, measured at initialize on the ranks themselves
([Note: host term] in planner/host.py). Collective: every rank runs the same calls in the same
order, from the training thread, on the default group.

[Note: host probe]
Three short bursts, each on every rank at once, so that ranks sharing cores (or a node's host)
see each other as they will in the step; each figure is the slowest rank's (one all-reduce), so
every rank ranks alike:

1. ``HOST_REPS`` tiny all-gathers on the default group: seconds per collective call, as the one
   lane issues them (on gloo the call also moves the bytes: the host's whole cost; on
   NCCL/RCCL the host only enqueues, so the burst is timed without waiting for the device);
2. ``TICK_REPS`` pieces of the tick mode's own work: a forward gather and a gradient reduce of a
   small bucket, each in ``TICK_CHUNKS`` chunks, made by the runtime's jobs over the hops of the
   ``frontier`` plan with the job's compression (the plan of the candidates that run in ticks)
   and run by the tick executor and transport on the default group: seconds per point-to-point
   op as a tick posts them, with the local work each chunk does beside them (encode, decode,
   the copies of its rows, the kept copies, the driver's Python per tick), the whole pieces'
   time over their ops. The quantization block is cut to the kernels' smallest
   (``probe_plan``), so the bucket is a few blocks per rank at any world size; the block
   changes the bytes, not the calls;
3. quantize + dequantize of ``QUANT_ELEMS`` elements on the device, ``QUANT_REPS`` passes after
   one untimed pass: elements/s, the rate the link term charges (de)quantization at (cost.py).

The world group is the one group every rank has before the runtime's exist; on gloo, whose ring
runs its steps on the calling thread, the figure is taken per ring step (``ring_steps``: the
world less one) and a hop group of ``k`` ranks is charged ``k - 1`` of them; NCCL/RCCL launch a
collective in one call whatever its group. Cost: one warm-up call and ``HOST_REPS``
collectives, one warm-up and ``TICK_REPS`` tick pieces, ``QUANT_REPS`` + 1 quantization
passes; printed and recorded as ``host.seconds`` (docs/benchmarks.md has the emulated
cluster's). On a GPU node the same calls are small launches, not yet measured. Memory: the
world all-gather's output and the pieces' bucket both grow with the world (``probe_elements``:
at most 0.17 GB of fp32 per rank at 9,408 nodes x 8 GCDs), all freed before the runtime is
built.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch
import torch.distributed as dist

from ..core.plan import CommPlan, Hop
from ..core.topology import Topology
from ..detect.links import device_sync, timed
from ..planner.host import HostRates

HOST_REPS = 8
TICK_REPS = 2
TICK_CHUNKS = 2
TINY = 64  # elements per rank of the probe's messages: the per-op cost, not the bytes
PROBE_BLOCK = 32  # the tick piece's quantization block: the kernels' smallest (quant/_checks.py)
PIECE_COPIES = 8  # whole-tensor buffers of a piece's bucket alive at once, at most (probe_elements)
QUANT_ELEMS = 1 << 18
# passes timed: one pass of 16 ranks on 2 shared cores read anywhere from 20 to 229 M elements/s
QUANT_REPS = 4


def probe_elements(topo: Topology) -> int:
    """Most elements the host probe holds on one rank ([Note: host probe]), counted as if all
    were alive at once: the world all-gather's input and output; the tick pieces' bucket, whose
    whole tensor is the world's rows (``PIECE_COPIES`` of it: the gathered buffer, its decode,
    the values, the kept copy, the gradients, their packed rows and the reduce's output and
    staging); the quantization's input. Grows with the world: 38.5 M of the pieces' and 4.8 M of
    the all-gather's at 9,408 nodes x 8 GCDs. Pure."""
    world = topo.world_size
    return TINY * (1 + world) + PIECE_COPIES * TICK_CHUNKS * PROBE_BLOCK * world + QUANT_ELEMS


def _burst(fn, device: torch.device, reps: int, host_only: bool) -> float:
    """Seconds per call of ``fn`` over ``reps`` calls after one warm-up, from a barrier; with
    ``host_only`` the device is not waited for inside the burst (the host's enqueue time)."""
    sync = device_sync(device)
    fn()
    sync()
    dist.barrier()
    seconds = timed(fn, (lambda: None) if host_only else sync, reps, warmup=0)
    sync()
    return seconds


def _quant_rate(device: torch.device) -> float:
    from .. import quant

    x = torch.randn(QUANT_ELEMS, device=device)
    seconds = timed(
        lambda: quant.dequantize(quant.quantize(x, 8, 256), torch.float32), device_sync(device), QUANT_REPS
    )
    return QUANT_ELEMS / max(seconds, 1e-9)


def probe_plan(plan: CommPlan) -> CommPlan:
    """``plan`` with every hop's quantization block cut to ``PROBE_BLOCK`` (the smallest the
    kernels take), so that the tick piece's bucket stays small at any world size ([Note: host
    probe], 2.): what the piece measures is the fixed work of each chunk and hop, which the
    block size does not change; the per-byte work is the link term's, at the measured rate."""

    def cut(hops: tuple[Hop, ...]) -> tuple[Hop, ...]:
        return tuple(h._replace(block_size=PROBE_BLOCK) for h in hops)

    return plan._replace(
        forward=cut(plan.forward),
        backward=cut(plan.backward),
        reduce=cut(plan.reduce),
        block_size=PROBE_BLOCK,
        by_level=tuple((axes, cut(hops)) for axes, hops in plan.by_level),
    )


class TickProbe(NamedTuple):
    """What the tick pieces of the host probe did on this rank ([Note: host probe], 2.)."""

    op_s: float  # seconds per point-to-point op, the pieces' whole time over their ops
    ops: int  # point-to-point ops posted, the warm-up piece's included
    pieces: int  # pieces run, each a forward gather and a gradient reduce
    phase_bytes: dict[str, int]  # bytes the pieces' jobs sent, by phase (the stats' count)


def tick_probe(topo: Topology, rank: int, device: torch.device, host_only: bool, plan: CommPlan) -> TickProbe:
    """Seconds per point-to-point op of the tick mode's own work ([Note: host probe], 2.): a
    forward gather and a gradient reduce of a small bucket, each in ``TICK_CHUNKS`` chunks, made
    by the runtime's jobs (``comm.gather.chunk_jobs`` ending in ``finish_bucket``,
    ``comm.reduce.submit_reduce_scatter``) over ``plan``'s hops and run by a ``TickExecutor`` on a
    ``TickTransport`` over the default group, timed whole over the ops the transport posted."""
    from ..comm import gather
    from ..comm.collectives import HierCollectives
    from ..comm.context import CommContext
    from ..comm.groups import HopGroup
    from ..comm.reduce import submit_reduce_scatter
    from ..comm.stats import CommStats
    from ..comm.ticks import TickExecutor, TickTransport
    from ..core import layout

    world_pg = dist.group.WORLD
    assert world_pg is not None  # initialised: the caller ran collectives on it
    plan = probe_plan(plan)
    hops = gather.hops_for(plan, (), "forward_gather")
    axes = dict.fromkeys(h.axes for h in (*hops, *plan.reduce))
    # the hops' groups as the ticks use them: the members in coordinate order; the transfers go
    # over the transport's group (the default one here), never over these groups' communicators
    groups = {a: HopGroup(a, world_pg, topo.peers(rank, a), None, None) for a in axes}
    stats = CommStats(topo, rank)
    transport = TickTransport(world_pg, rank, topo, stats)
    transport.log = []
    executor = TickExecutor(f"auto-host-probe-{rank}", device, transport)
    ctx = CommContext(topo, rank, plan, HierCollectives(topo, groups, stats), executor, pipeline_chunks=TICK_CHUNKS)
    world = topo.world_size
    width = TICK_CHUNKS * gather.slot_align(hops)  # a chunk per block of the row
    sizes, numels = [width], [width * world]
    slots = gather.slots_of(sizes, gather.slot_align(hops))
    start = gather.primary_buffer([torch.ones(width, device=device)], sizes, numels, slots, rank)
    valid = layout.valid_of(sizes, slots)
    keep = [plan.kept_axes] if plan.kept_axes is not None else None
    ranges = gather.column_ranges(sum(slots), gather.chunk_align(hops), TICK_CHUNKS)
    grads = [torch.ones(numels[0], device=device)]
    lanes = [h.axes for h in hops]

    def piece() -> None:
        finish = gather.finish_bucket(ctx, torch.float32, sizes, slots, numels, keep)
        jobs = gather.chunk_jobs(ctx, hops, lambda: start, ranges, "forward_gather", finish, valid=valid)
        executor.result(executor.submit_all(jobs, lanes))
        executor.result(submit_reduce_scatter(ctx, grads, torch.float32))

    try:
        seconds = _burst(piece, device, TICK_REPS, host_only)
    finally:
        executor.close()
    ops = sum((out > 0) + (got > 0) for _, _, moved in transport.log for _, out, got in moved)
    pieces = TICK_REPS + 1  # the log holds the warm-up piece too
    sent = {ph: sum(by.values()) for ph, by in stats.snapshot()["bytes"].items()}
    return TickProbe(seconds * pieces / ops if ops else 0.0, ops, pieces, sent)


def measure_host(
    device: torch.device, topo: Topology, plan: CommPlan, reps: int = HOST_REPS
) -> tuple[HostRates, float, float]:
    """([Note: host probe]) the slowest rank's seconds per collective and per point-to-point op,
    the slowest rank's quantize + dequantize rate (elements/s), and the probe's own seconds.
    Collective."""
    t_start = time.perf_counter()
    rank, world = dist.get_rank(), dist.get_world_size()
    host_only = device.type == "cuda"
    coll_s = p2p_s = 0.0
    if world > 1:
        x = torch.ones(TINY, device=device)
        y = torch.empty(TINY * world, device=device)
        coll_s = _burst(lambda: dist.all_gather_into_tensor(y, x), device, reps, host_only)
        p2p_s = tick_probe(topo, rank, device, host_only, plan).op_s
    rate = _quant_rate(device)
    # one all-reduce: the slowest rank's per-op times, and its quantization rate (as its negative)
    t = torch.tensor([coll_s, p2p_s, -rate], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    coll_s, p2p_s, rate = float(t[0]), float(t[1]), -float(t[2])
    took = time.perf_counter() - t_start
    # gloo runs the world's ring on the calling thread: world - 1 steps in the call timed
    steps = world - 1 if dist.get_backend() == "gloo" else 0
    return HostRates(coll_s, p2p_s, f"measured at initialize ({took:.2f} s)", steps), rate, took


def declared_host(values: tuple[tuple[str, float], ...]) -> tuple[HostRates, float]:
    """``auto.host`` as declared (core/config.HOST_KEYS): the rates and the quantization rate."""
    v = dict(values)
    return HostRates(v["collective_us"] * 1e-6, v["p2p_op_us"] * 1e-6, "declared auto.host"), v[
        "quant_melems_per_s"
    ] * 1e6


__all__ = ["HOST_REPS", "TickProbe", "declared_host", "measure_host", "probe_elements", "probe_plan", "tick_probe"]
