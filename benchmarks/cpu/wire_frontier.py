"""The hierarchy's case in bytes: what ``zeropp`` and ``frontier`` put on each node's uplink per
step on Frontier, by phase, as the planner's link model counts it ([Note: bytes per link] in
zeropp_hier/core/wire.py) and as the payload view would (every collective sent direct).

    python -m benchmarks.cpu.wire_frontier            # 20B GPT, 48 and 1,024 nodes (printed)

Pure: the planner only, no measurement. ``zeropp``'s collectives run one lane (RCCL rings for
its flat gather), ``frontier``'s in ticks (point-to-point, direct), as ``overlap: true``
resolves them on RCCL ([Note: one issuing thread on GPUs] in comm/issue.py).
"""

from __future__ import annotations

import argparse
import sys

from zeropp_hier import planner as P
from zeropp_hier.planner.cost import bytes_per_elem, link_loads
from zeropp_hier.tools.cli import gpt_shape

PRESETS = ("zeropp", "frontier")


def node_uplink_bytes(nodes: int, params: float) -> dict:
    """{preset: {"mode", "step_s", "link": {phase: bytes}, "payload": {phase: bytes}, "latency_steps"}}:
    bytes out of one node's uplink per step, by phase; network latency steps per step."""
    layers, d = gpt_shape(params)
    wl = P.gpt_workload(params, layers, d, 2048, 1, weight_bytes=2)
    cluster = P.frontier(nodes)
    cands = {c.name: c for c in P.default_candidates(cluster)}
    out = {}
    for name in PRESETS:
        pred = P.predict(cands[name], cluster, wl)
        ticks = pred.mode == "ticks"
        link: dict[str, float] = {}
        payload: dict[str, float] = {}
        steps = 0
        for cost in pred.costs:
            c = cost.coll
            nbytes = c.send_elems * bytes_per_elem(c.scheme, wl.weight_bytes, cands[name].compression.block_size)
            for view, direct in ((link, ticks), (payload, True)):
                load = link_loads(c, cluster.topology, cluster.library, nbytes, direct).get("node_out")
                view[c.phase] = view.get(c.phase, 0.0) + (load.per_link if load else 0.0)
            if "node" in c.axes:
                k = cluster.topology.axes_size(c.axes)
                steps += 1 if ticks else k - 1
        out[name] = {
            "mode": pred.mode,
            "step_s": pred.step_s,
            "link": link,
            "payload": payload,
            "latency_steps": steps,
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=20e9)
    ap.add_argument("--nodes", type=int, nargs="+", default=[48, 1024])
    args = ap.parse_args(argv)
    for nodes in args.nodes:
        rows = node_uplink_bytes(nodes, args.params)
        print(
            f"{nodes} nodes, {args.params / 1e9:g}B, GB out of each node's uplink per step (link view | payload view):"
        )
        for name, r in rows.items():
            cells = "  ".join(f"{ph} {r['link'][ph] / 1e9:.2f} | {r['payload'][ph] / 1e9:.2f}" for ph in r["link"])
            total = sum(r["link"].values()) / 1e9, sum(r["payload"].values()) / 1e9
            print(
                f"  {name:<9} ({r['mode']}) {cells}  total {total[0]:.2f} | {total[1]:.2f}; "
                f"network latency steps per pass of collectives {r['latency_steps']}; step {r['step_s']:.2f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
