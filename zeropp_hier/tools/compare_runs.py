"""The report of the "check the claim" job (``scripts/frontier/compare.sbatch``): stock ZeRO-3,
DeepSpeed's own ZeRO++, our ``zeropp`` and ``frontier`` trained as the same job on the same
ranks, side by side.

    python -m zeropp_hier.tools.compare_runs DIR [--warmup 5]
    python -m zeropp_hier.tools.compare_runs --ds-quantizer   # why DeepSpeed's qwZ/qgZ cannot run ('' if they can)

DIR holds ``probe.json`` (``zeropp-hier probe --out``, optional) and one run directory per run,
``stock/``, ``zeropp/`` and ``frontier/`` (required) and ``ds-zeropp-hpz/`` / ``ds-zeropp/``
(DeepSpeed's ZeRO++, ``preset=stock`` with its ``zero_hpz_partition_size``, and with its
``zero_quantized_weights`` / ``zero_quantized_gradients`` too), each with the job's
``summary.json``, ``metrics.jsonl`` and ``ds_config.json``; a run of DeepSpeed's ZeRO++ that is not
there is reported as not run, with ``<name>.not_run``'s reason when the job wrote one.

Prints the probed links, one table (tokens/s, TFLOP/s per GCD, step time,
bytes per tier per step, peak memory, tokens/s over stock) and the measured ratios beside the
published ones; writes ``compare.json`` and ``compare.png`` into DIR.

[Note: what the comparison measures]
- The first ``--warmup`` steps of every run are left out (the first step builds buffers and, in
  the section, gathers what later steps keep; its bytes differ from a steady step's).
- tokens/s: the tokens of the measured steps over the sum of their step times (``metrics.jsonl``'s
  "seconds": one optimizer step, timed by ``train_steps``), not the wall clock between steps,
  which also holds rank 0's writing. TFLOP/s per GCD from it, as the job computes it
  ([Note: model FLOPs] in app/model/flops.py).
- bytes per tier: what rank 0 sent per step over each tier, all phases, counted by the section.
  Stock ZeRO-3 is DeepSpeed's own engine without the section: it has no per-tier counters (its
  collectives run flat over all ranks), so its cells are empty ("—"), never 0.
- The runs must be one job but the preset (same world, model, tokens per step); a comparison of
  different jobs is refused, naming what differs. A run of DeepSpeed's ZeRO++ must have its keys
  on in its ``ds_config.json`` (what DeepSpeed was given), or it is refused.
- The paper's 1.71x is ``frontier`` over DeepSpeed's ZeRO++ with hpZ, qwZ and qgZ, and its ~1.4x
  that ZeRO++ over ZeRO-3: each stands only beside the same measured ratio. Ratios against our
  ``zeropp`` preset or DeepSpeed's hpZ alone have no published value.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..app.model import flops
from ..core.vocab import TIERS
from ..files import write_atomic, write_json_atomic
from ..planner.tables import fmt_bytes, table
from .cli import PUBLISHED, probe_lines

PRESETS = ("stock", "zeropp", "frontier")  # the runs every comparison needs
# DeepSpeed's ZeRO++ (preset=stock with its keys): run name -> (what it is, the keys it must have on)
DS_RUNS = {
    "ds-zeropp-hpz": ("DeepSpeed's ZeRO++, hpZ only", ("zero_hpz_partition_size",)),
    "ds-zeropp": (
        "DeepSpeed's ZeRO++ (hpZ, qwZ, qgZ)",
        ("zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients"),
    ),
}
RUNS = ("stock", "ds-zeropp-hpz", "ds-zeropp", "zeropp", "frontier")  # the job's order: the baseline first
DEFAULT_WARMUP = 5
# what must be equal across the three runs for the ratios to mean anything
SAME_JOB = ("world", "params", "tokens_per_step")


class CompareError(ValueError):
    """The run directories cannot be compared; the message says what is wrong and the fix."""


def ds_quantizer_problem() -> str | None:
    """Why DeepSpeed's own qwZ/qgZ cannot run on this machine's accelerator (None if its
    quantizer op is compatible here: it is then built at first use)."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    builder = acc.create_op_builder("QuantizerBuilder")
    if builder is None or type(builder).__name__ == "NotImplementedBuilder" or not builder.is_compatible(False):
        return (
            f"DeepSpeed's QuantizerBuilder is not implemented for the '{acc.device_name()}' "
            "accelerator, so zero_quantized_weights / zero_quantized_gradients (qwZ/qgZ) cannot "
            "run; stock ZeRO++ runs with hpZ only"
        )
    return None


def check_ds_run(name: str, ds_config: Mapping[str, Any]) -> None:
    """Refuse a run of DeepSpeed's ZeRO++ that DeepSpeed was not given its keys for; pure."""
    zero = ds_config.get("zero_optimization") or {}
    off = [k for k in DS_RUNS[name][1] if not (zero.get(k) if k != "zero_hpz_partition_size" else zero.get(k, 1) > 1)]
    if off:
        raise CompareError(
            f"the {name} run's ds_config.json has {off} off: it did not run {DS_RUNS[name][0]}; rerun it with "
            "+deepspeed.zero_optimization.<key>=... (compare.sbatch does)"
        )


def read_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """A run directory's ``summary.json`` and ``metrics.jsonl`` rows."""
    summary_file, metrics_file = run_dir / "summary.json", run_dir / "metrics.jsonl"
    for f in (summary_file, metrics_file):
        if not f.is_file():
            raise CompareError(f"{f} is missing: did the {run_dir.name} run finish? (its job output says why not)")
    summary = json.loads(summary_file.read_text())
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    return summary, rows


def run_row(preset: str, summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], warmup: int) -> dict:
    """One preset's measured values ([Note: what the comparison measures]); pure."""
    ran, want = summary["spec"]["preset"], "stock" if preset in DS_RUNS else preset
    if ran != want:
        raise CompareError(f"the {preset} run directory holds a run of preset {ran!r}: rerun it with preset={want}")
    if warmup < 0:
        raise CompareError(f"warm-up {warmup}: give 0 or more steps to leave out")
    measured = list(rows[warmup:])
    if not measured:
        raise CompareError(
            f"the {preset} run trained {len(rows)} step(s) and the warm-up leaves out {warmup}: "
            f"train more steps or lower the warm-up (ZH_COMPARE_WARMUP / --warmup) below {len(rows)}"
        )
    seconds = sum(r["seconds"] for r in measured)
    tokens = summary["tokens_per_step"] * len(measured)
    tflops = flops.tflops_per_gcd(summary["flops_per_token"], tokens, seconds, summary["world"])
    per_tier = None
    if all("bytes" in r for r in measured):
        per_tier = {t: sum(r["bytes"][t] for r in measured) / len(measured) for t in TIERS}
    return {
        "preset": preset,
        "world": summary["world"],
        "params": summary["params"],
        "tokens_per_step": summary["tokens_per_step"],
        "steps": len(rows),
        "measured_steps": len(measured),
        "tokens_per_s": tokens / seconds,
        "step_s": seconds / len(measured),
        "tflops_per_gcd": tflops,
        "mfu": flops.mfu(tflops, summary.get("peak_bf16_tflops")),
        "bytes_per_step": per_tier,  # None: stock ZeRO-3, no per-tier counters
        "peak_memory_bytes": max(summary["peak_memory_bytes_per_rank"]),
        "final_loss": summary["final_loss"],
        "device": summary.get("device", "cpu"),
    }


def compare(
    runs: Mapping[str, tuple[Mapping, Sequence[Mapping]]],
    probe: Mapping | None,
    warmup: int,
    not_run: Mapping[str, str] | None = None,
) -> dict:
    """The comparison of ``runs`` ({run name: (summary, metrics rows)}, every preset of
    ``PRESETS`` and any of ``DS_RUNS``) with the probed links; ``not_run``: why a run of
    DeepSpeed's ZeRO++ is not there; pure."""
    missing = [p for p in PRESETS if p not in runs]
    if missing:
        raise CompareError(f"no run of preset(s) {missing}: the comparison needs {list(PRESETS)}")
    rows = [run_row(p, *runs[p], warmup) for p in RUNS if p in runs]
    for key in SAME_JOB:
        values = {r["preset"]: r[key] for r in rows}
        if len(set(values.values())) > 1:
            raise CompareError(
                f"the runs differ in {key} ({values}): compare one job under the three presets "
                "(the same model, micro-batch and ranks; only preset= differs)"
            )
    by = {r["preset"]: r for r in rows}
    for r in rows:
        r["speedup_vs_stock"] = r["tokens_per_s"] / by["stock"]["tokens_per_s"]
    # (numerator, denominator, the published value beside it: only DeepSpeed's full ZeRO++ has one)
    pairs: list[tuple[str, str, float | None]] = []
    for name in ("ds-zeropp", "ds-zeropp-hpz"):  # the like-for-like one first
        if name in by:
            full = name == "ds-zeropp"
            pairs.append(("frontier", name, PUBLISHED["frontier/zeropp"] if full else None))
            pairs.append((name, "stock", PUBLISHED["zeropp/zero3"] if full else None))
    pairs += [("frontier", "zeropp", None), ("zeropp", "stock", None)]
    label = {**{n: what for n, (what, _) in DS_RUNS.items()}, "zeropp": "our zeropp preset", "stock": "stock ZeRO-3"}
    ratios = [
        {
            "ratio": f"{label.get(a, a)} over {label[b]}",
            "measured": by[a]["tokens_per_s"] / by[b]["tokens_per_s"],
            "published": published,
        }
        for a, b, published in pairs
    ]
    gone = {name: (not_run or {}).get(name) or "its run is not in the job's directory" for name in DS_RUNS}
    return {
        "warmup_steps": warmup,
        "runs": rows,
        "ratios": ratios,
        "not_run": {name: why for name, why in gone.items() if name not in by},
        "published_source": "Xu et al., arXiv 2501.04266: GPT-NeoX-20B on 48 Frontier nodes (384 GCDs), against "
        "DeepSpeed's ZeRO++ with hpZ, qwZ and qgZ; shown beside that ratio only",
        "probe": dict(probe) if probe is not None else None,
    }


def _bytes_cell(row: Mapping[str, Any], tier: str) -> str:
    return "—" if row["bytes_per_step"] is None else fmt_bytes(row["bytes_per_step"][tier])


def table_lines(result: Mapping[str, Any]) -> list[str]:
    """What the job prints: the links, the table, the ratios; pure."""
    rows = result["runs"]
    first = rows[0]
    lines = [
        f"check the claim: {first['params'] / 1e6:.1f}M parameters, {first['world']} ranks, "
        f"{first['tokens_per_step']} tokens per step, {first['device']}; means over steps "
        f"{result['warmup_steps']}..{first['steps'] - 1} (the first {result['warmup_steps']} left out as warm-up)"
    ]
    if first["device"] == "cpu":
        lines.append(
            "CPU ranks: this checks that the job runs, times and counts; its ratios say nothing about GPUs "
            "(the published ones are for Frontier)"
        )
    probe = result.get("probe")
    if probe:
        lines.append(f"links probed ({probe.get('backend', '?')}, world {probe.get('world', '?')}):")
        lines += ["  " + ln for ln in probe_lines(probe["tiers"])]
    else:
        lines.append("links: no probe.json (the probe did not run)")
    tiers = list(reversed(TIERS))  # slowest first, as the job's own tables
    head = [
        "preset",
        "tokens/s",
        "vs stock",
        "TFLOP/s/GCD",
        "MFU",
        "step s",
        *(f"{t} B/step" for t in tiers),
        "peak mem/rank",
        "final loss",
    ]
    body = [
        [
            r["preset"],
            f"{r['tokens_per_s']:.0f}",
            f"{r['speedup_vs_stock']:.2f}x",
            f"{r['tflops_per_gcd']:.3g}",
            "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
            f"{r['step_s']:.3g}",
            *(_bytes_cell(r, t) for t in tiers),
            fmt_bytes(r["peak_memory_bytes"]),
            f"{r['final_loss']:.4f}",
        ]
        for r in rows
    ]
    lines += table(head, body)
    lines.append(
        "  bytes: sent by rank 0 per step over each tier, all phases; stock ZeRO-3 and DeepSpeed's "
        "ZeRO++ (DeepSpeed's own engine) have no per-tier counters (—)"
    )
    for name, why in result.get("not_run", {}).items():
        lines.append(f"not run: {name} ({DS_RUNS[name][0]}): {why}")
    lines.append(f"ratios of tokens/s (published: {result['published_source']}):")
    lines += table(
        ["ratio", "measured", "published"],
        [
            [x["ratio"], f"{x['measured']:.2f}x", "—" if x["published"] is None else f"{x['published']:.2f}x"]
            for x in result["ratios"]
        ],
    )
    return lines


def render_png(result: Mapping[str, Any], steps: Mapping[str, Sequence[Mapping[str, Any]]]) -> bytes:
    """PNG bytes of three panels: tokens/s per preset, bytes per tier per step, and every step's
    time (``steps``: {preset: metrics rows}) with the warm-up shaded."""
    from matplotlib.figure import Figure  # no pyplot: no display, no global state (as app/monitoring/chart.py)

    rows = result["runs"]
    names = [r["preset"] for r in rows]
    fig = Figure(figsize=(12, 3.6), dpi=100)
    tput, sent, times = fig.subplots(1, 3)
    colors = {"stock": "tab:gray", "ds-zeropp-hpz": "tab:olive", "ds-zeropp": "tab:green", "zeropp": "tab:blue"}
    bars = tput.bar(names, [r["tokens_per_s"] for r in rows], color=[colors.get(n, "tab:orange") for n in names])
    tput.bar_label(bars, labels=[f"{r['speedup_vs_stock']:.2f}x" for r in rows], fontsize=8)
    tput.set(ylabel="tokens/s (all ranks)", title="throughput (x stock)")
    tiers = list(reversed(TIERS))
    width = 0.8 / len(tiers)
    for i, tier in enumerate(tiers):
        xs = [j + (i - 1) * width for j in range(len(rows))]
        vals = [0.0 if r["bytes_per_step"] is None else r["bytes_per_step"][tier] / 1e6 for r in rows]
        sent.bar(xs, vals, width, label=tier)
    for j, r in enumerate(rows):
        if r["bytes_per_step"] is None:
            sent.text(j, 0, "no per-tier\ncounters", ha="center", va="bottom", fontsize=7)
    sent.set_xticks(range(len(rows)), names)
    sent.set(ylabel="MB sent by rank 0 per step", title="bytes per tier per step")
    sent.legend(fontsize=7)
    for name in names:
        ss = steps[name]
        times.plot([s["step"] for s in ss], [s["seconds"] for s in ss], marker=".", label=name)
    if result["warmup_steps"]:
        times.axvspan(-0.5, result["warmup_steps"] - 0.5, color="0.9", label="warm-up (left out)")
    times.set(xlabel="step", ylabel="seconds", title="step time")
    times.set_ylim(bottom=0)
    times.legend(fontsize=7)
    for ax in (tput, sent, times):
        ax.grid(alpha=0.3)
    first = rows[0]
    where = "cpu (the job's mechanics, not the claim)" if first["device"] == "cpu" else first["device"]
    fig.suptitle(f"{first['params'] / 1e6:.1f}M parameters, {first['world']} ranks, {where}", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zeropp_hier.tools.compare_runs", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "dir",
        type=Path,
        nargs="?",
        help="the job's output directory (stock/, zeropp/, frontier/, ds-zeropp*/, ...)",
    )
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="steps left out at the start of each run")
    ap.add_argument("--ds-quantizer", action="store_true", help="print why DeepSpeed's qwZ/qgZ cannot run here, or ''")
    args = ap.parse_args(argv)
    if args.ds_quantizer:
        print(ds_quantizer_problem() or "")
        return 0
    if args.dir is None:
        ap.error("argument dir: missing; give the job's output directory")
    try:
        runs = {p: read_run(args.dir / p) for p in PRESETS}
        not_run = {}
        for name in DS_RUNS:
            if (args.dir / name / "summary.json").is_file():
                check_ds_run(name, json.loads((args.dir / name / "ds_config.json").read_text()))
                runs[name] = read_run(args.dir / name)
            elif (reason := args.dir / f"{name}.not_run").is_file():
                not_run[name] = reason.read_text().strip()
            elif (args.dir / name).is_dir():
                not_run[name] = "its run did not finish (its step's lines in the job's output say why)"
        probe_file = args.dir / "probe.json"
        probe = json.loads(probe_file.read_text()) if probe_file.is_file() else None
        result = compare(runs, probe, args.warmup, not_run)
    except CompareError as e:
        print(f"compare_runs: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(table_lines(result)))
    write_json_atomic(args.dir / "compare.json", result, indent=1)
    write_atomic(args.dir / "compare.png", render_png(result, {p: runs[p][1] for p in runs}))
    print(f"wrote {args.dir / 'compare.json'} and {args.dir / 'compare.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
