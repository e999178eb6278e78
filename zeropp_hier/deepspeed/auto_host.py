"""``auto``'s host probe: the issuing thread's seconds per collective call and per point-to-point
op, and the device's quantize + dequantize rate, measured at initialize on the ranks themselves
([Note: host term] in planner/host.py). Collective: every rank runs the same calls in the same
order, from the training thread, on the default group.

[Note: host probe]
Four short bursts, each on every rank at once, so that ranks sharing cores (or a node's host)
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
   one untimed pass: elements/s, the rate the link term charges (de)quantization at (cost.py);
4. the tick mode's local work per element (``tick_local``): the piece of 2. in one chunk,
   through a transport that fills each receive buffer on the rank itself and sends nothing, at
   two sizes (a block per rank, and a bucket of about ``LOCAL_ELEMS`` elements, twice the small
   one where the world makes that larger): the same ops at both, so the difference in time over
   the difference in elements the hops touch (each gather hop's output, each reduce hop's input,
   counted by the planner's own collectives: ``piece_elements``) is the work per element: the
   rows' slot copies, concatenations and reorder, the encodes, decodes and sums, the values.
   Less the (de)quantization the link term already charges for those elements (at the rate of
   3.), it is the seconds per element a tick hop touches, which the host term charges per step
   in ticks ([Note: host term] in planner/host.py). A library collective does that assembly
   inside its call, where the link probe's measured rates carry it, so one-lane candidates are
   not charged it. Nothing crosses a link, so the links' speed does not enter; the device is
   waited for, since on a GPU this work is kernels.

The world group is the one group every rank has before the runtime's exist; on gloo, whose ring
runs its steps on the calling thread, the figure is taken per ring step (``ring_steps``: the
world less one) and a hop group of ``k`` ranks is charged ``k - 1`` of them; NCCL/RCCL launch a
collective in one call whatever its group. Cost: one warm-up call and ``HOST_REPS``
collectives, one warm-up and ``TICK_REPS`` tick pieces, ``QUANT_REPS`` + 1 quantization
passes, two sizes of one warm-up and ``TICK_REPS`` local pieces; printed and recorded as
``host.seconds`` (docs/benchmarks.md has the emulated cluster's). On a GPU node the same calls
are small launches, not yet measured. Memory: the world all-gather's output and the pieces'
buckets grow with the world; each step frees its tensors before the next (``probe_elements``:
at most 0.15 GB of fp32 per rank at 9,408 nodes x 8 GCDs), all freed before the runtime is
built.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.distributed as dist

from ..core.config import CompressionConfig
from ..core.plan import CommPlan, Hop
from ..core.topology import Topology
from ..detect.links import device_sync, timed
from ..planner.host import HostRates

if TYPE_CHECKING:  # the runtime's tick machinery, imported where the probe runs
    from ..comm.context import CommContext
    from ..comm.stats import CommStats
    from ..comm.tick import TickExecutor, TickTransport

HOST_REPS = 8
TICK_REPS = 2
TICK_CHUNKS = 2
TINY = 64  # elements per rank of the probe's messages: the per-op cost, not the bytes
PROBE_BLOCK = 32  # the tick piece's quantization block: the kernels' smallest (quant/_checks.py)
PIECE_COPIES = 8  # whole-tensor buffers of a piece's bucket alive at once, at most (probe_elements)
# the local piece's larger bucket, whole tensor (about a layer of the emulated cluster's model);
# where the world makes the small one (a block per rank) half of this or more, twice the small one
LOCAL_ELEMS = 1 << 21
QUANT_ELEMS = 1 << 18
# passes timed: one pass of 16 ranks on 2 shared cores read anywhere from 20 to 229 M elements/s
QUANT_REPS = 4


def local_widths(world: int) -> tuple[int, int]:
    """Row widths per rank of the local pieces ([Note: host probe], 4.): the small one's a block
    (one chunk); the large one's ``LOCAL_ELEMS`` over the world in whole small widths, at least
    twice the small one. Pure."""
    small = PROBE_BLOCK
    return small, max(2 * small, small * -(-LOCAL_ELEMS // (world * small)))


def probe_elements(topo: Topology) -> int:
    """Most elements the host probe holds on one rank at once ([Note: host probe]): the largest
    step's, each step freeing its tensors before the next. The world all-gather's input and
    output; the tick pieces' bucket, whose whole tensor is the world's rows (``PIECE_COPIES`` of
    it: the gathered buffer, its decode, the values, the kept copy, the gradients, their packed
    rows and the reduce's output and staging), and the larger local piece's likewise; the
    quantization's input. Grows with the world: at 9,408 nodes x 8 GCDs 4.8 M for the
    all-gather, 38.5 M for each tick piece and the local pieces. Pure."""
    world = topo.world_size
    return max(
        TINY * (1 + world),
        PIECE_COPIES * TICK_CHUNKS * PROBE_BLOCK * world,
        PIECE_COPIES * local_widths(world)[1] * world,
        QUANT_ELEMS,
    )


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
        # a rotation larger than the probe's block shrinks with it ([Note: rotation policy])
        return tuple(h._replace(block_size=PROBE_BLOCK, rotate=min(h.rotate, PROBE_BLOCK)) for h in hops)

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


class _Ticks(NamedTuple):
    ctx: CommContext
    executor: TickExecutor
    transport: TickTransport
    stats: CommStats


def _tick_context(
    topo: Topology, rank: int, device: torch.device, plan: CommPlan, chunks: int, local: bool = False
) -> _Ticks:
    """The runtime's tick machinery over the default group: a ``TickExecutor`` on a
    ``TickTransport`` (``local``: the stand-in, which sends nothing), and a context whose hop
    groups are the plan's, members in coordinate order (the transfers go over the transport's
    group, never over these groups' communicators)."""
    from ..comm.collectives import HierCollectives
    from ..comm.context import CommContext
    from ..comm.groups import HopGroup
    from ..comm.stats import CommStats
    from ..comm.tick import LocalTickTransport, TickExecutor, TickTransport

    world_pg = dist.group.WORLD
    assert world_pg is not None  # initialised: the caller ran collectives on it
    axes = dict.fromkeys(h.axes for h in (*plan.forward, *plan.reduce))
    groups = {a: HopGroup(a, world_pg, topo.peers(rank, a), None, None) for a in axes}
    stats = CommStats(topo, rank)
    transport = (LocalTickTransport if local else TickTransport)(world_pg, rank, topo, stats)
    transport.log = []
    executor = TickExecutor(f"auto-host-probe-{rank}", device, transport)
    ctx = CommContext(topo, rank, plan, HierCollectives(topo, groups, stats), executor, pipeline_chunks=chunks)
    return _Ticks(ctx, executor, transport, stats)


def _piece(t: _Ticks, topo: Topology, rank: int, device: torch.device, width: int, chunks: int):
    """A tick piece: a forward gather of a bucket ``width`` per rank wide (the whole tensor the
    world's rows), ending in ``finish_bucket`` (decode, kept copy, values), and the reduce of its
    gradient, each in ``chunks`` chunks, made by the runtime's jobs and run by ``t``'s executor."""
    from ..comm import gather
    from ..comm.reduce import submit_reduce_scatter
    from ..core import layout

    ctx, executor, plan = t.ctx, t.executor, t.ctx.plan
    hops = gather.hops_for(plan, (), "forward_gather")
    sizes, numels = [width], [width * topo.world_size]
    slots = gather.slots_of(sizes, gather.slot_align(hops), topo.world_size)
    start = gather.primary_buffer([torch.ones(width, device=device)], sizes, numels, slots, rank)
    valid = layout.valid_of(sizes, slots)
    keep = [plan.kept_axes] if plan.kept_axes is not None else None
    ranges = gather.column_ranges(sum(slots), gather.chunk_align(hops), chunks)
    grads = [torch.ones(numels[0], device=device)]
    lanes = [h.axes for h in hops]

    def piece() -> None:
        finish = gather.finish_bucket(ctx, torch.float32, sizes, slots, numels, keep)
        jobs = gather.chunk_jobs(ctx, hops, lambda: start, ranges, "forward_gather", finish, valid=valid)
        executor.result(executor.submit_all(jobs, lanes))
        executor.result(submit_reduce_scatter(ctx, grads, torch.float32))

    return piece


def tick_probe(topo: Topology, rank: int, device: torch.device, host_only: bool, plan: CommPlan) -> TickProbe:
    """Seconds per point-to-point op of the tick mode's own work ([Note: host probe], 2.): a
    forward gather and a gradient reduce of a small bucket, each in ``TICK_CHUNKS`` chunks, made
    by the runtime's jobs (``comm.gather.chunk_jobs`` ending in ``finish_bucket``,
    ``comm.reduce.submit_reduce_scatter``) over ``plan``'s hops and run by a ``TickExecutor`` on a
    ``TickTransport`` over the default group, timed whole over the ops the transport posted."""
    from ..comm import gather

    plan = probe_plan(plan)
    t = _tick_context(topo, rank, device, plan, TICK_CHUNKS)
    width = TICK_CHUNKS * gather.slot_align(plan.forward)  # a chunk per block of the row
    try:
        seconds = _burst(_piece(t, topo, rank, device, width, TICK_CHUNKS), device, TICK_REPS, host_only)
    finally:
        t.executor.close()
    log = t.transport.log or []  # set to a list by _tick_context
    ops = sum((out > 0) + (got > 0) for _, _, moved in log for _, out, got in moved)
    pieces = TICK_REPS + 1  # the log holds the warm-up piece too
    sent = {ph: sum(by.values()) for ph, by in t.stats.snapshot()["bytes"].items()}
    return TickProbe(seconds * pieces / ops if ops else 0.0, ops, pieces, sent)


class TickLocal(NamedTuple):
    """What the local pieces of the host probe did on this rank ([Note: host probe], 4.)."""

    elem_s: float  # seconds per element a tick hop touches, the (de)quantization taken out (>= 0)
    seconds: tuple[float, float]  # one small piece's, one large piece's
    touched: tuple[float, float]  # elements the hops touched in each, as the host term counts them
    quant: tuple[float, float]  # elements each (de)quantized, as the link term counts them
    calls: int  # grouped calls the stand-in took (and sent nothing of)


def piece_elements(topo: Topology, compression: CompressionConfig, width: int) -> tuple[float, float]:
    """Elements a tick piece of rows ``width`` per rank touches (``planner.touched_elems``, the
    host term's count) and (de)quantizes (the link term's count): the planner's own collectives
    for a one-tensor model of the piece's size, forward gather and gradient reduce. Pure."""
    from .. import planner as P
    from ..planner.cost import collectives

    cand = P.Candidate("host probe", False, "frontier", compression)
    _, colls = collectives(cand, topo, float(width * topo.world_size))
    mine = [c for c in colls if c.phase in ("forward_gather", "grad_reduce")]
    touched = sum(P.touched_elems(c, topo.axes_size(c.axes)) for c in mine)
    return touched, sum(c.quant_elems for c in mine)


def tick_local(
    topo: Topology, rank: int, device: torch.device, host_only: bool, compression: CompressionConfig, quant_rate: float
) -> TickLocal:
    """The tick mode's local work per element ([Note: host probe], 4.): the tick piece of
    ``tick_probe`` on the ``frontier`` plan with ``compression``, through a transport that sends
    nothing, at two sizes (``local_widths``) in one chunk; the difference in time, less the
    difference in (de)quantization at ``quant_rate`` (the link term charges that), over the
    difference in elements touched. Every rank runs it at once; nothing crosses a link."""
    from ..core.plan import make_plan

    plan = probe_plan(make_plan("frontier", compression, topo))
    t = _tick_context(topo, rank, device, plan, 1, local=True)
    small, large = local_widths(topo.world_size)
    try:
        s0 = _burst(_piece(t, topo, rank, device, small, 1), device, TICK_REPS, host_only)
        s1 = _burst(_piece(t, topo, rank, device, large, 1), device, TICK_REPS, host_only)
    finally:
        t.executor.close()
    (t0, q0), (t1, q1) = piece_elements(topo, compression, small), piece_elements(topo, compression, large)
    work = s1 - s0 - (q1 - q0) / max(quant_rate, 1e-9)
    calls = t.transport.calls
    return TickLocal(max(0.0, work) / (t1 - t0), (s0, s1), (t0, t1), (q0, q1), calls)


def measure_host(
    device: torch.device, topo: Topology, compression: CompressionConfig, reps: int = HOST_REPS
) -> tuple[HostRates, float, float]:
    """([Note: host probe]) the slowest rank's seconds per collective, per point-to-point op and
    per element a tick hop touches, its quantize + dequantize rate (elements/s), and the probe's
    own seconds; the tick pieces run the ``frontier`` plan with the job's ``compression`` (the
    plan of the candidates that run in ticks). Collective."""
    from ..core.plan import make_plan

    t_start = time.perf_counter()
    rank, world = dist.get_rank(), dist.get_world_size()
    host_only = device.type == "cuda"
    coll_s = p2p_s = elem_s = 0.0
    rate = _quant_rate(device)
    if world > 1:
        x = torch.ones(TINY, device=device)
        y = torch.empty(TINY * world, device=device)
        coll_s = _burst(lambda: dist.all_gather_into_tensor(y, x), device, reps, host_only)
        del x, y
        p2p_s = tick_probe(topo, rank, device, host_only, make_plan("frontier", compression, topo)).op_s
        # timed with the device waited for: the work that grows with the elements is the kernels'
        elem_s = tick_local(topo, rank, device, False, compression, rate).elem_s
    # one all-reduce: the slowest rank's per-op and per-element times, and its quantization rate
    # (as its negative)
    t = torch.tensor([coll_s, p2p_s, elem_s, -rate], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    coll_s, p2p_s, elem_s, rate = float(t[0]), float(t[1]), float(t[2]), -float(t[3])
    took = time.perf_counter() - t_start
    # gloo runs the world's ring on the calling thread: world - 1 steps in the call timed
    steps = world - 1 if dist.get_backend() == "gloo" else 0
    return HostRates(coll_s, p2p_s, f"measured at initialize ({took:.2f} s)", steps, elem_s), rate, took


def declared_host(values: tuple[tuple[str, float], ...]) -> tuple[HostRates, float]:
    """``auto.host`` as declared (core/config.HOST_KEYS): the rates and the quantization rate."""
    v = dict(values)
    rates = HostRates(
        v["collective_us"] * 1e-6,
        v["p2p_op_us"] * 1e-6,
        "declared auto.host",
        tick_elem_s=v.get("tick_ns_per_elem", 0.0) * 1e-9,
    )
    return rates, v["quant_melems_per_s"] * 1e6


__all__ = [
    "HOST_REPS",
    "TickLocal",
    "TickProbe",
    "declared_host",
    "local_widths",
    "measure_host",
    "piece_elements",
    "probe_elements",
    "probe_plan",
    "tick_local",
    "tick_probe",
]
