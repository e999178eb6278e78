"""The tick mode's local work on one rank's device tensors: host time of the issuing thread per
tick beside the device time of the kernels it launched.

    python -m benchmarks.gpu.tick_work [--device cuda] [--hidden 6144] [--nodes 48] [--chunks 8|plan]
                                       [--rank 0] [--reps 3] [--out benchmarks/results/gpu_tick_work.json]
    python -m benchmarks.gpu.tick_work --device cpu --hidden 64 --out /tmp/tick_work.json   # a check

One rank of the ``frontier`` preset at Frontier's shape (``--nodes`` x 4 GPUs x 2 GCDs), the
runtime's own plan, default compression and chunk count (``pipeline.chunks`` as the tick mode
defaults it; ``--chunks plan``: the count ``zeropp-hier plan`` chooses), for one GPT-NeoX layer
(hidden 6144: GPT-NeoX-20B) laid out as ``benchmarks/cpu/layer_cost.py`` derives its per-rank
share ([Note: tick work of one layer] in benchmarks/cpu/tick_work.py). It runs the rank's real
tick-mode work for that layer: the runtime's gather jobs (``comm.gather.chunk_jobs``, ending in
``finish_bucket``: decode, the kept copies, the values) for the forward gather and the backward
re-gather from the kept copy, and the gradient jobs of ``comm.reduce.submit_reduce_scatter`` for
the gradient reduce, each piece driven by ``comm.tick.tick_job`` through
``comm.tick.LocalTickTransport``, a ``TickTransport`` whose network part (``post``) is a local
stand-in (the one ``auto``'s host probe times per element).

The stand-in does no transfer. It fills each receive buffer of a tick with a valid payload of
the right size and dtype: a copy of what this rank sends in the same slot (the encoded bytes of
its own rows, so every decode reads real data and scales), zeros where it sends nothing. The
values that come out are therefore not the layer's; they are not the point. Only the cost of
the local work is: the casts, encodes, packing, decodes, stage sums, index and copy kernels,
and the host's Python between ticks, on the device named.

Timing, per piece, over the stretches of local work between ticks (the stand-in's fills
excluded from both figures):

* host: ``time.perf_counter`` around each stretch on the issuing thread, with nothing
  synchronised until the piece ends (the launches only, as the runtime's thread does them);
* device (CUDA): a second run with CUDA events around each stretch, each stretch queued behind a
  ``torch.cuda._sleep`` longer than the host's stretch, so the events span the kernels back to
  back and not the gaps while the host launches them. On a CPU the host time is both.

Their ratio per tick says which bounds the local work: above 1 the issuing thread (Python and
launches), below 1 the device's kernels. Bytes encoded and decoded are counted from the
quantization calls of the first (untimed) run and must equal the plan's
(``benchmarks/cpu/tick_work.codec_bytes``); ticks equal the schedule's (``layer_ticks``). Not
counted: the error sample every 16th collective (no numerics hooks here) and the gradients'
packing into rows, done on the caller before the piece is submitted. Process groups are torch's
``fake`` backend, for group construction only: nothing is sent.

A warm run of each piece under ``torch.cuda.set_sync_debug_mode("warn")`` records every host
synchronisation the local work makes, by origin (``host_syncs``; expected: none).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Iterator, Sequence

from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS
from zeropp_hier.files import write_json_atomic

from ..cpu import layer_cost as lc
from ..cpu import tick_work as tw

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "gpu_tick_work.json"


class _Capture:
    """The context's executor while jobs are made: it keeps what is submitted (the runtime's own
    jobs and lanes) for the tick driver here, and runs nothing."""

    yields_wires = True

    def __init__(self) -> None:
        self.got: tuple[list, list, str] | None = None

    def submit_all(self, jobs: Sequence[Any], lanes: Sequence[Any], *, kind: str = "gather") -> Future:
        self.got = (list(jobs), list(lanes), kind)
        return Future()

    def submit(self, job: Any, lanes: Sequence[Any], hops: Any = None, *, kind: str = "gather") -> Future:
        self.got = ([job], list(lanes), kind)
        return Future()


class _Clock:
    """Host seconds of the stretches of local work, and on CUDA the event pairs around them."""

    def __init__(self, dev: Any, sleep_cycles: int = 0) -> None:
        import torch

        self.torch = torch
        self.cuda = dev.type == "cuda"
        self.sleep_cycles = sleep_cycles
        self.host = 0.0
        self.segments: list[float] = []  # host seconds of each stretch
        self.pairs: list[tuple[Any, Any]] = []
        self._t0 = 0.0
        self._ev: Any = None

    def begin(self) -> None:
        if self.cuda:
            if self.sleep_cycles:  # the device waits while the host queues the stretch
                self.torch.cuda._sleep(self.sleep_cycles)
            self._ev = self.torch.cuda.Event(enable_timing=True)
            self._ev.record()
        self._t0 = time.perf_counter()

    def end(self) -> float:
        dt = time.perf_counter() - self._t0
        self.host += dt
        self.segments.append(dt)
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            self.pairs.append((self._ev, ev))
        return dt

    def device_s(self) -> float:
        if not self.cuda:
            return self.host
        self.torch.cuda.synchronize()
        return sum(a.elapsed_time(b) for a, b in self.pairs) / 1e3


def _stand_in(base: Any) -> Any:
    """The package's ``LocalTickTransport`` (the network part fills the receive buffers locally:
    module docstring), pausing the clock meanwhile."""

    class StandIn(base):
        clock: _Clock | None = None

        def post(self, wires: Sequence[Any], batches: Sequence[Any]) -> None:
            if self.clock is not None:
                self.clock.end()
            super().post(wires, batches)
            if self.clock is not None:
                self.clock.begin()

    return StandIn


@contextlib.contextmanager
def counting_quant(counts: dict[str, int]) -> Iterator[None]:
    """Counts the bytes the quantization calls write (``encoded``) and read (``decoded``) while
    the block runs (a wrapper around ``zeropp_hier.quant``'s functions, which the collectives
    call through the module)."""
    from zeropp_hier import quant

    orig = quant.quantize, quant.dequantize, quant.dequantize_sum

    def nbytes(q: Any) -> int:
        return q.data.numel() * q.data.element_size() + q.scales.numel() * q.scales.element_size()

    def quantize(x, bits, block_size, *rest):
        q = orig[0](x, bits, block_size, *rest)
        counts["encoded"] += nbytes(q)
        return q

    def dequantize(q, dtype=None, *rest):
        counts["decoded"] += nbytes(q)
        return orig[1](q) if dtype is None else orig[1](q, dtype, *rest)

    def dequantize_sum(parts, dtype=None, *rest):
        counts["decoded"] += nbytes(parts) if isinstance(parts, quant.Quantized) else sum(nbytes(p) for p in parts)
        return orig[2](parts) if dtype is None else orig[2](parts, dtype, *rest)

    quant.quantize, quant.dequantize, quant.dequantize_sum = quantize, dequantize, dequantize_sum
    try:
        yield
    finally:
        quant.quantize, quant.dequantize, quant.dequantize_sum = orig


class Layer:
    """One rank's share of one layer and the context its jobs run in (fake process groups)."""

    def __init__(self, dev: Any, hidden: int, intermediate: int, nodes: int, rank: int, chunks: int) -> None:
        import torch
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        from zeropp_hier.comm import gather
        from zeropp_hier.comm.collectives import HierCollectives
        from zeropp_hier.comm.context import CommContext
        from zeropp_hier.comm.groups import build_hop_groups, build_tick_group
        from zeropp_hier.comm.stats import CommStats
        from zeropp_hier.comm.tick import LocalTickTransport
        from zeropp_hier.core import layout
        from zeropp_hier.core.topology import Topology

        self.topo = topo = Topology(nodes, 4, 2)
        self.plan = plan = lc.plan_of("frontier", topo)
        self.dev, self.rank, self.chunks = dev, rank, chunks
        world = topo.world_size
        if not dist.is_initialized():
            dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        self.backward = gather.backward_hops(plan, False)
        axes_sets = [h.axes for h in (*plan.forward, *self.backward, *plan.reduce)]
        groups = build_hop_groups(topo, axes_sets, rank)
        self.stats = CommStats(topo, rank)
        self.capture = _Capture()
        self.ctx = CommContext(
            topo,
            rank,
            plan,
            HierCollectives(topo, groups, self.stats),
            self.capture,  # type: ignore[arg-type]
            pipeline_chunks=chunks,
        )
        self.transport = _stand_in(LocalTickTransport)(build_tick_group(topo), rank, topo, self.stats)
        self.numels = lc.neox_layer_numels(hidden, intermediate)
        self.align = gather.slot_align((*plan.forward, *self.backward))  # the runtime's _gather_align
        self.sizes = [-(-n // world) for n in self.numels]
        self.slots = gather.slots_of(self.sizes, self.align)
        self.width = sum(self.slots)
        if self.width != lc.shard_elems(self.numels, world, self.align):
            raise AssertionError("the share differs from benchmarks/cpu/layer_cost.py's")
        self.valid = layout.valid_of(self.sizes, self.slots)
        gen = torch.Generator(device="cpu").manual_seed(rank)
        self.parts = [torch.randn(n, generator=gen).to(dev, torch.bfloat16) for n in self.sizes]
        self.grads = [torch.randn(n, generator=gen).to(dev, torch.bfloat16) for n in self.numels]
        self.kept: list | None = None

    def jobs(self, phase: str) -> tuple[list, list, str]:
        """The runtime's jobs of ``phase`` for this layer, with their hop lanes and kind."""
        import torch

        from zeropp_hier.comm import gather, reduce
        from zeropp_hier.comm.collectives import Encoded

        ctx, plan = self.ctx, self.plan
        if phase == "grad_reduce":
            reduce.submit_reduce_scatter(ctx, self.grads, torch.float32)
            assert self.capture.got is not None
            return self.capture.got
        if phase == "forward_gather":
            hops, start_block, carry = plan.forward, 1, ()
            keep = [plan.kept_axes] * len(self.numels) if plan.kept_axes is not None else None

            def make_start() -> gather.Buffer:
                return gather.primary_buffer(self.parts, self.sizes, self.numels, self.slots, self.rank)

        else:
            if self.kept is None or plan.kept_axes is None:
                raise AssertionError("the backward re-gather needs the forward's kept copies (run it first)")
            kept = self.kept
            hops = gather.hops_for(plan, plan.kept_axes, phase)
            start_block, keep = kept[0].block_size, None
            carry = tuple(t for s in kept for t in (s.data, s.scales))

            def make_start() -> gather.Buffer:
                return Encoded.cat(kept)

        ranges = gather.column_ranges(self.width, gather.chunk_align(hops, start_block), self.chunks)
        finish = gather.finish_bucket(ctx, torch.bfloat16, self.sizes, self.slots, self.numels, keep)
        jobs = gather.chunk_jobs(ctx, hops, make_start, ranges, phase, finish, carry, self.valid)
        return jobs, [h.axes for h in hops], "gather"


def run_piece(layer: Layer, phase: str, clock: _Clock | None) -> tuple[Any, int]:
    """One piece of ``phase`` in ticks: (its value, ticks); the stretches' times in ``clock``."""
    from zeropp_hier.comm.tick import tick_job

    jobs, lanes, kind = layer.jobs(phase)
    transport = layer.transport
    transport.clock = clock
    driver = tick_job(transport, jobs, [tuple(lanes)] * len(jobs), kind=kind)
    ticks = 0
    try:
        while True:
            if clock is not None:
                clock.begin()
            try:
                next(driver)
            finally:
                if clock is not None:
                    clock.end()
            ticks += 1
    except StopIteration as stop:
        value = stop.value
    transport.clock = None
    return value, ticks


def sleep_rate(dev: Any) -> float:
    """Cycles of ``torch.cuda._sleep`` per second on this device (0 on a CPU)."""
    import torch

    if dev.type != "cuda":
        return 0.0
    n = 10_000_000
    torch.cuda._sleep(n)  # warm-up
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(n)
    b.record()
    torch.cuda.synchronize()
    return n / (a.elapsed_time(b) / 1e3)


def measure(layer: Layer, reps: int) -> dict[str, dict[str, Any]]:
    """Every phase: a counted run (bytes, ticks, grouped calls, wire bytes), then ``reps`` host
    runs and ``reps`` device runs (CUDA only)."""
    from .kernels import device_sync

    dev = layer.dev
    out: dict[str, dict[str, Any]] = {}
    for phase in tw.PHASES:
        counts = {"encoded": 0, "decoded": 0}
        layer.stats.reset()
        calls0 = layer.transport.calls
        with counting_quant(counts):
            value, ticks = run_piece(layer, phase, None)
        calls = layer.transport.calls - calls0
        payload = layer.stats.snapshot()["bytes"][phase]
        if phase == "forward_gather":
            layer.kept = [k for k in value.kept]  # chunk_jobs' last value: the bucket's Gathered
        device_sync(dev)
        syncs = None
        if dev.type == "cuda":  # a warm run under sync-debug "warn": every host sync, by origin
            import torch

            from .engine import SyncRecorder

            with SyncRecorder() as rec:
                rec.phase = phase
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    run_piece(layer, phase, None)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = rec.summary()
            device_sync(dev)
        host: list[float] = []
        stretches: list[float] = []
        for _ in range(reps):
            clock = _Clock(dev)
            run_piece(layer, phase, clock)
            device_sync(dev)
            host.append(clock.host)
            stretches = clock.segments
        device = host
        if dev.type == "cuda":
            rate = sleep_rate(dev)
            # twice the longest host stretch, at least 1 ms; at most 0.25 s (a longer stretch is
            # the host's bound anyway, and its gaps then count as device time: an upper bound)
            cycles = int(rate * min(0.25, max(1e-3, 2 * max(stretches, default=0.0))))
            device = []
            for _ in range(reps):
                clock = _Clock(dev, cycles)
                run_piece(layer, phase, clock)
                device.append(clock.device_s())
        s = tw.summarise(ticks, host, device, stretches)
        out[phase] = {
            "ticks": ticks,
            "grouped_calls": calls,
            "host_ms_per_tick": s.host_ms_per_tick,
            "device_ms_per_tick": s.device_ms_per_tick,
            "host_over_device": s.host_over_device,
            "host_ms_max_stretch": s.host_ms_max_interval,
            "host_s_reps": host,
            "device_s_reps": device,
            "bytes_encoded": counts["encoded"],
            "bytes_decoded": counts["decoded"],
            "wire_payload_bytes": {t: b for t, b in payload.items() if b},
            # host synchronisations in a warm run, by origin (None: not a CUDA device, not checked)
            "host_syncs": syncs,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hidden", type=int, default=6144, help="hidden size (6144: GPT-NeoX-20B)")
    ap.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    ap.add_argument("--nodes", type=int, default=48)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument(
        "--chunks",
        default=str(DEFAULT_TICK_CHUNKS),
        help="pipeline.chunks: a count (default: the tick mode's own), or 'plan': the count zeropp-hier plan "
        "chooses for frontier with GPT-NeoX-20B at --nodes",
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    plan_chunks = tw.plan_chunks(args.nodes)
    if args.chunks == "plan":
        args.chunks, source = plan_chunks, "zeropp-hier plan's choice for frontier, GPT-NeoX-20B"
    elif args.chunks.isdigit() and int(args.chunks) >= 1:
        args.chunks = int(args.chunks)
        source = "the tick mode's default" if args.chunks == DEFAULT_TICK_CHUNKS else "given"
    else:
        ap.error(f"--chunks {args.chunks!r}: use a positive count or 'plan'")
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here; use --device cpu for the check at toy size")
    if dev.type == "cuda":
        if dev.index is None:  # "cuda": the current device, named by its index (set_device needs one)
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    intermediate = args.intermediate or 4 * args.hidden
    layer = Layer(dev, args.hidden, intermediate, args.nodes, args.rank, args.chunks)
    from zeropp_hier import quant

    phases = measure(layer, args.reps)
    expected_ticks = tw.layer_ticks(layer.plan, layer.topo, layer.width, args.chunks)
    kernels = lc.layer_kernels(layer.numels, layer.topo, "frontier", args.chunks)
    expected_bytes = tw.codec_bytes(kernels.calls)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    result = {
        "device": name,
        "torch": torch.__version__,
        "kernels": quant.backend(dev),
        "topology": [args.nodes, 4, 2],
        "rank": args.rank,
        "preset": "frontier",
        "hidden": args.hidden,
        "intermediate": intermediate,
        "layer_params": sum(layer.numels),
        "share_elems": layer.width,
        "pipeline_chunks": args.chunks,
        "chunks_source": source,
        "chunks_runtime_default": DEFAULT_TICK_CHUNKS,
        "chunks_plan": plan_chunks,
        "reps": args.reps,
        "phases": phases,
        "expected": {
            p: {"ticks": expected_ticks[p], "bytes_encoded": b.encoded, "bytes_decoded": b.decoded}
            for p, b in expected_bytes.items()
        },
        "stand_in": "no transfer: each receive buffer gets a copy of this rank's own payload of the slot "
        "(zeros where it sends none); values are not the layer's, only the local work's cost is measured",
        "timing": "host: perf_counter around each stretch of local work, the stand-in excluded; device: CUDA "
        "events around the same stretches, each queued behind a sleep longer than the host's stretch "
        "(kernels back to back); on a CPU the host time is both",
    }
    write_json_atomic(args.out, result)
    print(
        f"{name}: one frontier rank at {args.nodes}x4x2, hidden {args.hidden}, share {layer.width} elements, "
        f"{args.chunks} chunks ({source})"
    )
    for line in tw.table(phases):
        print(line)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
