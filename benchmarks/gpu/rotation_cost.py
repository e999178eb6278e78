"""What the block rotation ([Note: GPU block rotation]) costs on the GPU beside plain quantization:
quantize and dequantize of one tensor with rotation size R (0: none), through the public API on
CUDA tensors, timed as ``benchmarks.gpu.kernels`` times its ops (CUDA events of back-to-back calls
after a warm-up, the median over runs).

    python -m benchmarks.gpu.rotation_cost [--size 64M] [--block-size 256] [--rotations 0,32,256]
                                           [--out benchmarks/results/gpu_rotation_cost.json]

Per bits (8, 4) and R: milliseconds per call and the ratio to R = 0 ("x plain"). ``--device cpu``
runs the same on the CPU kernels (a check of the script, not a GPU figure).
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from zeropp_hier.files import write_json_atomic

from ..cpu.kernels import _parse_size
from ..tables.provenance import run_meta
from .kernels import time_fn


def measure(n: int, block: int, rotations: list[int], dev_name: str, iters: int, reps: int) -> list[dict]:
    import torch

    from zeropp_hier import quant

    dev = torch.device(dev_name)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(n, generator=g, dtype=torch.float32).to(dev)
    rows = []
    for bits in (8, 4):
        plain: dict[str, float] = {}
        for r in rotations:
            q = quant.quantize(x, bits, block, rotate=r)
            t_q = time_fn(lambda: quant.quantize(x, bits, block, rotate=r), dev, iters, reps)
            t_d = time_fn(lambda: quant.dequantize(q, torch.float32, rotate=r), dev, iters, reps)
            if r == 0:
                plain = {"quantize": t_q, "dequantize": t_d}
            rows.append(
                {
                    "bits": bits,
                    "rotate": r,
                    "quantize_ms": t_q * 1e3,
                    "dequantize_ms": t_d * 1e3,
                    "quantize_x_plain": t_q / plain["quantize"] if plain else None,
                    "dequantize_x_plain": t_d / plain["dequantize"] if plain else None,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--rotations", default="0,32,256", help="comma-separated; 0 (none) first")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/gpu_rotation_cost.json")
    args = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(args)
    import torch

    rotations = [int(r) for r in a.rotations.split(",")]
    if rotations[0] != 0:
        ap.error(f"--rotations must start with 0 (the plain kernels the ratios are to); got {a.rotations}")
    n = _parse_size(a.size)
    rows = measure(n, a.block_size, rotations, a.device, a.iters, a.reps)
    device = torch.cuda.get_device_name(0) if a.device == "cuda" else platform.processor() or "cpu"
    for r in rows:
        print(
            f"int{r['bits']} R={r['rotate']:>4}: quantize {r['quantize_ms']:.3f} ms (x{r['quantize_x_plain']:.2f}), "
            f"dequantize {r['dequantize_ms']:.3f} ms (x{r['dequantize_x_plain']:.2f})"
        )
    doc = {
        "device": device,
        "n": n,
        "block_size": a.block_size,
        "rows": rows,
        "meta": run_meta({"command": " ".join(["python -m benchmarks.gpu.rotation_cost", *args]), "device": device}),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(a.out, doc, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
