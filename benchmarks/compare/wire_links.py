"""What crosses each link: ``comm_stats``' link view against the emulated cluster's wire counters.

    sudo python -m benchmarks.compare.wire_links --nodes 8 --gpus-per-node 1   # 8 x 1 x 2, 16 ranks
    sudo python -m benchmarks.compare.wire_links --nodes 2 --gpus-per-node 4   # 2 x 4 x 2, 16 ranks

Trains the benchmark's GPT shape under each preset (``--configs``, default zeropp and frontier)
with the links unshaped (bytes do not depend on the rates, and the run is shortest), in the
benchmark's ``gpu`` issue mode ([Note: benchmark issue mode] in variants.py), and records
per link class and step, summed over ranks: the interface counters ([Note: wire bytes] in
cluster/spec.py), ``comm_stats``' link view (``link_bytes``, [Note: bytes per link] in
core/wire.py), its payload view (``bytes``, [Note: byte accounting] in comm/stats.py) and the
planner's bytes for the same plan. The counters include TCP/IP headers and ACKs; the link view
counts payload only, so the file also records the packet counters and the counters less the
transport's framing: one TCP/IP header per packet and gloo's per-message ops ([Note: headers per
packet]). DeepSpeed's own small collectives (loss, gradient norm)
stay in both wire figures.
tests/unit/test_wire.py re-checks the recorded files against the model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Sequence

from benchmarks.cluster import netns
from benchmarks.cluster.driver import run_marked
from benchmarks.cluster.runner import Cluster
from benchmarks.cluster.spec import ClusterSpec, wire_bytes
from benchmarks.compare import run as compare
from benchmarks.compare.planner import predictions
from benchmarks.compare.report import summarize
from benchmarks.tables.provenance import run_meta
from zeropp_hier.core.vocab import TIERS
from zeropp_hier.files import write_json_atomic
from zeropp_hier.tools.compare_runs import ds_quantizer_problem

# [Note: headers per packet]
# A tx counter counts each skb's length, one Ethernet (14), IPv4 (20) and TCP header (20, plus 12
# of timestamp options, on by default) per skb, whether the skb is one segment or a GSO burst of
# many (veth and lo count one packet per skb). So counted bytes less 66 per counted packet is the
# TCP payload that crossed the link, ACKs (header only) included at zero.
HEADER_BYTES = 14 + 20 + 20 + 12
# gloo's TCP transport frames each message with a 48-byte op preamble (six size_t:
# gloo/transport/tcp/pair.h) and sends two more such ops per message, a send-ready notice ahead of
# the data and a receive-ready notice back from the receiver (unbound-buffer send/recv), both over
# the same pair of ranks, so on links of the same class: three preambles per message that
# ``comm_stats`` counts (``link_messages``).
GLOO_BYTES_PER_MESSAGE = 3 * 48


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus-per-node", type=int, default=1)
    ap.add_argument("--gcds-per-gpu", type=int, default=2)
    ap.add_argument("--configs", default="zeropp,frontier")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--prefix", default="zwire")
    ap.add_argument("--out", default=None, help="default benchmarks/results/wire_links_<n>x<p>x<g>.json")
    return ap.parse_args(argv)


def cluster_and_plan(args: argparse.Namespace, quant_problem: str | None) -> tuple[ClusterSpec, dict]:
    """The emulated cluster and what every rank runs: benchmarks.compare's plan at this shape,
    one unshaped pass of ``args.steps`` steps."""
    spec = ClusterSpec(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, gcds_per_gpu=args.gcds_per_gpu, prefix=args.prefix
    )
    cargs = compare.parse_args(["--configs", args.configs, "--steps", str(args.steps), "--warmup", str(args.warmup)])
    plan = compare.build_plan(cargs, spec, quant_problem)
    plan["phases"] = [{"name": "unshaped", "rounds": 1, "steps": args.steps}]
    return spec, plan


def planner_bytes(plan: dict, names) -> dict:
    """The planner's bytes per link class and step, whole cluster, for each configuration."""
    pred = predictions(plan, None, 1.0, 1e9, list(names))
    return {n: {t: pred[n][f"{t}_bytes"] for t in TIERS} for n in names if n in pred}


def message_overhead(records: Sequence[dict]) -> dict:
    """The wire's bytes beyond the link view per message ``comm_stats`` counted, from recorded
    runs of this module (their ``configs``): per (shape, configuration, link class) with
    messages, and ``"all"``, over every message of every record: the planner's
    ``EMULATED_MESSAGE_OVERHEAD`` ([Note: per-message framing] in zeropp_hier/planner/clusters.py).
    The counters also carry DeepSpeed's own small collectives, which the link view leaves out."""
    per: dict = {}
    extra = msgs = 0.0
    for rec in records:
        shape = "x".join(str(rec["topology"][k]) for k in ("nodes", "gpus_per_node", "gcds_per_gpu"))
        for name, row in rec["configs"].items():
            for t in TIERS:
                m = row["link_messages_per_step"][t]
                if m <= 0:
                    continue
                e = row["wire_per_step"][t] - row["link_view_per_step"][t]
                per[(shape, name, t)] = e / m
                extra, msgs = extra + e, msgs + m
    if msgs <= 0:
        raise ValueError("wire_links.message_overhead: no recorded messages in the records given")
    return {"all": extra / msgs, **per}


def compare_row(wire: dict, links: dict) -> dict:
    """Per link class: the link view over the counters (1.0: equal), None where both are 0."""
    return {t: (links[t] / wire[t] if wire[t] else None) for t in TIERS}


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = netns.root_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    shape = f"{args.nodes}x{args.gpus_per_node}x{args.gcds_per_gpu}"
    out = args.out or f"benchmarks/results/wire_links_{shape}.json"
    spec, plan = cluster_and_plan(args, ds_quantizer_problem())
    t0 = time.time()

    packets: dict = {}  # run label -> packets per link class over its measured steps
    begun: dict = {}

    def on_mark(label, _bytes):
        if label == "phase unshaped" or label.endswith(" build"):
            netns.unshape(spec)
        run, _, what = label.rpartition(" ")
        if what in ("begin", "end"):
            now = netns.tx_bytes(spec, "packets")
            if what == "begin":
                begun[run] = now
            else:
                packets[run] = wire_bytes({k: now[k] - begun[run][k] for k in now}, spec)
        print(f"[{time.time() - t0:6.0f} s] {label}", file=sys.stderr, flush=True)

    with Cluster(spec):
        netns.unshape(spec)
        results, wire = run_marked(spec, ["-m", "benchmarks.compare.rank", json.dumps(plan)], on_mark=on_mark)
    summary = summarize(results, wire, plan)["unshaped"]
    pred = planner_bytes(plan, summary)
    rows = {}
    for name, d in summary.items():
        pk = {t: sum(v[t] for lb, v in packets.items() if lb.endswith(f"/{name}")) / args.steps for t in TIERS}
        msgs = d["link_messages_per_step"]
        payload = {t: d["wire_per_step"][t] - HEADER_BYTES * pk[t] - GLOO_BYTES_PER_MESSAGE * msgs[t] for t in TIERS}
        rows[name] = {
            "wire_per_step": d["wire_per_step"],
            "wire_packets_per_step": pk,
            "link_messages_per_step": msgs,
            "wire_less_headers_per_step": payload,
            "link_over_wire_less_headers": compare_row(payload, d["link_stats_per_step"]),
            "link_view_per_step": d["link_stats_per_step"],
            "payload_view_per_step": d["stats_per_step"],
            "link_over_wire": compare_row(d["wire_per_step"], d["link_stats_per_step"]),
            "planner_bytes_per_step": pred.get(name),
        }
        print(
            f"{name}: per step, all ranks, MB (gcd/gpu/node): wire "
            + " / ".join(f"{d['wire_per_step'][t] / 1e6:.3f}" for t in TIERS)
            + "; less headers "
            + " / ".join(f"{payload[t] / 1e6:.3f}" for t in TIERS)
            + "; link view "
            + " / ".join(f"{d['link_stats_per_step'][t] / 1e6:.3f}" for t in TIERS)
            + "; payload view "
            + " / ".join(f"{d['stats_per_step'][t] / 1e6:.3f}" for t in TIERS)
        )
    conditions = {
        "model": plan["shape"],
        "ranks": args.nodes * args.gpus_per_node * args.gcds_per_gpu,
        "emulated_nodes": args.nodes,
        "packages_per_node": args.gpus_per_node,
        "gcds_per_package": args.gcds_per_gpu,
        "issue_mode": plan["issue_mode"],
        "links": "unshaped",
        "steps": args.steps,
    }
    doc = {
        "meta": run_meta(conditions),
        "what": "bytes per link class and step, summed over ranks: interface counters against comm_stats' "
        "link view (and payload view) and the planner, links unshaped",
        "command": "python -m benchmarks.compare.wire_links " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": vars(args),
        "stock_quantization_problem": ds_quantizer_problem(),
        "topology": {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "gcds_per_gpu": args.gcds_per_gpu},
        "shape": plan["shape"],
        "params": plan["params"],
        "issue_mode": plan["issue_mode"],
        "steps": args.steps,
        "header_bytes_per_packet": HEADER_BYTES,
        "gloo_bytes_per_message": GLOO_BYTES_PER_MESSAGE,
        "configs": rows,
        "seconds": time.time() - t0,
    }
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    write_json_atomic(out, doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
