"""``python -m benchmarks.cluster setup|teardown|status|uplink-down|uplink-loss|uplink-clear``
(root required). The uplink commands disturb a running cluster's node ``--node`` ([Note: failing
links] in spec.py): take its uplink down, drop ``--loss-percent`` of its packets each way, or stop
dropping."""

from __future__ import annotations

import argparse
import json
import sys

from . import netns
from .spec import DEFAULT_NODE_MBIT, ClusterSpec, wire_bytes


def spec_from_args(args) -> ClusterSpec:
    return ClusterSpec.scaled(
        node_mbit=args.node_mbit,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gcds_per_gpu=args.gcds_per_gpu,
        prefix=args.prefix,
    )


def add_spec_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=2)
    ap.add_argument("--gcds-per-gpu", type=int, default=2)
    ap.add_argument(
        "--node-mbit",
        type=float,
        default=DEFAULT_NODE_MBIT,
        help="node-tier rate per GCD in Mbit/s; gpu and gcd follow Frontier's 4x and 16x",
    )
    ap.add_argument(
        "--prefix",
        default="zhc",
        help="namespace name prefix (teardown removes the <prefix>-* namespaces that setup created and marked)",
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__)
    ap.add_argument("command", choices=("setup", "teardown", "status", "uplink-down", "uplink-loss", "uplink-clear"))
    add_spec_args(ap)
    ap.add_argument("--node", type=int, default=1, help="uplink-*: which node's uplink")
    ap.add_argument("--loss-percent", type=float, default=5.0, help="uplink-loss: packets dropped, per cent")
    args = ap.parse_args(argv)
    problem = netns.root_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    spec = spec_from_args(args)
    if args.command == "setup":
        netns.setup(spec)
        print(
            f"emulated cluster up: {spec.nodes} nodes x {spec.gpus_per_node} packages x "
            f"{spec.gcds_per_gpu} GCDs; per-GCD Mbit/s {spec.per_gcd_mbit()}; namespaces "
            f"{spec.namespaces()}"
        )
        return 0
    if args.command.startswith("uplink-"):
        if args.command == "uplink-down":
            netns.uplink_down(spec, args.node)
        elif args.command == "uplink-loss":
            netns.uplink_loss(spec, args.node, args.loss_percent)
        else:
            netns.uplink_clear_loss(spec, args.node)
        print(f"{args.command}: node {args.node}'s uplink {spec.uplink(args.node)[:4]}")
        return 0
    if args.command == "teardown":
        left = netns.teardown(args.prefix)
        others = netns.foreign(args.prefix)
        if others:
            print(
                f"not touched: {others} (named {args.prefix}-* but not created by this tool's setup)",
                file=sys.stderr,
            )
        if any(left.values()):
            print(f"error: left behind: {left}", file=sys.stderr)
            return 1
        print(f"removed every {args.prefix}-* namespace that setup created (and their links, qdiscs, processes)")
        return 0
    print(
        json.dumps(
            {
                "leftovers_or_live": netns.leftovers(args.prefix),
                "qdiscs": {f"{k[0]}/{k[1]}": v for k, v in netns.qdiscs(spec).items()},
                "wire_bytes": wire_bytes(netns.tx_bytes(spec), spec),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
