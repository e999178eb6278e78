"""Per-rank functions for the numerics tests (error feedback in checkpoints, non-finite
gradients), run on every rank of a ``LocalWorld``; they return plain data, the test asserts."""

from __future__ import annotations

import torch
import torch.distributed as dist

from zeropp_hier.app import run as app_run
from zeropp_hier.app.data.tokens import synthetic_batch
from zeropp_hier.app.model.gpt import GPTConfig

INJECT_PARAM = "blocks.0.fc.weight"


def _residuals(engine) -> dict:
    ef = engine.hier_runtime.numerics.error_feedback
    return {k: r.clone() for k, r in ef.residuals.items()}


def ef_checkpoint_resume(
    config: dict, ckpt_dir: str, before: int, after: int, model_cfg: GPTConfig = GPTConfig()
) -> dict:
    """Uninterrupted run vs save + load into a fresh engine + continue, with error feedback on;
    and a control that loads the same checkpoint but drops the residuals."""
    import zeropp_hier

    build = lambda seed=0: app_run.build_engine(config, model_cfg, seed)  # noqa: E731
    ref = build()
    ref_losses = app_run.train_steps(ref, before + after)
    ref_state = app_run.gathered_state(ref)
    ref_stats = zeropp_hier.comm_stats(ref)
    app_run.release(ref)

    first = build()
    app_run.train_steps(first, before)
    saved = _residuals(first)
    first.save_checkpoint(ckpt_dir, tag="ef")
    app_run.release(first)

    second = build(seed=123)  # different init: the load must overwrite it
    second.load_checkpoint(ckpt_dir, tag="ef")
    loaded = _residuals(second)
    resumed = app_run.train_steps(second, after, start=before)
    state = app_run.gathered_state(second)
    app_run.release(second)

    control = build(seed=123)
    control.load_checkpoint(ckpt_dir, tag="ef")
    control.hier_runtime.numerics.error_feedback.reset()
    control_losses = app_run.train_steps(control, after, start=before)
    app_run.release(control)

    same_keys = sorted(saved) == sorted(loaded)
    max_diff = max((float((saved[k] - loaded[k]).abs().max()) for k in saved), default=None) if same_keys else None
    return {
        "ref_losses": ref_losses[before:],
        "resumed_losses": resumed,
        "control_losses": control_losses,
        "ref_state": ref_state,
        "state": state,
        "saved_buffers": len(saved),
        "saved_norm": sum(float(r.norm()) for r in saved.values()),
        "same_keys": same_keys,
        "residual_max_diff": max_diff,
        "numerics": ref_stats["numerics"],
    }


def _train_with_injection(engine, steps: int, inject_step: int, inject_rank: int) -> dict:
    """Train ``steps`` steps; at ``inject_step`` one element of one gradient becomes +Inf on
    ``inject_rank`` only. Returns weights around that step, loss scales, skips, and the error
    raised, if any (every rank raises at the same point, so catching it here is safe)."""
    import zeropp_hier

    rank = dist.get_rank()
    now = {"step": -1}
    param = dict(engine.module.named_parameters())[INJECT_PARAM]

    def poison(grad):
        if now["step"] == inject_step and rank == inject_rank:
            grad = grad.clone()
            grad.view(-1)[0] = float("inf")
        return grad

    handle = param.register_hook(poison)
    c = engine.module.config
    out = {"losses": [], "scales": [], "error": None}
    for step in range(steps):
        now["step"] = step
        if step == inject_step:
            out["before"] = app_run.gathered_state(engine)
        x, y = synthetic_batch(c, engine.train_micro_batch_size_per_gpu(), step, rank)
        loss = engine(x, y)
        engine.backward(loss)
        try:
            engine.step()
        except zeropp_hier.HierNonFiniteError as e:
            out["error"] = {
                "message": str(e),
                "step": e.step,
                "rank": e.rank,
                "phase": e.phase,
                "tier": e.tier,
                "seen": e.seen,
            }
            out["after"] = app_run.gathered_state(engine)
            break
        out["losses"].append(float(loss.detach().float()))
        out["scales"].append(float(engine.optimizer.loss_scale))
        if step == inject_step:
            out["after"] = app_run.gathered_state(engine)
    handle.remove()
    out["skipped_steps"] = engine.skipped_steps
    if getattr(engine, "hier_runtime", None) is not None:
        out["numerics"] = zeropp_hier.comm_stats(engine)["numerics"]
        ef = engine.hier_runtime.numerics.error_feedback
        out["ef_finite"] = all(bool(torch.isfinite(r).all()) for r in ef.residuals.values())
        out["ef_buffers"] = len(ef.residuals)
    return out


def nonfinite_injection(configs: dict, steps: int, inject_step: int, inject_rank: int) -> dict:
    out = {}
    for name, cfg in configs.items():
        engine = app_run.build_engine(cfg)
        out[name] = _train_with_injection(engine, steps, inject_step, inject_rank)
        app_run.release(engine)
    return out


def numerics_suite(
    resume_config: dict, ckpt_dir: str, nonfinite_configs: dict, steps: int, inject_step: int, inject_rank: int
) -> dict:
    """Everything the numerics tests need, in one task (one round trip to the world)."""
    # untied head: DeepSpeed gathers a tied weight's second use with its own stock gather, so a
    # fresh engine's first step sees it once compressed and later steps not (see GPTConfig)
    untied = GPTConfig(tie_embeddings=False)
    return {
        "resume": ef_checkpoint_resume(resume_config, ckpt_dir, 2, 2, untied),
        "nonfinite": nonfinite_injection(nonfinite_configs, steps, inject_step, inject_rank),
    }
