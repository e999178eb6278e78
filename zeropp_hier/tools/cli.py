"""``zeropp-hier plan`` and ``zeropp-hier probe``.

    zeropp-hier plan --params 20B --nodes 48                  # Frontier, ranked layouts + reasons
    zeropp-hier plan --cluster emulated --params 3.4M --dtype-bytes 4 --tokens-per-gcd 128
    zeropp-hier plan --tier-bw gcd=200,gpu=100,node=25        # your own per-GCD GB/s
    torchrun --nproc-per-node 8 -m zeropp_hier.tools.cli probe --out probe.json   # measure tiers
    zeropp-hier plan --probe probe.json ...                   # plan with measured tiers

``plan`` is pure arithmetic (``zeropp_hier.planner``); ``probe`` runs collectives in the current
torch.distributed world (env:// variables as set by torchrun, srun wrappers or our emulated
cluster) over each tier's groups and reports per-GCD bandwidth and latency.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from dataclasses import replace
from typing import Any, Mapping

from ..core.vocab import TIERS

PUBLISHED = {"frontier/zeropp": 1.71, "zeropp/zero3": 1.4}


# [Note: command-line values]
# Every value is checked by its argparse ``type`` (or, for a file, right after parsing), before
# anything runs: a bad one ends in argparse's usage line and "argument --flag: got VALUE; FIX",
# exit status 2, never a traceback. Numbers must be finite and inside a range that the planner
# can compute with; 0 or a negative count is refused rather than replaced by a default.
MAX_PARAMS = 1e16  # ten quadrillion parameters: far above any model, far below float overflow
MAX_COUNT = 10**7  # d_model, sequence length, ...: above any real value, small enough to compute with
MAX_LAYERS = 100_000  # the planner works per layer: bounded so that a typo cannot run for hours


def parse_count(text: str) -> float:
    """'20B', '3.4M', '1.3e9' -> number (ValueError for anything else)."""
    t = text.strip().upper()
    mult = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(t[-1:], None)
    return float(t[:-1]) * mult if mult else float(t)


def _params(text: str) -> float:
    fix = "give a positive parameter count such as 20B, 3.4M, 125000 or 1.3e9 (suffixes K, M, B or G, T)"
    try:
        v = parse_count(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; {fix}") from None
    if not math.isfinite(v) or v < 1 or v > MAX_PARAMS:
        raise argparse.ArgumentTypeError(f"got {text!r} ({v:g}); {fix}, at most {MAX_PARAMS:g}")
    return v


def _int_in(lo: int, hi: int, what: str):
    def check(text: str) -> int:
        try:
            v = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}; give {what}: a whole number from {lo} to {hi}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"got {text!r}; give {what}: a whole number from {lo} to {hi}")
        return v

    check.__name__ = what  # argparse names the type in some messages
    return check


def _positive_float(what: str, hi: float = 1e12):
    def check(text: str) -> float:
        fix = f"give {what}: a number above 0 and at most {hi:g}"
        try:
            v = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}; {fix}") from None
        if not (math.isfinite(v) and 0 < v <= hi):
            raise argparse.ArgumentTypeError(f"got {text!r}; {fix}")
        return v

    check.__name__ = what
    return check


def _sizes(text: str) -> list[int]:
    fix = (
        "give two or more different message sizes in bytes, comma-separated, each a multiple of 4 "
        "from 4 to 2^34, e.g. 65536,16777216"
    )
    try:
        sizes = [int(s.strip()) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; {fix}") from None
    if len(sizes) < 2 or len(set(sizes)) < 2 or any(not 4 <= s <= 2**34 or s % 4 for s in sizes):
        raise argparse.ArgumentTypeError(f"got {text!r}; {fix}")
    return sizes


def gpt_shape(params: float) -> tuple[int, int]:
    """(layers, d_model) of a GPT with ~params parameters and the usual aspect d_model ~ 128 *
    layers (12 * layers * d^2 parameters in the blocks)."""
    d = (params * 128 / 12) ** (1 / 3)
    d = max(128, int(round(d / 128)) * 128)
    return max(1, int(round(params / (12 * d * d)))), d


def _tier_bw(text: str) -> dict[str, float]:
    fix = (
        "give TIER=GB/s pairs, comma-separated, each tier (gcd, gpu, node) at most once and each rate "
        "a number above 0 and at most 1e6, e.g. gcd=200,gpu=50,node=12.5"
    )
    out: dict[str, float] = {}
    for part in text.split(","):
        k, _, v = part.strip().partition("=")
        try:
            gbps = float(v)
        except ValueError:
            gbps = float("nan")
        if k not in TIERS or k in out or not (math.isfinite(gbps) and 0 < gbps <= 1e6):
            raise argparse.ArgumentTypeError(f"got {text!r} (at {part!r}); {fix}")
        out[k] = gbps * 1e9
    return out


def build_plan_inputs(args):
    from .. import planner as P

    if args.cluster == "frontier":
        cluster = P.frontier(args.nodes)
    elif args.cluster == "emulated":
        cluster = P.emulated(node_mbit=args.node_mbit, nodes=args.nodes or 2)
    else:
        raise SystemExit(f"error: --cluster {args.cluster!r}: use frontier or emulated")
    if args.tier_bw:
        tiers = dict(cluster.tiers)
        for t, bw in args.tier_bw.items():
            tiers[t] = P.TierLink(bw, tiers[t].latency)
        cluster = replace(cluster, tiers=tiers, source=cluster.source + "; tier bandwidths from --tier-bw")
    if args.probe:
        rates = args.probe_tiers if hasattr(args, "probe_tiers") else _read_probe_arg(args.probe)
        probed: P.ProbedTiers = {"tiers": {t: {"bandwidth": bw, "latency": lat} for t, (bw, lat) in rates.items()}}
        cluster = P.with_probed_tiers(cluster, probed)
    if args.memory_gb is not None:
        cluster = replace(cluster, memory_per_gcd=args.memory_gb * 1e9)
    if args.device_tflops is not None:
        cluster = replace(cluster, device_flops=args.device_tflops * 1e12)
    params = args.params if isinstance(args.params, float) else _params(args.params)
    layers, d = gpt_shape(params)
    layers = args.layers if args.layers is not None else layers
    d = args.d_model if args.d_model is not None else d
    wl = P.gpt_workload(params, layers, d, args.seq_len, args.micro_batch, weight_bytes=args.dtype_bytes)
    if args.tokens_per_gcd is not None:
        wl = replace(wl, tokens_per_gcd=args.tokens_per_gcd)
    return cluster, wl, (layers, d)


def cmd_plan(args) -> int:
    from .. import planner as P
    from ..planner import tables

    cluster, wl, (layers, d) = build_plan_inputs(args)
    preds = P.rank(cluster, wl)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": p.candidate.name,
                        "step_s": p.step_s,
                        "fits": p.memory.fits,
                        "memory_gb": p.memory.total / 1e9,
                        "phase_s": p.phase_s,
                        "tier_s": p.tier_s,
                        "tier_bytes": p.tier_bytes,
                    }
                    for p in preds
                ],
                indent=1,
            )
        )
        return 0
    print(
        f"PREDICTION (analytical model, not a measurement) for a {wl.params / 1e9:.3g}B-parameter GPT "
        f"({layers} layers, d_model {d}, {wl.tokens_per_gcd} tokens per GCD per step, "
        f"{wl.weight_bytes}-byte weights) on {cluster.name}"
    )
    bw = ", ".join(f"{t} {cluster.tiers[t].bandwidth / 1e9:.3g} GB/s" for t in TIERS)
    print(f"per-GCD link rates: {bw}; {cluster.source}\n")
    print("\n".join(tables.prediction_table(preds)))
    print()
    for line in tables.explain(preds, cluster):
        print(line)
    ticked = tables.tick_lines(preds, cluster)  # the tick mode's peers, ops per call, latency
    if ticked:
        print()
        print("\n".join(ticked))
    for p in preds:
        if p.kept_levels is not None:
            print()
            print("\n".join(tables.level_lines(p)))
    if args.hops:
        from ..core.plan import make_plan

        print()
        for line in tables.topology_lines(cluster.topology):
            print(line)
        for cand in P.default_candidates(cluster):
            if not cand.stock and cand.name == cand.preset:  # each preset with its own compression
                print()
                topo = cluster.topology
                for line in tables.plan_lines(make_plan(cand.preset, cand.compression, topo), topo):
                    print(line)
    by = {p.candidate.name: p for p in preds}
    if "ds-zeropp" in by and "frontier" in by and cluster.library != "gloo":
        print()
        print(published_comparison(cluster, wl, preds))
    return 0


def published_comparison(cluster, wl, preds) -> str:
    """Predicted ratios beside the published ones, and what moves them."""
    from .. import planner as P
    from ..planner.tables import fmt_bytes, markdown

    f_zpp = P.ratio(preds, "ds-zeropp", "frontier")
    zpp_z3 = P.ratio(preds, "ds-zero3", "ds-zeropp")
    rows = [
        ["frontier over stock ZeRO++", f"{f_zpp:.2f}x", f"{PUBLISHED['frontier/zeropp']:.2f}x"],
        ["stock ZeRO++ over stock ZeRO-3", f"{zpp_z3:.2f}x", f"~{PUBLISHED['zeropp/zero3']:.1f}x"],
    ]
    lines = [*markdown(["ratio", "predicted", "published (384 GCDs)"], rows), ""]
    by = {p.candidate.name: p for p in preds}
    comp = by["frontier"].compute_s / by["frontier"].step_s
    lines.append("Where and why the prediction differs:")
    lines.append(
        f"- compute is {comp:.0%} of frontier's predicted step (assumed {cluster.device_flops / 1e12:.0f} "
        f"TFLOP/s per GCD, {wl.tokens_per_gcd} tokens/GCD, no overlap of communication with compute); every "
        "ratio shrinks toward 1 as compute grows, and grows as it shrinks:"
    )
    for tokens in sorted({max(1, wl.tokens_per_gcd // 4), wl.tokens_per_gcd, wl.tokens_per_gcd * 4}):
        pr = P.rank(cluster, replace(wl, tokens_per_gcd=tokens))
        lines.append(
            f"    {tokens:>6} tokens/GCD: frontier/ZeRO++ {P.ratio(pr, 'ds-zeropp', 'frontier'):.2f}x, "
            f"ZeRO++/ZeRO-3 {P.ratio(pr, 'ds-zero3', 'ds-zeropp'):.2f}x"
        )
    z3, zpp = by["ds-zero3"], by["ds-zeropp"]
    lines.append(
        f"- stock ZeRO-3's node traffic is a flat ring, which crosses each node's links about once per "
        f"collective: {fmt_bytes(z3.tier_bytes['node'])} vs ZeRO++'s "
        f"{fmt_bytes(zpp.tier_bytes['node'])} per step. The model charges rings at the link rates of "
        "docs/design.md#hardware-tiers; if the real inter-node rings get much less than 12.5 GB/s "
        "per GCD (congestion, fewer NICs per ring), ZeRO-3 suffers more and ZeRO++/ZeRO-3 "
        "approaches the published ~1.4x."
    )
    lines.append(
        f"- ZeRO++'s remaining cost is its flat int8 forward gather over all {cluster.world_size} GCDs "
        f"({zpp.phase_s['forward_gather']:.3g} s, ring latency {cluster.tiers['node'].latency * 1e6:.0f} us "
        f"per step assumed) and its node-wide backward gather over the package links "
        f"({zpp.phase_s['backward_gather']:.3g} s); frontier replaces both by hops of {cluster.nodes}, "
        f"{cluster.gpus_per_node} and {cluster.gcds_per_gpu} ranks "
        f"and a backward gather over the 200 GB/s in-package link ({by['frontier'].phase_s['backward_gather']:.3g} s)."
    )
    lat = cluster.tiers["node"].latency
    lines.append(
        f"- {zpp.latency_s:.3g} s of ZeRO++'s and {by['frontier'].latency_s:.3g} s of frontier's step are "
        f"collective latency (alpha x ring steps x {wl.gathers_per_pass} gathers per pass), an assumption; "
        "with another node-tier alpha:"
    )
    for a in (lat / 4, lat * 2):
        tiers = dict(cluster.tiers)
        tiers["node"] = P.TierLink(tiers["node"].bandwidth, a)
        pr = P.rank(replace(cluster, tiers=tiers), wl)
        lines.append(
            f"    alpha {a * 1e6:>4.0f} us: frontier/ZeRO++ {P.ratio(pr, 'ds-zeropp', 'frontier'):.2f}x, "
            f"ZeRO++/ZeRO-3 {P.ratio(pr, 'ds-zero3', 'ds-zeropp'):.2f}x"
        )
    lines.append("- unverified on hardware: these are predictions from link rates, not GPU measurements.")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
def probe_lines(tiers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per tier of a probe's ``"tiers"`` (as ``probe --out`` writes them)."""
    return [
        f"{t:>4}: {v['bandwidth'] * 8 / 1e6:10.2f} Mbit/s per GCD ({v['bandwidth'] / 1e9:.4g} GB/s), "
        f"latency {v['latency'] * 1e6:8.1f} us, group of {v['group_size']}"
        for t, v in tiers.items()
    ]


def cmd_probe(args) -> int:
    import os

    import torch
    import torch.distributed as dist

    from ..comm.groups import build_hop_groups
    from ..core.topology import Topology

    if not dist.is_initialized():
        from ..app.launch import launcher_env

        # under srun (scripts/frontier/compare.sbatch) the rank and world come from Slurm's
        # variables, as for the training job; torchrun's are taken as they are
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        os.environ.update(launcher_env(os.environ, gpus) or {})
        os.environ.setdefault("LOCAL_RANK", os.environ.get("RANK", "0"))
        backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    topo = Topology.for_world(world, args.gpus_per_node, args.gcds_per_gpu)
    groups = build_hop_groups(topo, [(t,) for t in TIERS], rank)
    sizes: list[int] = args.sizes  # parsed and checked by _sizes
    out: dict[str, Any] = {
        "world": world,
        "topology": {"gpus_per_node": args.gpus_per_node, "gcds_per_gpu": args.gcds_per_gpu},
        "backend": dist.get_backend(),
        "tiers": {},
    }

    from ..detect.links import device_sync, measure_tiers, slowest, timed

    out["tiers"] = measure_tiers(groups, device, sizes, args.reps)
    # the all-to-all time beside (the gradient stages' collective), for reference
    for tier, v in out["tiers"].items():
        hg, k = groups[(tier,)], v["group_size"]
        big = torch.ones(k * (sizes[-1] // 4 // k), device=device)
        recv = torch.empty_like(big)
        seconds = timed(
            functools.partial(dist.all_to_all_single, recv, big, group=hg.group), device_sync(device), args.reps
        )
        v["all_to_all_s"] = slowest(seconds, device)
    if rank == 0:
        if args.out:
            from ..files import write_json_atomic

            write_json_atomic(args.out, out, indent=1)
        if not args.quiet:
            print("\n".join(probe_lines(out["tiers"])))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command's parser, and its ``plan`` and ``probe`` subparsers."""
    ap = argparse.ArgumentParser(
        prog="zeropp-hier", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="rank layouts and compression for a model and cluster (prediction)")
    p.add_argument("--cluster", default="frontier", choices=("frontier", "emulated"))
    p.add_argument("--nodes", type=_int_in(1, 100_000, "a number of nodes"), default=48)
    p.add_argument(
        "--node-mbit",
        type=_positive_float("node Mbit/s per GCD", 1e9),
        default=6.0,
        help="emulated cluster: node Mbit/s per GCD",
    )
    p.add_argument("--params", type=_params, default="20B", help="parameters, e.g. 20B, 3.4M")
    p.add_argument("--layers", type=_int_in(1, MAX_LAYERS, "a number of layers"))
    p.add_argument("--d-model", type=_int_in(1, MAX_COUNT, "a model width"))
    p.add_argument("--seq-len", type=_int_in(1, MAX_COUNT, "a sequence length in tokens"), default=2048)
    p.add_argument("--micro-batch", type=_int_in(1, MAX_COUNT, "a micro-batch size"), default=1)
    p.add_argument(
        "--tokens-per-gcd",
        type=_int_in(1, 10**12, "a number of tokens per GCD per step"),
        help="override seq_len * micro_batch",
    )
    p.add_argument("--dtype-bytes", type=int, default=2, choices=(2, 4))
    p.add_argument("--memory-gb", type=_positive_float("GB of memory per GCD", 1e6), help="memory limit per GCD")
    p.add_argument(
        "--device-tflops", type=_positive_float("achieved TFLOP/s per GCD", 1e6), help="achieved TFLOP/s per GCD"
    )
    p.add_argument("--tier-bw", type=_tier_bw, help="per-GCD GB/s per direction, e.g. gcd=200,gpu=50,node=12.5")
    p.add_argument("--probe", help="JSON written by `zeropp-hier probe --out`")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--hops",
        action="store_true",
        help="also print the topology and each preset's hops, as the training job prints them",
    )
    p.set_defaults(fn=cmd_plan)
    q = sub.add_parser("probe", help="time all_gather / all_to_all per tier in the current world")
    q.add_argument("--gpus-per-node", type=_int_in(1, 1024, "a number of GPU packages per node"), default=4)
    q.add_argument("--gcds-per-gpu", type=_int_in(1, 64, "a number of GCDs per package"), default=2)
    q.add_argument("--sizes", type=_sizes, default="65536,16777216", help="bytes per rank, small,large")
    q.add_argument("--reps", type=_int_in(1, 10_000, "a number of repetitions"), default=2)
    q.add_argument("--backend", choices=("nccl", "gloo"), help="default: nccl with a GPU, else gloo")
    q.add_argument("--out", help="write the JSON here (rank 0)")
    q.add_argument("--quiet", action="store_true")
    q.set_defaults(fn=cmd_probe)
    return ap, p, q


def options_of(command: str) -> set[str]:
    """The option strings of subcommand ``command`` (empty for an unknown one)."""
    _, p, q = build_parser()
    sub = {"plan": p, "probe": q}.get(command)
    return set(sub._option_string_actions) if sub is not None else set()


def main(argv=None) -> int:
    ap, p, q = build_parser()
    args = ap.parse_args(_join_negative_values(sys.argv[1:] if argv is None else list(argv), ap))
    # files: checked before anything runs (the probe's --out before torch.distributed starts)
    if args.command == "plan" and args.probe:
        try:
            args.probe_tiers = _read_probe_arg(args.probe)
        except argparse.ArgumentTypeError as e:
            p.error(f"argument --probe: {e}")
    if args.command == "probe" and args.out:
        problem = _out_problem(args.out)
        if problem:
            q.error(f"argument --out: got {args.out!r}; {problem}")
    return args.fn(args)


def _join_negative_values(argv: list[str], ap: argparse.ArgumentParser) -> list[str]:
    """``--params -5B`` as ``--params=-5B``: argparse takes a value that starts with "-" (and is
    not a plain negative number) for an option and says only "expected one argument"; joined,
    the value reaches its check, which names it and the fix. A value that is one of the
    command's own options (``--params --json``) is left alone: the value is missing."""
    known = options_of(argv[0]) if argv else set()
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a.startswith("--") and "=" not in a and a in known and nxt is not None and nxt.startswith("-"):
            if nxt.split("=", 1)[0] not in known:
                out.append(f"{a}={nxt}")
                i += 2
                continue
        out.append(a)
        i += 1
    return out


def _read_probe_arg(path: str) -> dict:
    from ..detect.probe_file import FIX, ProbeFileError, read_probe

    try:
        return read_probe(path)
    except ProbeFileError as e:
        raise argparse.ArgumentTypeError(f"got {path!r}: {e}; {FIX}") from None


def _out_problem(path: str) -> str | None:
    """Why the probe's output file could not be written, or None."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "it is a directory; give a file name"
    if not os.path.isdir(directory):
        return f"its directory {directory!r} does not exist; create it or give another path"
    if not os.access(directory, os.W_OK):
        return f"its directory {directory!r} is not writable; give another path"
    return None


if __name__ == "__main__":
    sys.exit(main())
