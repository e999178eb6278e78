"""The main job: a small GPT trained on a simulated Frontier, on the CPU.

    python -m zeropp_hier.demo                       # 8 ranks = 2 nodes x 2 GPUs x 2 GCDs, frontier preset
    python -m zeropp_hier.demo --preset zeropp --steps 50
    python -m zeropp_hier.demo --preset stock        # stock DeepSpeed ZeRO-3, for comparison

Without a launcher it starts its own ranks (gloo on CPU); under ``srun`` or ``torchrun`` it runs
as one rank per process. Rank 0 prints, per step, the loss (mean over ranks), tokens/s and the
bytes one rank sent over each tier, then a per-phase table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

PRESETS = ("frontier", "zeropp", "zero3", "stock")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=PRESETS, default="frontier")
    ap.add_argument("--compression", default=None,
                    help="'none' to switch compression off, or a JSON object for zeropp_hier.compression "
                         "(default: the preset's own)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=2)
    ap.add_argument("--gcds-per-gpu", type=int, default=2)
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--data", choices=("synthetic", "stdlib"), default="synthetic",
                    help="synthetic sequences, or real text: the Python standard library's sources, "
                         "byte by byte (zeropp_hier.text; no download)")
    ap.add_argument("--metrics", default=None, help="write per-step metrics as JSON to this file")
    return ap.parse_args(argv)


def _compression(arg):
    if arg is None or arg in ("none", "int8", "int4", "fp16", "bf16"):
        return arg
    return json.loads(arg)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:7.1f} {unit}"
        n /= 1000.0
    return str(n)


def numerics_lines(engine) -> list[str]:
    """End-of-run table of the compression error per phase and tier, error-feedback memory and
    skipped steps, from ``comm_stats(engine)["numerics"]`` (this rank)."""
    import zeropp_hier
    num = zeropp_hier.comm_stats(engine)["numerics"]
    plan = engine.hier_runtime.plan
    hops = {"forward_gather": plan.forward, "backward_gather": plan.backward, "grad_reduce": plan.reduce}
    lines = [f"compression error ||x - deq(q(x))|| / ||x|| on rank 0, sampled every {num['sample_every']}th call:",
             f"  {'phase':16s} {'tier':5s} {'scheme':7s} {'mean':>8s} {'max':>8s} {'samples':>8s}  feedback"]
    for phase, tiers in num["relative_error"].items():
        for tier, e in tiers.items():
            hop = next((h for h in hops.get(phase, ()) if h.tier == tier), None)
            scheme = hop.scheme if hop else "?"
            fb = "on" if hop is not None and hop.error_feedback else ""
            lines.append(f"  {phase:16s} {tier:5s} {scheme:7s} {e['mean']:8.4f} {e['max']:8.4f} {e['samples']:8d}  {fb}")
    if not num["relative_error"]:
        lines.append("  (nothing compressed, or sampling off)")
    ef, nf = num["error_feedback"], num["nonfinite"]
    lines.append(f"error feedback: {ef['buffers']} residual buffer(s), {_fmt_bytes(ef['bytes']).strip()} on rank 0; "
                 f"skipped steps ({nf['policy']} on non-finite): {nf['skipped_steps'] or 'none'}")
    return lines


def rank_main(args: argparse.Namespace) -> dict:
    import torch
    import torch.distributed as dist

    import zeropp_hier
    from zeropp_hier import training
    from zeropp_hier.models.gpt import GPTConfig
    from zeropp_hier.topology import TIERS

    rank, world = dist.get_rank(), dist.get_world_size()
    model_cfg = GPTConfig(vocab_size=256, seq_len=32, d_model=args.d_model, n_heads=4, n_layers=args.layers)
    preset = None if args.preset == "stock" else args.preset
    cfg = training.ds_config(preset, dtype=args.dtype, micro_batch=args.micro_batch,
                             compression=_compression(args.compression),
                             gpus_per_node=args.gpus_per_node, gcds_per_gpu=args.gcds_per_gpu)
    engine = training.build_engine(cfg, model_cfg)
    hier = getattr(engine, "hier_runtime", None) is not None
    batch_fn = None
    if args.data == "stdlib":
        from zeropp_hier import text
        corpus = text.stdlib_corpus()
        batch_fn = lambda index, batch, r: text.windows(corpus.train, batch, model_cfg.seq_len,  # noqa: E731
                                                        text.batch_seed(0, index, r))
    tokens_per_step = world * args.micro_batch * model_cfg.seq_len
    n_params = sum(p.ds_numel for p in engine.module.parameters())
    if rank == 0:
        topo = f"{world // (args.gpus_per_node * args.gcds_per_gpu)} nodes x {args.gpus_per_node} GPUs x {args.gcds_per_gpu} GCDs"
        print(f"zeropp-hier demo: preset={args.preset} dtype={args.dtype} data={args.data} world={world} ({topo}), "
              f"GPT {n_params / 1e6:.2f}M params, {tokens_per_step} tokens/step", flush=True)
        if hier:
            print(f"plan: {engine.hier_runtime.plan}", flush=True)
    history = []
    prev = {t: 0 for t in TIERS}
    skipped = [0]

    def on_step(step, loss, seconds):
        t = torch.tensor([loss], dtype=torch.float64)
        dist.all_reduce(t)
        row = {"step": step, "loss": float(t) / world, "tokens_per_s": tokens_per_step / seconds}
        if hier:
            snap = zeropp_hier.comm_stats(engine)["bytes"]
            now = {tier: sum(snap[p][tier] for p in snap) for tier in TIERS}
            row["bytes"] = {tier: now[tier] - prev[tier] for tier in TIERS}
            prev.update(now)
        row["skipped"] = engine.skipped_steps > skipped[0]  # fp16 overflow or non-finite gradient
        skipped[0] = engine.skipped_steps
        history.append(row)
        if rank == 0:
            sent = ""
            if hier:
                sent = " | sent/rank " + "  ".join(f"{tier} {_fmt_bytes(row['bytes'][tier])}"
                                                   for tier in reversed(TIERS))
            mark = " | SKIPPED (weights unchanged)" if row["skipped"] else ""
            print(f"step {step:4d} | loss {row['loss']:.4f} | {row['tokens_per_s']:8.0f} tok/s{sent}{mark}", flush=True)

    t0 = time.perf_counter()
    training.train_steps(engine, args.steps, on_step=on_step, batch_fn=batch_fn)
    elapsed = time.perf_counter() - t0
    summary = {"preset": args.preset, "world": world, "steps": args.steps, "history": history,
               "tokens_per_s": tokens_per_step * args.steps / elapsed}
    if hier:
        summary["comm_stats"] = zeropp_hier.comm_stats(engine)
    if rank == 0:
        print(f"done: {args.steps} steps, mean {summary['tokens_per_s']:.0f} tok/s, final loss "
              f"{history[-1]['loss']:.4f} (first {history[0]['loss']:.4f})", flush=True)
        if hier:
            st = summary["comm_stats"]
            print("\nbytes sent by rank 0 per step, by phase and tier:")
            print(f"  {'phase':16s} " + " ".join(f"{t:>12s}" for t in reversed(TIERS)))
            for phase, per in st["bytes"].items():
                print(f"  {phase:16s} " + " ".join(f"{_fmt_bytes(per[t] / args.steps):>12s}" for t in reversed(TIERS)))
            print()
            print("\n".join(numerics_lines(engine)))
        if args.metrics:
            with open(args.metrics, "w") as f:
                json.dump(summary, f, indent=1)
    training.release(engine)
    return {"final_loss": history[-1]["loss"], "first_loss": history[0]["loss"]}


def _under_launcher() -> bool:
    return "RANK" in os.environ or "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if _under_launcher():
        import deepspeed
        os.environ.setdefault("RANK", os.environ.get("SLURM_PROCID", "0"))
        os.environ.setdefault("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))
        os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
        deepspeed.init_distributed()
        rank_main(args)
        return 0
    from zeropp_hier.launch import LocalWorld
    world = args.nodes * args.gpus_per_node * args.gcds_per_gpu
    print(f"starting {world} local CPU ranks (gloo)...", flush=True)
    with LocalWorld(world, timeout=1800) as w:
        out = w.run(rank_main, args)
    return 0 if out[0]["final_loss"] < out[0]["first_loss"] else 1


if __name__ == "__main__":
    sys.exit(main())
