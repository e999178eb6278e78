"""The planner beside the comparison benchmark: its cluster and workload for a run
(``planner_inputs``), the candidate for each configuration as it ran, and the predicted and
scheduled step of each (``predictions``). Pure: it reads a run's plan and measurements (a live
run's, or a recorded JSON's, as the planner tests do) and starts nothing.

    python -m benchmarks.compare.planner benchmarks/results/compare_link_bound_gpu_mode.json

prints a recorded file's predictions re-run now (``table``): the "scheduled s (error)" of
docs/benchmarks.md, and each tier's hop seconds beside the measured busy seconds."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics

from benchmarks.compare.linkuse import tier_of_lane
from benchmarks.compare.variants import UNRECORDED_PRESET_COMPRESSION
from zeropp_hier import planner as P
from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS, one_tier_hops
from zeropp_hier.core.config import parse_section
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.policy import PRESET_COMPRESSION, merge_schemes
from zeropp_hier.core.topology import Topology
from zeropp_hier.core.vocab import TIERS
from zeropp_hier.planner import schedule as S


def compute_estimate(summary: dict) -> float | None:
    """Compute time per step for the planner: the median of every unshaped step, all
    configurations pooled. With the links unshaped every configuration's step is compute plus
    memory-speed copies; pooling damps the load spikes of a machine shared with others."""
    samples = [t for d in summary.get("unshaped", {}).values() for t in d["step_times"]]
    return statistics.median(samples) if samples else None


def planner_inputs(plan: dict, probe: dict | None, compute_s: float, quant_rate: float):
    """The planner's cluster and workload for a run of this benchmark (also what the planner
    test re-runs from a recorded JSON)."""
    topo = plan["topology"]
    gcds_per_node = topo["gpus_per_node"] * topo["gcds_per_gpu"]
    cl = P.emulated(
        node_mbit=plan["node_mbit"],
        nodes=plan["world"] // gcds_per_node,
        gpus_per_node=topo["gpus_per_node"],
        gcds_per_gpu=topo["gcds_per_gpu"],
        compute_s=compute_s,
        quant_rate=quant_rate,
        # overlap hides communication only with DeepSpeed's prefetch on ([Note: cost model])
        exposed=P.EMULATED_EXPOSED if plan.get("prefetch_bucket") else None,
    )
    if probe is not None:
        cl = P.with_probed_tiers(cl, probe)
    m = plan["model"]
    wl = P.gpt_workload(
        plan["params"],
        m["n_layers"],
        m["d_model"],
        m["seq_len"],
        plan["micro_batch"],
        weight_bytes=2 if plan.get("dtype") == "bf16" else 4,
        vocab=m["vocab_size"],
        prefetch_bucket=plan.get("prefetch_bucket") or 0,  # [Note: the turn] in planner/workload.py
    )
    return cl, wl


def preset_compression(presets) -> dict:
    """The compression each of our presets ran with, for the plan: a result file re-run later
    ([Note: step schedule]) must model what ran, not a later default."""
    return {p: PRESET_COMPRESSION[p] for p in sorted(set(presets)) if p in PRESET_COMPRESSION}


def _as_ran(preset_compression: dict) -> dict:
    """A recorded preset's compression with every tier named: the record is the preset's
    ``PRESET_COMPRESSION`` entry of its day, where a tier left out was exact, whatever the
    default says now."""

    def full(tiers):
        return {t: tiers.get(t, "none") for t in TIERS} if isinstance(tiers, dict) else tiers

    return {kind: full(tiers) for kind, tiers in preset_compression.items()}


def _over(base: dict, override: dict) -> dict:
    """A configuration's compression override over its preset's, kind by kind and tier by tier,
    by the config parser's own merge rule (``merge_schemes``); other keys are replaced."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merge_schemes(base[k], v, f"compression.{k}") if isinstance(base.get(k), dict) else v
    return out


# [Note: recorded tick chunks]
# Where a configuration of ours leaves ``pipeline.chunks`` out, the tick mode cuts its work into
# the tick mode's default count of the day (comm/issue.DEFAULT_TICK_CHUNKS), which has changed
# (4, then 8). A plan records the count it ran with (``tick_chunks``); a file written before that
# record says it in its notes ("..., 4 chunks unless the configuration sets them"), which
# ``as_recorded`` reads back, so a re-run models what ran. A plan with neither ran no tick mode
# by default (the count came with the GPU issue mode): today's default stands in.
_NOTED_CHUNKS = re.compile(r"(\d+) chunks unless the configuration sets them")


def tick_chunks(plan: dict) -> int:
    """The chunks a configuration of ``plan`` in ticks ran with where it left them out ([Note:
    recorded tick chunks])."""
    return int(plan.get("tick_chunks", DEFAULT_TICK_CHUNKS))


def as_recorded(rec: dict) -> dict:
    """A result file's plan with its tick chunks as they ran ([Note: recorded tick chunks])."""
    plan = rec["plan"]
    if "tick_chunks" in plan:
        return plan
    for note in rec.get("notes", []):
        m = _NOTED_CHUNKS.search(note)
        if m:
            return {**plan, "tick_chunks": int(m.group(1))}
    return plan


def _candidate(plan: dict, name: str, cands: dict):
    """The planner's candidate for a configuration of the plan: by name (with the preset's
    compression as the run had it), or our preset with the configuration's compression over the
    preset's as it ran, and its chunks (None where the planner has none)."""
    cfg = plan["configs"].get(name, {})
    ran = plan.get("preset_compression", UNRECORDED_PRESET_COMPRESSION)
    if name in cands:
        cand = cands[name]
        if cfg.get("kind") == "ours" and name in ran:
            cand = cand._replace(compression=P.compression_for(name, schemes=_as_ran(ran[name])))
    elif cfg.get("kind") == "ours" and cfg.get("preset") in cands:
        base = cands[cfg["preset"]]
        preset_ran = _as_ran(ran[cfg["preset"]]) if cfg["preset"] in ran else None
        comp = cfg.get("compression")
        if preset_ran is not None:
            comp = _over(preset_ran, comp) if comp else preset_ran
        cand = base._replace(
            name=name, compression=P.compression_for(cfg["preset"], schemes=comp) if comp else base.compression
        )
    else:
        return None
    if cfg.get("kind") != "ours":
        return cand
    # chunks left out: the count the configuration's issue mode runs (comm/issue.default_chunks)
    chunks = cfg.get("pipeline", {}).get("chunks")
    return cand._replace(
        chunks=chunks if chunks is not None else (tick_chunks(plan) if schedule_mode(cfg) == "ticks" else 1)
    )


def _hop_axes(preset: str) -> list[tuple[str, ...]]:
    """Every hop's axes of ``preset``'s plan on the emulated cluster's node shape (the axes do
    not depend on the compression or the node count)."""
    topo = Topology.for_world(16, 4, 2)
    plan = make_plan(preset, parse_section({"enabled": True, "preset": preset}).compression, topo)
    return [h.axes for h in (*plan.forward, *plan.backward, *plan.reduce)]


def schedule_mode(cfg: dict) -> str:
    """The issue mode a configuration ran in on gloo, as the planner models it ([Note: step
    schedule]): ``overlap`` "ticks" and "one_lane" as named, false (inline, hop after hop on the
    training thread) as one lane; true and "lanes" are gloo's lanes. Stock DeepSpeed's own
    collectives are modelled on lanes, as before the issue mode was recorded."""
    overlap = cfg.get("overlap", True) if cfg.get("kind") == "ours" else True
    if overlap == "gpu":  # as NCCL/RCCL resolve true: by the preset's hops
        if cfg.get("preset") == "auto":  # its choice decides; `predictions` leaves auto out
            raise ValueError("schedule_mode: auto's issue mode is its choice's; name the chosen preset")
        return "ticks" if one_tier_hops(_hop_axes(cfg["preset"])) else "one_lane"
    if overlap in ("ticks", "one_lane"):
        return str(overlap)
    return "one_lane" if overlap is False else "lanes"


def predictions(plan: dict, probe: dict | None, compute_s: float, quant_rate: float, names) -> dict:
    """The planner beside each configuration: its cost model (``step_s``), and for the link-bound
    regime the step scheduled in the configuration's issue mode (``schedule_mode``; [Note: step
    schedule] in planner/schedule.py):
    probed hop rates, the tbf capacities for the busiest-link bound, and the emulated cluster's
    latencies (a probe's intercept at sub-Mbit rates is the token bucket's burst and TCP's
    window, hundreds of ms, not a per-collective cost)."""
    cl, wl = planner_inputs(plan, probe, compute_s, quant_rate)
    tbf, _ = planner_inputs(plan, None, compute_s, quant_rate)
    tbf = dataclasses.replace(tbf, efficiency=1.0)  # the links' physical capacity
    lanes = dataclasses.replace(
        cl, tiers={t: P.TierLink(v.bandwidth, tbf.tiers[t].latency) for t, v in cl.tiers.items()}
    )
    if plan.get("reduce_bucket"):
        wl = dataclasses.replace(wl, reduce_bucket=float(plan["reduce_bucket"]))
    layer_params = plan["params"] / max(1, wl.layers)
    window = max(1, round(plan["prefetch_bucket"] / layer_params)) if plan.get("prefetch_bucket") else 0
    cands = {c.name: c for c in P.default_candidates(cl)}
    by = {p.candidate.name: p for p in P.rank(cl, wl)}
    out = {}
    for n in names:
        cand = _candidate(plan, n, cands)
        if cand is None:
            continue
        cfg = plan["configs"].get(n, {})
        mode = schedule_mode(cfg)
        prefetch = cfg.get("prefetch", True)  # rank.ds_overrides
        wl_n = wl if prefetch else dataclasses.replace(wl, kept_at_turn=0.0)
        steps = cfg.get("pipeline", {}).get("hop_steps", "auto")  # [Note: log-step hops]
        cl_n = dataclasses.replace(cl, issue_mode=mode, hop_steps=steps)
        p = (
            by[n]
            if n in by and cand == by[n].candidate and prefetch and mode == "lanes"
            else P.predict(cand, cl_n, wl_n)
        )
        row = {
            "step_s": p.step_s,
            "node_bytes": p.tier_bytes["node"],
            "gpu_bytes": p.tier_bytes["gpu"],
            "gcd_bytes": p.tier_bytes["gcd"],
            "phase_s": p.phase_s,
        }
        # in the configuration's issue mode: the messages (and their framing) are the mode's, a
        # tick's direct transfers or a lane's rings ([Note: per-message framing] in planner/clusters.py)
        bound = P.predict(cand, dataclasses.replace(tbf, issue_mode=mode, hop_steps=steps), wl_n).link_bound_s
        ahead = cfg.get("pipeline", {}).get("backward_layers_ahead")
        win = window if prefetch else 0
        laid = P.predict(cand, dataclasses.replace(lanes, issue_mode=mode, hop_steps=steps), wl_n)
        sched = S.for_prediction(
            laid, wl_n, win, compute_s, link_bound_s=bound, backward_window=ahead, mode=mode, cluster=cl_n
        )
        hop_s = {t: 0.0 for t in TIERS}  # each tier's hops for the whole step, as the schedule takes them
        for c in laid.costs:
            hop_s[tier_of_lane(c.coll.axes)] += c.seconds
        row.update(
            # messages per step and tier in the configuration's issue mode, whole cluster
            link_messages=laid.tier_messages,
            scheduled_s=sched.step_s,
            schedule_only_s=sched.schedule_s,
            link_bound_s=bound,
            window=win,
            mode=mode,
            hop_s=hop_s,
        )
        out[n] = row
    return out


def recorded_predictions(rec: dict) -> dict:
    """``predictions`` re-run from a recorded result file's inputs (its plan as it ran, probe,
    unshaped steps and quantization rates), for every configuration it measured shaped."""
    return predictions(
        as_recorded(rec),
        rec.get("probe"),
        compute_estimate(rec["summary"]) or 0.0,
        statistics.median(rec["quant_rate_per_rank"]),
        list(rec["summary"]["shaped"]),
    )


def table(rec: dict) -> list[str]:
    """Each configuration of a recorded file: its issue mode, measured median step, the
    scheduled step re-run now and its error (docs/benchmarks.md's "scheduled s (error)"), and per
    tier the planner's hop seconds beside the measured busy seconds per step (mean over ranks;
    [Note: link use] in benchmarks/compare/linkuse.py)."""
    pred = recorded_predictions(rec)
    lines = [
        "| configuration | issue mode | step s | scheduled s (error) "
        "| hops s node / gpu / gcd: planner | measured busy |",
        "|---|---|---|---|---|---|",
    ]
    for name, sh in rec["summary"]["shaped"].items():
        p = pred.get(name)
        if p is None:
            continue
        step = statistics.median(sh["step_times"])
        err = p["scheduled_s"] / step - 1
        busy = sh.get("busy") or []
        measured = (
            " / ".join(f"{statistics.mean(b['busy_s'][t] / b['steps'] for b in busy):.2f}" for t in reversed(TIERS))
            if busy
            else "-"
        )
        planned = " / ".join(f"{p['hop_s'][t]:.2f}" for t in reversed(TIERS))
        stock = rec["plan"]["configs"].get(name, {}).get("kind") == "stock"
        mode = "DeepSpeed's" if stock else p["mode"].replace("_", " ")  # stock is laid out in lanes
        lines.append(
            f"| `{name}` | {mode} | {step:.2f} | {p['scheduled_s']:.1f} ({err:+.1%}) | {planned} | {measured} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.compare.planner FILE...``: ``table`` for each recorded result file."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compare.planner", description=table.__doc__)
    ap.add_argument("files", nargs="+", help="result JSONs written by benchmarks.compare")
    args = ap.parse_args(argv)
    for path in args.files:
        with open(path) as f:
            rec = json.load(f)
        print(f"{path}\n" + "\n".join(table(rec)) + "\n")


if __name__ == "__main__":
    main()
