"""python -m benchmarks.cpu.grad_error [--quick]: see benchmarks/cpu/grad_error/__init__.py."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

import torch

from zeropp_hier import quant
from zeropp_hier.core.policy import PRESET_COMPRESSION, PRESET_ERROR_FEEDBACK
from zeropp_hier.core.topology import Topology
from zeropp_hier.files import write_json_atomic

from . import qgz
from .gradients import Trainer, model_spec, prepare_data
from .metrics import Window
from .pipelines import Reducer
from .report import markdown
from .rows import QGZ, describe, rows

SHAPES = {"2x4x2": (2, 4, 2), "8x1x2": (8, 1, 2)}


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu.grad_error", description=__doc__)
    p.add_argument("--points", type=int, nargs="+", default=[0, 50, 150], help="training steps before each window")
    p.add_argument("--window", type=int, default=8, help="consecutive measured steps per point")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--beta", type=float, default=0.9, help="LoCo-style moving average of the residual")
    p.add_argument("--rotations", type=int, nargs="*", default=[32, 128])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--data", default="data/stdlib", help="the job's token files (prepared here if absent)")
    p.add_argument("--out", default="benchmarks/results/grad_error", help="writes OUT.json and OUT.md")
    p.add_argument("--quick", action="store_true", help="a look in a minute: points 0 2, window 2, a 0.3M model")
    a = p.parse_args(argv)
    if a.quick:
        a.points, a.window, a.hidden, a.layers, a.seq_len = [0, 2], 2, 64, 2, 16
    if sorted(a.points) != a.points or len(set(a.points)) != len(a.points) or a.points[0] < 0:
        p.error(f"--points {a.points}: give increasing non-negative step counts")
    if a.window < 1:
        p.error(f"--window {a.window}: give at least 1")
    return a


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _write(a, argv, tr, spec, index, configs, points, seconds, world) -> None:
    """The results so far (after every point: a run cut short keeps what it measured)."""
    result = {
        "what": "relative error, cosine and accumulated bias of each gradient-reduce pipeline against the exact mean",
        "command": "python -m benchmarks.cpu.grad_error " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": _git_commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"quant kernels {quant.kernel_info('cpu')}, shared with other jobs (timings under load)",
        "seconds": round(seconds, 1),
        "complete": len(points) == len(a.points),
        "model": {
            "arch": "GPT-NeoX (transformers)",
            "parameters": tr.numel,
            **{k: getattr(spec, k) for k in ("hidden", "layers", "heads", "seq_len", "intermediate")},
            "vocab": spec.vocab,
        },
        "data": {"path": a.data, "source": index.get("source"), "tokens": index.get("tokens")},
        "world": world,
        "micro_batch": a.micro_batch,
        "lr": a.lr,
        "seed": a.seed,
        "points": a.points,
        "window": a.window,
        "defaults": {"compression": PRESET_COMPRESSION, "error_feedback": PRESET_ERROR_FEEDBACK, "block_size": 256},
        "configs": {s: {n: describe(c) for n, c in configs[s].items()} for s in a.shapes},
        "results": points,
    }
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    write_json_atomic(a.out + ".json", result)
    with open(a.out + ".md", "w") as f:
        f.write(markdown(result))


def main(argv=None) -> int:
    a = _args(argv)
    torch.manual_seed(a.seed)
    index = prepare_data(a.data)
    spec = model_spec(a.hidden, a.layers, a.heads, a.seq_len)
    world = 16
    tr = Trainer(spec, a.data, world, a.micro_batch, a.lr, a.seed)
    topos = {name: Topology(*SHAPES[name]) for name in a.shapes}
    configs = {name: rows(t, a.rotations, a.beta) for name, t in topos.items()}
    print(f"model: {tr.numel / 1e6:.2f}M parameters, {world} ranks x {a.micro_batch} x {a.seq_len} tokens", flush=True)
    t0 = time.time()
    step, points = 0, []
    for point in a.points:
        while step < point:
            loss = tr.warm_step(step)
            step += 1
            if step % 25 == 0:
                print(f"  warm-up step {step}: loss {loss:.3f} ({time.time() - t0:.0f} s)", flush=True)
        reducers = {
            s: Reducer(topos[s], {n: c for n, c in configs[s].items() if not isinstance(c, str)}) for s in a.shapes
        }
        windows = {s: Window(list(configs[s])) for s in a.shapes}
        losses = []
        for _ in range(a.window):
            grads, loss = tr.rank_grads(step)
            losses.append(loss)
            exact = [
                torch.stack([g[t] for g in grads]).to(torch.float64).mean(0).reshape(-1) for t in range(len(tr.params))
            ]
            for s in a.shapes:
                got = reducers[s].reduce(grads)
                for name, c in configs[s].items():
                    if c == QGZ:
                        n, p, g = SHAPES[s]
                        got[name], _ = qgz.reduce(grads, n, p * g)
                windows[s].add(exact, got)
            tr.apply([e.to(torch.float32) for e in exact])
            step += 1
            print(f"  step {step}: loss {loss:.3f} ({time.time() - t0:.0f} s)", flush=True)
        print(
            f"point {point}: {a.window} steps, loss {sum(losses) / len(losses):.3f} ({time.time() - t0:.0f} s)",
            flush=True,
        )
        points.append(
            {
                "steps_before": point,
                "loss": sum(losses) / len(losses),
                "shapes": {s: windows[s].summary() for s in a.shapes},
            }
        )
        _write(a, argv, tr, spec, index, configs, points, time.time() - t0, world)
    with open(a.out + ".md") as f:
        print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
