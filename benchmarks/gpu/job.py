"""The real job on one GPU: the main job (``python -m zeropp_hier train``) at world size 1 with
ZeRO-3, our engine's exact ZeRO-3 (``preset=zero3 compression=none``) beside stock DeepSpeed
ZeRO-3 (``preset=stock``), same seed, same steps, each in a process of its own so that each has
the whole GPU. Target: our per-step overhead at world size 1 within 3% of stock.

    python -m benchmarks.gpu.job [--device cuda] [--size auto] [--steps 12] [--warmup 4]
        [--timeout 300] [--repeats 1] [--out benchmarks/results/gpu_job.json] [--work DIR]
    python -m benchmarks.gpu.job --device cpu     # the same path on CPU (gloo), the tiny model

Settings: the GPU recipe (``recipe=neox1_4b``: bf16, activation checkpointing per block with
torch's checkpoint, DeepSpeed's prefetch on with one block per bucket, AdamW, clipping, cosine
schedule), synthetic data (``data.micro_batch`` 4 sequences of 2048 tokens per step), one rank on
NCCL started torchrun-style (RANK/WORLD_SIZE set), as ``scripts/gpu/check.sh`` starts the job.

Size (``--size auto``): the largest GPT-NeoX in a shape Pythia published (Biderman et al. 2023,
"Pythia: A Suite for Analyzing Large Language Models Across Training and Scaling", Table 1:
layers x model dimension, heads; MLP 4 x dimension, rotary on 25% of each head, parallel
residual, 2048 tokens; the vocabulary as released: 50304 as model=neox_1_4b has it, 50432 for 6.9B
and 50688 for 12B, which give Table 1's parameter counts exactly) whose memory per
rank by the job's own memory check (``app/memory_check.need_bytes``: the planner's model at world
1, both configurations) fits within ``1 - margin`` of the device's memory budget
(``memory_check.device_budget``: 80 GB on an H100, what torch reports on others). The margin (25%
by default) covers what the planner's model leaves out: the output logits in fp32 for the loss
and their gradient (about 5 GB at 8192 tokens and vocabulary 50304), the recomputed block's
activations, the optimizer's temporaries and the allocator's fragmentation. On an H100 this is
Pythia-2.8B (48 GB by the check); the 6.9B needs 117 GB.

Timing: each step's seconds as the job records them (``metrics.jsonl``: host time of the step,
which ends with the loss read back, so the device's work is in it); the first ``--warmup`` steps
are left out (allocations, NCCL's first calls, kernel selection). Per configuration: mean step
time over the timed steps, tokens/s, model TFLOP/s per GCD and MFU from it ([Note: model FLOPs]
in zeropp_hier/app/model/flops.py; MFU against the device's dense bf16 peak), the peak memory the job
records. Then ours/stock per metric, the overhead per step (ours / stock - 1) against the 3%
target, and the largest relative difference of the per-step losses (the exact preset is expected
to give stock's numbers; the tolerance is the repo's parity tests': 1e-5 in fp32, 2e-2 in bf16).
``--repeats`` N runs the pair N times in alternating order (stock first, then ours first, ...)
and pools the timed steps. Writes the JSON and prints a table; exits 1 when a run failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

from zeropp_hier.app.model import flops
from zeropp_hier.app.spec import n_params
from zeropp_hier.app.train import spec_from_overrides
from zeropp_hier.files import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]
GB = 1e9
TARGET = 0.03  # our per-step overhead at world size 1, as a share of stock's step
MARGIN = 0.25  # of the device's memory left free by the size choice (see the docstring)
# the repo's parity tolerances (per-step losses, relative): tests/dist/test_parity.py (fp32),
# tests/dist/test_dtypes.py (bf16: stock sums the reduce-scatter in bf16, we in fp32)
LOSS_RTOL = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 5e-3}
RECIPE = "neox1_4b"


class Shape(NamedTuple):
    layers: int
    hidden: int
    heads: int
    vocab: int = 50304  # model=neox_1_4b's: Pythia's tokenizer padded to a multiple of 128


# Pythia (Biderman et al. 2023, Table 1): name -> layers, model dimension, heads; the two largest
# were released with larger vocabulary paddings, which Table 1's parameter counts include
PYTHIA: dict[str, Shape] = {
    "70m": Shape(6, 512, 8),
    "160m": Shape(12, 768, 12),
    "410m": Shape(24, 1024, 16),
    "1b": Shape(16, 2048, 8),
    "1.4b": Shape(24, 2048, 16),
    "2.8b": Shape(32, 2560, 32),
    "6.9b": Shape(32, 4096, 32, 50432),
    "12b": Shape(36, 5120, 40, 50688),
}
TINY = "tiny"  # the repo's model=tiny: the CPU mode's size
# configuration -> its Hydra overrides: stock DeepSpeed ZeRO-3, and our engine's exact ZeRO-3
CONFIGS: dict[str, tuple[str, ...]] = {
    "stock": ("preset=stock", "compression=none"),
    "ours": ("preset=zero3", "compression=none"),
}


# -- pure: sizes, overrides, metrics, comparison ------------------------------------------------


def model_overrides(size: str) -> list[str]:
    """Hydra overrides that give the job the model ``size`` (a PYTHIA name, or ``tiny``)."""
    if size == TINY:
        return ["model=tiny"]
    s = PYTHIA[size]
    return [
        "model=neox_1_4b",  # Pythia's other settings: 2048 tokens, rotary 25%, parallel residual
        f"model.layers={s.layers}",
        f"model.hidden={s.hidden}",
        f"model.heads={s.heads}",
        f"model.intermediate={4 * s.hidden}",
        f"model.vocab_size={s.vocab}",
    ]


def job_overrides(size: str, config: str, steps: int, seed: int, run_dir: str | None = None) -> list[str]:
    """The job's command line after ``train`` for one configuration at world size 1."""
    out = [
        f"recipe={RECIPE}",
        "global_batch=null",  # one micro-batch per step: the step this compares (the recipe's 1024 sequences: 256)
        *model_overrides(size),
        *CONFIGS[config],
        f"steps={steps}",
        f"seed={seed}",
        "progress=off",
        "topology.section.gpus_per_node=1",
        "topology.section.gcds_per_gpu=1",
    ]
    if run_dir is not None:
        out += [f"hydra.run.dir={run_dir}", "hydra.output_subdir=null"]
    return out


def need_bytes(size: str, device_name: str | None, device_bytes: float | None) -> float:
    """Memory per rank the job's own check predicts for ``size`` at world size 1: the larger of
    the two configurations'."""
    from zeropp_hier.app import memory_check

    return max(
        memory_check.need_bytes(spec_from_overrides(job_overrides(size, c, 12, 0)), 1, 1, device_name, device_bytes)
        for c in CONFIGS
    )


def choose_size(needs: Mapping[str, float], params: Mapping[str, int], budget: float, margin: float) -> str | None:
    """The size with the most parameters whose need fits in ``(1 - margin) x budget``; None when
    none does."""
    fitting = [s for s, need in needs.items() if need <= (1.0 - margin) * budget]
    return max(fitting, key=lambda s: params[s]) if fitting else None


def run_metrics(rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], warmup: int) -> dict:
    """One configuration's figures from its runs' ``metrics.jsonl`` rows (pooled over repeats) and
    one ``summary.json``: the steps from ``warmup`` on are timed."""
    timed = [r["seconds"] for r in rows if r["step"] >= warmup]
    if not timed:
        raise ValueError(f"no step after the {warmup} warm-up steps: ask for more steps")
    step_s = statistics.fmean(timed)
    tps, world = summary["tokens_per_step"], summary["world"]
    tflops = flops.tflops_per_gcd(summary["flops_per_token"], tps, step_s, world)
    return {
        "timed_steps": len(timed),
        "step_s": step_s,
        "step_s_min": min(timed),
        "step_s_max": max(timed),
        "step_s_stdev": statistics.stdev(timed) if len(timed) > 1 else 0.0,
        "tokens_per_s": tps / step_s,
        "tflops_per_gcd": tflops,
        "mfu": flops.mfu(tflops, summary["peak_bf16_tflops"]),
        "peak_memory_bytes": max(summary["peak_memory_bytes_per_rank"]),
        "params": summary["params"],
        "tokens_per_step": tps,
        "device": summary["device"],
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def max_rel_diff(got: Sequence[float], ref: Sequence[float]) -> float:
    """The largest relative difference of two loss curves (inf when one is not finite or their
    lengths differ)."""
    if len(got) != len(ref) or not all(math.isfinite(x) for x in (*got, *ref)):
        return math.inf
    return max((abs(g - r) / max(abs(r), 1e-12) for g, r in zip(got, ref)), default=0.0)


RATIO_KEYS = ("step_s", "tokens_per_s", "tflops_per_gcd", "mfu", "peak_memory_bytes")


def compare(stock: Mapping[str, Any], ours: Mapping[str, Any], dtype: str, target: float = TARGET) -> dict:
    """Ours/stock per metric, the per-step overhead against ``target`` and the losses' agreement."""
    overhead = ours["step_s"] / stock["step_s"] - 1.0
    diff = max_rel_diff(ours["losses"], stock["losses"])
    rtol = LOSS_RTOL[dtype]
    return {
        "ratio_ours_over_stock": {k: _ratio(ours[k], stock[k]) for k in RATIO_KEYS},
        "overhead_per_step": overhead,
        "target": target,
        "target_met": overhead <= target,
        "loss_max_rel_diff": diff,
        "loss_rtol": rtol,
        "losses_match": diff <= rtol,
    }


def _fmt(v: Any, scale: float = 1.0, spec: str = ".4g") -> str:
    return "n/a" if v is None else format(v / scale, spec)


def table_lines(result: Mapping[str, Any]) -> list[str]:
    """The printed table: each metric for stock and ours, and ours/stock."""
    stock, ours = result["configs"]["stock"], result["configs"]["ours"]
    cmp = result["comparison"]
    ratio = cmp["ratio_ours_over_stock"]
    w = result["settings"]["warmup"]
    rows = [
        (f"step s (mean of steps {w}..)", "step_s", 1.0),
        ("tokens/s", "tokens_per_s", 1.0),
        ("model TFLOP/s per GCD", "tflops_per_gcd", 1.0),
        ("MFU", "mfu", 1.0),
        ("peak memory GB", "peak_memory_bytes", GB),
    ]
    lines = ["| metric | stock | ours | ours/stock |", "|---|---|---|---|"]
    for label, key, scale in rows:
        lines.append(f"| {label} | {_fmt(stock[key], scale)} | {_fmt(ours[key], scale)} | {_fmt(ratio[key])} |")
    lines.append(f"| final loss | {stock['losses'][-1]:.6g} | {ours['losses'][-1]:.6g} | |")
    met = "met" if cmp["target_met"] else "NOT met"
    match = "match" if cmp["losses_match"] else "DIFFER"
    lines.append(
        f"overhead per step {100 * cmp['overhead_per_step']:+.2f}% (target <= {100 * cmp['target']:g}%: {met}); "
        f"losses: max rel diff {cmp['loss_max_rel_diff']:.3g} (tolerance {cmp['loss_rtol']:g}: {match})"
    )
    return lines


# -- side effects: the device, the runs ---------------------------------------------------------

_DEVICE_PY = (
    "import json, torch; p = torch.cuda.get_device_properties(0); "
    "print(json.dumps({'name': torch.cuda.get_device_name(0), 'total_memory': p.total_memory}))"
)


def device_info(device: str) -> tuple[str | None, float | None]:
    """The GPU's name and memory, asked in a process of its own (this one must hold no CUDA
    context while the runs use the GPU); (None, None) for the CPU."""
    if device == "cpu":
        return None, None
    out = subprocess.run([sys.executable, "-c", _DEVICE_PY], capture_output=True, text=True, timeout=120, check=True)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    return info["name"], float(info["total_memory"])


def run_env(device: str, port: int) -> dict:
    """One rank, torchrun-style, of this checkout; on ``cpu`` with no GPU visible."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_SIZE", "LOCAL_WORLD_SIZE")}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
    return env


def run_job(args: list[str], run_dir: Path, device: str, timeout: float) -> dict:
    """Run the job once; its rows, summary and wall time, or the error and the log's tail."""
    from zeropp_hier.launch.ports import free_port

    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "job.log"
    cmd = [sys.executable, "-m", "zeropp_hier", "train", *args]
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"command": cmd}
    with open(log, "w") as f:
        try:
            rc = subprocess.run(
                cmd, cwd=ROOT, env=run_env(device, free_port()), stdout=f, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = None
    rec["wall_s"] = time.perf_counter() - t0
    rec["returncode"] = rc
    summary = run_dir / "summary.json"
    if rc != 0 or not summary.exists():
        rec["error"] = f"timed out after {timeout:g} s" if rc is None else f"exit {rc}"
        rec["log_tail"] = log.read_text(errors="replace")[-4000:]
        return rec
    rec["summary"] = json.loads(summary.read_text())
    rec["hier"] = "comm_stats" in rec["summary"]  # our engine ran (stock DeepSpeed's summary has none)
    rec["rows"] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    rec["step_seconds"] = [row["seconds"] for row in rec["rows"]]  # warm-up steps included: the record
    rec["losses"] = [row["loss"] for row in rec["rows"]]
    return rec


def _ladder(device_name: str | None, device_bytes: float | None, budget: float, margin: float) -> list[dict]:
    out = []
    for name in PYTHIA:
        need = need_bytes(name, device_name, device_bytes)
        m = spec_from_overrides(model_overrides(name)).model
        out.append(
            {
                "name": name,
                **PYTHIA[name]._asdict(),
                "params": n_params(m),
                "need_bytes": need,
                "fits": need <= (1.0 - margin) * budget,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument(
        "--size", default="auto", choices=("auto", TINY, *PYTHIA), help="auto: the largest that fits (cpu: tiny)"
    )
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4, help="steps left out of the timing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--margin", type=float, default=MARGIN, help="share of the device's memory the size leaves free")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each configuration, alternating the order")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_job.json"))
    ap.add_argument(
        "--work", default=None, help="run directories (job.log, metrics.jsonl, summary.json); default: temp"
    )
    a = ap.parse_args(argv)
    if a.warmup >= a.steps:
        ap.error("--warmup must leave at least one timed step (--warmup < --steps)")
    t_start = time.perf_counter()

    from zeropp_hier.app import memory_check

    name, total = device_info(a.device)
    budget, source = memory_check.device_budget(name, 1, total)
    ladder = _ladder(name, total, budget, a.margin)
    needs = {r["name"]: r["need_bytes"] for r in ladder}
    params = {r["name"]: r["params"] for r in ladder}
    chosen = choose_size(needs, params, budget, a.margin)
    size = a.size if a.size != "auto" else (TINY if a.device == "cpu" else chosen)
    if size is None:
        print(f"no Pythia size fits in {(1 - a.margin) * budget / GB:.3g} GB ({source})", flush=True)
        return 1
    print(
        f"device {name or 'cpu'}: budget {budget / GB:.3g} GB ({source}), margin {a.margin:g}; "
        f"largest Pythia size that fits: {chosen}; running {size}",
        flush=True,
    )
    spec = spec_from_overrides(job_overrides(size, "ours", a.steps, a.seed))
    work_ctx = tempfile.TemporaryDirectory(prefix="gpu_job_") if a.work is None else None
    work = Path(a.work if work_ctx is None else work_ctx.name)
    runs: list[dict] = []
    for rep in range(a.repeats):
        order = list(CONFIGS) if rep % 2 == 0 else list(reversed(CONFIGS))
        for config in order:
            run_dir = work / f"{config}_{rep}"
            rec = run_job(job_overrides(size, config, a.steps, a.seed, str(run_dir)), run_dir, a.device, a.timeout)
            rec.update(config=config, repeat=rep)
            status = rec.get("error", "ok")
            print(f"{config} (repeat {rep}): {status}, {rec['wall_s']:.1f} s wall", flush=True)
            if "error" in rec:
                print(rec["log_tail"][-2000:], flush=True)
            runs.append(rec)
    if work_ctx is not None:
        work_ctx.cleanup()

    result: dict[str, Any] = {
        "device": {"kind": a.device, "name": name, "total_memory_bytes": total, "budget_bytes": budget},
        "size": {
            "name": size,
            "largest_fitting": chosen,
            "margin": a.margin,
            "budget_source": source,
            "ladder_source": "Pythia (Biderman et al. 2023, Table 1); memory by app/memory_check.need_bytes",
            "ladder": ladder,
        },
        "settings": {
            "recipe": RECIPE,
            "steps": a.steps,
            "warmup": a.warmup,
            "seed": a.seed,
            "repeats": a.repeats,
            "timeout_s": a.timeout,
            "dtype": spec.dtype,
            "activation_checkpointing": spec.activation_checkpointing,
            "micro_batch": spec.micro_batch,
            "seq_len": spec.model.seq_len,
            "world": 1,
            "configs": {c: list(o) for c, o in CONFIGS.items()},
        },
        "runs": [{k: v for k, v in r.items() if k not in ("summary", "rows")} for r in runs],
    }
    failed = [r for r in runs if "error" in r]
    if not failed:
        configs = {}
        for c in CONFIGS:
            mine = [r for r in runs if r["config"] == c]
            configs[c] = run_metrics([row for r in mine for row in r["rows"]], mine[0]["summary"], a.warmup)
            configs[c]["losses"] = [row["loss"] for row in mine[0]["rows"]]
            configs[c]["need_bytes"] = needs.get(size)
        result["configs"] = configs
        result["comparison"] = compare(configs["stock"], configs["ours"], spec.dtype)
    result["elapsed_s"] = time.perf_counter() - t_start
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(a.out, result, indent=1)
    if not failed:
        print("\n".join(table_lines(result)), flush=True)
    print(f"wrote {a.out}; elapsed {result['elapsed_s']:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
