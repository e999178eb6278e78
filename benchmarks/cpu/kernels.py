"""Throughput of the CPU quantization kernels beside the PyTorch reference and a memory copy.

    python -m benchmarks.cpu.kernels [--sizes 1M,4M,16M,64M] [--block-size 256] [--parts 4]
                                 [--dtype float32] [--rotations 32,128]
                                 [--out benchmarks/results/kernels.json]

For each size n and for int8 and int4 it times, in one process:
- quantize (x [n] -> payload), dequantize (payload -> [n] fp32),
  dequantize_sum (k payloads -> [n] fp32 sum), dequantize_sum_requantize (k payloads -> payload),
  with the compiled CPU kernels (zeropp_hier._C) and with zeropp_hier.quant.reference;
- ``y.copy_(x)`` of the fp32 [n] buffer, right before each op, as the memory-bandwidth yardstick;
- quantize and dequantize with the block rotation ([Note: block rotation]) for each R of
  ``--rotations``; and under "rotation_cost", the compiled quantize/dequantize with each R
  against the same op without rotation, per element, timed apart from the table: one thread,
  its CPU time (time.thread_time), the two calls alternating, minimum over --reps * 5 pairs, so
  that other processes on a shared machine move the ratio as little as possible.

Columns:
- "in GB/s": bytes of the op's input per second (the fp32/bf16/fp16 tensor for quantize; data +
  scales of every payload otherwise);
- "x ref": reference time / kernel time;
- "% copy": elements handled per second relative to copy_'s elements per second on the same n,
  i.e. the kernel's full-precision bytes (4 B x n, or x k*n for the sums) per second against
  copy_'s. 100% means the kernel runs through its fp32 side as fast as copy_ moves it.
Times are the minimum over repetitions (the machine is shared; the minimum is the least noisy).

Outputs are allocated on every call. glibc hands buffers over 32 MB back to the OS on free, so
each call would also pay page faults on fresh memory, which copy_ into a preallocated buffer
does not; on a GPU the caching allocator hides them. To compare like with like the benchmark
re-executes itself with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ set so freed memory is
reused (``--cold-alloc`` keeps glibc's defaults instead).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks.tables.provenance import run_meta
from zeropp_hier.files import write_json_atomic

_WARM_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 34), "MALLOC_TRIM_THRESHOLD_": str(1 << 34)}


def _parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def _best_time(fn, reps: int, budget_s: float) -> float:
    """Minimum wall time of fn over up to reps calls (at least 1, stops after budget_s)."""
    best, spent = float("inf"), 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
        if spent > budget_s:
            break
    return best


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def run(args) -> dict:
    import torch

    from zeropp_hier import quant
    from zeropp_hier.quant import reference

    if quant.backend("cpu") != "cpu-ext":
        raise SystemExit(
            "benchmarks/cpu/kernels.py: the compiled CPU kernels are not available; "
            "build them with `pip install --no-build-isolation -e .`"
        )
    dtype = getattr(torch, args.dtype)
    B, K = args.block_size, args.parts
    load_before = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    rows = []
    for n in args.sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
        src = torch.randn(n)
        dst = torch.empty_like(src)
        copy_times = []

        def timed(fn, reps):
            # copy_ right before each op, so both see the same machine state
            copy_times.append(_best_time(lambda: dst.copy_(src), 5, 1.0))
            fn()  # warm-up (first-touch, thread pool)
            return _best_time(fn, reps, args.budget)

        for bits in (8, 4):
            q = quant.quantize(x, bits, B)
            payload = q.nbytes()
            stacked = quant.Quantized(torch.stack([q.data] * K), torch.stack([q.scales] * K), n, bits, B)
            parts = [quant.Quantized(stacked.data[j], stacked.scales[j], n, bits, B) for j in range(K)]
            cases = [
                (
                    "quantize",
                    n * x.element_size(),
                    n,
                    lambda: quant.quantize(x, bits, B),
                    lambda: reference.quantize(x, bits, B),
                ),
                ("dequantize", payload, n, lambda: quant.dequantize(q), lambda: reference.dequantize(q)),
                (
                    f"dequantize_sum(k={K})",
                    K * payload,
                    K * n,
                    lambda: quant.dequantize_sum(stacked),
                    lambda: reference.dequantize_sum(parts),
                ),
                (
                    f"dequantize_sum_requantize(k={K})",
                    K * payload,
                    K * n,
                    lambda: quant.dequantize_sum_requantize(stacked, bits, B),
                    lambda: reference.dequantize_sum_requantize(parts, bits, B),
                ),
            ]
            for r in args.rotations:
                qr = quant.quantize(x, bits, B, r)
                cases += [
                    (
                        f"quantize(rotate={r})",
                        n * x.element_size(),
                        n,
                        lambda r=r: quant.quantize(x, bits, B, r),
                        lambda r=r: reference.quantize(x, bits, B, r),
                    ),
                    (
                        f"dequantize(rotate={r})",
                        payload,
                        n,
                        lambda r=r, qr=qr: quant.dequantize(qr, torch.float32, r),
                        lambda r=r, qr=qr: reference.dequantize(qr, torch.float32, r),
                    ),
                ]
            for name, in_bytes, elems, ext_fn, ref_fn in cases:
                t_ext = timed(ext_fn, args.reps)
                t_ref = timed(ref_fn, args.ref_reps)
                t_copy = min(copy_times[-2:])
                rows.append(
                    {
                        "op": name,
                        "bits": bits,
                        "numel": n,
                        "input_bytes": in_bytes,
                        "ext_s": t_ext,
                        "ref_s": t_ref,
                        "copy_s": t_copy,
                        "ext_in_GBps": in_bytes / t_ext / 1e9,
                        "ref_in_GBps": in_bytes / t_ref / 1e9,
                        "copy_GBps": n * 4 / t_copy / 1e9,
                        "speedup_vs_ref": t_ref / t_ext,
                        "pct_of_copy": 100.0 * (elems / t_ext) / (n / t_copy),
                    }
                )
                _print_row(rows[-1])
    rotation_cost = _rotation_cost(args, dtype)
    for c in rotation_cost:
        print(
            f"{c['op']:10s} int{c['bits']} {c['numel'] >> 20}M R={c['rotate']:<4d} "
            f"{c['plain_ns_per_elem']:.3f} -> {c['rotated_ns_per_elem']:.3f} ns/element: x{c['ratio']:.2f}"
        )
    return {
        "rotation_cost": rotation_cost,
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpu_isa": torch.ops.zeropp_hier.cpu_isa(),
            "load_average_1min": [load_before, os.getloadavg()[0]],
            "allocator": "cold (glibc defaults)"
            if args.cold_alloc
            else "warm (MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ raised)",
        },
        "config": {
            "input_dtype": args.dtype,
            "block_size": B,
            "parts": K,
            "reps": args.reps,
            "ref_reps": args.ref_reps,
            "timing": "min over reps",
        },
        "definitions": {
            "ext_in_GBps": "op input bytes per second (x for quantize; data+scales of every payload otherwise)",
            "pct_of_copy": "elements per second (n, or k*n for the sums) relative to "
            "torch.Tensor.copy_ of the fp32 [n] buffer, measured in the same run",
            "speedup_vs_ref": "reference time / kernel time",
        },
        "rows": rows,
    }


def _rotation_cost(args, dtype) -> list[dict]:
    """Rotated quantize/dequantize against the same op without rotation, in one thread's CPU
    time, the pair alternating (see the module docstring)."""
    import torch

    from zeropp_hier import quant

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # also the kernels' OpenMP team of this thread
    out = []
    try:
        n = min(args.sizes)
        x = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(dtype)
        B = args.block_size
        for bits in (8, 4):
            for r in args.rotations:
                q0, qr = quant.quantize(x, bits, B), quant.quantize(x, bits, B, r)
                pairs = {
                    "quantize": (lambda: quant.quantize(x, bits, B), lambda r=r: quant.quantize(x, bits, B, r)),
                    "dequantize": (lambda: quant.dequantize(q0), lambda r=r, qr=qr: quant.dequantize(qr, rotate=r)),
                }
                for op, (plain, rotated) in pairs.items():
                    t0, t1 = _best_pair(plain, rotated, 5 * args.reps)
                    out.append(
                        {
                            "op": op,
                            "bits": bits,
                            "numel": n,
                            "rotate": r,
                            "plain_ns_per_elem": t0 / n * 1e9,
                            "rotated_ns_per_elem": t1 / n * 1e9,
                            "ratio": t1 / t0,
                            "timing": "1 thread, thread CPU time, min over alternating pairs",
                        }
                    )
    finally:
        torch.set_num_threads(threads)
    return out


def _best_pair(f0, f1, reps: int) -> tuple[float, float]:
    f0(), f1()  # warm-up
    b0 = b1 = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        f0()
        t1 = time.thread_time()
        f1()
        t2 = time.thread_time()
        b0, b1 = min(b0, t1 - t0), min(b1, t2 - t1)
    return b0, b1


_HEADER = (
    f"{'op':34s} {'bits':>4s} {'numel':>6s} | {'ext in GB/s':>11s} {'ref in GB/s':>11s} "
    f"{'x ref':>7s} | {'copy GB/s':>9s} {'% copy':>7s}"
)


def _print_row(r: dict) -> None:
    n = r["numel"]
    size = f"{n >> 20}M" if n >= 1 << 20 else str(n)
    print(
        f"{r['op']:34s} {r['bits']:>4d} {size:>6s} | {r['ext_in_GBps']:11.2f} "
        f"{r['ref_in_GBps']:11.3f} {r['speedup_vs_ref']:7.1f} | {r['copy_GBps']:9.2f} "
        f"{r['pct_of_copy']:6.0f}%",
        flush=True,
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1M,4M,16M,64M", type=lambda s: [_parse_size(v) for v in s.split(",")])
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--rotations",
        default="32,128",
        type=lambda s: [int(v) for v in s.split(",") if v],
        help="rotation sizes R to time quantize/dequantize with ('' for none)",
    )
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ref-reps", type=int, default=5)
    p.add_argument("--budget", type=float, default=3.0, help="seconds per measurement, at most")
    p.add_argument("--cold-alloc", action="store_true")
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "kernels.json"))
    args = p.parse_args(argv)
    if not args.cold_alloc and any(os.environ.get(k) != v for k, v in _WARM_ENV.items()):
        # glibc reads these at start-up only: re-execute with them set.
        again = ["-m", __spec__.name] if __spec__ else [sys.argv[0]]  # as it was started
        os.execve(sys.executable, [sys.executable, *again, *sys.argv[1:]], {**os.environ, **_WARM_ENV})
    print(_HEADER)
    print("-" * len(_HEADER))
    result = run(args)
    result = {"meta": run_meta({**result["machine"], **result["config"]}), **result}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, result, indent=2)
    m = result["machine"]
    print(
        f"\n{m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
        f"CPU kernels: {m['cpu_isa']}, allocator: {m['allocator']}, load average "
        f"{m['load_average_1min'][0]:.1f} -> {m['load_average_1min'][1]:.1f}\nwrote {out}"
    )


if __name__ == "__main__":
    main()
