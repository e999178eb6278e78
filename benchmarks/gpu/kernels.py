"""Throughput of the GPU quantization kernels beside a device-to-device copy, on one GPU.

    python -m benchmarks.gpu.kernels [--sizes 16M,64M,256M] [--block-size 256] [--parts 4]
                                     [--dtypes float32,bfloat16] [--out benchmarks/results/gpu_kernels.json]

For each size n, input dtype, and int8/int4 it times quantize (x [n] -> payload), dequantize
(payload -> [n] in the input dtype), dequantize_sum (k payloads -> [n]) and
dequantize_sum_requantize (k payloads -> payload), through the public API on CUDA tensors.

Bandwidth is what a memory-bound kernel can be judged by: bytes read + bytes written per second.
The yardstick is ``dst.copy_(src)`` moving as many bytes (read + written) as the op does, timed
the same way right before it. "% copy" = op bandwidth / copy bandwidth; the target is >= 70% at
n >= 64M. Times are CUDA-event times of ``--iters`` back-to-back calls (after a warm-up), the
median over ``--reps`` such runs; outputs come from torch's caching allocator as in training.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

from zeropp_hier.files import write_json_atomic

from ..cpu.kernels import _parse_size


def device_sync(dev) -> None:
    """Wait for everything queued on ``dev`` (nothing to wait for on a CPU)."""
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_fn(fn: Callable[[], object], dev, iters: int, reps: int) -> float:
    """Median seconds per call of ``fn`` over ``reps`` runs of ``iters`` back-to-back calls, after
    one warm-up: CUDA events around the calls on a GPU (the host only queues them), the host
    clock on a CPU (a call has finished when it returns)."""
    import torch

    fn()
    device_sync(dev)
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def payload_bytes(n: int, bits: int, block: int) -> int:
    """Bytes of the encoding of ``n`` elements: whole blocks of codes and one fp32 scale each."""
    nblocks = -(-n // block)
    return nblocks * block * bits // 8 + 4 * nblocks


def measure_ops(x, bits: int, block: int, sums: Sequence[tuple[int, int]], dev, iters: int, reps: int) -> list[dict]:
    """Rows for quantize and dequantize of ``x`` and, for each ``(k, m)`` of ``sums``,
    dequantize_sum and dequantize_sum_requantize of k stacked payloads of m elements (an
    all-to-all receive buffer), each timed beside ``dst.copy_(src)`` moving as many bytes (read +
    written) right before it."""
    import torch

    from zeropp_hier import quant

    n, dtype = x.numel(), x.dtype
    es = x.element_size()
    q = quant.quantize(x, bits, block)
    cases: list[tuple[str, int, int, int, int, Callable[[], object]]] = [
        ("quantize", 1, n, n * es, payload_bytes(n, bits, block), lambda: quant.quantize(x, bits, block)),
        ("dequantize", 1, n, payload_bytes(n, bits, block), n * es, lambda: quant.dequantize(q, dtype)),
    ]
    for k, m in sums:
        part = quant.quantize(x[:m] if m <= n else torch.randn(m, device=dev).to(dtype), bits, block)
        st = quant.Quantized(
            part.data.unsqueeze(0).repeat(k, 1), part.scales.unsqueeze(0).repeat(k, 1), m, bits, block
        )
        pb = payload_bytes(m, bits, block)
        cases.append(
            (f"dequantize_sum(k={k})", k, m, k * pb, m * es, functools.partial(quant.dequantize_sum, st, dtype))
        )
        cases.append(
            (
                f"dequantize_sum_requantize(k={k})",
                k,
                m,
                k * pb,
                pb,
                functools.partial(quant.dequantize_sum_requantize, st, bits, block),
            )
        )
    rows = []
    for name, k, m, read, written, fn in cases:
        half = max((read + written) // 2, 1)  # the copy moves as many bytes as the op, half each way
        src = torch.empty(half, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        t_copy = time_fn(lambda: dst.copy_(src), dev, iters, reps)
        t_op = time_fn(fn, dev, iters, reps)
        bw, cbw = (read + written) / t_op / 1e9, 2 * half / t_copy / 1e9
        rows.append(
            {
                "op": name,
                "dtype": str(dtype).removeprefix("torch."),
                "bits": bits,
                "parts": k,
                "numel": m,
                "read_bytes": read,
                "written_bytes": written,
                "op_s": t_op,
                "copy_s": t_copy,
                "op_GBps": bw,
                "copy_GBps": cbw,
                "pct_of_copy": 100.0 * bw / cbw,
                "elems_per_s": k * m / t_op,
            }
        )
    return rows


def run(args) -> dict:
    import torch

    from zeropp_hier import quant

    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu/kernels.py: no GPU visible to torch")
    if quant.backend("cuda") not in ("cuda", "hip"):
        raise SystemExit("benchmarks/gpu/kernels.py: the GPU kernels are not built (zeropp_hier._C without GPU code)")
    dev = torch.device("cuda")
    B, K = args.block_size, args.parts
    rows = []
    # one scratch pair for the copy yardstick, as large as the largest op's traffic
    for n in args.sizes:
        for dname in args.dtypes:
            x = torch.randn(n, device=dev).to(getattr(torch, dname))
            for bits in (8, 4):
                for row in measure_ops(x, bits, B, [(K, n)], dev, args.iters, args.reps):
                    rows.append(row)
                    _print_row(row)
            torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(dev)
    return {
        "machine": {
            "device": torch.cuda.get_device_name(dev),
            "multiprocessors": props.multi_processor_count,
            "memory_GiB": props.total_memory / 2**30,
            "driver": _driver(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None),
            "kernels": quant.backend(dev),
        },
        "config": {"block_size": B, "parts": K, "iters": args.iters, "reps": args.reps, "timing": "median"},
        "definitions": {
            "op_GBps": "(bytes read + bytes written) / time",
            "copy_GBps": "(bytes read + bytes written) / time of dst.copy_(src) moving the same total",
            "pct_of_copy": "op_GBps / copy_GBps",
        },
        "rows": rows,
    }


def _driver() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


_HEADER = f"{'op':34s} {'dtype':>8s} {'bits':>4s} {'numel':>6s} | {'GB/s':>8s} {'copy GB/s':>9s} {'% copy':>7s}"


def _print_row(r: dict) -> None:
    n = r["numel"]
    size = f"{n >> 20}M" if n >= 1 << 20 else str(n)
    print(
        f"{r['op']:34s} {r['dtype']:>8s} {r['bits']:>4d} {size:>6s} | {r['op_GBps']:8.0f} "
        f"{r['copy_GBps']:9.0f} {r['pct_of_copy']:6.0f}%",
        flush=True,
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16M,64M,256M", type=lambda s: [_parse_size(v) for v in s.split(",")])
    p.add_argument("--dtypes", default="float32,bfloat16", type=lambda s: s.split(","))
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "gpu_kernels.json"))
    args = p.parse_args(argv)
    print(_HEADER)
    print("-" * len(_HEADER))
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, result, indent=2)
    m = result["machine"]
    print(f"\n{m['device']} (driver {m['driver']}), torch {m['torch']}, kernels: {m['kernels']}\nwrote {out}")
    low = [r for r in result["rows"] if r["numel"] >= 64 << 20 and r["pct_of_copy"] < 70]
    print(f"rows at >= 64M elements below 70% of copy bandwidth: {len(low)}")


if __name__ == "__main__":
    main()
