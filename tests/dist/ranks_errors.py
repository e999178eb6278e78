"""Per-rank functions for the one-rank-error tests: a check that fails on one rank only (its
environment, its probe file, its config), a cap on skipped steps, and an interrupt mid-step.
Each runs in real rank processes of a LocalWorld with real DeepSpeed engines; errors every rank
is expected to raise are caught and returned as text, so that the next case runs in the same
world (which shows no rank was left inside a collective)."""

from __future__ import annotations

import copy
import json
import os
import signal
import time

import torch.distributed as dist

from zeropp_hier.app import run as app_run


def _outcome(fn) -> dict:
    t0 = time.monotonic()
    try:
        fn()
        return {"error": None, "seconds": time.monotonic() - t0}
    except Exception as e:  # the expected, agreed error: returned for the test to read
        return {"error": f"{type(e).__name__}: {e}", "type": type(e).__name__, "seconds": time.monotonic() - t0}


def _build_and_release(config: dict) -> dict:
    engine = app_run.build_engine(config)
    out = {"preset": engine.hier_runtime.cfg.preset if engine.hier_runtime else None}
    app_run.release(engine)
    return out


def one_rank_errors(config: dict, auto_config: dict, probe_dir: str) -> dict:
    """The cases, in order, on every rank."""
    rank = dist.get_rank()
    out = {}

    # 1. LOCAL_RANK unusable on rank 1 only
    saved = os.environ["LOCAL_RANK"]
    if rank == 1:
        os.environ["LOCAL_RANK"] = "abc"
    try:
        out["local_rank"] = _outcome(lambda: _build_and_release(config))
    finally:
        os.environ["LOCAL_RANK"] = saved

    # 2. the probe file: present on rank 0, absent on rank 1 (another node's file system); rank 0
    # reads it for everyone, so every rank plans from the same rates
    good = os.path.join(probe_dir, "probe.json")
    if rank == 0:
        with open(good, "w") as f:
            json.dump({"tiers": {"gcd": {"bandwidth": 5e10, "latency": 1e-5}}}, f)
    dist.barrier()
    cfg = copy.deepcopy(auto_config)
    cfg["zeropp_hier"]["auto"] = {"probe_file": good if rank == 0 else os.path.join(probe_dir, "elsewhere.json")}
    chosen = {}

    def auto_build():
        chosen.update(_build_and_release(cfg))

    out["probe_on_rank0_only"] = {**_outcome(auto_build), **chosen}

    # 3. the probe file absent on rank 0: every rank raises rank 0's reading of it
    cfg = copy.deepcopy(auto_config)
    cfg["zeropp_hier"]["auto"] = {"probe_file": os.path.join(probe_dir, "missing.json")}
    out["probe_missing_on_rank0"] = _outcome(lambda: _build_and_release(cfg))

    # 4. a different config on rank 1 (another preset): the plans differ, refused before any
    # hop group is built
    cfg = copy.deepcopy(config)
    if rank == 1:
        cfg["zeropp_hier"]["preset"] = "zeropp"
    out["different_plan"] = _outcome(lambda: _build_and_release(cfg))

    # 5. and the world still works: every rank builds and trains one step
    engine = app_run.build_engine(config)
    out["after"] = app_run.train_steps(engine, 1)
    app_run.release(engine)
    return out


def skip_cap(config: dict, inject_rank: int, first_bad: int, steps: int) -> dict:
    """From step ``first_bad`` on, one gradient element on ``inject_rank`` is +Inf every step."""
    import zeropp_hier

    engine = app_run.build_engine(config)
    rank = dist.get_rank()
    now = {"step": -1}
    param = dict(engine.module.named_parameters())["blocks.0.fc.weight"]

    def poison(grad):
        if now["step"] >= first_bad and rank == inject_rank:
            grad = grad.clone()
            grad.view(-1)[0] = float("inf")
        return grad

    param.register_hook(poison)
    out = {"error": None, "steps_run": 0}
    try:
        for step in range(steps):
            now["step"] = step
            app_run.train_steps(engine, 1, start=step)
            out["steps_run"] += 1
    except zeropp_hier.HierSkippedStepsError as e:
        out["error"] = str(e)
        out["history"] = e.history
        out["at_step"] = now["step"]
    app_run.release(engine)
    return out


def interrupted_mid_step(config: dict, signal_step: int, marker_dir: str, save_dir: str, waiters: list) -> str:
    """Train; in the forward of ``signal_step`` the ranks in ``waiters`` announce themselves (a
    file) and wait there, in the middle of the step, for the test's signal (the others go on
    into the step's next gather, which waits for them). A KeyboardInterrupt (SIGINT) is
    answered as a training script should: try to save (the engine must refuse), then fail with
    the cause. SIGTERM ends the process by Python's default action."""
    from zeropp_hier.core.errors import HierUnsafeSaveError

    # A terminal's Ctrl-C reaches a foreground job, whose Python answers SIGINT with
    # KeyboardInterrupt. A test runner started as a background job of a non-interactive shell
    # (`pytest ... &`) has SIGINT ignored, every process it starts inherits that, and Python then
    # installs no handler: restore the foreground job's answer for what this test is about.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    engine = app_run.build_engine(config)
    rank = dist.get_rank()

    def hook(module, inputs):
        if engine.global_steps == signal_step and rank in waiters:
            open(os.path.join(marker_dir, f"rank{rank}"), "w").close()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # the signal arrives here
                time.sleep(0.05)

    engine.module.blocks[1].fc.register_forward_pre_hook(hook)
    try:
        app_run.train_steps(engine, signal_step + 2)
    except KeyboardInterrupt as interrupt:
        try:
            engine.save_checkpoint(save_dir)
        except HierUnsafeSaveError as refusal:
            raise RuntimeError(f"rank {rank}: interrupted mid-step (KeyboardInterrupt); {refusal}") from interrupt
        raise AssertionError(f"rank {rank}: a checkpoint was saved after an interrupt mid-step") from interrupt
    return "finished"  # never reached: the test fails if it is
