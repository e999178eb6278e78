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
2. ``TICK_REPS`` tick streams of ``TICK_CHUNKS`` chunks of tiny gathers, one hop per tier of
   more than one rank, driven by the tick mode's own driver and transport (``tick_job``,
   ``TickTransport`` on the default group): seconds per point-to-point op as a tick posts them,
   the driver's Python per slot and per tick included (the whole stream's time over its ops);
3. quantize + dequantize of ``QUANT_ELEMS`` elements on the device (after one untimed pass):
   elements/s, the rate the link term charges (de)quantization at (cost.py).

The world group is the one group every rank has before the runtime's exist; on gloo, whose ring
runs its steps on the calling thread, the figure is taken per ring step (``ring_steps``: the
world less one) and a hop group of ``k`` ranks is charged ``k - 1`` of them; NCCL/RCCL launch a
collective in one call whatever its group. Cost: one warm-up call and ``HOST_REPS``
collectives, ``TICK_REPS`` tick streams, one quantization pass: 0.49-0.65 s for the emulated
cluster's 16 CPU ranks on 2 loaded cores (docs/benchmarks.md); on a GPU node the same calls are
tiny launches, expected to take milliseconds but not yet measured (printed and recorded as
``host.seconds``). What it leaves out: a real chunk's local work (encode, decode, copies of its
rows) beside the driver; on the emulated cluster a tick op cost the step about 1.6-1.9x what the
probe measured.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..core.topology import Topology
from ..core.vocab import TIERS
from ..detect.links import device_sync, timed
from ..planner.host import HostRates

HOST_REPS = 8
TICK_REPS = 2
TICK_CHUNKS = 4
TINY = 64  # elements per rank of the probe's messages: the per-op cost, not the bytes
QUANT_ELEMS = 1 << 18


def probe_elements(topo: Topology) -> int:
    """Most elements the host probe holds on one rank at once ([Note: host probe]): the world
    all-gather's output (it grows with the world: 4.8 M at 9,408 nodes x 8 GCDs), the chunks' gather
    buffers (a row per member of each hop), the quantization's input. Pure."""
    hops = sum(topo.axes_size((t,)) for t in TIERS if topo.axes_size((t,)) > 1)
    return TINY * (1 + topo.world_size) + TICK_CHUNKS * TINY * (1 + hops) + QUANT_ELEMS


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
    seconds = timed(lambda: quant.dequantize(quant.quantize(x, 8, 256), torch.float32), device_sync(device), 1)
    return QUANT_ELEMS / max(seconds, 1e-9)


def _tick_op_s(topo: Topology, rank: int, device: torch.device, host_only: bool) -> float:
    """Seconds per point-to-point op of tick streams run by the tick mode's driver ([Note: host
    probe], 2.): a hop per tier of more than one rank, on the default group."""
    from ..comm.collectives import Wire
    from ..comm.groups import HopGroup
    from ..comm.job import Job, Move
    from ..comm.stats import CommStats
    from ..comm.ticks import TickTransport, tick_job

    world = dist.group.WORLD
    assert world is not None  # initialised: the caller ran collectives on it
    hops = [HopGroup((t,), world, topo.peers(rank, (t,)), None, None) for t in TIERS if topo.axes_size((t,)) > 1]
    transport = TickTransport(world, rank, topo, CommStats(topo, rank))
    transport.log = []
    x = torch.ones(TINY, device=device)

    def chunk() -> Job[None]:
        for hg in hops:
            yield Move(hg.axes)
            yield Wire("gather", hg, x, "other_gather")

    def stream() -> None:
        for _ in tick_job(transport, [chunk() for _ in range(TICK_CHUNKS)], [[hg.axes for hg in hops]] * TICK_CHUNKS):
            pass  # each step of the driver is one tick, run here on this thread

    seconds = _burst(stream, device, TICK_REPS, host_only)
    ops = sum((out > 0) + (got > 0) for _, _, moved in transport.log for _, out, got in moved)
    return seconds * (TICK_REPS + 1) / ops if ops else 0.0  # the log holds the warm-up stream too


def measure_host(device: torch.device, topo: Topology, reps: int = HOST_REPS) -> tuple[HostRates, float, float]:
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
        p2p_s = _tick_op_s(topo, rank, device, host_only)
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


__all__ = ["HOST_REPS", "declared_host", "measure_host", "probe_elements"]
