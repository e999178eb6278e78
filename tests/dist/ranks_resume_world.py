"""Rank-side helpers of test_resume_world.py: what the job holds right after a save and right
after a resume's load, gathered in full on every rank."""

from __future__ import annotations

import torch


def full_state(engine) -> dict[str, dict[str, torch.Tensor]]:
    """Per parameter: the full fp32 master weight and both Adam moments (collectives: every
    rank calls it, in the same parameter order)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out = {}
    for name, p in engine.module.named_parameters():
        out[name] = {
            "fp32": safe_get_full_fp32_param(p).detach().clone(),
            "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").detach().clone(),
            "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq").detach().clone(),
        }
    out["_lr"] = {"lr": torch.tensor([g["lr"] for g in engine.optimizer.param_groups], dtype=torch.float64)}
    out["_steps"] = {"global_steps": torch.tensor([engine.global_steps])}
    return out


class Capture:
    """``rank_main``'s hooks: the full state after a load and after each save."""

    def loaded(self, engine):
        return full_state(engine)

    def saved(self, engine, step):
        return full_state(engine)


def rank_main_logged(log: str, spec, hooks=None) -> dict:
    """The job on this rank with what it prints (rank 0's lines) written to ``log``.<rank>: the
    preloaded ranks' stdout is the fork server's, which a test cannot capture."""
    import contextlib

    import torch.distributed as dist

    from zeropp_hier.app.run import rank_main

    with open(f"{log}.{dist.get_rank()}", "w") as f, contextlib.redirect_stdout(f):
        return rank_main(spec, hooks)
