"""The block rotation's CPU cost in instructions, independent of the machine's load.

    python -m benchmarks.cpu.rotation_instructions [--isa avx2] [--rotations 32,128]
        [--numel 262144] [--block-size 256] [--out benchmarks/results/rotation_instructions.json]

Runs one process under valgrind's callgrind (``apt-get install -y valgrind``) that calls the
compiled CPU kernels' quantize and dequantize (fp32, one thread) without rotation and with each
R of ``--rotations``, int8 and int4, and counts the instructions executed inside the kernels'
block loops only (``--toggle-collect`` on ``*quantize_blocks*``; the process asks for a dump
after each call). The ratio
rotated / plain per element is the rotation's cost in instructions ([Note: CPU rotation layout]).

Instructions are not time (a shuffle and an add count alike; memory stalls count nothing), but
they do not move with other processes, which the timed ratios of ``benchmarks.cpu.kernels`` on a
shared machine do. Valgrind has no AVX-512: under it the CPU reports at most AVX2, so ``--isa``
is ``avx2`` or ``default`` (ZEROPP_HIER_CPU_ISA, see quant_cpu.cpp).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.tables.provenance import run_meta
from zeropp_hier.files import write_json_atomic

_OPS = ("quantize", "dequantize")


def _calls(rotations: list[int]) -> list[tuple[str, int, int]]:
    """(op, bits, R) of each measured call, in the order the child makes them (R 0: plain)."""
    return [(op, bits, r) for bits in (8, 4) for op in _OPS for r in (0, *rotations)]


def _child(args) -> None:
    import torch

    from zeropp_hier import quant

    def dump() -> None:  # one profile per kernel call: callgrind zeroes its counts after a dump
        subprocess.run(["callgrind_control", "-d", str(os.getpid())], check=True, stdout=subprocess.DEVNULL)

    torch.set_num_threads(1)
    x = torch.randn(args.numel, generator=torch.Generator().manual_seed(1))
    B = args.block_size
    for bits in (8, 4):
        qs = []
        for r in (0, *args.rotations):
            qs.append(quant.quantize(x, bits, B, r))
            dump()
        for r, q in zip((0, *args.rotations), qs):
            quant.dequantize(q, torch.float32, r)
            dump()


def _instructions(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        m = re.match(r"(?:summary|totals):\s+(\d+)", line)
        if m:
            return int(m.group(1))
    raise RuntimeError(f"{dump}: no summary line")


def run(args) -> dict:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is missing: apt-get install -y valgrind")
    calls = _calls(args.rotations)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            valgrind,
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "--toggle-collect=*quantize_blocks*",
            "--collect-atstart=no",
            sys.executable,
            "-m",
            __spec__.name if __spec__ else "benchmarks.cpu.rotation_instructions",
            "--child",
            "--rotations",
            ",".join(map(str, args.rotations)),
            "--numel",
            str(args.numel),
            "--block-size",
            str(args.block_size),
        ]
        env = {**os.environ, "ZEROPP_HIER_CPU_ISA": args.isa, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        dumps = sorted(Path(tmp).glob("callgrind.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
        counts = [_instructions(d) for d in dumps]
    if len(counts) != len(calls):
        raise RuntimeError(f"expected {len(calls)} kernel calls under callgrind, got {len(counts)}")
    per_elem = {c: n / args.numel for c, n in zip(calls, counts)}
    rows = []
    for op, bits, r in calls:
        if r:
            plain, rotated = per_elem[(op, bits, 0)], per_elem[(op, bits, r)]
            rows.append(
                {
                    "op": op,
                    "bits": bits,
                    "rotate": r,
                    "plain_instr_per_elem": round(plain, 3),
                    "rotated_instr_per_elem": round(rotated, 3),
                    "ratio": round(rotated / plain, 3),
                }
            )
    return {
        "isa": args.isa,
        "config": {"numel": args.numel, "block_size": args.block_size, "input_dtype": "float32", "threads": 1},
        "definitions": {
            "instr_per_elem": "instructions executed inside the kernel's block loop (callgrind), per element",
            "ratio": "rotated / plain",
        },
        "rows": rows,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--isa", default="avx2", choices=["avx2", "default"])
    p.add_argument("--rotations", default="32,128", type=lambda s: [int(v) for v in s.split(",") if v])
    p.add_argument("--numel", type=int, default=1 << 18)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--out", default=str(Path(__file__).resolve().parents[1] / "results" / "rotation_instructions.json")
    )
    args = p.parse_args(argv)
    if args.child:
        _child(args)
        return
    result = run(args)
    for r in result["rows"]:
        print(
            f"{args.isa} {r['op']:10s} int{r['bits']} R={r['rotate']:<4d} {r['plain_instr_per_elem']:.2f} -> "
            f"{r['rotated_instr_per_elem']:.2f} instructions/element: x{r['ratio']:.3f}"
        )
    conditions = {"isa": args.isa, "tool": "valgrind callgrind", **result["config"]}
    result = {"meta": run_meta(conditions), **result}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, result, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
