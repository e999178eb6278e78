"""Stock DeepSpeed ZeRO-3 / ZeRO++ against our presets, on the emulated three-tier cluster.

    sudo python -m benchmarks.compare                       # full run (~20 min on 2 CPU cores)
    sudo python -m benchmarks.compare --rounds 1 --steps 1  # smoke run

Builds the emulated cluster (benchmarks/cluster: 2 nodes x 2 packages x 2 GCDs, tbf links in
Frontier's per-GCD ratios), probes each tier, then trains the same GPT-NeoX shape
(``--shape``, benchmarks/shapes.py; fp32, DeepSpeed prefetch and reuse distance 0 so that
backward re-gathers as for a large model) through the training job's own code
(benchmarks/compare_rank.py) under every configuration in one 8-rank world, round after round
in a rotating order, and finally one pass with the links unshaped (the CPU-bound part of each
step). Reports median step time, tokens/s, wire bytes per tier per step from the interface
counters (the same for stock DeepSpeed and for us) beside ``comm_stats`` for ours, peak RSS per
rank, ratios, and the planner's predictions; writes JSON and a PNG bar chart. The cluster is
torn down at the end, on error and on signals.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

from benchmarks import linkuse
from benchmarks.cluster import netns
from benchmarks.cluster.driver import run_marked
from benchmarks.cluster.runner import Cluster
from benchmarks.cluster.spec import ClusterSpec
from benchmarks.schemes import EXACT_GCD_GRADIENTS, INT4_NODE_GRADIENTS, INT8_GCD_GRADIENTS, INT8_GCD_NODE8
from benchmarks.shapes import DEFAULT_SHAPE, SHAPES, planner_model
from zeropp_hier.files import write_json_atomic

DEFAULT_NODE_MBIT = 6.0  # per GCD, the CPU-bound regime's node rate
REGIMES = ("cpu-bound", "link-bound")
ORDER = ["ds-zero3", "ds-zeropp", "zero3", "zeropp", "frontier", "auto"]
DEFAULT = ORDER[:5]
# variants for the overlap question (name them with --configs): prefetch off, and every
# collective inline (overlap off) with prefetch on
# frontier's whole compression until its node stage became int8 (CHANGELOG)
FRONTIER_INT4_NODE = {"weights": {"node": "int8"}, **INT4_NODE_GRADIENTS}
VARIANTS = {
    "zeropp/no-prefetch": {"kind": "ours", "preset": "zeropp", "prefetch": False},
    "frontier/no-prefetch": {"kind": "ours", "preset": "frontier", "prefetch": False},
    "zeropp/inline": {"kind": "ours", "preset": "zeropp", "overlap": False},
    "frontier/inline": {"kind": "ours", "preset": "frontier", "overlap": False},
    # package copies for about half the layers, node copies for the rest ([Note: kept levels]):
    # the model's package copy is ~1.75 MB per rank in int8 rows, a node copy ~0.44 MB
    "frontier/half": {"kind": "ours", "preset": "frontier", "memory": {"kept_shards_gb": 0.0011}},
    # zeropp (ZeRO++'s flat forward) with package copies for the same layers: their backward
    # stays in the package; and with package copies for every layer (hpZ over the package)
    "zeropp/half": {"kind": "ours", "preset": "zeropp", "memory": {"kept_shards_gb": 0.0011}},
    "zeropp/package": {"kind": "ours", "preset": "zeropp", "memory": {"kept_shards_gb": 1.0}},
    # package copies for half the transformer blocks (blocks.0-1, with the embeddings and ln_f,
    # upgraded in model order; 1.19 of 1.81 MB per rank), node copies for blocks.2-3
    "zeropp/half-blocks": {"kind": "ours", "preset": "zeropp", "memory": {"kept_shards_gb": 0.0012}},
    # pipelined hops ([Note: chunked gathers]): each gather and gradient bucket cut into 4
    # block-aligned chunks, so the lanes run different chunks' hops on different tiers at once
    "frontier/pipe": {"kind": "ours", "preset": "frontier", "pipeline": {"chunks": 4}},
    "zeropp/pipe": {"kind": "ours", "preset": "zeropp", "pipeline": {"chunks": 4}},
    # twice the chunks: less fill and drain per job, more messages (the schedule at link share
    # 0.15: 68.0 s with 4 chunks, 65.3 s with 8)
    "frontier/pipe8": {"kind": "ours", "preset": "frontier", "pipeline": {"chunks": 8}},
    # int8 gradients on the package links, int4 on the network (frontier's default before int4 on
    # the package links)
    "frontier/int8-gpu": {
        "kind": "ours",
        "preset": "frontier",
        "compression": {"gradients": {"gcd": "none", "gpu": "int8", "node": "int4"}},
    },
    # pipelined, with int8 gradients on the in-package hop too: in the link-bound regime the
    # backward's gcd lane carries the backward gathers and every gradient in bf16 and binds there
    # while the package links wait ([Note: step schedule] in zeropp_hier/planner/schedule.py)
    "frontier/pipe-int8-gcd": {
        "kind": "ours",
        "preset": "frontier",
        "pipeline": {"chunks": 4},
        "compression": INT8_GCD_GRADIENTS,
    },
    # int8 on the in-package hop beside int4 gpu and int8 node hops: frontier/pipe since this
    # became frontier's default, spelled out
    "frontier/pipe-int8-gcd-node8": {
        "kind": "ours",
        "preset": "frontier",
        "pipeline": {"chunks": 4},
        "compression": INT8_GCD_NODE8,
    },
    # frontier's default before that: the in-package hop exact; unchunked and pipelined
    "frontier/exact-gcd": {"kind": "ours", "preset": "frontier", "compression": EXACT_GCD_GRADIENTS},
    "frontier/pipe-exact-gcd": {
        "kind": "ours",
        "preset": "frontier",
        "pipeline": {"chunks": 4},
        "compression": EXACT_GCD_GRADIENTS,
    },
    # and with the backward's gathers at most one layer ahead, so that each layer's gradients
    # reach the gcd lane before the gathers of the layers after the next ([Note: backward window]
    # in zeropp_hier/deepspeed/inflight.py)
    "frontier/pipe-int8-gcd-w1": {
        "kind": "ours",
        "preset": "frontier",
        "pipeline": {"chunks": 4, "backward_layers_ahead": 1},
        "compression": INT8_GCD_GRADIENTS,
    },
    # int4 gradients on the package links and the network, spelled out (frontier's default
    # before its node stage became int8; the recorded runs below that name it were made when
    # frontier sent int8 on the package links)
    "frontier/int4-gpu": {"kind": "ours", "preset": "frontier", "compression": FRONTIER_INT4_NODE},
}


def stock_quantization_problem() -> str | None:
    """Why DeepSpeed's own qwZ/qgZ cannot run here (None if they can)."""
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


def configs(gcds_per_node: int, stock_quant_ok: bool) -> dict:
    zpp = {"zero_hpz_partition_size": gcds_per_node}
    if stock_quant_ok:
        zpp.update(zero_quantized_weights=True, zero_quantized_gradients=True)
    return {
        "ds-zero3": {"kind": "stock"},
        "ds-zeropp": {"kind": "stock", "zero": zpp},
        "zero3": {"kind": "ours", "preset": "zero3"},
        "zeropp": {"kind": "ours", "preset": "zeropp"},
        "frontier": {"kind": "ours", "preset": "frontier"},
        # chooses at initialize from a probe of these links ([Note: auto preset])
        "auto": {"kind": "ours", "preset": "auto"},
        **VARIANTS,
    }


def params_of(shape: str) -> int:
    from zeropp_hier.app.spec import n_params

    return n_params(SHAPES[shape])


# --------------------------------------------------------------------------------------------
def summarize(results: list, wire: dict, plan: dict, links: dict | None = None) -> dict:
    """Per configuration and phase: median step time (slowest rank per step), wire and
    comm_stats bytes per step, peak RSS; with ``links`` ({run label: {"ns/if": tx bytes}}) the
    bytes per step on every shaped link direction, and the executor's busy fractions where
    the ranks sent them ([Note: link use] in benchmarks/linkuse.py)."""
    tokens = plan["world"] * plan["micro_batch"] * plan["model"]["seq_len"]
    out: dict = {}
    for res in results:
        if "name" not in res:
            continue
        d = out.setdefault(res["phase"], {}).setdefault(
            res["name"], {"step_times": [], "wire": [], "stats": [], "peak_rss": [], "losses": []}
        )
        per_rank = res["per_rank"]
        steps = len(per_rank[0]["times"])
        d["step_times"] += [max(r["times"][i] for r in per_rank) for i in range(steps)]
        d["losses"] += per_rank[0]["losses"]
        d["peak_rss"].append(max(r["peak_rss"] for r in per_rank))
        d.setdefault("build_s", []).append(max(r.get("build_s", 0.0) for r in per_rank))
        auto = per_rank[0].get("stats", {}).get("auto")
        if auto is not None:  # what "auto" chose this time, and how long its probe took
            d.setdefault("auto", []).append(
                {
                    "chosen": auto["chosen"],
                    "seconds": auto["seconds"],
                    "runner_up": auto["runner_up"],
                    "rates_gbps": auto["rates_gbps"],
                }
            )
        w = wire[f"{res['label']} end"]
        d["wire"].append({t: v / steps for t, v in w.items()})
        if links is not None and res["label"] in links:
            d.setdefault("links", []).append({k: v / steps for k, v in links[res["label"]].items()})
        if "busy" in per_rank[0]:
            d.setdefault("busy", []).extend(r["busy"] for r in per_rank)
        if "stats" in per_rank[0]:
            d["stats"].append(
                {
                    t: sum(sum(r["stats"]["bytes"][p][t] for p in r["stats"]["bytes"]) for r in per_rank) / steps
                    for t in ("gcd", "gpu", "node")
                }
            )
            # per phase too: how much of the backward re-gathers (DeepSpeed's prefetch keeps the
            # last layers of the forward gathered into the backward where it reaches that far)
            d.setdefault("phase_stats", []).append(
                {
                    p: {t: sum(r["stats"]["bytes"][p][t] for r in per_rank) / steps for t in ("gcd", "gpu", "node")}
                    for p in per_rank[0]["stats"]["bytes"]
                }
            )
    for phase in out.values():
        for d in phase.values():
            d["median_step_s"] = statistics.median(d["step_times"])
            d["tokens_per_s"] = tokens / d["median_step_s"]
            d["wire_per_step"] = {t: statistics.mean(x[t] for x in d["wire"]) for t in ("gcd", "gpu", "node")}
            if d["stats"]:
                d["stats_per_step"] = {t: statistics.mean(x[t] for x in d["stats"]) for t in ("gcd", "gpu", "node")}
            if d.get("phase_stats"):
                first = d["phase_stats"][0]
                d["phase_stats_per_step"] = {
                    p: {t: statistics.mean(x[p][t] for x in d["phase_stats"]) for t in first[p]} for p in first
                }
            d["peak_rss_mb"] = max(d["peak_rss"]) / 2**20
            if d.get("links"):
                d["links_per_step"] = {k: statistics.mean(x[k] for x in d["links"]) for k in d["links"][0]}
            if d.get("busy"):
                d["busy_fractions"] = linkuse.busy_fractions(d["busy"])
    return out


def link_uses(spec: ClusterSpec, per_step: dict, per_node_mbit: bool = False) -> list:
    """``LinkUse`` of every shaped link direction from its bytes per step; with
    ``per_node_mbit`` capacities are per Mbit/s of node rate ([Note: link-bound calibration])."""
    scale = spec.node_mbit if per_node_mbit else 1.0
    return [
        linkuse.LinkUse(f"{e.namespace}/{e.ifname}", e.tier, e.mbit / scale, per_step[f"{e.namespace}/{e.ifname}"])
        for e in spec.shaped_egress()
    ]


def add_link_use(summary: dict, spec: ClusterSpec) -> None:
    """Per shaped configuration: link utilisation at its median step, the ideal step and the
    efficiency ([Note: link use]). The CPU work that cannot hide is the same configuration's
    time per step outside every collective on the unshaped pass (None without one, or for
    stock DeepSpeed, whose collectives the executor does not see)."""
    un = summary.get("unshaped", {})
    for name, d in summary.get("shaped", {}).items():
        if "links_per_step" not in d:
            continue
        use = linkuse.utilisation(link_uses(spec, d["links_per_step"]), d["median_step_s"])
        cpu = un.get(name, {}).get("busy_fractions", {}).get("outside_s")
        use["cpu_outside_s"] = cpu
        use["ideal_s"] = linkuse.ideal(use["links_s"], cpu)
        use["efficiency"] = linkuse.efficiency(use["ideal_s"], d["median_step_s"])
        d["link_use"] = use


def link_table(summary: dict, names: list) -> list:
    """The printed columns of [Note: link use], one row per shaped configuration."""
    s = summary["shaped"]
    pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
    sec = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    lines = [
        "Link use per tier (gcd / gpu / node; a gpu link is a package veth direction, it carries the "
        "node tier's bytes too): busy = time with a collective of the tier in flight (executor, mean "
        "over ranks; a hop spanning several tiers counts under its slowest); "
        "util = wire bytes / (capacity x step), mean over the tier's links; ideal = "
        "busiest link's bytes / capacity + unshaped CPU time outside every collective:",
        "",
        "| configuration | wire MB/step | busy | 2+ tiers busy | mean util | busiest link util | "
        "links s | CPU outside s | ideal s | measured s | efficiency |",
        "|" + "---|" * 11,
    ]
    for n in names:
        d = s[n]
        u = d.get("link_use")
        if u is None:
            continue
        w = d["wire_per_step"]
        bf = d.get("busy_fractions")
        tri = lambda f: " / ".join(f(t) for t in linkuse.TIERS)  # noqa: E731
        lines.append(
            f"| {n} | {tri(lambda t: f'{w[t] / 1e6:.1f}')} | "
            f"{tri(lambda t: pct(bf['busy'][t])) if bf else 'n/a (stock)'} | "
            f"{pct(bf['together']) if bf else '-'} | {tri(lambda t: pct(u['mean'].get(t)))} | "
            f"{tri(lambda t: pct(u['busiest'].get(t)))} | {u['links_s']:.2f} | {sec(u['cpu_outside_s'])} | "
            f"{sec(u['ideal_s'])} | {d['median_step_s']:.2f} | {sec(u['efficiency'])} |"
        )
    return lines


def compute_estimate(summary: dict) -> float | None:
    """Compute time per step for the planner: the median of every unshaped step, all
    configurations pooled. With the links unshaped every configuration's step is compute plus
    memory-speed copies; pooling damps the load spikes of a machine shared with others."""
    samples = [t for d in summary.get("unshaped", {}).values() for t in d["step_times"]]
    return statistics.median(samples) if samples else None


def planner_inputs(plan: dict, probe: dict | None, compute_s: float, quant_rate: float):
    """The planner's cluster and workload for a run of this benchmark (also what the planner
    test re-runs from a recorded JSON)."""
    from zeropp_hier.planner import model as P

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
        prefetch_bucket=plan.get("prefetch_bucket") or 0,  # [Note: the turn] in planner/model.py
    )
    return cl, wl


# What the presets compressed in result files written before the plan recorded it
# ("preset_compression")
UNRECORDED_PRESET_COMPRESSION = {"frontier": FRONTIER_INT4_NODE}


def preset_compression(presets) -> dict:
    """The compression each of our presets ran with, for the plan: a result file re-run later
    ([Note: step schedule]) must model what ran, not a later default."""
    from zeropp_hier.core.policy import PRESET_COMPRESSION

    return {p: PRESET_COMPRESSION[p] for p in sorted(set(presets)) if p in PRESET_COMPRESSION}


def _as_ran(preset_compression: dict) -> dict:
    """A recorded preset's compression with every tier named: the record is the preset's
    ``PRESET_COMPRESSION`` entry of its day, where a tier left out was exact, whatever the
    default says now."""
    from zeropp_hier.core.vocab import TIERS

    def full(tiers):
        return {t: tiers.get(t, "none") for t in TIERS} if isinstance(tiers, dict) else tiers

    return {kind: full(tiers) for kind, tiers in preset_compression.items()}


def _over(base: dict, override: dict) -> dict:
    """A configuration's compression override over its preset's, kind by kind and tier by tier,
    by the config parser's own merge rule (``_merge_schemes``); other keys are replaced."""
    from zeropp_hier.core.policy import _merge_schemes

    out = dict(base)
    for k, v in override.items():
        out[k] = _merge_schemes(base[k], v, f"compression.{k}") if isinstance(base.get(k), dict) else v
    return out


def _candidate(plan: dict, name: str, cands: dict):
    """The planner's candidate for a configuration of the plan: by name (with the preset's
    compression as the run had it), or our preset with the configuration's compression over the
    preset's as it ran, and its chunks (None where the planner has none)."""
    from zeropp_hier.planner import model as P

    cfg = plan["configs"].get(name, {})
    ran = plan.get("preset_compression", UNRECORDED_PRESET_COMPRESSION)
    if name in cands:
        cand = cands[name]
        if cfg.get("kind") == "ours" and name in ran:
            cand = cand._replace(compression=P._compression(name, schemes=_as_ran(ran[name])))
    elif cfg.get("kind") == "ours" and cfg.get("preset") in cands:
        base = cands[cfg["preset"]]
        preset_ran = _as_ran(ran[cfg["preset"]]) if cfg["preset"] in ran else None
        comp = cfg.get("compression")
        if preset_ran is not None:
            comp = _over(preset_ran, comp) if comp else preset_ran
        cand = base._replace(
            name=name, compression=P._compression(cfg["preset"], schemes=comp) if comp else base.compression
        )
    else:
        return None
    return cand._replace(chunks=cfg.get("pipeline", {}).get("chunks", 1)) if cfg.get("kind") == "ours" else cand


def predictions(plan: dict, probe: dict | None, compute_s: float, quant_rate: float, names) -> dict:
    """The planner beside each configuration: its cost model (``step_s``), and for the link-bound
    regime the step scheduled on the lanes ([Note: step schedule] in planner/schedule.py):
    probed hop rates, the tbf capacities for the busiest-link bound, and the emulated cluster's
    latencies (a probe's intercept at sub-Mbit rates is the token bucket's burst and TCP's
    window, hundreds of ms, not a per-collective cost)."""
    import dataclasses

    from zeropp_hier.planner import model as P
    from zeropp_hier.planner import schedule as S

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
        prefetch = plan["configs"].get(n, {}).get("prefetch", True)  # compare_rank.ds_overrides
        wl_n = wl if prefetch else dataclasses.replace(wl, kept_at_turn=0.0)
        p = by[n] if n in by and cand == by[n].candidate and prefetch else P.predict(cand, cl, wl_n)
        row = {
            "step_s": p.step_s,
            "node_bytes": p.tier_bytes["node"],
            "gpu_bytes": p.tier_bytes["gpu"],
            "gcd_bytes": p.tier_bytes["gcd"],
            "phase_s": p.phase_s,
        }
        bound = P.predict(cand, tbf, wl_n).link_bound_s
        ahead = plan["configs"].get(n, {}).get("pipeline", {}).get("backward_layers_ahead")
        win = window if prefetch else 0
        sched = S.for_prediction(
            P.predict(cand, lanes, wl_n), wl_n, win, compute_s, link_bound_s=bound, backward_window=ahead
        )
        row.update(scheduled_s=sched.step_s, schedule_only_s=sched.schedule_s, link_bound_s=bound, window=win)
        out[n] = row
    return out


def report(summary: dict, pred: dict, meta: dict) -> str:
    s = summary["shaped"]
    un = summary.get("unshaped", {})
    names = [n for n in ORDER + list(VARIANTS) if n in s]
    # ratios against stock where it ran, else against our own presets of the same layouts
    b3 = next((n for n in ("ds-zero3", "zero3") if n in s), names[0])
    bpp = next((n for n in ("ds-zeropp", "zeropp") if n in s), names[0])
    base3, basepp = s[b3]["median_step_s"], s[bpp]["median_step_s"]
    mb = lambda x: f"{x / 1e6:.1f}"  # noqa: E731
    lines = [
        f"| configuration | median step s | tokens/s | vs {b3} | vs {bpp} | node MB/step (wire) | "
        "gpu MB/step (wire) | gcd MB/step (wire) | node MB/step (comm_stats) | peak RSS/rank MB | "
        "unshaped step s | exposed comm s |",
        "|" + "---|" * 12,
    ]
    for n in names:
        d = s[n]
        st = d.get("stats_per_step")
        unshaped = f"{un[n]['median_step_s']:.2f}" if n in un else "-"
        # what the links added to the step: communication that compute did not hide
        exposed = f"{d['median_step_s'] - un[n]['median_step_s']:.2f}" if n in un else "-"
        lines.append(
            f"| {n} | {d['median_step_s']:.2f} | {d['tokens_per_s']:.0f} | "
            f"{base3 / d['median_step_s']:.2f}x | {basepp / d['median_step_s']:.2f}x | "
            f"{mb(d['wire_per_step']['node'])} | {mb(d['wire_per_step']['gpu'])} | "
            f"{mb(d['wire_per_step']['gcd'])} | {mb(st['node']) if st else 'n/a (stock)'} | "
            f"{d['peak_rss_mb']:.0f} | {unshaped} | {exposed} |"
        )
    if "auto" in s:
        fixed = [n for n in names if n in ("zero3", "zeropp", "frontier")]
        best = min(fixed, key=lambda n: s[n]["median_step_s"]) if fixed else None
        a = s["auto"]
        chosen = sorted({x["chosen"] for x in a.get("auto", [])})
        probe = [x["seconds"] for x in a.get("auto", [])]
        lines += [
            "",
            f"auto chose {', '.join(chosen)} (probe + choice {max(probe):.2f} s at most); "
            + (
                f"best fixed preset {best} {s[best]['median_step_s']:.2f} s/step; auto / best = "
                f"{a['median_step_s'] / s[best]['median_step_s']:.3f}"
                if best
                else ""
            ),
        ]
    lines += [
        "",
        "Planner beside measurement (step-time ratios; the planner's node bytes are wire bytes; "
        "scheduled: the step laid out on the lanes, [Note: step schedule] in zeropp_hier/planner/schedule.py, "
        "at least the busiest link at its tbf capacity):",
        "",
        f"| configuration | measured s | predicted s | measured vs {b3} | predicted vs {b3} | "
        f"measured vs {bpp} | predicted vs {bpp} | node MB/step measured | predicted | "
        "scheduled s | scheduled / measured | busiest link at capacity s |",
        "|" + "---|" * 12,
    ]
    p3, ppp = pred.get(b3, {}).get("step_s"), pred.get(bpp, {}).get("step_s")
    for n in names:
        if n not in pred:
            continue
        m, p = s[n]["median_step_s"], pred[n]["step_s"]
        lines.append(
            f"| {n} | {m:.2f} | {p:.2f} | {base3 / m:.2f}x | {p3 / p:.2f}x | {basepp / m:.2f}x | "
            f"{ppp / p:.2f}x | {mb(s[n]['wire_per_step']['node'])} | {mb(pred[n]['node_bytes'])} | "
            + (
                f"{pred[n]['scheduled_s']:.2f} | {pred[n]['scheduled_s'] / m:.2f} | {pred[n]['link_bound_s']:.2f} |"
                if "scheduled_s" in pred[n]
                else "- | - | - |"
            )
        )
    if any("link_use" in s[n] for n in names):
        lines += ["", *link_table(summary, names)]
    lines += ["", *meta["notes"]]
    return "\n".join(lines)


def bar_chart(summary: dict, path: str, shape: str = DEFAULT_SHAPE) -> None:
    try:
        import matplotlib
    except ImportError:  # optional: the table and the JSON carry every number
        print(f"(matplotlib not installed: no chart at {path})")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary["shaped"]
    names = [n for n in ORDER if n in s]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    a1.bar(
        names,
        [s[n]["median_step_s"] for n in names],
        color=["#888", "#aaa", "#4a7", "#39c", "#c63", "#a5c"][: len(names)],
    )
    a1.set_ylabel("median step time (s)")
    a1.set_title(f"step time, emulated cluster, shape {shape}")
    a2.bar(names, [s[n]["wire_per_step"]["node"] / 1e6 for n in names], color="#c63")
    a2.set_ylabel("node-tier wire MB per step")
    a2.set_title("inter-node bytes (interface counters)")
    for a in (a1, a2):
        a.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="measured steps per configuration and round")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument(
        "--node-mbit",
        type=float,
        default=None,
        help=f"node-tier Mbit/s per GCD (gpu 4x, gcd 16x; default {DEFAULT_NODE_MBIT}; "
        "--regime link-bound chooses it)",
    )
    ap.add_argument(
        "--regime",
        choices=REGIMES,
        default="cpu-bound",
        help="cpu-bound: the links at --node-mbit; link-bound: rates from a short unshaped "
        "calibration, so that the unshaped step is at most --link-share of the slowest preset's "
        "shaped step ([Note: link-bound calibration] in benchmarks/linkuse.py)",
    )
    ap.add_argument(
        "--link-share",
        type=float,
        default=0.3,
        help="link-bound regime: the largest unshaped step over the slowest preset's link bound",
    )
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument(
        "--shape",
        choices=list(SHAPES),
        default=DEFAULT_SHAPE,
        help="the GPT-NeoX shape every configuration trains (benchmarks/shapes.py)",
    )
    ap.add_argument("--no-unshaped", action="store_true", help="skip the unshaped (CPU-bound) pass")
    ap.add_argument(
        "--no-probe", action="store_true", help="skip the link probe: the planner takes the tbf rates (a shorter run)"
    )
    ap.add_argument("--out", default="benchmarks/results/compare.json")
    ap.add_argument("--png", default="benchmarks/results/compare.png")
    ap.add_argument("--prefix", default="zhc")
    ap.add_argument("--gpus-per-node", type=int, default=2, help="packages per node (Frontier: 4)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument(
        "--prefetch-bucket",
        type=int,
        default=0,
        help="DeepSpeed stage3_prefetch_bucket_size (elements; reuse distance stays 0 so "
        "backward re-gathers); 0 = no prefetch",
    )
    ap.add_argument(
        "--ratios",
        default="16:4:1",
        help="per-GCD link rates gcd:gpu:node relative to --node-mbit (Frontier 16:4:1; flat 1:1:1)",
    )
    ap.add_argument(
        "--reduce-bucket",
        type=int,
        default=None,
        help="DeepSpeed reduce_bucket_size for every configuration (elements; default: DeepSpeed's, "
        "or about one layer with --fair)",
    )
    ap.add_argument(
        "--device-ms",
        type=float,
        default=0.0,
        help="emulate device compute: each transformer block waits this long in forward and twice "
        "that in backward with the CPU free ([Note: device-time compute] in compare_rank.py)",
    )
    ap.add_argument("--configs", help=f"comma-separated, from {ORDER + list(VARIANTS)} (default: {DEFAULT})")
    ap.add_argument(
        "--fair",
        action="store_true",
        help="the fair fight: Frontier's node shape (2 nodes x 4 packages x 2 GCDs = 16 "
        "ranks), bf16, prefetch of about one transformer layer",
    )
    args = ap.parse_args(argv)
    if args.regime == "link-bound" and args.node_mbit is not None:
        ap.error(
            f"--node-mbit {args.node_mbit:g} and --regime link-bound both set the node rate: the "
            "link-bound regime calibrates it; drop --node-mbit (or use --regime cpu-bound)"
        )
    if not 0 < args.link_share < 1:
        ap.error(f"--link-share must be in (0, 1), got {args.link_share:g}")
    calibrating = args.regime == "link-bound"
    if args.node_mbit is None:
        args.node_mbit = DEFAULT_NODE_MBIT  # link-bound: the calibration's placeholder (unshaped)
    if args.fair:
        args.gpus_per_node, args.dtype = 4, "bf16"
        args.prefetch_bucket = args.prefetch_bucket or 12 * SHAPES[args.shape].hidden ** 2  # ~ one layer
        if args.reduce_bucket is None:
            args.reduce_bucket = args.prefetch_bucket
        if args.out == ap.get_default("out"):
            args.out, args.png = "benchmarks/results/compare_fair.json", "benchmarks/results/compare_fair.png"
    if calibrating and args.out in (ap.get_default("out"), "benchmarks/results/compare_fair.json"):
        base = args.out.removesuffix(".json") + "_link_bound"
        args.out, args.png = base + ".json", base + ".png"
    problem = netns.root_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    r_gcd, r_gpu, r_node = (float(x) for x in args.ratios.split(":"))

    def spec_at(node_mbit: float) -> ClusterSpec:
        unit = node_mbit / r_node
        return ClusterSpec(
            node_mbit=node_mbit,
            gpu_mbit=unit * r_gpu,
            gcd_mbit=unit * r_gcd,
            prefix=args.prefix,
            gpus_per_node=args.gpus_per_node,
        )

    spec = spec_at(args.node_mbit)
    quant_problem = stock_quantization_problem()
    model = SHAPES[args.shape]
    plan = {
        "shape": args.shape,
        "model": planner_model(model),  # the planner's view (planner_inputs)
        "model_spec": dataclasses.asdict(model),  # what the ranks build (zeropp_hier.app.models)
        "params": params_of(args.shape),
        "micro_batch": args.micro_batch,
        "regather": True,
        "dtype": args.dtype,
        "prefetch_bucket": args.prefetch_bucket,
        "device_ms": args.device_ms,
        "reduce_bucket": args.reduce_bucket or 0,
        "warmup": args.warmup,
        "steps": args.steps,
        "world": spec.world_size,
        "node_mbit": args.node_mbit,
        "topology": {"gpus_per_node": spec.gpus_per_node, "gcds_per_gpu": spec.gcds_per_gpu},
        "configs": {
            n: c
            for n, c in configs(spec.gcds_per_node, quant_problem is None).items()
            if n in (args.configs.split(",") if args.configs else DEFAULT)
        },
        "phases": [{"name": "shaped", "rounds": args.rounds}]
        + ([] if args.no_unshaped else [{"name": "unshaped", "rounds": 1, "steps": 2}]),
    }
    plan["preset_compression"] = preset_compression(c["preset"] for c in plan["configs"].values() if "preset" in c)
    notes = [
        f"Model: GPT-NeoX shape {args.shape} ({model.layers} layers x hidden {model.hidden}, {model.heads} heads, "
        f"vocabulary {model.vocab_size}, {model.seq_len} tokens), {plan['params'] / 1e6:.2f}M parameters, "
        f"built and trained by the job's code (zeropp_hier.app.run.Run), {args.dtype}, micro-batch "
        f"{args.micro_batch}, DeepSpeed stage3_prefetch_bucket_size={args.prefetch_bucket} and "
        "stage3_max_reuse_distance=0 (backward re-gathers)"
        + (f", reduce_bucket_size={args.reduce_bucket}." if args.reduce_bucket else ".")
        + (
            f" Device-time compute: every block waits {args.device_ms:g} ms in forward and "
            f"{2 * args.device_ms:g} ms in backward with the CPU free (a stand-in for GPU compute)."
            if args.device_ms
            else ""
        ),
        f"{args.rounds} rounds x {args.steps} measured steps (+{args.warmup} warm-up) per configuration, "
        "rotating order; step time = slowest rank; median over rounds and steps.",
        f"Stock ZeRO++: zero_hpz_partition_size={spec.gcds_per_node} (node size). "
        + (quant_problem + "." if quant_problem else "qwZ/qgZ on."),
        "Wire bytes: interface tx counters (TCP/IP headers and ACKs included); comm_stats counts payload "
        "as a direct algorithm would send it (gloo's flat ring all-gather sends fewer node bytes).",
        "Peak RSS per rank includes the Python/DeepSpeed baseline of each process.",
    ]
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    t_start = time.time()
    log = open(os.devnull, "w") if os.environ.get("QUIET") else sys.stderr
    links: dict = {}  # run label -> tx bytes per shaped link direction over its measured steps
    begun: dict = {}
    regime: dict = {"name": args.regime}
    with Cluster(spec):

        def on_mark(label, _bytes):
            # [Note: build unshaped] DeepSpeed broadcasts and partitions the whole model while an
            # engine is built; that is not a training step, so it runs on unshaped links
            if label == "phase unshaped" or label.endswith(" build"):
                netns.unshape(spec)
            elif label.endswith(" shape"):
                netns.shape(spec)
            elif label.endswith(" begin") or label.endswith(" end"):
                # every link direction's counter ([Note: link use]); the ranks wait at the mark
                run, _, what = label.rpartition(" ")
                tx = {f"{ns}/{ifname}": v for (ns, ifname), v in netns.egress_tx(spec).items()}
                if what == "begin":
                    begun[run] = tx
                else:
                    links[run] = {k: v - begun[run][k] for k, v in tx.items()}
            print(f"[{time.time() - t_start:6.0f} s] {label}", file=sys.stderr, flush=True)

        if calibrating:
            regime.update(calibrate(spec, plan, args.link_share, on_mark, links, log))
            spec = spec_at(regime["node_mbit"])
            plan["node_mbit"] = spec.node_mbit
            netns.shape(spec)
            print(
                f"link-bound regime: node {spec.node_mbit:g} Mbit/s per GCD (per-GCD Mbit/s "
                f"{spec.per_gcd_mbit()}), from the unshaped calibration of {sorted(regime['calibration'])}: "
                f"slowest {regime['slowest']}, unshaped step <= {regime['unshaped_max_s']:.2f} s, "
                f"predicted share {regime['predicted_share']:.2f} (<= {args.link_share:g})",
                file=sys.stderr,
                flush=True,
            )
        probe = None if args.no_probe else run_probe(spec)
        results, wire = run_marked(spec, ["-m", "benchmarks.compare_rank", json.dumps(plan)], on_mark=on_mark, log=log)
    # what the ranks measured, before any arithmetic on it: a bug in the report loses no run
    raw = args.out.removesuffix(".json") + ".raw.json"  # removed once the report is written
    with open(raw, "w") as f:
        json.dump({"plan": plan, "results": results, "wire": wire, "links": links, "regime": regime}, f)
    notes.insert(
        0,
        f"Emulated cluster: {spec.nodes} nodes x {spec.gpus_per_node} packages x {spec.gcds_per_gpu} GCDs, "
        f"per-GCD Mbit/s {spec.per_gcd_mbit()} (gcd:gpu:node {args.ratios}), gloo over TCP; regime {args.regime}.",
    )
    summary = summarize(results, wire, plan, links)
    add_link_use(summary, spec)
    if calibrating:
        regime["check"] = regime_check(summary, regime["slowest"])
        c = regime["check"]
        notes.append(
            f"Link-bound regime: node rate {spec.node_mbit:g} Mbit/s per GCD chosen from an unshaped "
            f"calibration ({args.warmup} warm-up + 1 step per preset of {sorted(regime['calibration'])}): the slowest "
            f"preset {regime['slowest']} moves its busiest link's bytes in "
            f"{regime['predicted_links_s'][regime['slowest']]:.1f} s "
            f"at that rate, and the largest unshaped step was {regime['unshaped_max_s']:.2f} s "
            f"(share {regime['predicted_share']:.2f} <= {args.link_share:g}). Measured here: largest unshaped "
            + (
                f"step {c['unshaped_max_s']:.2f} s = {c['share']:.2f} of {regime['slowest']}'s shaped step."
                if c
                else "step not measured (--no-unshaped)."
            )
        )
    rates = next(r["quant_rate_per_rank"] for r in results if "quant_rate_per_rank" in r)
    quant_rate = statistics.median(rates)
    compute_s = compute_estimate(summary)
    if compute_s is None:
        compute_s = 0.0
        notes.append("No unshaped pass: the planner assumed zero compute time.")
    pred = predictions(plan, probe, compute_s, quant_rate, [n for n in summary["shaped"] if n != "auto"])
    if probe is not None:
        mbit = {t: round(v["bandwidth"] * 8 / 1e6, 2) for t, v in probe["tiers"].items()}
        probed = f"tiers probed on this cluster ({json.dumps(mbit)} Mbit/s per GCD)"
    else:
        probed = "tiers at their tbf rates (--no-probe)"
    notes.append(
        f"Planner inputs: {probed}, "
        f"compute = median unshaped step over all configurations {compute_s:.2f} s, "
        f"quantize+dequantize {quant_rate / 1e6:.1f} M elem/s per rank."
    )
    text = report(summary, pred, {"notes": notes})
    print(text)
    write_json_atomic(
        args.out,
        {
            "plan": plan,
            "summary": summary,
            "predictions": pred,
            "probe": probe,
            "notes": notes,
            "quant_rate_per_rank": rates,
            "regime": regime,
            "wall_s": time.time() - t_start,
        },
        indent=1,
    )
    os.remove(raw)
    bar_chart(summary, args.png, args.shape)
    print(f"\nwrote {args.out} and {args.png} ({time.time() - t_start:.0f} s)")
    return 0


def calibrate(spec: ClusterSpec, plan: dict, share: float, on_mark, links: dict, log) -> dict:
    """The link-bound regime's rates ([Note: link-bound calibration] in benchmarks/linkuse.py):
    one unshaped step (after the warm-up) of each of our presets in the plan (of every
    configuration when it has none of ours), its bytes on every link, and the node rate that
    keeps the largest unshaped step within ``share`` of the slowest preset's link bound."""
    ours = {n: c for n, c in plan["configs"].items() if c["kind"] == "ours"} or plan["configs"]
    cal_plan = {**plan, "configs": ours, "phases": [{"name": "unshaped", "rounds": 1, "steps": 1}]}
    results, wire = run_marked(
        spec, ["-m", "benchmarks.compare_rank", json.dumps(cal_plan)], on_mark=on_mark, port=29513, log=log
    )
    unshaped = summarize(results, wire, cal_plan, links)["unshaped"]
    derived = linkuse.link_bound_rate(
        {
            n: {"unshaped_s": d["median_step_s"], "links": link_uses(spec, d["links_per_step"], per_node_mbit=True)}
            for n, d in unshaped.items()
        },
        share,
    )
    derived["calibration"] = {
        n: {"unshaped_s": d["median_step_s"], "wire_per_step": d["wire_per_step"]} for n, d in unshaped.items()
    }
    return derived


def regime_check(summary: dict, slowest: str) -> dict | None:
    """What the measured run says of the link-bound choice: the largest unshaped step over the
    slowest preset's shaped step (None without the unshaped pass)."""
    un = summary.get("unshaped", {})
    shaped = summary["shaped"].get(slowest)
    if not un or shaped is None:
        return None
    t = max(d["median_step_s"] for d in un.values())
    return {"unshaped_max_s": t, "slowest_shaped_s": shaped["median_step_s"], "share": t / shaped["median_step_s"]}


def probe_sizes(node_mbit: float) -> str:
    """The probe's message sizes: 16 KiB and 1 MiB at the CPU-bound regime's rate; the large one
    shrinks with the node rate (to 64 KiB at least) so that the probe takes about as long at
    link-bound rates (at 0.3 Mbit/s per GCD a 1 MiB node-tier all-gather takes ~30 s, and the
    probe runs five of them per tier)."""
    large = min(1 << 20, max(1 << 16, int((1 << 20) * node_mbit / DEFAULT_NODE_MBIT) // 4096 * 4096))
    return f"16384,{large}"


def run_probe(spec: ClusterSpec) -> dict:
    """``zeropp-hier probe`` on the cluster: per-tier all-gather bandwidth and latency."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "probe.json")
        run_marked(
            spec,
            [
                "-m",
                "zeropp_hier.tools.cli",
                "probe",
                "--out",
                out,
                "--gcds-per-gpu",
                str(spec.gcds_per_gpu),
                "--gpus-per-node",
                str(spec.gpus_per_node),
                "--sizes",
                probe_sizes(spec.node_mbit),
            ],
            port=29512,
        )
        with open(out) as f:
            return json.load(f)


if __name__ == "__main__":
    sys.exit(main())
