"""One training run on the current rank: shared by the job, the benchmarks and the tests, so
that all of them exercise the same code path. The model is a ``ModelSpec`` (the job's
GPT-NeoX sizes, zeropp_hier.app.models) or the hand-written GPT's ``GPTConfig``."""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from .gpt import GPT, GPTConfig, synthetic_batch


def build_engine(config: dict, model_cfg: Any = GPTConfig(), seed: int = 0, checkpointing: str = "none"):
    """An engine for ``model_cfg``: a ``ModelSpec`` is built sharded under ZeRO-3
    ([Note: building a model sharded] in models.py); a ``GPTConfig`` whole, as the tests of
    the hand-written GPT always did. ``checkpointing``: activation checkpointing per block
    ("none", "torch", "deepspeed")."""
    import zeropp_hier

    from . import models

    if isinstance(model_cfg, models.ModelSpec):
        model = models.build(model_cfg, config, seed=seed)
    else:
        torch.manual_seed(seed)
        model = GPT(model_cfg)
    models.enable_checkpointing(model, checkpointing)  # type: ignore[arg-type]
    engine, *_ = zeropp_hier.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def gathered_state(engine) -> dict[str, torch.Tensor]:
    """Full fp32 copies of every parameter (collective: every rank must call it)."""
    import deepspeed

    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return {n: p.detach().float().clone() for n, p in params.items()}


def train_steps(
    engine,
    steps: int,
    start: int = 0,
    on_step: Callable[[int, float, float], None] | None = None,
    batch_fn: Callable[[int, int, int], tuple] | None = None,
) -> list[float]:
    """Run ``steps`` optimizer steps; returns this rank's loss per step (mean over micro-batches).
    ``batch_fn(index, batch, rank) -> (inputs, targets)`` gives the ``index``-th micro-batch
    (index = step * accumulation + micro); the default is the model's synthetic sequences."""
    c = engine.module.config
    rank, accum = dist.get_rank(), engine.gradient_accumulation_steps()
    micro = engine.train_micro_batch_size_per_gpu()
    if batch_fn is None:
        batch_fn = lambda index, batch, r: synthetic_batch(c, batch, index, r)  # noqa: E731
    losses = []
    for step in range(start, start + steps):
        t0 = time.perf_counter()
        total = 0.0
        for m in range(accum):
            x, y = batch_fn(step * accum + m, micro, rank)
            x, y = x.to(engine.device), y.to(engine.device)  # no-op on CPU
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += float(loss.detach().float())
        losses.append(total / accum)
        if on_step is not None:
            on_step(step, losses[-1], time.perf_counter() - t0)
    return losses


def release(engine) -> None:
    """Free an engine so the next one in this process starts clean."""
    engine.destroy()
    del engine
    gc.collect()


def run(config: dict, steps: int, model_cfg: GPTConfig = GPTConfig(), seed: int = 0, want_state: bool = True) -> dict:
    """Build, train, report: losses, final weights and comm stats for this rank."""
    import zeropp_hier

    engine = build_engine(config, model_cfg, seed)
    losses = train_steps(engine, steps)
    out: dict[str, Any] = {"losses": losses}
    if want_state:
        out["state"] = gathered_state(engine)
    if getattr(engine, "hier_runtime", None) is not None:
        out["stats"] = zeropp_hier.comm_stats(engine)
    release(engine)
    return out
