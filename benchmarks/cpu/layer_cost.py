"""The arithmetic of ``benchmarks/gpu/layer_cost.py``: which quantization kernels the ``frontier`` preset
runs for one transformer layer on one rank, on how many elements, and the constants that scale
a measurement on an NVIDIA GPU to one MI250X GCD. Pure (no torch is touched; the partition
helpers are the runtime's own, imported from ``comm``).

[Note: kernels of one layer]
Everything below is read from the plan the runtime builds (``core.plan.make_plan`` over the
preset's resolved compression, ``core.policy``), not written out by hand:

* Partition. DeepSpeed cuts each parameter tensor of ``n`` elements into ``W`` pieces of
  ceil(n / W); the gather puts each piece in a slot of whole quantization blocks
  (``comm.gather.slot_align`` / ``slots_of``: the largest block of a quantizing hop, 256), so one
  rank's start row is S = sum over the layer's tensors of aligned(ceil(n / W), 256) elements and
  the gathered buffer is W x S. The gradient rows are laid out the same way
  (``core.layout.pack_grad_rows`` with ``align_chunks``): W rows of C = S columns, fp32.
* Forward gather (hops node, gpu, gcd; frontier weights: int8 on the node tier only). The first
  quantizing hop encodes this rank's buffer as it is then (``comm.gather.hop_steps``): at the
  node hop, the start row, S elements of the bf16 weights -> one ``quantize`` per column chunk
  of the gather (``pipeline.chunks``, ``comm.gather.column_ranges``). Later hops carry the
  encoded rows as bytes ([Note: quantize once per gather] in comm/collectives.py); the end
  decodes the whole gathered buffer: one ``dequantize`` of W x S elements to bf16.
* Backward re-gather (hop gcd, from the kept copy spanning node and gpu). The kept copy is cut
  from the forward's encoded buffer, so it stays encoded: no quantize, and the end decodes the
  whole layer again, one more ``dequantize`` of W x S elements to bf16.
* Gradient reduce-scatter (stages gcd int8, gpu int4, node int8; error feedback "auto" is off
  for int8 and the gpu stage has none, so no residual kernels). Each stage of each streamed
  column chunk ([Note: streamed gradient stages] in comm/reduce.py: at most 2^24 elements over
  all W rows, and at most 1/chunks of the row with ``pipeline.chunks``) quantizes its whole
  fp32 buffer (``reduce_stage_steps``: ``quantize(send)``, the stage's buf elements) and sums
  the k received payloads (``dequantize_sum`` of k parts of buf / k elements, fp32 out), k the
  stage's group size: 2 (gcd), 4 (gpu), 48 (node, at 48 nodes). The buffer shrinks by k each
  stage: W x C, then W x C / 2, then W x C / 8 elements. The runtime does not call
  ``dequantize_sum_requantize`` (the stages reorder rows between them), so it is timed only on
  its own.
* Not counted: the error sample every 16th collective (``numerics.sample_every``: one more
  dequantize of that payload), and recomputation under activation checkpointing (another
  forward, with no gather kernels of its own).

Planner accounting (planner/cost.py): a collective's quantization costs quant_elems / (2 x
quant_rate) seconds, quant_elems counting every element quantized plus every element
dequantized. The rate that reproduces a measured per-layer kernel time is therefore
(sum of quant_elems over the layer's collectives) / (2 x measured seconds); ``planner_quant_elems``
takes that sum from the planner's own ``collectives`` for one layer's parameters.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple, Sequence

from zeropp_hier.app.model.flops import PEAK_BF16_TFLOPS, by_device_name, peak_tflops
from zeropp_hier.comm.gather import column_ranges, slot_align
from zeropp_hier.comm.reduce import column_chunks
from zeropp_hier.core.plan import STREAM_CHUNK_ELEMS, CommPlan, Hop, make_plan
from zeropp_hier.core.policy import BITS, QUANTIZED
from zeropp_hier.core.topology import Topology
from zeropp_hier.planner.clusters import frontier

# HBM bandwidth per device that one rank drives, TB/s, by a substring of the device name (as
# app/model/flops.py keys its peaks; the NVL key before its prefix, first match wins). NVIDIA H100 SXM5
# 3.35 TB/s (H100 data sheet; "H100 80GB HBM3" is the SXM5's name); H200 SXM and NVL 4.8 TB/s
# (H200 data sheet). AMD MI250X 3.2 TB/s per package of two GCDs (MI250X data sheet), 1.6 per
# GCD, each GCD one device to ROCm.
HBM_TBPS: dict[str, float] = {"MI250X": 1.6, "H100 80GB HBM3": 3.35, "H200 NVL": 4.8, "H200": 4.8}
MI250X_GCD_HBM_TBPS = HBM_TBPS["MI250X"]
MI250X_GCD_PEAK_TFLOPS = PEAK_BF16_TFLOPS["MI250X"]
SOURCES = {
    "MI250X_hbm": "AMD Instinct MI250X data sheet: 3.2 TB/s HBM2e per package = 1.6 TB/s per GCD",
    "MI250X_peak": "AMD Instinct MI250X data sheet: 383 TFLOP/s dense bf16 per package = 191.5 per GCD",
    "H100_hbm": "NVIDIA H100 data sheet: H100 SXM5 3.35 TB/s",
    "H100_peak": "NVIDIA H100 data sheet: H100 SXM5 989 TFLOP/s dense bf16 (1979 with sparsity)",
    "H200_hbm": "NVIDIA H200 data sheet: H200 SXM and NVL 4.8 TB/s",
    "H200_peak": "NVIDIA H200 data sheet: H200 SXM 989, NVL 835.5 TFLOP/s dense bf16",
    "peaks_table": "zeropp_hier/app/model/flops.py PEAK_BF16_TFLOPS",
}
# where a later session changes the planner's rate (the value there today: ``frontier().quant_rate``)
PLANNER_FILE = "zeropp_hier/planner/clusters.py"


def hbm_tbps(device_name: str | None) -> float | None:
    """HBM bandwidth (TB/s) of the device named ``device_name``; None for a CPU or an unknown one."""
    return by_device_name(HBM_TBPS, device_name)


class Scaling(NamedTuple):
    """Factors that turn times on this device into MI250X GCD times (None: not known here)."""

    kernel: float | None  # memory-bound kernels: this device's HBM / the GCD's
    gemm: float | None  # compute-bound matmuls: this device's bf16 peak / the GCD's


def mi250x_scaling(device_name: str | None) -> Scaling:
    """A kernel that moves bytes at the same fraction of HBM takes (HBM here / 1.6 TB/s) times as
    long on a GCD; a GEMM at the same fraction of peak takes (peak here / 191.5) times as long."""
    bw, peak = hbm_tbps(device_name), peak_tflops(device_name)
    return Scaling(
        None if bw is None else bw / MI250X_GCD_HBM_TBPS,
        None if peak is None else peak / MI250X_GCD_PEAK_TFLOPS,
    )


def scaled(seconds: float, factor: float | None) -> float | None:
    return None if factor is None else seconds * factor


def ratio(compression_s: float | None, compute_s: float | None) -> float | None:
    """Compression seconds per layer per step over the layer's compute seconds."""
    if compression_s is None or compute_s is None or compute_s <= 0:
        return None
    return compression_s / compute_s


# -- the layer and its partition -------------------------------------------------------------


def neox_layer_numels(hidden: int, intermediate: int) -> list[int]:
    """Elements of each parameter of one GPT-NeoX layer, in transformers' order: two LayerNorms
    (weight, bias), fused QKV h -> 3h, attention output h -> h, MLP h -> i and i -> h, each with
    a bias (app/spec.py ``block_params`` is their sum)."""
    h, i = hidden, intermediate
    return [h, h, h, h, 3 * h * h, 3 * h, h * h, h, i * h, i, h * i, h]


def aligned(n: int, block: int) -> int:
    return -(-n // block) * block


def shard_elems(numels: Sequence[int], world: int, align: int) -> int:
    """S: one rank's start row of a gather (or width of the gradient rows): each tensor's piece
    of ceil(n / world) elements in a slot of whole ``align`` blocks."""
    return sum(aligned(-(-n // world), align) for n in numels)


def plan_of(preset: str, topo: Topology, block: int = 256) -> CommPlan:
    """The plan the runtime builds for ``preset`` with the preset's own compression."""
    from zeropp_hier.planner.candidates import compression_for

    return make_plan(preset, compression_for(preset, block=block), topo)  # type: ignore[arg-type]


# -- kernel calls ----------------------------------------------------------------------------


class KernelCall(NamedTuple):
    """One kind of kernel call and how often one rank makes it for one layer per step."""

    phase: str  # forward_gather | backward_gather | grad_reduce
    tier: str  # the hop's tier
    op: str  # quantize | dequantize | dequantize_sum
    bits: int
    dtype: str  # quantize: input dtype; dequantize(_sum): output dtype (torch names)
    numel: int  # elements of the call (dequantize_sum: of each part)
    parts: int  # k payloads summed (1 for quantize / dequantize)
    block: int
    calls: int

    @property
    def elems(self) -> int:
        """Elements (de)quantized per call, as the planner counts them."""
        return self.numel * self.parts


def _merge(calls: list[KernelCall]) -> list[KernelCall]:
    """Identical calls (all but ``calls``) merged, first occurrence order kept."""
    n: Counter = Counter()
    for c in calls:
        n[c._replace(calls=0)] += c.calls
    return [k._replace(calls=v) for k, v in n.items()]


def gather_calls(
    phase: str,
    hops: Sequence[Hop],
    topo: Topology,
    width: int,
    rows: int,
    encoded: Hop | None,
    chunks: int,
    dtype: str,
    used: int | None = None,
) -> tuple[list[KernelCall], Hop | None]:
    """The kernels of one gather (``comm.gather.hop_steps`` over each column chunk, then
    ``finish`` on the assembled buffer): ``rows`` start rows of ``width`` elements, already
    encoded by ``encoded`` (the hop that encoded a kept copy) or plain. Returns the calls and
    the hop whose encoding the result carries. ``used``: the values of a row (its tensors'
    pieces); where they are at most half the row and unrotated, the end decodes only their
    columns by elementwise ops, not the dequantize kernel (``comm.gather.split_full``, [Note:
    decoding a few columns]), and no kernel call is counted for it."""
    align = max(slot_align(hops), encoded.block_size if encoded is not None else 1)
    ranges = column_ranges(width, align, chunks) if chunks > 1 else [(0, width)]
    out: list[KernelCall] = []
    enc = encoded
    for hop in hops:
        if enc is None and hop.scheme in QUANTIZED:
            enc = hop
            for a, b in ranges:
                out.append(
                    KernelCall(
                        phase, hop.tier, "quantize", BITS[hop.scheme], dtype, rows * (b - a), 1, hop.block_size, 1
                    )
                )
        rows *= topo.axes_size(hop.axes)
    columns = used is not None and enc is not None and not enc.rotate and 2 * used <= width
    if enc is not None and not columns:  # the end decodes the whole gathered buffer once
        tier = hops[0].tier if hops else enc.tier
        out.append(KernelCall(phase, tier, "dequantize", BITS[enc.scheme], dtype, rows * width, 1, enc.block_size, 1))
    return _merge(out), enc


def reduce_calls(
    hops: Sequence[Hop], topo: Topology, width: int, chunks: int, stream_chunk_elems: int = STREAM_CHUNK_ELEMS
) -> list[KernelCall]:
    """The kernels of one gradient bucket's stages (``comm.reduce``): W rows of ``width`` fp32
    columns, streamed in column chunks; per chunk and quantized stage a quantize of the stage's
    buffer and a dequantize_sum of its k received payloads."""
    world = topo.world_size
    pad = slot_align(hops)
    elems = stream_chunk_elems
    if chunks > 1:  # as submit_reduce_scatter: a job per chunk, at most 1/chunks of a row each
        elems = min(stream_chunk_elems, world * -(-width // chunks))
    out: list[KernelCall] = []
    for a, b in column_chunks(width, pad, world, elems):
        buf = world * (b - a)
        for hop in hops:
            k = topo.axes_size(hop.axes)
            if hop.scheme in QUANTIZED:
                bits = BITS[hop.scheme]
                out.append(KernelCall("grad_reduce", hop.tier, "quantize", bits, "float32", buf, 1, hop.block_size, 1))
                out.append(
                    KernelCall(
                        "grad_reduce", hop.tier, "dequantize_sum", bits, "float32", buf // k, k, hop.block_size, 1
                    )
                )
            buf //= k
    return _merge(out)


class LayerKernels(NamedTuple):
    world: int
    shard: int  # S: elements of one rank's start row (= gradient row width)
    gathered: int  # W x S: elements of the gathered layer, slot padding included
    calls: list[KernelCall]


def layer_kernels(
    numels: Sequence[int], topo: Topology, preset: str = "frontier", chunks: int = 1, weight_dtype: str = "bfloat16"
) -> LayerKernels:
    """[Note: kernels of one layer]: every quantization kernel one rank runs for one layer per
    step (forward gather, backward re-gather from the kept copy, gradient reduce-scatter)."""
    plan = plan_of(preset, topo)
    world = topo.world_size
    align = max(slot_align(plan.forward), slot_align(plan.backward), slot_align(plan.reduce))
    width = shard_elems(numels, world, align)
    used = sum(-(-n // world) for n in numels)  # DeepSpeed's piece of each tensor, side by side
    calls, enc = gather_calls("forward_gather", plan.forward, topo, width, 1, None, chunks, weight_dtype, used)
    if plan.kept_axes is not None:
        rows = topo.axes_size(plan.kept_axes)
        bwd, _ = gather_calls("backward_gather", plan.backward, topo, width, rows, enc, chunks, weight_dtype, used)
    else:  # no kept copy: the forward's gather again
        bwd = [c._replace(phase="backward_gather") for c in calls]
    calls = calls + bwd + reduce_calls(plan.reduce, topo, width, chunks)
    return LayerKernels(world, width, world * width, calls)


def calls_elems(calls: Sequence[KernelCall]) -> int:
    return sum(c.elems * c.calls for c in calls)


def planner_quant_elems(params: int, topo: Topology, preset: str = "frontier") -> float:
    """Sum of the planner's quant_elems (planner/cost.py ``collectives``) for one layer of
    ``params`` parameters: the elements its model (de)quantizes per rank per step."""
    from zeropp_hier.planner.candidates import Candidate, compression_for
    from zeropp_hier.planner.cost import collectives

    cand = Candidate(preset, False, preset, compression_for(preset))  # type: ignore[arg-type]
    _, colls = collectives(cand, topo, float(params))
    return sum(c.quant_elems for c in colls)


def planner_quant_rate(quant_elems: float, seconds: float) -> float:
    """The ``quant_rate`` under which the planner's quant_elems / (2 x rate) equals ``seconds``."""
    return quant_elems / (2.0 * seconds)


def planner_line(rate: float, device: str) -> str:
    """The line of ``frontier()`` in planner/clusters.py a later session would change."""
    return (
        f"{PLANNER_FILE}: frontier(): quant_rate={frontier().quant_rate:.0e},  ->  "
        f"quant_rate={rate:.2e},  # benchmarks/gpu/layer_cost.py on {device}, scaled by HBM to an MI250X GCD"
    )
