"""The dry run on a GPU: rank 0 of the job at 48 and 9,408 nodes x 4 x 2 with its engine on the
device, reporting the device memory the rank's caching allocator handed out beside what the
engine holds by part and the planner's memory table for the same job.

    python -m benchmarks.gpu.dryrun --out gpu_dryrun.json [--runs presets neox20b_4 neox20b]

Runs (each ``zeropp-hier train ... dryrun.nodes=N`` through the dry run's own entry, in a process
of its own, so that each peak is its own; several at once, ``--jobs``):

- ``presets``: ``frontier``, ``zeropp`` and ``zero3`` on the hand-written GPT of 3.24M parameters
  (docs/usage.md's dry-run table, ``benchmarks/cpu/dryrun_presets.py``), 6 steps;
- ``neox20b_4``: the GPT-NeoX-20B recipe at its width, sequence and micro-batch, 4 of its 44
  blocks, 2 steps;
- ``neox20b``: the recipe unshortened (44 blocks), 2 steps.

The 20B runs keep ``memory_gb=64`` (a MI250X GCD's budget, which the job's check holds the
layout to) and take ``global_batch=null`` where 1536 sequences do not split over the world
(``benchmarks/cpu/dryrun_20b.py``). A run that fails or outlasts ``--timeout`` is recorded with
the end of its log. The device is whatever GPU torch sees; a CUDA GPU is not a MI250X: the
memory is the job's by the caching allocator of this torch, the host seconds this host's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.cpu import dryrun_20b, dryrun_presets
from zeropp_hier.files import write_json_atomic

ROOT = dryrun_presets.ROOT
RUNS = ("presets", "neox20b_4", "neox20b")


def commands(runs: list[str], nodes: list[int]) -> dict[str, list[str]]:
    """Each run's name and its job overrides (the dry run's ``dryrun.*`` among them), the longest
    first (the pool starts them in this order)."""
    out: dict[str, list[str]] = {}
    for name, layers in (("neox20b", None), ("neox20b_4", 4)):
        for n in nodes if name in runs else ():
            ovr, _ = dryrun_20b.overrides(n, layers, None)
            out[f"{name}_{n}"] = [*ovr, f"dryrun.nodes={n}", "dryrun.steps=2"]
    for preset in dryrun_presets.PRESETS if "presets" in runs else ():
        for n in nodes:
            out[f"{preset}_{n}"] = dryrun_presets.command(preset, n)
    return out


def run_one(overrides: list[str], timeout: float) -> dict:
    """One dry run in a child process: its report, or the end of its log where it failed."""
    with tempfile.TemporaryDirectory(prefix="gpu_dryrun_") as tmp:
        report = os.path.join(tmp, "dryrun.json")
        argv, env = dryrun_presets.child(overrides, report, threads=2)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
            rc, log = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, log = None, f"{(e.stdout or b'')!r:.4000}\n{(e.stderr or b'')!r:.4000}\ntimed out after {timeout} s"
        wall = round(time.perf_counter() - t0, 1)
        out: dict = {"command": "zeropp-hier train " + " ".join(overrides), "wall_s": wall, "rc": rc}
        if rc == 0 and os.path.exists(report):
            with open(report) as f:
                out["report"] = json.load(f)
        else:
            out["log_tail"] = log[-6000:]
        return out


def summary(name: str, r: dict) -> str:
    """One line per run for the log."""
    rep = r.get("report")
    if rep is None:
        return f"{name}: FAILED (rc {r['rc']}, {r['wall_s']} s): {r.get('log_tail', '')[-600:]}"
    m, s = rep["memory"], rep["per_step"]
    held = sum((m.get("engine_memory") or {}).values())
    planner = {k: v.get("total") for k, v in (m.get("planner_memory") or {}).items()}
    gb = 1e9
    dev = m.get("device_peak_allocated_bytes")
    res = m.get("device_peak_reserved_bytes")
    return (
        f"{name}: {rep.get('device')}; device peak allocated {dev / gb if dev else 0:.3f} GB, reserved "
        f"{res / gb if res else 0:.3f} GB, in a step {(s.get('device_peak_bytes') or 0) / gb:.3f} GB; engine holds "
        f"{held / gb:.3f} GB; planner total {', '.join(f'{k} {v / gb:.3f} GB' for k, v in planner.items() if v)}; "
        f"host s/step {s['host_seconds']:.3f}; peak RSS {m['peak_rss_bytes'] / 2**30:.2f} GiB; {r['wall_s']} s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    ap.add_argument("--nodes", nargs="+", type=int, default=list(dryrun_presets.NODES))
    ap.add_argument("--jobs", type=int, default=4, help="dry runs at once (each its own process)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per dry run")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gpu_dryrun.json"))
    a = ap.parse_args(argv)
    todo = commands(a.runs, a.nodes)
    results: dict[str, dict] = {}
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = {pool.submit(run_one, ovr, a.timeout): name for name, ovr in todo.items()}
        for fut in concurrent.futures.as_completed(futures):
            name = futures[fut]
            results[name] = fut.result()
            print(summary(name, results[name]), flush=True)
            # written after each run: a call cut short keeps what finished
            write_json_atomic(a.out, {"runs": results, "jobs": a.jobs}, indent=1, default=str)
    print(f"wrote {a.out}; {len(results)} runs in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0 if all(r.get("report") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
