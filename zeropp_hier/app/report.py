"""Rank 0's output of the job: the lines it prints (the header, one line per step, the closing
tables), ``metrics.jsonl`` (one row per step), ``summary.json`` and the chart.

Pure formatting and file writing: the values come from the rank (``app/run.py``), which gathers
whatever needs a collective on every rank before it hands them over.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict
from typing import Any, Mapping, Sequence

from tqdm import tqdm

from ..core.ranks_text import shortened
from ..core.vocab import TIERS
from ..files import write_json_atomic
from ..planner import tables
from ..planner.tables import fmt_bytes
from .model import flops
from .monitoring import chart, monitor
from .spec import JobSpec

ARCH_NAMES = {"neox": "GPT-NeoX", "gpt": "GPT"}


class _JobLogHandler(logging.StreamHandler):
    """The job's own handler of the package's log, added once per process."""


def log_to_stdout() -> None:
    """Rank 0 prints the package's INFO log (e.g. the auto topology's detection report, which
    zeropp_hier.detect.probe logs on rank 0) with the job's lines."""
    log = logging.getLogger("zeropp_hier")
    if not any(isinstance(h, _JobLogHandler) for h in log.handlers):
        log.addHandler(_JobLogHandler(sys.stdout))
    log.setLevel(logging.INFO)
    log.propagate = False


class Reporter:
    """Rank 0's output: a progress bar, one line per step, metrics.jsonl (in ``metrics_dir``,
    default the run directory; ``append``: continue a resumed run's file, app/monitoring/monitor_run.py)."""

    def __init__(self, spec: JobSpec, enabled: bool, metrics_dir: str | None = None, append: bool = False):
        self.enabled = enabled
        self.bar = None
        self.jsonl = None
        self.path = ""
        if not enabled:
            return
        disable = {"auto": None, "on": False, "off": True}[spec.progress]  # None: only on a TTY
        self.bar = tqdm(
            total=spec.steps,
            desc="train",
            unit="step",
            disable=disable,
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
        )
        if where := metrics_dir or spec.out_dir:
            os.makedirs(where, exist_ok=True)
            self.path = os.path.join(where, "metrics.jsonl")
            self.jsonl = open(self.path, "a" if append else "w")

    def resumed_at(self, start: int, steps: int) -> None:
        """A resumed run trains steps start..steps-1: the bar counts those, not ``steps``."""
        if self.bar is not None:
            self.bar.reset(total=steps - start)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None and not self.bar.disable:
            self.bar.write(text, file=sys.stdout)  # keeps the bar below the lines
        else:
            print(text, flush=True)

    def lines(self, texts: Sequence[str]) -> None:
        for text in texts:
            self.line(text)

    def step(self, row: dict, text: str) -> None:
        if not self.enabled:
            return
        self.line(text)
        if self.jsonl is not None:
            self.jsonl.write(json.dumps(row) + "\n")
            self.jsonl.flush()
        if self.bar is not None:  # made whenever the reporter is enabled
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['loss']:.3f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.jsonl is not None:
            self.jsonl.close()


def topology_mode(spec: JobSpec) -> str:
    """ "manual" or "auto": how the job's topology is given."""
    return spec.topology if isinstance(spec.topology, str) else (spec.topology or {}).get("mode", "manual")


def header_lines(
    spec: JobSpec, world: int, n_params: int, tokens_per_step: int, kernels: list, runtime: Any
) -> list[str]:
    """What rank 0 prints before the first step: the job, the quantization kernels of every rank
    (a rank on another CPU may pick another variant) and, under our section, the topology and
    the plan of hops."""
    m = spec.model
    lines = [
        f"zeropp-hier: preset={spec.preset} compression={spec.compression or 'preset default'} "
        f"dtype={spec.dtype} world={world}, {ARCH_NAMES[m.arch]} {n_params / 1e6:.2f}M params "
        f"({m.layers} layers x {m.hidden}, vocabulary {m.vocab_size}), "
        f"{tokens_per_step} tokens/step, "
        f"data {spec.data_path or 'synthetic'}, activation checkpointing {spec.activation_checkpointing}",
        "quantization kernels: "
        + "; ".join(
            f"{k} on ranks {','.join(shortened(r for r in range(world) if kernels[r] == k))}"
            for k in dict.fromkeys(kernels)
        ),
    ]
    if runtime is not None:
        mode = topology_mode(spec)
        lines += [*tables.topology_lines(runtime.topo, mode), *tables.plan_lines(runtime.plan, runtime.topo)]
    return lines


def step_line(row: Mapping[str, Any], hier: bool, device_name: str | None) -> str:
    """One step's line: loss, throughput, TFLOP/s, under our section the bytes sent per tier and,
    in the job's rows (``monitor.StepMonitor``), lr, grad norm, the val loss and the ETA (after
    the bytes, so that the line's head reads as before)."""
    sent = ""
    if hier:
        sent = " | sent/rank " + "  ".join(f"{tier} {fmt_bytes(row['bytes'][tier]):>9s}" for tier in reversed(TIERS))
    mark = " | SKIPPED (weights unchanged)" if row["skipped"] else ""
    perf = f"{row['tflops_per_gcd']:.3g} TFLOP/s/GCD {flops.mfu_text(row['mfu'], device_name)}"
    extra = ""
    if "lr" in row:
        norm = "n/a" if row.get("grad_norm") is None else f"{row['grad_norm']:.3g}"
        extra += f" | lr {row['lr']:.3g} | grad norm {norm}"
    if row.get("val_loss") is not None:
        extra += f" | val loss {row['val_loss']:.4f}"
    if "eta_s" in row:
        extra += f" | ETA {monitor.fmt_duration(row['eta_s'])}"
    head = f"step {row['step']:4d} | loss {row['loss']:.4f} | {row['tokens_per_s']:8.0f} tok/s | {perf}"
    return f"{head}{sent}{extra}{mark}"


def resumed_line(path: str, start: int, sample: int, saved_world: int, world: int, universal: bool) -> str:
    return f"resumed from {path} at step {start}, data sample {sample}" + (
        f" ({saved_world} ranks -> {world}, universal format)" if universal else ""
    )


def numerics_lines(stats: Mapping[str, Any], plan: Any) -> list[str]:
    """End-of-run table of the compression error per phase and tier, error-feedback memory and
    skipped steps, from ``comm_stats(engine)`` (this rank) and the engine's plan of hops."""
    num = stats["numerics"]
    hops = {"forward_gather": plan.forward, "backward_gather": plan.backward, "grad_reduce": plan.reduce}
    rows = []
    for phase, tiers in num["relative_error"].items():
        for tier, e in tiers.items():
            hop = next((h for h in hops.get(phase, ()) if h.tier == tier), None)
            scheme = hop.scheme if hop else "?"
            fb = "on" if hop is not None and hop.error_feedback else ""
            rows.append([phase, tier, scheme, f"{e['mean']:.4f}", f"{e['max']:.4f}", e["samples"], fb])
    lines = [f"compression error ||x - deq(q(x))|| / ||x|| on rank 0, sampled every {num['sample_every']}th call:"]
    if rows:
        lines += tables.table(["phase", "tier", "scheme", "mean", "max", "samples", "feedback"], rows)
    else:
        lines.append("  (nothing compressed, or sampling off)")
    ef, nf = num["error_feedback"], num["nonfinite"]
    lines.append(
        f"error feedback: {ef['buffers']} residual buffer(s), {fmt_bytes(ef['bytes'])} on rank 0; "
        f"skipped steps ({nf['policy']} on non-finite): {nf['skipped_steps'] or 'none'}"
    )
    return lines


def summary(
    spec: JobSpec,
    *,
    world: int,
    n_params: int,
    tokens_per_step: int,
    history: Sequence[dict],
    elapsed: float,
    kernels: list,
    flops_per_token: float,
    device_name: str | None,
    peak_tflops: float | None,
    memory: list,
    runtime: Any,
    stats: Mapping[str, Any] | None,
) -> dict:
    """The run's ``summary.json``: the spec, the means over the steps trained here, every rank's
    peak memory and kernels and, under our section, the topology, bytes per step and comm_stats."""
    out: dict[str, Any] = {
        "spec": asdict(spec),
        "world": world,
        "params": n_params,
        "tokens_per_step": tokens_per_step,
        "first_loss": history[0]["loss"],
        "final_loss": history[-1]["loss"],
        "tokens_per_s": tokens_per_step * len(history) / elapsed,
        "seconds": elapsed,
        "kernels": kernels,
        # [Note: model FLOPs] in app/model/flops.py: 6 N + 12 L h s per token, recomputation not counted
        "flops_per_token": flops_per_token,
        "device": device_name or "cpu",
        "tflops_per_gcd": flops.tflops_per_gcd(flops_per_token, tokens_per_step * len(history), elapsed, world),
        "peak_bf16_tflops": peak_tflops,
    }
    out["mfu"] = flops.mfu(out["tflops_per_gcd"], peak_tflops)
    vals = [row["val_loss"] for row in history if row.get("val_loss") is not None]
    if vals:
        out["final_val_loss"] = vals[-1]
    out["peak_memory_bytes_per_rank"] = memory
    if runtime is not None and stats is not None:
        out["topology"] = {
            "dims": list(runtime.topo.dims),
            "mode": topology_mode(spec),
            "rank_map": None if runtime.topo.is_identity_map else list(runtime.topo.rank_map),
        }
        # the training steps' own: the evaluations' gathers (rows' val_bytes) left out
        evals = [row["val_bytes"] for row in history if row.get("val_bytes")]
        out["bytes_per_step"] = {
            p: {t: (v - sum(e.get(p, {}).get(t, 0) for e in evals)) / len(history) for t, v in per.items()}
            for p, per in stats["bytes"].items()
        }
        out["comm_stats"] = stats
        if stats.get("auto"):  # "preset": "auto": what it chose ([Note: auto preset])
            out["auto"] = {k: stats["auto"][k] for k in ("chosen", "runner_up", "rates_gbps", "source")}
    return out


def finish(
    rep: Reporter,
    spec: JobSpec,
    summ: Mapping[str, Any],
    history: Sequence[dict],
    plan: Any,
    device_name: str | None,
) -> None:
    """Rank 0's closing lines and files: the run's means, the bytes and compression tables
    (under our section; ``plan``: the engine's plan of hops, None without it), summary.json and
    the chart."""
    rep.line(
        f"done: {len(history)} steps, mean {summ['tokens_per_s']:.0f} tok/s, "
        f"{summ['tflops_per_gcd']:.3g} TFLOP/s per GCD ({flops.mfu_text(summ['mfu'], device_name)}), "
        f"final loss {summ['final_loss']:.4f} (first {summ['first_loss']:.4f}), "
        f"peak memory per rank {fmt_bytes(max(summ['peak_memory_bytes_per_rank']))} (max over ranks)"
        + (f", final val loss {summ['final_val_loss']:.4f}" if "final_val_loss" in summ else "")
    )
    if plan is not None:
        rep.lines(tables.bytes_lines(summ["bytes_per_step"], "bytes sent by rank 0 per step, by phase and tier:"))
        rep.lines(numerics_lines(summ["comm_stats"], plan))
    if spec.out_dir:
        write_json_atomic(os.path.join(spec.out_dir, "summary.json"), summ, indent=1)
        arch, params = ARCH_NAMES[spec.model.arch], summ["params"] / 1e6
        title = f"{arch} {params:.1f}M, preset {spec.preset}, {spec.dtype}, {summ['world']} ranks"
        png = chart.write(history, spec.out_dir, title)
        rep.line(f"metrics: {rep.path}; {spec.out_dir}: summary.json, {os.path.basename(png)}")
