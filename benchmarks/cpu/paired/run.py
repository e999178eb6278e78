"""Paired convergence test (issue 60, item 3): every arm of protocol.json at every seed, paired
by seed, then the protocol's intervals and decisions.

    python -m benchmarks.cpu.paired.run                       # the full run: protocol.json as committed
    python -m benchmarks.cpu.paired.run --pilot --seeds 1 2 --arms stock A/A --steps 40   # sizing only
    python -m benchmarks.cpu.paired.run --analyze benchmarks/results/paired.json       # the table again
    python -m benchmarks.cpu.paired.run --protocol benchmarks/cpu/paired/protocol_v2.json   # version 2
    python -m benchmarks.cpu.paired.run --analyze FILE --store   # a stopped run: store its (partial) analysis

Each (seed, arm) is the training job on 8 local CPU ranks = 2 nodes x 2 packages x 2 GCDs
(``rank.py``), one after the other in one world, seed by seed, so that a stopped run holds whole
pairs; ``--resume`` keeps the pairs already recorded under the same protocol. A full run
refuses a protocol with uncommitted changes and every command-line override; ``--pilot``
allows them and its file and table say "pilot" (no decision is drawn from a pilot).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from zeropp_hier.files import write_json_atomic
from zeropp_hier.launch.world import LocalWorld

from . import analyze
from . import protocol as proto
from .rank import train_arm

RESULTS = "benchmarks/results"


def corpus(data: str | None) -> tuple[str, dict]:
    """The token files: ``data``, or the stdlib corpus prepared once into the results folder."""
    if data is None:
        from ..convergence import prepare_data

        path = os.path.abspath(os.path.join(RESULTS, "stdlib_tokens"))
        return path, prepare_data(path)
    from zeropp_hier.app.data.tokens import TokenData

    path = os.path.abspath(data)
    return path, TokenData(path).index  # a clear error when it is not a prepared directory


def plan(p: proto.Protocol, a: argparse.Namespace) -> tuple[list[int], list[str], dict]:
    """Seeds, arms and run settings: the protocol's, or a pilot's shortening of them."""
    overrides = [k for k in ("seeds", "arms", "steps", "eval_every", "eval_last") if getattr(a, k) is not None]
    if not a.pilot:
        if overrides:
            raise SystemExit(
                f"--{', --'.join(o.replace('_', '-') for o in overrides)}: a full run takes every setting "
                f"from {p.path}; change the protocol (and commit it before running) or add --pilot"
            )
        why = proto.uncommitted(p.path)
        if why is not None:
            raise SystemExit(f"{p.path}: {why}; commit the protocol before a full run, or add --pilot")
        return p.seeds, list(p.arms), p.run
    arms = a.arms or list(p.arms)
    unknown = [x for x in arms if x not in p.arms]
    if unknown:
        raise SystemExit(f"--arms {unknown}: not in the protocol; choose from {list(p.arms)}")
    try:
        run = proto.pilot_run(p.run, a.steps, a.eval_every, a.eval_last)
    except proto.ProtocolError as e:
        raise SystemExit(str(e)) from e
    return a.seeds or p.seeds, arms, run


def previous(path: str, p: proto.Protocol, run: dict, pilot: bool, data_sha: str) -> dict:
    """The runs already recorded in ``path`` under the same protocol, settings and data."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        prev = json.load(f)
    same = (prev["protocol_sha256"], prev["run"], prev["pilot"], prev["corpus_sha256"]) == (
        p.sha256,
        run,
        pilot,
        data_sha,
    )
    if not same:
        raise SystemExit(f"--resume: {path} was made under another protocol, run or corpus; rerun without --resume")
    return prev["runs"]


def analysis(p: proto.Protocol, record: dict) -> dict:
    """The protocol's analysis of ``record``'s runs, with the reproducibility check the protocol
    may name (an earlier file's runs of one arm; reported, not required; skipped when that file
    is absent)."""
    result = analyze.analyze({**p.data, "run": record["run"]}, record["runs"], record["pilot"])
    rep = p.reproduce
    if rep is not None and os.path.exists(rep["file"]):
        with open(rep["file"]) as f:
            earlier = json.load(f)
        same_run = earlier.get("run") == record["run"]
        result["reproduction"] = {
            **analyze.reproduction(record["runs"], earlier["runs"] if same_run else {}, rep["arm"]),
            "file": rep["file"],
            "same_run_settings": same_run,
        }
    return result


def report(p: proto.Protocol, record: dict) -> str:
    result = analysis(p, record)
    head = "PILOT (sizing only, not evidence)\n" if record["pilot"] else ""
    return head + analyze.table(result)


def new_record(p: proto.Protocol, run: dict, pilot: bool, index: dict, runs: dict) -> dict:
    """The result file's content before (``runs`` empty) or while resuming the runs."""
    return {
        "protocol_sha256": p.sha256,
        "protocol": p.data,
        "pilot": pilot,
        "run": run,
        "eval_steps": proto.eval_steps(run),
        "world": "8 CPU ranks = 2 nodes x 2 packages x 2 GCDs, gloo",
        "python": sys.version.split()[0],
        "corpus_sha256": index["sha256"],
        "corpus_tokens": index["tokens"],
        "runs": runs,
    }


def execute(world, p: proto.Protocol, seeds: list[int], arms: list[str], record: dict, data: str, out: str) -> None:
    """Every (seed, arm) not yet in ``record["runs"]``, seed by seed, in ``world`` (8 ranks);
    ``out`` is rewritten after each, so that a stopped run still holds its whole pairs."""
    runs, run = record["runs"], record["run"]
    t_start = time.perf_counter()
    for seed in seeds:
        for arm in arms:
            if arm in runs.get(str(seed), {}):
                continue
            per_rank = world.run(train_arm, arm, p.arms[arm], run, seed, data, record["eval_steps"])
            r = per_rank[0]  # losses are every rank's mean; digests and held-out losses agree
            r["seconds"] = max(x["seconds"] for x in per_rank)
            runs.setdefault(str(seed), {})[arm] = r
            held = sum(r["held_out"].values()) / len(r["held_out"])
            print(
                f"[{time.perf_counter() - t_start:7.0f} s] seed {seed} {arm}: held-out {held:.5f}, "
                f"final lr {r['lr'][-1]:.2e}, {r['seconds'] / run['steps']:.2f} s/step",
                flush=True,
            )
            write_json_atomic(out, record, indent=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", default=proto.DEFAULT_PATH)
    ap.add_argument(
        "--out", default=None, help=f"result file (default {RESULTS}/paired.json; paired_v<N>.json for version N > 1)"
    )
    ap.add_argument("--data", default=None, help="a `zeropp-hier data prepare` directory (default: the stdlib corpus)")
    ap.add_argument("--resume", action="store_true", help="keep the pairs already in --out (same protocol and run)")
    ap.add_argument("--analyze", metavar="FILE", default=None, help="print the table of a result file; run nothing")
    ap.add_argument("--store", action="store_true", help="with --analyze: write the analysis into FILE")
    ap.add_argument("--pilot", action="store_true", help="allow the overrides below; results are marked pilot")
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--arms", nargs="+", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--eval-every", type=int, default=None)
    ap.add_argument("--eval-last", type=int, default=None)
    a = ap.parse_args(argv)
    try:
        p = proto.load(a.protocol)
    except proto.ProtocolError as e:
        raise SystemExit(str(e)) from e
    if a.analyze:
        with open(a.analyze) as f:
            record = json.load(f)
        if record["protocol_sha256"] != p.sha256:
            raise SystemExit(f"{a.analyze} was run under another protocol than {p.path} (its hash differs)")
        if a.store:  # a stopped run's file: its whole pairs' analysis beside them, for docs' table
            record["analysis"] = analysis(p, record)
            write_json_atomic(a.analyze, record, indent=1)
        print(report(p, record))
        return 0
    seeds, arms, run = plan(p, a)
    out = a.out or os.path.join(RESULTS, p.default_out(a.pilot))
    data, index = corpus(a.data)
    runs: dict = previous(out, p, run, a.pilot, index["sha256"]) if a.resume else {}
    record = new_record(p, run, a.pilot, index, runs)
    t_start = time.perf_counter()
    with LocalWorld(8, timeout=6 * 3600) as w:
        execute(w, p, seeds, arms, record, data, out)
    # the analysis beside the runs it came from: docs' table renders it (benchmarks/tables cannot
    # import this folder), and tests/unit/test_paired.py re-derives it from the runs
    record["analysis"] = analysis(p, record)
    write_json_atomic(out, record, indent=1)
    print(report(p, record))
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
