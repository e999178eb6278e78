"""Convergence on real text: does the model still learn when the collectives are compressed?

    python -m benchmarks.cpu.convergence                    # ~25 min on 2 CPU cores
    python -m benchmarks.cpu.convergence --steps 60 --configs "stock ZeRO-3" frontier   # a quick look

Every configuration is the training job itself (``zeropp_hier.app.run.Run``: the job's
config, its GPT-NeoX built sharded, its data loader, step loop and metrics), on 8 local CPU
ranks = 2 nodes x 2 GPUs x 2 GCDs, gloo. The model is the job's ``tiny`` GPT-NeoX (byte level,
vocabulary 256; ``--d-model``/``--heads``/``--layers``/``--seq-len`` change it); the data is the
Python standard library's own sources tokenized by the job's ``data prepare`` step (no download,
deterministic for a Python version; prepared once into ``<out-dir>/stdlib_tokens``, or
``--data DIR``). Every configuration starts from the same seed and sees the same samples in the
same order, one after the other in the same world: stock DeepSpeed ZeRO-3 (the job's ``stock``
preset), then each preset and compression scheme. DeepSpeed's prefetch and reuse distance are 0,
so the backward pass re-gathers weights as for a large model (and that gather is compressed
whenever the scheme says so).

Reported per configuration: final training loss (mean over the last 20 steps and the 8 ranks),
held-out loss of the final weights (exact fp32 copies, the token files' ``val`` split: every
20th stdlib file), relative
differences to stock, node-tier bytes one rank sends per step, the sampled relative error of the
int4 node-stage gradients, and seconds per step (CPU, shared machine: not a speed measurement).
Writes ``convergence.json`` and ``convergence.png`` to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from benchmarks.compare.schemes import EXACT_GCD_GRADIENTS, INT4_NODE_GRADIENTS, INT8_GCD_GRADIENTS
from benchmarks.tables.provenance import run_meta
from zeropp_hier.app.spec import MODELS, ModelSpec
from zeropp_hier.files import write_json_atomic
from zeropp_hier.launch.world import LocalWorld

INT4_EVERYWHERE = {"weights": "int4", "gradients": "int4", "error_feedback": False}
# name -> (preset or None for stock DeepSpeed, compression override or None for the preset's)
CONFIGS = {
    "stock ZeRO-3": (None, None),
    "zero3": ("zero3", None),
    "zeropp": ("zeropp", None),
    "frontier": ("frontier", None),
    "frontier, int4 node gradients": ("frontier", INT4_NODE_GRADIENTS),
    "int4 everywhere": ("frontier", INT4_EVERYWHERE),
}
OPTIONAL = {  # not run by default; name them with --configs
    "int4 everywhere + error feedback": ("frontier", {**INT4_EVERYWHERE, "error_feedback": True}),
    # ablations of the int4 node stage: which part of it costs the loss
    "frontier, int4 node gradients, no error feedback": ("frontier", {**INT4_NODE_GRADIENTS, "error_feedback": False}),
    "frontier, int4 node block 64": ("frontier", {**INT4_NODE_GRADIENTS, "block_size": {"node": 64}}),
    "frontier, int4 node gradients, exact weights": ("frontier", {**INT4_NODE_GRADIENTS, "weights": "none"}),
    "frontier, int8 gpu gradients": ("frontier", {"gradients": {"gcd": "none", "gpu": "int8", "node": "int4"}}),
    # the link-bound benchmark's frontier/pipe-int8-gcd, as it ran: int8 on the in-package hop too
    "frontier, int8 gcd gradients": ("frontier", INT8_GCD_GRADIENTS),
    # frontier's default before int8 on the in-package hop (the link-bound frontier/pipe-exact-gcd)
    "frontier, exact gcd gradients": ("frontier", EXACT_GCD_GRADIENTS),
    "frontier, exact gradients": ("frontier", {"gradients": "none"}),
    "frontier, int8 gradients": ("frontier", {"gradients": {"gcd": "none", "gpu": "int8", "node": "int8"}}),
}
LAST = 20  # final loss = mean of the last 20 steps


def model_config(a: dict) -> ModelSpec:
    """The job's ``tiny`` GPT-NeoX (byte level), with the command line's overrides."""
    return dataclasses.replace(
        MODELS["tiny"],
        vocab_size=256,
        seq_len=a["seq_len"],
        hidden=a["d_model"],
        heads=a["heads"],
        layers=a["layers"],
        intermediate=4 * a["d_model"],
    )


def prepare_data(path: str) -> dict:
    """The stdlib corpus as the job's token files (``zeropp-hier data prepare --stdlib``), once."""
    from zeropp_hier.app.data import tokens as data
    from zeropp_hier.app.data.tokens import stdlib_files

    index = os.path.join(path, "index.json")
    if not os.path.exists(index):
        data.prepare(stdlib_files(), path, "python standard library")
    with open(index) as f:
        return json.load(f)


def job_spec(preset, compression, a: dict):
    from zeropp_hier.app.spec import JobSpec

    return JobSpec(
        preset=preset or "stock",
        compression=compression,
        steps=a["steps"],
        micro_batch=a["micro_batch"],
        model=model_config(a),
        data_path=a["data"],
        lr=a["lr"],
        seed=a["seed"],
        local_world=8,
        progress="off",
    )


def _held_out_loss(state: dict, a: dict, rank: int, world: int) -> float:
    """Loss of the exact final weights on the held-out split, in a plain PyTorch copy of the
    model (built whole: no DeepSpeed), ``eval_batches`` micro-batches per rank."""
    import torch

    from zeropp_hier.app.data.tokens import Loader, TokenData
    from zeropp_hier.app.model import models

    spec = model_config(a)
    model = models.build(spec, {})
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(state[name])
    model.eval()
    val = Loader(TokenData(a["data"], "val"), spec.seq_len, a["micro_batch"], rank, world, a["seed"] + 1)
    total = 0.0
    with torch.no_grad():
        for i in range(a["eval_batches"]):
            x, y = val.batch(i)
            total += float(model(x, y))
    return total / a["eval_batches"]


def train_one(name: str, preset, compression, a: dict) -> dict:
    """One configuration on this rank: the job's run, then its final weights evaluated."""
    import torch.distributed as dist

    import zeropp_hier
    from zeropp_hier.app import run as app_run
    from zeropp_hier.app.run import Run

    rank, world = dist.get_rank(), dist.get_world_size()
    run = Run(job_spec(preset, compression, a))
    t0 = time.perf_counter()
    rows = run.train(a["steps"])
    seconds = time.perf_counter() - t0
    state = app_run.gathered_state(run.engine)
    out = {"losses": [r["loss"] for r in rows], "seconds": seconds, "params": run.n_params}
    if run.hier:
        st = zeropp_hier.comm_stats(run.engine)
        out["numerics"] = st["numerics"]
        out["bytes"] = st["bytes"]
        out["plan"] = repr(run.runtime.plan)
    run.release()
    out["held_out_loss"] = _held_out_loss(state, a, rank, world)
    return out


def summarize(name: str, per_rank: list, a: dict) -> dict:
    steps = len(per_rank[0]["losses"])
    curve = [sum(r["losses"][s] for r in per_rank) / len(per_rank) for s in range(steps)]
    row = {
        "name": name,
        "curve": curve,
        "final_loss": sum(curve[-LAST:]) / min(LAST, steps),
        "held_out_loss": sum(r["held_out_loss"] for r in per_rank) / len(per_rank),
        "seconds_per_step": max(r["seconds"] for r in per_rank) / steps,
        "params": per_rank[0]["params"],
    }
    if "bytes" in per_rank[0]:
        row["node_bytes_per_step"] = (
            sum(sum(r["bytes"][p]["node"] for p in r["bytes"]) for r in per_rank) / len(per_rank) / steps
        )
        rel = [r["numerics"]["relative_error"].get("grad_reduce", {}).get("node") for r in per_rank]
        rel = [x["mean"] for x in rel if x]
        row["grad_node_rel_error"] = sum(rel) / len(rel) if rel else None
        row["numerics_rank0"] = per_rank[0]["numerics"]
        row["plan"] = per_rank[0]["plan"]
    return row


def print_table(rows: list, steps: int) -> None:
    stock = next((r for r in rows if r["name"] == "stock ZeRO-3"), None)

    def vs(r, key):
        return f"{100 * (r[key] / stock[key] - 1):+.2f}%" if stock else "-"

    print(
        f"\n| configuration | final loss (last {LAST} of {steps} steps) | vs stock | held-out loss | vs stock "
        "| node KB/step/rank | int4 grad error (node) | s/step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        node = f"{r['node_bytes_per_step'] / 1e3:.1f}" if "node_bytes_per_step" in r else "(stock)"
        err = f"{r['grad_node_rel_error']:.3f}" if r.get("grad_node_rel_error") is not None else "-"
        print(
            f"| {r['name']} | {r['final_loss']:.4f} | {vs(r, 'final_loss')} | {r['held_out_loss']:.4f} | "
            f"{vs(r, 'held_out_loss')} | {node} | {err} | {r['seconds_per_step']:.2f} |"
        )


def plot(rows: list, path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: no plot written ({path}); pip install matplotlib")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (full, tail) = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in rows:
        c = r["curve"]
        k = 10  # running mean over 10 steps: per-step losses are noisy
        smooth = [sum(c[max(0, i - k + 1) : i + 1]) / len(c[max(0, i - k + 1) : i + 1]) for i in range(len(c))]
        full.plot(smooth, label=r["name"], lw=1.2)
        start = len(c) // 2
        tail.plot(range(start, len(c)), smooth[start:], label=r["name"], lw=1.2)
    full.set(
        xlabel="step", ylabel="training loss (10-step mean, 8 ranks)", title="byte-level GPT-NeoX on stdlib sources"
    )
    tail.set(xlabel="step", title="second half")
    tail.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


_SAME = ("steps", "micro_batch", "seq_len", "d_model", "heads", "layers", "lr", "seed", "eval_batches")


def _previous_rows(path: str, a: dict, model: dict, data_sha: str) -> list:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        prev = json.load(f)
    differ = {k: (prev["args"].get(k), a[k]) for k in _SAME if prev["args"].get(k) != a[k]}
    if prev.get("model") != model:
        differ["model"] = (prev.get("model"), model)
    if prev.get("corpus", {}).get("sha256") != data_sha:
        differ["data"] = (prev.get("corpus", {}).get("sha256"), data_sha)
    if differ:
        raise SystemExit(
            f"--resume: {path} was made with other settings {differ} (saved, now); "
            "rerun without --resume or with the same settings"
        )
    return prev["results"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), help=f"names from {list(CONFIGS) + list(OPTIONAL)}")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument(
        "--data",
        default=None,
        help="a `zeropp-hier data prepare` directory (default: the stdlib corpus, prepared once into "
        "<out-dir>/stdlib_tokens)",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the configurations already in <out-dir>/convergence.json (same settings) "
        "and run only the missing ones: every run is deterministic, so a stopped "
        "benchmark can be finished in a new world",
    )
    args = ap.parse_args(argv)
    known = {**CONFIGS, **OPTIONAL}
    unknown = [n for n in args.configs if n not in known]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; choose from {list(known)}")
    os.makedirs(args.out_dir, exist_ok=True)
    if args.data is None:
        args.data = os.path.abspath(os.path.join(args.out_dir, "stdlib_tokens"))
        index = prepare_data(args.data)
    else:
        from zeropp_hier.app.data.tokens import TokenData

        args.data = os.path.abspath(args.data)
        index = TokenData(args.data).index  # a clear error when it is not a prepared directory
    a = {k.replace("-", "_"): v for k, v in vars(args).items()}
    model = dataclasses.asdict(model_config(a))
    out_json = os.path.join(args.out_dir, "convergence.json")
    rows = _previous_rows(out_json, a, model, index["sha256"]) if args.resume else []
    done = {r["name"] for r in rows}
    if done:
        print(f"resuming: keeping {sorted(done)} from {out_json}")
    t_start = time.perf_counter()
    with LocalWorld(8, timeout=4 * 3600) as w:
        for name in args.configs:
            if name in done:
                continue
            preset, compression = known[name]
            t0 = time.perf_counter()
            per_rank = w.run(train_one, name, preset, compression, a)
            rows.append(summarize(name, per_rank, a))
            r = rows[-1]
            print(
                f"[{time.perf_counter() - t_start:7.0f} s] {name}: final loss {r['final_loss']:.4f}, held-out "
                f"{r['held_out_loss']:.4f} ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
            # after every configuration: a partial run still reports
            write_json_atomic(
                out_json,
                {
                    "meta": run_meta(
                        {
                            "ranks": 8,
                            "topology": "2 x 2 x 2 (LocalWorld, gloo)",
                            "seed": a["seed"],
                            "steps": a["steps"],
                        }
                    ),
                    "args": a,
                    "model": model,
                    "world": "8 ranks = 2 nodes x 2 GPUs x 2 GCDs",
                    "corpus": {
                        "python": sys.version.split()[0],
                        "path": args.data,
                        "source": index.get("source"),
                        "documents": index["documents"],
                        "tokens": index["tokens"],
                        "sha256": index["sha256"],
                    },
                    "configs": {n: {"preset": known[n][0], "compression": known[n][1]} for n in args.configs},
                    "results": rows,
                },
                indent=1,
            )
    rows.sort(key=lambda r: args.configs.index(r["name"]) if r["name"] in args.configs else len(args.configs))
    print_table(rows, args.steps)
    print(
        f"\nmodel {model_config(a)}, {rows[0]['params']} parameters; {args.micro_batch} x {args.seq_len} bytes "
        f"per rank per step; Adam lr {args.lr}; total {time.perf_counter() - t_start:.0f} s; wrote {out_json}"
    )
    plot(rows, os.path.join(args.out_dir, "convergence.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
