"""The job's checkpoints: every ``save_every`` steps and after the last, through the engine's
transactional ``save_checkpoint``; ``resume=latest`` (or a tag) continues a run.

[Note: what a job checkpoint holds]
The engine's checkpoint holds the model, the optimizer (and a scheduler, if the config has one).
The job adds, as DeepSpeed client state: the number of steps done, the data position (the next
global sample, [Note: sample order] in data.py) and the RNG state of rank 0 (torch, CUDA,
Python's ``random``). Every rank of the job draws the same numbers (one seed; the data order is
a function of the seed and the sample position, dropout is 0), so rank 0's state stands for all.
A resumed run trains steps ``step .. steps - 1`` on the same batches the uninterrupted run
would have seen; a run whose world or micro-batch differs from the saved one is refused before
it trains (the position would fall inside a micro-batch).
"""

from __future__ import annotations

import random

import torch

KEY = "zeropp_hier_job"


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def tag_for(step_done: int) -> str:
    return f"step{step_done}"


def save(engine, ckpt_dir: str, step_done: int, data_state: dict) -> str:
    """Collective: every rank calls it after step ``step_done - 1``."""
    tag = tag_for(step_done)
    client = {KEY: {"step": step_done, "data": data_state, "rng": rng_state()}}
    engine.save_checkpoint(ckpt_dir, tag=tag, client_state=client)
    return tag


def load(engine, ckpt_dir: str, resume: str) -> dict:
    """Collective: restore ``resume`` ("latest" or a tag) into ``engine``; returns the job's
    state (step, data position)."""
    from ..core.errors import HierConfigError
    from ..deepspeed.engine import HierEngine

    # our engine refuses a missing 'latest' unless asked not to; the job names its own field
    # instead (stock DeepSpeed's engine returns (None, None) for it by itself)
    extra = {"missing_ok": True} if isinstance(engine, HierEngine) else {}
    path, client = engine.load_checkpoint(ckpt_dir, tag=None if resume == "latest" else resume, **extra)
    if path is None:
        raise HierConfigError(
            "resume", resume, f"no checkpoint found in {ckpt_dir}: set checkpoint_dir to the saved run's directory"
        )
    job = (client or {}).get(KEY)
    if job is None:
        raise HierConfigError(
            "resume", resume, f"{path} was not written by zeropp-hier train (no job state): resume a job's checkpoint"
        )
    set_rng_state(job["rng"])
    return job
