"""Bytes per tier per step for each preset, counted by ``comm_stats`` (exact, machine-independent).

    python -m benchmarks.compare.bytes_per_tier [--steps 4] [--out benchmarks/results/bytes_per_tier.json]

Runs the demo GPT on 8 local CPU ranks (2 nodes x 2 GPUs x 2 GCDs) under zero3, zeropp and
frontier (each with its default compression, and frontier also uncompressed), with DeepSpeed's
prefetch and reuse distance at 0 so that backward re-gathers as a large model would. Prints two
markdown tables of the bytes one rank sends per step (mean over ranks) — the payload view
(``bytes``, [Note: byte accounting]) and the link view (``link_bytes``, what crosses each link
as gloo moves it, [Note: bytes per link]) — and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.tables.provenance import run_meta
from zeropp_hier.app import run as app_run
from zeropp_hier.app.model.gpt import GPTConfig
from zeropp_hier.app.spec import ds_config
from zeropp_hier.files import write_json_atomic
from zeropp_hier.launch.world import LocalWorld

MODEL = GPTConfig(vocab_size=256, seq_len=32, d_model=64, n_heads=4, n_layers=4)
CONFIGS = {
    "zero3": dict(preset="zero3"),
    "zeropp": dict(preset="zeropp"),
    "frontier": dict(preset="frontier"),
    "frontier (no compression)": dict(preset="frontier", compression="none"),
}


def measure(configs: dict, steps: int) -> dict:
    out = {}
    for name, cfg in configs.items():
        res = app_run.run_config(
            ds_config(cfg["preset"], compression=cfg.get("compression"), micro_batch=4),
            steps,
            MODEL,
            want_state=False,
        )
        out[name] = res["stats"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results/bytes_per_tier.json")
    args = ap.parse_args(argv)
    with LocalWorld(8) as w:
        per_rank = w.run(measure, CONFIGS, args.steps)
    phases = ("forward_gather", "backward_gather", "grad_reduce")
    tiers = ("node", "gpu", "gcd")
    tables = {}
    for view in ("bytes", "link_bytes"):
        table = tables[view] = {}
        for name in CONFIGS:
            table[name] = {
                p: {t: sum(r[name][view][p][t] for r in per_rank) / len(per_rank) / args.steps for t in tiers}
                for p in phases
            }
        head = (
            "| preset | "
            + " | ".join(
                f"{p.replace('_gather', '').replace('grad_reduce', 'grad')} {t}" for p in phases for t in tiers
            )
            + " | node total |"
        )
        print(f"\n{'payload view (bytes)' if view == 'bytes' else 'link view (link_bytes)'}:\n")
        print(head)
        print("|" + "---|" * (len(phases) * len(tiers) + 2))
        for name, per in table.items():
            node = sum(per[p]["node"] for p in phases)
            print(
                f"| {name} | "
                + " | ".join(f"{per[p][t] / 1e3:.1f}" for p in phases for t in tiers)
                + f" | {node / 1e3:.1f} |"
            )
    print(f"\nKB sent per rank per step (mean over 8 ranks and {args.steps} steps); model: {MODEL}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    write_json_atomic(
        args.out,
        {
            "meta": run_meta(
                {"ranks": 8, "topology": "2 x 2 x 2 (LocalWorld, gloo, links unshaped)", "steps": args.steps}
            ),
            "steps": args.steps,
            "model": MODEL.__dict__,
            "bytes_per_step_per_rank": tables["bytes"],
            "link_bytes_per_step_per_rank": tables["link_bytes"],
        },
        indent=1,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
