"""The GPT-NeoX-20B recipe's dry run (rank 0 of N nodes x 4 x 2, ``zeropp-hier train
recipe=neox20b model=neox_20b ... dryrun.nodes=N``) beside the planner's memory table.

    python -m benchmarks.cpu.dryrun_20b --nodes 48
    python -m benchmarks.cpu.dryrun_20b --nodes 9408

One process of a small shared machine cannot hold or step the whole 20B model (its kept package
copies alone are 10 GB per rank), so the run is shortened, and every shortening is written into
the result's ``meta.conditions``: ``--layers`` of the 44 transformer blocks, ``--hidden`` (the
20B's 6144 narrowed, its heads of 96 and MLP of 4 x hidden kept; the vocabulary stays 50432),
``--seq-len`` tokens instead of 2048, ``--steps`` steps; ``memory_gb=64`` (a MI250X GCD's: on a
CPU the job's budget would be this machine's RAM over 8 ranks, and it refuses the layout); and,
where the recipe's global batch of 1536 sequences cannot be split over the world (75,264 ranks
x micro-batch 4), ``global_batch=null`` (one micro-batch per step; the memory per rank does not
depend on the accumulation).

Written to ``benchmarks/results/dryrun_neox20b_<N>.json``: the dry run's report (host peak RSS,
tracemalloc's peak, what the engine holds by part, the planner's table for the same shortened
job) and ``planner_recipe``, the planner's table for the recipe unshortened (44 layers, 2048
tokens) on the same world.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from benchmarks.tables.provenance import run_meta
from zeropp_hier.files import write_json_atomic

RECIPE = ["recipe=neox20b", "model=neox_20b", "memory_gb=64"]
RECIPE_BATCH = 1536
MICRO_BATCH = 4  # data.micro_batch's default, which the recipe keeps


def overrides(
    nodes: int, layers: int | None, seq_len: int | None, hidden: int | None = None
) -> tuple[list[str], list[str]]:
    """The dry run's overrides and the shortenings among them (said beside the figures)."""
    short: list[str] = []
    if hidden is not None:  # narrowed as the 20B is shaped: heads of 96, an MLP of 4 x hidden
        short += [f"model.hidden={hidden}", f"model.heads={hidden // 96}", f"model.intermediate={4 * hidden}"]
    if layers is not None:
        short.append(f"model.layers={layers}")
    if seq_len is not None:
        short.append(f"model.seq_len={seq_len}")
    if RECIPE_BATCH % (nodes * 8 * MICRO_BATCH):
        short.append("global_batch=null")
    return RECIPE + short, short


def planner_table(overrides_: list[str], nodes: int) -> dict:
    """The planner's memory table (app/memory_check.parts) for the job these overrides compose to,
    on ``nodes`` x 4 x 2 ranks, as the dry run's rank computes it."""
    from zeropp_hier.app import memory_check
    from zeropp_hier.app.job_vocab import with_data_vocab
    from zeropp_hier.dryrun.cli import settings
    from zeropp_hier.dryrun.world import DryWorld

    world = DryWorld(nodes=nodes)
    spec, _ = settings(overrides_)
    spec = with_data_vocab(replace(spec, topology=world.topology(), local_world=world.world_size))
    return memory_check.parts(spec, world.world_size, world.per_node, None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--layers", type=int, default=1, help="transformer blocks (the recipe's: 44)")
    ap.add_argument("--seq-len", type=int, default=16, help="tokens per sequence (the recipe's: 2048)")
    ap.add_argument("--hidden", type=int, default=None, help="model width, a multiple of 96 (the recipe's: 6144)")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from zeropp_hier.dryrun.cli import run_from_config, settings

    ovr, short = overrides(a.nodes, a.layers, a.seq_len, a.hidden)
    out = a.out or f"benchmarks/results/dryrun_neox20b_{a.nodes}.json"
    full_ovr = RECIPE + [s for s in short if s == "global_batch=null"]
    recipe_table = planner_table(full_ovr, a.nodes)
    spec, dry = settings([*ovr, f"dryrun.nodes={a.nodes}", f"dryrun.steps={a.steps}"])
    run_dir = os.path.abspath(os.path.join("outputs", "dryrun_20b", str(a.nodes)))
    rep = run_from_config(spec, dry, out_dir=run_dir)
    rep["planner_recipe"] = {"overrides": full_ovr, "table": recipe_table}
    rep["meta"] = run_meta(
        {
            "command": "zeropp-hier train " + " ".join([*ovr, f"dryrun.nodes={a.nodes}", f"dryrun.steps={a.steps}"]),
            "shortened": short + [f"dryrun.steps={a.steps}"],
            "memory_gb": "64 (a MI250X GCD's; the CPU budget would refuse the layout)",
            "rank": 0,
            "world": f"{a.nodes} x 4 x 2",
            "machine": "2 shared CPU cores (the 1-minute load recorded beside): host times are not a GPU's",
        }
    )
    write_json_atomic(out, rep, indent=1, default=str)
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
