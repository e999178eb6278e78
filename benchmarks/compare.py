"""Stock DeepSpeed ZeRO-3 / ZeRO++ against our presets, on the emulated three-tier cluster.

    sudo python -m benchmarks.compare                       # full run (~20 min on 2 CPU cores)
    sudo python -m benchmarks.compare --rounds 1 --steps 1  # smoke run

Builds the emulated cluster (benchmarks/cluster: 2 nodes x 2 packages x 2 GCDs, tbf links in
Frontier's per-GCD ratios), probes each tier, then runs the same GPT (fp32, DeepSpeed prefetch
and reuse distance 0 so that backward re-gathers as for a large model) under every
configuration in one 8-rank world, round after round in a rotating order, and finally one pass
with the links unshaped (the CPU-bound part of each step). Reports median step time, tokens/s,
wire bytes per tier per step from the interface counters (the same for stock DeepSpeed and for
us) beside ``comm_stats`` for ours, peak RSS per rank, ratios, and the planner's predictions;
writes JSON and a PNG bar chart. The cluster is torn down at the end, on error and on signals.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks.cluster import netns
from benchmarks.cluster.driver import run_marked
from benchmarks.cluster.runner import Cluster
from benchmarks.cluster.spec import ClusterSpec
from zeropp_hier.files import write_json_atomic

MODEL = dict(vocab_size=1024, seq_len=64, d_model=256, n_heads=4, n_layers=4)  # ~3.4M parameters
ORDER = ["ds-zero3", "ds-zeropp", "zero3", "zeropp", "frontier", "auto"]
DEFAULT = ORDER[:5]
# variants for the overlap question (name them with --configs): prefetch off, and every
# collective inline (overlap off) with prefetch on
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
    # int4 gradients on the package links too (a candidate of "auto")
    "frontier/int4-gpu": {
        "kind": "ours",
        "preset": "frontier",
        "compression": {"gradients": {"gpu": "int4", "node": "int4"}},
    },
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


def params_of(model: dict) -> int:
    from zeropp_hier.testing.models.gpt import GPT, GPTConfig

    return sum(p.numel() for p in GPT(GPTConfig(**model)).parameters())


# --------------------------------------------------------------------------------------------
def summarize(results: list, wire: dict, plan: dict) -> dict:
    """Per configuration and phase: median step time (slowest rank per step), wire and
    comm_stats bytes per step, peak RSS."""
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
        if "stats" in per_rank[0]:
            d["stats"].append(
                {
                    t: sum(sum(r["stats"]["bytes"][p][t] for p in r["stats"]["bytes"]) for r in per_rank) / steps
                    for t in ("gcd", "gpu", "node")
                }
            )
    for phase in out.values():
        for d in phase.values():
            d["median_step_s"] = statistics.median(d["step_times"])
            d["tokens_per_s"] = tokens / d["median_step_s"]
            d["wire_per_step"] = {t: statistics.mean(x[t] for x in d["wire"]) for t in ("gcd", "gpu", "node")}
            if d["stats"]:
                d["stats_per_step"] = {t: statistics.mean(x[t] for x in d["stats"]) for t in ("gcd", "gpu", "node")}
            d["peak_rss_mb"] = max(d["peak_rss"]) / 2**20
    return out


def compute_estimate(summary: dict) -> float | None:
    """Compute time per step for the planner: the median of every unshaped step, all
    configurations pooled. With the links unshaped every configuration's step is compute plus
    memory-speed copies; pooling damps the load spikes of a machine shared with others."""
    samples = [t for d in summary.get("unshaped", {}).values() for t in d["step_times"]]
    return statistics.median(samples) if samples else None


def planner_inputs(plan: dict, probe: dict | None, compute_s: float, quant_rate: float):
    """The planner's cluster and workload for a run of this benchmark (also what the planner
    test re-runs from a recorded JSON)."""
    from zeropp_hier.tools import planner as P

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
    )
    return cl, wl


def predictions(plan: dict, probe: dict | None, compute_s: float, quant_rate: float, names) -> dict:
    from zeropp_hier.tools import planner as P

    cl, wl = planner_inputs(plan, probe, compute_s, quant_rate)
    by = {p.candidate.name: p for p in P.rank(cl, wl)}
    return {
        n: {
            "step_s": by[n].step_s,
            "node_bytes": by[n].tier_bytes["node"],
            "gpu_bytes": by[n].tier_bytes["gpu"],
            "gcd_bytes": by[n].tier_bytes["gcd"],
            "phase_s": by[n].phase_s,
        }
        for n in names
    }


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
        "Planner beside measurement (step-time ratios; the planner's node bytes are wire bytes):",
        "",
        f"| configuration | measured s | predicted s | measured vs {b3} | predicted vs {b3} | "
        f"measured vs {bpp} | predicted vs {bpp} | node MB/step measured | predicted |",
        "|" + "---|" * 9,
    ]
    p3, ppp = pred.get(b3, {}).get("step_s"), pred.get(bpp, {}).get("step_s")
    for n in names:
        if n not in pred:
            continue
        m, p = s[n]["median_step_s"], pred[n]["step_s"]
        lines.append(
            f"| {n} | {m:.2f} | {p:.2f} | {base3 / m:.2f}x | {p3 / p:.2f}x | {basepp / m:.2f}x | "
            f"{ppp / p:.2f}x | {mb(s[n]['wire_per_step']['node'])} | {mb(pred[n]['node_bytes'])} |"
        )
    lines += ["", *meta["notes"]]
    return "\n".join(lines)


def bar_chart(summary: dict, path: str) -> None:
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
    a1.set_title("step time, emulated 2x2x2 cluster")
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
    ap.add_argument("--node-mbit", type=float, default=6.0, help="node-tier Mbit/s per GCD (gpu 4x, gcd 16x)")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--no-unshaped", action="store_true", help="skip the unshaped (CPU-bound) pass")
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
    if args.fair:
        args.gpus_per_node, args.dtype = 4, "bf16"
        args.prefetch_bucket = args.prefetch_bucket or 12 * MODEL["d_model"] ** 2  # ~ one layer
        if args.reduce_bucket is None:
            args.reduce_bucket = args.prefetch_bucket
        if args.out == ap.get_default("out"):
            args.out, args.png = "benchmarks/results/compare_fair.json", "benchmarks/results/compare_fair.png"
    problem = netns.root_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    r_gcd, r_gpu, r_node = (float(x) for x in args.ratios.split(":"))
    unit = args.node_mbit / r_node
    spec = ClusterSpec(
        node_mbit=args.node_mbit,
        gpu_mbit=unit * r_gpu,
        gcd_mbit=unit * r_gcd,
        prefix=args.prefix,
        gpus_per_node=args.gpus_per_node,
    )
    quant_problem = stock_quantization_problem()
    plan = {
        "model": MODEL,
        "params": params_of(MODEL),
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
    notes = [
        f"Emulated cluster: {spec.nodes} nodes x {spec.gpus_per_node} packages x {spec.gcds_per_gpu} GCDs, "
        f"per-GCD Mbit/s {spec.per_gcd_mbit()} (gcd:gpu:node {args.ratios}), gloo over TCP.",
        f"Model: GPT {MODEL}, {plan['params'] / 1e6:.2f}M parameters, {args.dtype}, micro-batch "
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
    with Cluster(spec):
        probe = run_probe(spec)

        def on_mark(label, _bytes):
            # [Note: build unshaped] DeepSpeed broadcasts and partitions the whole model while an
            # engine is built; that is not a training step, so it runs on unshaped links
            if label == "phase unshaped" or label.endswith(" build"):
                netns.unshape(spec)
            elif label.endswith(" shape"):
                netns.shape(spec)
            print(f"[{time.time() - t_start:6.0f} s] {label}", file=sys.stderr, flush=True)

        results, wire = run_marked(
            spec,
            ["-m", "benchmarks.compare_rank", json.dumps(plan)],
            on_mark=on_mark,
            log=open(os.devnull, "w") if os.environ.get("QUIET") else sys.stderr,
        )
    summary = summarize(results, wire, plan)
    rates = next(r["quant_rate_per_rank"] for r in results if "quant_rate_per_rank" in r)
    quant_rate = statistics.median(rates)
    compute_s = compute_estimate(summary)
    if compute_s is None:
        compute_s = 0.0
        notes.append("No unshaped pass: the planner assumed zero compute time.")
    pred = predictions(
        plan, probe, compute_s, quant_rate, [n for n in ORDER if n in summary["shaped"] and n != "auto"]
    )
    probed = json.dumps({t: round(v["bandwidth"] * 8 / 1e6, 2) for t, v in probe["tiers"].items()})
    notes.append(
        f"Planner inputs: tiers probed on this cluster ({probed} Mbit/s per GCD), "
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
            "wall_s": time.time() - t_start,
        },
        indent=1,
    )
    bar_chart(summary, args.png)
    print(f"\nwrote {args.out} and {args.png} ({time.time() - t_start:.0f} s)")
    return 0


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
                "16384,1048576",
            ],
            port=29512,
        )
        with open(out) as f:
            return json.load(f)


if __name__ == "__main__":
    sys.exit(main())
