"""What compression costs beside compute, for one transformer layer on one GPU.

    python -m benchmarks.gpu.layer_cost [--device cuda] [--hidden 6144] [--tokens 2048] [--heads 64]
                                        [--nodes 48] [--chunks 8] [--iters 5] [--reps 3]
                                        [--out benchmarks/results/gpu_layer_cost.json]
    python -m benchmarks.gpu.layer_cost --profile    # the fused requantize only, once per case (for ncu)
    python -m benchmarks.gpu.layer_cost --device cpu --hidden 128 --heads 2 --tokens 32   # a check

The default shape is one GPT-NeoX-20B layer (hidden 6144, 64 heads, MLP 4 x hidden, 2048 tokens
of one sample). It times, on one device:

* compute: transformers' ``GPTNeoXLayer`` in bf16 (sdpa attention, causal), its forward and its
  forward + backward (the input requires grad, as every layer's but the first); and the layer's
  four weight matmuls alone (QKV h -> 3h, output h -> h, MLP h -> 4h and 4h -> h: forward once,
  backward twice, for the input's and the weight's gradient), so that the ratio is also
  available against pure GEMM time.
* compression: every quantization kernel one rank of the ``frontier`` preset runs for that
  layer per step at Frontier's shape (``--nodes`` x 4 GPUs x 2 GCDs), derived from the plan the
  runtime builds ([Note: kernels of one layer] in benchmarks/cpu/layer_cost.py: the forward gather
  quantizes the rank's 1/W share of the bf16 weights at the node hop and dequantizes the whole
  layer, the backward re-gather dequantizes the whole layer again from the int8 kept copy, and
  each of the gradient stages gcd int8, gpu int4, node int8 quantizes its fp32 buffer and sums
  its k = 2, 4, nodes received payloads, chunk by streamed chunk). Each distinct call is timed
  on its own and multiplied by its count.
* kernels: quantize, dequantize, dequantize_sum and dequantize_sum_requantize on their own, bf16,
  int8 and int4, k = 2, 4 and ``--nodes`` parts (the group sizes of the gcd, gpu and node
  stages), on as many elements as the gathered layer (a sum's k parts together), each beside a
  device copy moving as many bytes (as benchmarks/gpu/kernels.py).

Times are CUDA-event times of ``--iters`` back-to-back calls after a warm-up, the median over
``--reps`` (``time.perf_counter`` on the CPU). The JSON holds every time; the ratio (compression
seconds per layer per step / forward + backward seconds, and / GEMM seconds); the same figures
scaled to one MI250X GCD: kernel times x (this device's HBM bandwidth / 1.6 TB/s) as for
memory-bound kernels, compute times x (this device's dense bf16 peak / 191.5 TFLOP/s) as for
compute-bound work (both assumptions, and the sources of every constant, are in the JSON); and
the planner's ``quant_rate`` (planner/clusters.py) that reproduces the measured kernel time,
with the line of ``frontier()`` a later session would change to it. Needs the compiled kernels
for the device (``python setup.py build_ext --inplace``).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Callable

from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS
from zeropp_hier.files import write_json_atomic
from zeropp_hier.planner.clusters import frontier

from ..cpu import layer_cost as lc
from .kernels import device_sync, measure_ops, time_fn

ASSUMPTIONS = (
    "kernel times scaled by HBM bandwidth (this device / MI250X GCD 1.6 TB/s): right for memory-bound "
    "kernels, optimistic for the fused and int4 ones, which are not (compute-heavy per byte); compute "
    "times scaled by dense bf16 peak (this device / 191.5 TFLOP/s): right for GEMMs at the same fraction "
    "of peak, pessimistic for the layer's memory-bound parts (attention softmax, LayerNorm, GELU)"
)


# -- compute ---------------------------------------------------------------------------------


def build_layer(hidden: int, heads: int, intermediate: int, tokens: int, dev):
    """One GPT-NeoX layer (the 20B's config with this shape, as app/model/models.py builds it) in bf16
    on ``dev``, and its rotary embedding for ``tokens`` positions."""
    import torch
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXLayer, GPTNeoXRotaryEmbedding

    from zeropp_hier.app.model.models import neox_config
    from zeropp_hier.app.spec import MODELS

    spec = replace(MODELS["neox_20b"], hidden=hidden, heads=heads, intermediate=intermediate, seq_len=tokens)
    cfg = neox_config(spec)
    cfg._attn_implementation = "sdpa"
    with torch.device(dev):
        layer = GPTNeoXLayer(cfg, 0).to(torch.bfloat16).train()
        rotary = GPTNeoXRotaryEmbedding(cfg)
    return layer, rotary


def time_compute(layer, rotary, tokens: int, dev, iters: int, reps: int) -> dict:
    import torch

    hidden = layer.input_layernorm.weight.numel()
    x = torch.randn(1, tokens, hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(tokens, device=dev).unsqueeze(0)
    with torch.no_grad():
        pe = rotary(x, pos)
    dy = torch.randn(1, tokens, hidden, device=dev, dtype=torch.bfloat16)
    params = list(layer.parameters())

    def forward():
        out = layer(x, position_embeddings=pe)
        return out[0] if isinstance(out, tuple) else out  # transformers 4 returns a tuple

    def forward_backward():
        for p in params:
            p.grad = None
        x.grad = None
        forward().backward(dy)

    fwd = time_fn(forward, dev, iters, reps)
    fwd_bwd = time_fn(forward_backward, dev, iters, reps)
    for p in params:
        p.grad = None

    # the four weight matmuls alone: y = x W^T; dx = dy W; dW = dy^T x
    linears = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    mats = []
    for m in linears:
        w = m.weight.detach()
        out_f, in_f = w.shape
        a = torch.randn(tokens, in_f, device=dev, dtype=torch.bfloat16)
        g = torch.randn(tokens, out_f, device=dev, dtype=torch.bfloat16)
        mats.append((w, a, g))

    def gemm_forward():
        for w, a, _ in mats:
            torch.matmul(a, w.t())

    def gemm_backward():
        for w, a, g in mats:
            torch.matmul(g, w)
            torch.matmul(g.t(), a)

    g_fwd = time_fn(gemm_forward, dev, iters, reps)
    g_bwd = time_fn(gemm_backward, dev, iters, reps)
    flops = sum(2.0 * tokens * w.shape[0] * w.shape[1] for w, _, _ in mats) * 3
    return {
        "forward_s": fwd,
        "forward_backward_s": fwd_bwd,
        "backward_s": fwd_bwd - fwd,
        "gemm_forward_s": g_fwd,
        "gemm_backward_s": g_bwd,
        "gemm_s": g_fwd + g_bwd,
        "gemm_flops": flops,
        "gemm_TFLOPs": flops / (g_fwd + g_bwd) / 1e12,
        "linear_shapes": [list(w.shape) for w in (m.weight for m in linears)],
    }


# -- compression -----------------------------------------------------------------------------


def _payload(n: int, bits: int, block: int, dev):
    import torch

    from zeropp_hier import quant

    return quant.quantize(torch.randn(n, device=dev), bits, block)


def _stacked(n: int, k: int, bits: int, block: int, dev):
    """k payloads of n elements each as one stacked Quantized (an all-to-all receive buffer)."""
    from zeropp_hier import quant

    q = _payload(n, bits, block, dev)
    return quant.Quantized(q.data.unsqueeze(0).repeat(k, 1), q.scales.unsqueeze(0).repeat(k, 1), n, bits, block)


def call_fn(c: lc.KernelCall, dev) -> Callable[[], object]:
    """A closure making the call ``c`` on fresh inputs of its size."""
    import torch

    from zeropp_hier import quant

    dtype = getattr(torch, c.dtype)
    if c.op == "quantize":
        x = torch.randn(c.numel, device=dev).to(dtype)
        return lambda: quant.quantize(x, c.bits, c.block)
    if c.op == "dequantize":
        q = _payload(c.numel, c.bits, c.block, dev)
        return lambda: quant.dequantize(q, dtype)
    if c.op == "dequantize_sum":
        st = _stacked(c.numel, c.parts, c.bits, c.block, dev)
        return lambda: quant.dequantize_sum(st, dtype)
    raise ValueError(f"unknown kernel op {c.op!r}")


def time_layer_kernels(lk: lc.LayerKernels, dev, iters: int, reps: int) -> dict:
    rows = []
    per_phase: dict[str, float] = {}
    for c in lk.calls:
        t = time_fn(call_fn(c, dev), dev, iters, reps)
        row = c._asdict() | {"elems": c.elems, "seconds_per_call": t, "seconds": t * c.calls}
        rows.append(row)
        per_phase[c.phase] = per_phase.get(c.phase, 0.0) + row["seconds"]
        _empty_cache(dev)
    return {
        "calls": rows,
        "per_phase_s": per_phase,
        "total_s": sum(per_phase.values()),
        "elems": lc.calls_elems(lk.calls),
    }


def _empty_cache(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.empty_cache()


def time_kernels(n: int, ks: list[int], block: int, dev, iters: int, reps: int) -> list[dict]:
    """The four ops on their own, bf16, int8 and int4, a sum's k parts together n elements
    (``kernels.measure_ops``: each beside a device copy moving the same bytes)."""
    import torch

    x = torch.randn(n, device=dev).to(torch.bfloat16)
    rows: list[dict] = []
    for bits in (8, 4):
        sums = [(k, lc.aligned(-(-n // k), block)) for k in ks]  # each part whole blocks
        rows += measure_ops(x, bits, block, sums, dev, iters, reps)
        _empty_cache(dev)
    return rows


# -- the whole run ---------------------------------------------------------------------------


def _device_name(dev) -> str | None:
    import torch

    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else None


def _check_kernels(dev) -> str:
    import torch

    from zeropp_hier import quant

    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("benchmarks/gpu/layer_cost.py: no GPU visible to torch (use --device cpu)")
        if quant.backend(dev) not in ("cuda", "hip"):
            raise SystemExit(
                "benchmarks/gpu/layer_cost.py: the GPU kernels are not built (python setup.py build_ext --inplace)"
            )
    return quant.kernel_info(dev)


def topology(nodes: int):
    from zeropp_hier.core.topology import Topology

    return Topology(nodes, 4, 2)  # Frontier: 4 MI250X packages of 2 GCDs per node


def run(args) -> dict:
    import torch

    dev = torch.device(args.device)
    kernels = _check_kernels(dev)
    name = _device_name(dev)
    intermediate = args.intermediate or 4 * args.hidden
    numels = lc.neox_layer_numels(args.hidden, intermediate)
    params = sum(numels)
    topo = topology(args.nodes)
    lk = lc.layer_kernels(numels, topo, "frontier", args.chunks)

    layer, rotary = build_layer(args.hidden, args.heads, intermediate, args.tokens, dev)
    built = sum(p.numel() for p in layer.parameters())
    if built != params:
        raise AssertionError(f"GPTNeoXLayer has {built} parameters, the partition arithmetic {params}")
    compute = time_compute(layer, rotary, args.tokens, dev, args.iters, args.reps)
    del layer, rotary
    _empty_cache(dev)
    _print_compute(compute)

    compression = time_layer_kernels(lk, dev, args.iters, args.reps)
    _print_calls(compression)
    # k: the group sizes of the gcd, gpu and node stages (each once where two are equal)
    ks = list(dict.fromkeys(topo.axes_size((t,)) for t in ("gcd", "gpu", "node")))
    kernel_rows = time_kernels(lk.gathered, ks, 256, dev, args.iters, args.reps)
    _print_kernels(kernel_rows)

    scale = lc.mi250x_scaling(name)
    comp_s, fb_s, gemm_s = compression["total_s"], compute["forward_backward_s"], compute["gemm_s"]
    mi_comp, mi_fb, mi_gemm = (
        lc.scaled(comp_s, scale.kernel),
        lc.scaled(fb_s, scale.gemm),
        lc.scaled(gemm_s, scale.gemm),
    )
    q_elems = lc.planner_quant_elems(params, topo)
    rate = lc.planner_quant_rate(q_elems, comp_s)
    rate_mi = None if mi_comp is None else lc.planner_quant_rate(q_elems, mi_comp)
    return {
        "machine": {
            "device": name or "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None),
            "kernels": kernels,
        },
        "config": {
            "hidden": args.hidden,
            "intermediate": intermediate,
            "heads": args.heads,
            "tokens": args.tokens,
            "nodes": args.nodes,
            "gpus_per_node": 4,
            "gcds_per_gpu": 2,
            "world": lk.world,
            "preset": "frontier",
            "pipeline_chunks": args.chunks,
            "block_size": 256,
            "iters": args.iters,
            "reps": args.reps,
            "timing": "median",
        },
        "layer": {"params": params, "tensors": numels, "shard_elems": lk.shard, "gathered_elems": lk.gathered},
        "compute": compute,
        "compression": compression,
        "kernels": kernel_rows,
        "ratios": {
            "compression_over_forward_backward": lc.ratio(comp_s, fb_s),
            "compression_over_gemm": lc.ratio(comp_s, gemm_s),
        },
        "mi250x": {
            "kernel_factor": scale.kernel,
            "gemm_factor": scale.gemm,
            "device_hbm_TBps": lc.hbm_tbps(name),
            "device_peak_TFLOPs": None if scale.gemm is None else scale.gemm * lc.MI250X_GCD_PEAK_TFLOPS,
            "gcd_hbm_TBps": lc.MI250X_GCD_HBM_TBPS,
            "gcd_peak_TFLOPs": lc.MI250X_GCD_PEAK_TFLOPS,
            "compression_s": mi_comp,
            "forward_backward_s": mi_fb,
            "gemm_s": mi_gemm,
            "compression_over_forward_backward": lc.ratio(mi_comp, mi_fb),
            "compression_over_gemm": lc.ratio(mi_comp, mi_gemm),
            "assumptions": ASSUMPTIONS,
        },
        "planner": {
            "quant_elems_per_layer": q_elems,
            "kernel_elems_per_layer": compression["elems"],
            "quant_rate_here": rate,
            "quant_rate_mi250x": rate_mi,
            "quant_rate_frontier_now": frontier().quant_rate,
            "definition": "planner quant_elems of one layer / (2 x measured kernel seconds of that layer)",
            "line": None if rate_mi is None else lc.planner_line(rate_mi, name or "cpu"),
        },
        "sources": lc.SOURCES,
    }


def profile(args) -> None:
    """The fused requantize once per case at the size of the layer's first gradient stage (one
    streamed chunk), for ncu: bits 8 and 4, k = 2, 4 and ``--nodes``."""
    import torch

    from zeropp_hier import quant

    dev = torch.device(args.device)
    _check_kernels(dev)
    topo = topology(args.nodes)
    lk = lc.layer_kernels(
        lc.neox_layer_numels(args.hidden, args.intermediate or 4 * args.hidden), topo, "frontier", args.chunks
    )
    n = max(c.numel for c in lk.calls if c.phase == "grad_reduce" and c.op == "quantize")
    for bits in (8, 4):
        for k in (2, 4, args.nodes):
            st = _stacked(lc.aligned(-(-n // k), 256), k, bits, 256, dev)
            device_sync(dev)
            quant.dequantize_sum_requantize(st, bits, 256)
            device_sync(dev)
            print(f"dequantize_sum_requantize bits={bits} k={k} parts of {st.numel} elements", flush=True)


def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{1e3 * s:9.3f}"


def _print_compute(c: dict) -> None:
    print("compute (one layer, bf16)            ms")
    for key in ("forward_s", "backward_s", "forward_backward_s", "gemm_forward_s", "gemm_backward_s", "gemm_s"):
        print(f"  {key[:-2]:34s} {_ms(c[key])}")
    print(f"  GEMMs at {c['gemm_TFLOPs']:.1f} TFLOP/s", flush=True)


def _print_calls(comp: dict) -> None:
    print(
        f"\n{'phase':16s} {'tier':4s} {'op':15s} {'bits':>4s} {'dtype':>8s} {'numel':>10s} {'k':>3s} "
        f"{'calls':>5s} | {'ms/call':>9s} {'ms':>9s}"
    )
    for r in comp["calls"]:
        print(
            f"{r['phase']:16s} {r['tier']:4s} {r['op']:15s} {r['bits']:4d} {r['dtype'][:8]:>8s} {r['numel']:10d} "
            f"{r['parts']:3d} {r['calls']:5d} | {_ms(r['seconds_per_call'])} {_ms(r['seconds'])}"
        )
    for phase, s in comp["per_phase_s"].items():
        print(f"  {phase:24s} {_ms(s)} ms")
    print(f"  {'total per layer per step':24s} {_ms(comp['total_s'])} ms", flush=True)


def _print_kernels(rows: list[dict]) -> None:
    print(f"\n{'op (bf16)':34s} {'bits':>4s} {'numel':>10s} | {'ms':>9s} {'GB/s':>8s} {'% copy':>7s}")
    for r in rows:
        print(
            f"{r['op']:34s} {r['bits']:4d} {r['numel']:10d} | {_ms(r['op_s'])} {r['op_GBps']:8.1f} "
            f"{r['pct_of_copy']:6.0f}%",
            flush=True,
        )


def _print_summary(result: dict) -> None:
    r, mi, pl = result["ratios"], result["mi250x"], result["planner"]

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{100 * v:.1f}%"

    print(f"\non {result['machine']['device']} (kernels {result['machine']['kernels']}):")
    print(
        f"  compression / forward+backward {pct(r['compression_over_forward_backward'])}, "
        f"/ GEMMs {pct(r['compression_over_gemm'])}"
    )

    def factor(v: float | None) -> str:
        return "n/a" if v is None else f"x{v:.3g}"

    print(
        f"  scaled to an MI250X GCD (kernels {factor(mi['kernel_factor'])} by HBM, compute "
        f"{factor(mi['gemm_factor'])} by bf16 peak): compression / forward+backward "
        f"{pct(mi['compression_over_forward_backward'])}, / GEMMs {pct(mi['compression_over_gemm'])}"
    )
    rate_mi = pl["quant_rate_mi250x"]
    print(
        f"  planner quant_rate: {pl['quant_rate_here']:.3g} elements/s here, "
        f"{'n/a' if rate_mi is None else f'{rate_mi:.3g}'} scaled to an MI250X GCD (Frontier assumes "
        f"{pl['quant_rate_frontier_now']:.0e})"
    )
    if pl["line"]:
        print(f"  {pl['line']}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--hidden", type=int, default=6144)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--nodes", type=int, default=48)
    # frontier on RCCL runs in the tick mode (every hop spans one tier), whose default is this
    p.add_argument(
        "--chunks", type=int, default=DEFAULT_TICK_CHUNKS, help="pipeline.chunks of the gathers and gradient buckets"
    )
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="only the fused requantize, once per case (for ncu)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "gpu_layer_cost.json"))
    args = p.parse_args(argv)
    if args.profile:
        profile(args)
        return
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, result, indent=2)
    _print_summary(result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
