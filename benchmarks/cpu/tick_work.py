"""The arithmetic of ``benchmarks/gpu/tick_work.py``: how many ticks and grouped calls one rank's
tick mode runs for one layer's pieces of work, how many bytes its quantization kernels encode
and decode there, and the per-tick summary of a measurement. Pure (torch is not touched; the
schedule and the chunking are the runtime's own, imported from ``comm``).

[Note: tick work of one layer]
One GPT-NeoX layer is one gather bucket (every tensor bf16, one source) and one gradient bucket,
as ``benchmarks/cpu/layer_cost.py`` lays them out ([Note: kernels of one layer] there). In the
tick mode each is one piece of work whose chunks advance together (``TickExecutor.submit_all``):

* forward gather: ``column_ranges(S, align, chunks)`` chunks over the forward hops (node, gpu,
  gcd; a node group above 32 members runs in log steps, ``comm/tick/plan.py``);
* backward re-gather: the same ranges of the kept copy over the backward hops (gcd);
* gradient reduce: the streamed column chunks of ``submit_reduce_scatter`` (at most 2^24
  elements over all W rows and at most 1/chunks of the row) over the reduce stages.

A piece of ``C`` chunks of ``H`` sub-hops each takes ``C + H - 1`` ticks (``tick_plan.ticks``).
What the kernels encode and decode follows from the same plan: a quantize of ``n`` elements
writes ``n x bits / 8`` data bytes and one fp32 scale per block; a dequantize reads as many.
"""

from __future__ import annotations

from statistics import median
from typing import Mapping, NamedTuple, Sequence

from zeropp_hier.comm.gather import chunk_align, column_ranges
from zeropp_hier.comm.reduce import column_chunks
from zeropp_hier.comm.tick import plan as tick_plan
from zeropp_hier.core.plan import STREAM_CHUNK_ELEMS, CommPlan, Hop
from zeropp_hier.core.policy import QUANTIZED
from zeropp_hier.core.topology import Topology

from .layer_cost import KernelCall

PHASES = ("forward_gather", "backward_gather", "grad_reduce")


def piece_ticks(topo: Topology, hops: Sequence[Hop], kind: str, chunks: int, steps: str = tick_plan.AUTO) -> int:
    """Ticks of one piece of ``chunks`` chunks over ``hops`` (only hops of more than one member
    move anything: a hop group of one has no transfer and no lane)."""
    sizes = [topo.axes_size(h.axes) for h in hops if topo.axes_size(h.axes) > 1]
    subs = tick_plan.sub_hops(sizes, steps, kind)
    return len(tick_plan.ticks([len(subs)] * chunks)) if subs and chunks else 0


def reduce_chunks(width: int, pad: int, world: int, chunks: int, stream_chunk_elems: int = STREAM_CHUNK_ELEMS) -> int:
    """Column chunks of one gradient bucket of ``width`` columns, as ``submit_reduce_scatter``
    cuts them: with ``chunks`` above 1 a job per chunk of at most 1/chunks of the row."""
    elems = stream_chunk_elems
    if chunks > 1:
        elems = min(stream_chunk_elems, world * -(-width // chunks))
    return len(column_chunks(width, pad, world, elems))


def layer_ticks(
    plan: CommPlan, topo: Topology, width: int, chunks: int, steps: str = tick_plan.AUTO
) -> dict[str, int]:
    """[Note: tick work of one layer]: ticks per phase for one layer of gather width ``width``."""
    backward = plan.backward_for(plan.kept_axes) if plan.kept_axes is not None else plan.forward
    fwd = len(column_ranges(width, chunk_align(plan.forward), chunks))
    start_block = max((h.block_size for h in plan.forward if h.scheme in QUANTIZED), default=1)
    bwd = len(column_ranges(width, chunk_align(backward, start_block if plan.kept_axes else 1), chunks))
    pad = max((h.block_size for h in plan.reduce if h.scheme in QUANTIZED), default=1)
    return {
        "forward_gather": piece_ticks(topo, plan.forward, tick_plan.GATHER, fwd, steps),
        "backward_gather": piece_ticks(topo, backward, tick_plan.GATHER, bwd, steps),
        "grad_reduce": piece_ticks(
            topo, plan.reduce, tick_plan.EXCHANGE, reduce_chunks(width, pad, topo.world_size, chunks), steps
        ),
    }


def plan_chunks(nodes: int, model: str = "neox_20b") -> int:
    """The chunk count ``zeropp-hier plan`` shows for the ``frontier`` configuration of ``model``
    (``app.spec.MODELS``) on Frontier at ``nodes`` nodes: the planner's own choice
    (``planner.ranking.predict`` with ``pipeline.chunks`` left to it). The runtime runs
    ``DEFAULT_TICK_CHUNKS`` unless ``pipeline.chunks`` says otherwise."""
    from zeropp_hier import planner
    from zeropp_hier.app.spec import MODELS, n_params
    from zeropp_hier.planner.candidates import Candidate, compression_for

    spec = MODELS[model]
    wl = planner.gpt_workload(n_params(spec), spec.layers, spec.hidden, spec.seq_len, 1)
    cand = Candidate("frontier", False, "frontier", compression_for("frontier"))
    return planner.predict(cand, planner.frontier(nodes), wl).chunks


def payload_bytes(numel: int, bits: int, block: int) -> int:
    """Bytes of one quantized payload of ``numel`` elements: data and one fp32 scale per block."""
    return numel * bits // 8 + 4 * -(-numel // block)


class CodecBytes(NamedTuple):
    encoded: int  # bytes the quantize calls write
    decoded: int  # bytes the dequantize (and dequantize_sum) calls read


def codec_bytes(calls: Sequence[KernelCall]) -> dict[str, CodecBytes]:
    """Per phase, the bytes the quantization kernels of ``calls`` (``layer_kernels``) encode and
    decode: the plan's figure that a run's own count must equal."""
    enc: dict[str, int] = dict.fromkeys(PHASES, 0)
    dec: dict[str, int] = dict.fromkeys(PHASES, 0)
    for c in calls:
        one = payload_bytes(c.numel, c.bits, c.block) * c.parts * c.calls
        if c.op == "quantize":
            enc[c.phase] += one
        else:
            dec[c.phase] += one
    return {p: CodecBytes(enc[p], dec[p]) for p in PHASES}


class TickSummary(NamedTuple):
    ticks: int
    host_ms_per_tick: float
    device_ms_per_tick: float
    host_over_device: float | None  # above 1: the issuing thread, not the device, bounds the local work
    host_ms_max_interval: float


def summarise(
    ticks: int, host_s: Sequence[float], device_s: Sequence[float], intervals_host_s: Sequence[float]
) -> TickSummary:
    """Per-tick figures of one phase: ``host_s`` and ``device_s`` are the totals of each
    repetition (the median is taken), ``intervals_host_s`` the host seconds of each stretch of
    local work between two ticks in one repetition."""
    h, d = median(host_s), median(device_s)
    per = max(ticks, 1)
    return TickSummary(
        ticks,
        1e3 * h / per,
        1e3 * d / per,
        h / d if d > 0 else None,
        1e3 * max(intervals_host_s, default=0.0),
    )


def table(phases: Mapping[str, Mapping[str, object]]) -> list[str]:
    """The printed table of a result's phases."""

    def num(x: object, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    def syncs(x: object) -> str:  # host syncs recorded (CUDA only), "-" where not checked
        return "-" if not isinstance(x, dict) else str(sum(x.values()))

    lines = [
        f"{'phase':<16} {'ticks':>5} {'calls':>5} {'host ms/tick':>12} {'device ms/tick':>14} {'host/dev':>8} "
        f"{'MB encoded':>10} {'MB decoded':>10} {'syncs':>5}"
    ]
    for name, p in phases.items():
        lines.append(
            f"{name:<16} {p['ticks']:>5} {p['grouped_calls']:>5} {num(p['host_ms_per_tick'], '.3f'):>12} "
            f"{num(p['device_ms_per_tick'], '.3f'):>14} {num(p['host_over_device'], '.2f'):>8} "
            f"{int(p['bytes_encoded']) / 1e6:>10.2f} {int(p['bytes_decoded']) / 1e6:>10.2f}"  # type: ignore[call-overload]
            f" {syncs(p.get('host_syncs')):>5}"
        )
    return lines
