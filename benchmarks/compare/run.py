"""Stock DeepSpeed ZeRO-3 / ZeRO++ against our presets, on the emulated three-tier cluster.

    sudo python -m benchmarks.compare                       # full run (~20 min on 2 CPU cores)
    sudo python -m benchmarks.compare --rounds 1 --steps 1  # smoke run
    sudo python -m benchmarks.compare --issue-mode lanes    # gloo's per-group threads instead

Builds the emulated cluster (benchmarks/cluster: 2 nodes x 2 packages x 2 GCDs, tbf links in
Frontier's per-GCD ratios), probes each tier, then trains the same GPT-NeoX shape
(``--shape``, benchmarks/compare/shapes.py; fp32, DeepSpeed prefetch and reuse distance 0 so that
backward re-gathers as for a large model) through the training job's own code
(benchmarks/compare/rank.py) under every configuration in one 8-rank world, round after round
in a rotating order (ours in ``--issue-mode``: by default ``gpu``, one issuing thread as
NCCL/RCCL run it, [Note: benchmark issue mode] in variants.py), and finally one pass
with the links unshaped (the CPU-bound part of each step). Reports median step time, tokens/s,
wire bytes per tier per step from the interface counters (the same for stock DeepSpeed and for
us) beside ``comm_stats`` for ours, peak RSS per rank, ratios, and the planner's predictions,
every table naming the issue mode; writes JSON and a PNG bar chart. The cluster is
torn down at the end, on error and on signals.

This module is the runner (the command line, the cluster, the calibration and the probe); the
configurations are data in ``variants``, the planner beside the measurements is
``planner`` and the summary, tables and chart are ``report``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

from benchmarks.cluster import netns
from benchmarks.cluster.driver import run_marked
from benchmarks.cluster.runner import Cluster
from benchmarks.cluster.spec import ClusterSpec
from benchmarks.compare import linkuse
from benchmarks.compare.planner import compute_estimate, predictions, preset_compression
from benchmarks.compare.report import add_link_use, bar_chart, link_uses, regime_check, report, summarize
from benchmarks.compare.shapes import DEFAULT_SHAPE, SHAPES, planner_model
from benchmarks.compare.variants import (
    DEFAULT,
    ISSUE_MODES,
    ORDER,
    VARIANTS,
    configs,
    in_issue_mode,
    issue_mode_label,
)
from benchmarks.tables.provenance import emulated_conditions, run_meta
from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS
from zeropp_hier.files import write_json_atomic
from zeropp_hier.tools.compare_runs import ds_quantizer_problem  # the compare job asks the same

DEFAULT_NODE_MBIT = 6.0  # per GCD, the CPU-bound regime's node rate
REGIMES = ("cpu-bound", "link-bound")


def params_of(shape: str) -> int:
    from zeropp_hier.app.spec import n_params

    return n_params(SHAPES[shape])


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = netns.root_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    spec_at = spec_maker(args)
    spec = spec_at(args.node_mbit)
    quant_problem = ds_quantizer_problem()
    plan = build_plan(args, spec, quant_problem)
    notes = plan_notes(args, plan, spec, quant_problem)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    t_start = time.time()
    spec, probe, results, wire, links, regime = measure(args, plan, spec_at, spec, t_start)
    # what the ranks measured, before any arithmetic on it: a bug in the report loses no run
    raw = args.out.removesuffix(".json") + ".raw.json"  # removed once the report is written
    with open(raw, "w") as f:
        json.dump({"plan": plan, "results": results, "wire": wire, "links": links, "regime": regime}, f)
    if args.unshaped_only:
        record_unshaped(args, plan, notes, results, wire, links, regime, t_start)
        os.remove(raw)
        print(f"\nwrote {args.out} ({time.time() - t_start:.0f} s)")
        return 0
    summary = record(args, plan, spec, notes, probe, results, wire, links, regime, t_start)
    os.remove(raw)
    bar_chart(summary, args.png, args.shape, issue_mode_label(plan))
    print(f"\nwrote {args.out} and {args.png} ({time.time() - t_start:.0f} s)")
    return 0


def parse_args(argv) -> argparse.Namespace:
    """The command line, with the defaults that depend on other flags filled in (``--fair``'s
    node shape, ``--regime link-bound``'s file names)."""
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
        "shaped step ([Note: link-bound calibration] in benchmarks/compare/linkuse.py)",
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
        help="the GPT-NeoX shape every configuration trains (benchmarks/compare/shapes.py)",
    )
    ap.add_argument("--no-unshaped", action="store_true", help="skip the unshaped (CPU-bound) pass")
    ap.add_argument(
        "--unshaped-only",
        action="store_true",
        help="only the unshaped pass, --rounds rounds of --steps steps: no shaped phase, calibration, probe, "
        "planner predictions or chart (the record holds the plan, the summary and the machine's load)",
    )
    ap.add_argument(
        "--no-probe", action="store_true", help="skip the link probe: the planner takes the tbf rates (a shorter run)"
    )
    ap.add_argument("--out", default="benchmarks/results/compare.json")
    ap.add_argument("--png", default="benchmarks/results/compare.png")
    ap.add_argument("--prefix", default="zhc")
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the emulated cluster")
    ap.add_argument(
        "--gpus-per-node", type=int, default=None, help="packages per node (default 2; Frontier and --fair: 4)"
    )
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
        "that in backward with the CPU free ([Note: device-time compute] in rank.py)",
    )
    ap.add_argument(
        "--issue-mode",
        choices=ISSUE_MODES,
        default="gpu",
        help="who issues our hop collectives: gpu = one issuing thread, overlap as NCCL/RCCL resolve it "
        '("ticks", with its chunks where a configuration leaves them out, or the mode a configuration '
        'names, e.g. "one_lane"); lanes = gloo\'s thread per hop '
        "group (not a GPU mode). Stock DeepSpeed is the same in both ([Note: benchmark issue mode])",
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
    if args.unshaped_only and args.no_unshaped:
        ap.error("--unshaped-only and --no-unshaped leave nothing to run: drop one")
    if args.unshaped_only:  # no shaped phase: nothing to calibrate or probe
        args.regime, args.no_probe = "cpu-bound", True
    calibrating = args.regime == "link-bound"
    if args.node_mbit is None:
        args.node_mbit = DEFAULT_NODE_MBIT  # link-bound: the calibration's placeholder (unshaped)
    if args.fair:
        args.gpus_per_node, args.dtype = args.gpus_per_node or 4, "bf16"
        args.prefetch_bucket = args.prefetch_bucket or 12 * SHAPES[args.shape].hidden ** 2  # ~ one layer
        if args.reduce_bucket is None:
            args.reduce_bucket = args.prefetch_bucket
        if args.out == ap.get_default("out"):
            args.out, args.png = "benchmarks/results/compare_fair.json", "benchmarks/results/compare_fair.png"
    args.gpus_per_node = args.gpus_per_node or 2
    if calibrating and args.out in (ap.get_default("out"), "benchmarks/results/compare_fair.json"):
        base = args.out.removesuffix(".json") + "_link_bound"
        args.out, args.png = base + ".json", base + ".png"
    return args


def spec_maker(args: argparse.Namespace):
    """The cluster at a node rate, the other tiers at ``--ratios`` of it."""
    r_gcd, r_gpu, r_node = (float(x) for x in args.ratios.split(":"))

    def spec_at(node_mbit: float) -> ClusterSpec:
        unit = node_mbit / r_node
        return ClusterSpec(
            node_mbit=node_mbit,
            gpu_mbit=unit * r_gpu,
            gcd_mbit=unit * r_gcd,
            prefix=args.prefix,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
        )

    return spec_at


def build_plan(args: argparse.Namespace, spec: ClusterSpec, quant_problem: str | None) -> dict:
    """What every rank runs (``benchmarks/compare/rank.py``) and the result file records."""
    model = SHAPES[args.shape]
    plan = {
        "shape": args.shape,
        "model": planner_model(model),  # the planner's view (planner_inputs)
        "model_spec": dataclasses.asdict(model),  # what the ranks build (zeropp_hier.app.model.models)
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
        "issue_mode": args.issue_mode,  # [Note: benchmark issue mode]
        # the chunks of the tick mode where a configuration leaves them out (the planner models
        # what ran, not a later default: benchmarks/compare/planner.tick_chunks)
        "tick_chunks": DEFAULT_TICK_CHUNKS,
        "configs": {
            n: in_issue_mode(c, args.issue_mode)
            for n, c in configs(spec.gcds_per_node, quant_problem is None).items()
            if n in (args.configs.split(",") if args.configs else DEFAULT)
        },
        "phases": [{"name": "unshaped", "rounds": args.rounds, "steps": args.steps}]
        if args.unshaped_only
        else [{"name": "shaped", "rounds": args.rounds}]
        + ([] if args.no_unshaped else [{"name": "unshaped", "rounds": 1, "steps": 2}]),
    }
    plan["preset_compression"] = preset_compression(c["preset"] for c in plan["configs"].values() if "preset" in c)
    return plan


def plan_notes(args: argparse.Namespace, plan: dict, spec: ClusterSpec, quant_problem: str | None) -> list[str]:
    """The report's notes on what ran: the model, the rounds, stock ZeRO++'s settings, the counters."""
    model = SHAPES[args.shape]
    return [
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
        f"Ours ran in {issue_mode_label(plan)}"
        + (
            ": every hop transfer from one thread, overlap true as NCCL/RCCL resolve it (ticks: one "
            f"grouped point-to-point call per tick on one communicator, {DEFAULT_TICK_CHUNKS} chunks unless the "
            "configuration sets them) or the mode a configuration names; in one_lane gloo omits RCCL's host "
            "wait before each collective."
            if args.issue_mode == "gpu"
            else "; a GPU runs one issuing thread (--issue-mode gpu)."
        ),
        f"{args.rounds} rounds x {args.steps} measured steps (+{args.warmup} warm-up) per configuration, "
        "rotating order; step time = slowest rank; median over rounds and steps.",
        f"Stock ZeRO++: zero_hpz_partition_size={spec.gcds_per_node} (node size). "
        + (quant_problem + "." if quant_problem else "qwZ/qgZ on."),
        "Wire bytes: interface tx counters (TCP/IP headers and ACKs included); comm_stats counts payload "
        "as a direct algorithm would send it (gloo's flat ring all-gather sends fewer node bytes).",
        "Peak RSS per rank includes the Python/DeepSpeed baseline of each process.",
    ]


def measure(args: argparse.Namespace, plan: dict, spec_at, spec: ClusterSpec, t_start: float):
    """The run on the emulated cluster: the link-bound calibration where asked, the probe, then
    every configuration round after round. Returns the cluster as shaped (the calibration may
    change its rates), the probe, the ranks' results, wire bytes per mark, bytes per shaped link
    direction per run and the regime."""
    calibrating = args.regime == "link-bound"
    log = open(os.devnull, "w") if os.environ.get("QUIET") else sys.stderr
    links: dict = {}  # run label -> tx bytes per shaped link direction over its measured steps
    begun: dict = {}
    # the machine's load (1/5/15-minute averages) at each run's first and last measured step:
    # the host is shared, so a reader can judge each row's timing by it
    regime: dict = {"name": args.regime, "loadavg": {}}
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
                regime["loadavg"].setdefault(run, {})[what] = os.getloadavg()
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
        if probe is not None and any(c.get("preset") == "auto" for c in plan["configs"].values()):
            # [Note: auto on the benchmark's probe] in compare/rank.py
            plan["auto_probe_file"] = args.out.removesuffix(".json") + ".probe.json"
            write_json_atomic(plan["auto_probe_file"], probe)
        results, wire = run_marked(spec, ["-m", "benchmarks.compare.rank", json.dumps(plan)], on_mark=on_mark, log=log)
    return spec, probe, results, wire, links, regime


def record(
    args: argparse.Namespace,
    plan: dict,
    spec: ClusterSpec,
    notes: list[str],
    probe: dict | None,
    results: list,
    wire: dict,
    links: dict,
    regime: dict,
    t_start: float,
) -> dict:
    """The summary, the planner beside it and the report: printed, and written to ``--out``.
    Returns the summary."""
    calibrating = args.regime == "link-bound"
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
    text = report(summary, pred, {"notes": notes, "issue_mode": issue_mode_label(plan)})
    print(text)
    _write(args.out, plan, summary, notes, rates, regime, t_start, args.ratios, predictions=pred, probe=probe)
    return summary


def _write(
    out: str, plan: dict, summary: dict, notes: list, rates, regime: dict, t_start: float, ratios: str, **extra
) -> None:
    """A run's record: the plan, the summary and what the run measured beside it (``extra``: the
    planner's predictions and the probe, where the run has them), and ``meta``: the commit, the
    defaults and the conditions it ran under (benchmarks/tables/provenance.py)."""
    meta = run_meta({**emulated_conditions(plan, ratios), "regime": regime.get("name")})
    record = {"meta": meta, "plan": plan, "summary": summary, **extra, "notes": notes, "quant_rate_per_rank": rates}
    write_json_atomic(out, {**record, "regime": regime, "wall_s": time.time() - t_start}, indent=1)


def record_unshaped(
    args: argparse.Namespace, plan: dict, notes: list, results: list, wire: dict, links: dict, regime: dict, t_start
) -> None:
    """``--unshaped-only``: the summary of the unshaped pass (steps, bytes, what ``auto`` chose
    and predicted), printed per configuration and written to ``--out``; no planner beside it."""
    summary = summarize(results, wire, plan, links)
    rates = next(r["quant_rate_per_rank"] for r in results if "quant_rate_per_rank" in r)
    notes.insert(0, "Links unshaped throughout (--unshaped-only): the step is the ranks' CPU work on shared cores.")
    for name, d in summary.get("unshaped", {}).items():
        chosen = f" (auto chose {d['auto'][0]['chosen']})" if d.get("auto") else ""
        times = ", ".join(f"{t:.2f}" for t in d["step_times"])
        print(f"{name:<16} median {d['median_step_s']:.2f} s per step ({times}){chosen}")
    _write(args.out, plan, summary, notes, rates, regime, t_start, args.ratios)


def calibrate(spec: ClusterSpec, plan: dict, share: float, on_mark, links: dict, log) -> dict:
    """The link-bound regime's rates ([Note: link-bound calibration] in benchmarks/compare/linkuse.py):
    one unshaped step (after the warm-up) of each of our presets in the plan (of every
    configuration when it has none of ours), its bytes on every link, and the node rate that
    keeps the largest unshaped step within ``share`` of the slowest preset's link bound."""
    ours = {n: c for n, c in plan["configs"].items() if c["kind"] == "ours"} or plan["configs"]
    cal_plan = {**plan, "configs": ours, "phases": [{"name": "unshaped", "rounds": 1, "steps": 1}]}
    results, wire = run_marked(
        spec, ["-m", "benchmarks.compare.rank", json.dumps(cal_plan)], on_mark=on_mark, port=29513, log=log
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
