"""Rank functions of tests/dist/test_collective_overlap.py: real DeepSpeed engines trained with
every communication call of every thread recorded (tests/dist/call_recorder.py), the way a
training script drives them: forward, a loss all-reduced for logging from the training thread
right after it (as Megatron's loss averaging does), backward, the optimizer step (DeepSpeed's
gradient-norm all-reduce under clipping), the loss logged again after it (as HF Trainer does),
an evaluation (forward under no_grad, its loss all-reduced) and a checkpoint save. They return
plain data; the test asserts."""

from __future__ import annotations

import os
import threading

import torch
import torch.distributed as dist

from zeropp_hier.app import run as app_run
from zeropp_hier.app.data.tokens import synthetic_batch

from .call_recorder import CallRecorder
from .overlaps import OpenCallError, conflicts, describe

STEPS = 2
EVAL_BATCHES = 2


def _labels(rt) -> dict[str, str]:
    labels = {hg.group.group_name: "hop:" + "+".join(axes) for axes, hg in rt.groups.items()}
    if rt.tick_group is not None:
        labels[rt.tick_group.group_name] = "tick"
    return labels


def _drains(pending: list) -> list:
    """Record every drain of the engine: what it was before, and the collectives in flight then."""
    from zeropp_hier.deepspeed import engine as engine_module
    from zeropp_hier.deepspeed import stage3

    undo = []
    for mod in (engine_module, stage3):
        real = mod.quiesce

        def recorded(executor, what, real=real):
            n = real(executor, what)
            pending.append((what, n))
            return n

        mod.quiesce = recorded
        undo.append(lambda m=mod, r=real: setattr(m, "quiesce", r))
    return undo


def _script(engine, root: str, name: str, inside: bool = False) -> None:
    """What a training script does with the engine, every call through the real functions.
    ``inside``: the model also all-reduces a statistic inside its forward, after its first block
    (as SyncBatchNorm does), from the training thread."""
    c = engine.module.config
    if inside:
        engine.module.blocks[0].register_forward_hook(lambda m, a, out: dist.all_reduce(out.detach().sum().view(1)))
    rank, micro = dist.get_rank(), engine.train_micro_batch_size_per_gpu()
    for step in range(STEPS):
        x, y = synthetic_batch(c, micro, step, rank)
        loss = engine(x, y)
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # logging from the training thread, right after the forward
        engine.backward(loss)
        engine.step()
        dist.all_reduce(loss.detach().clone())  # and after the step
    engine.eval()
    with torch.no_grad():
        for b in range(EVAL_BATCHES):
            x, y = synthetic_batch(c, micro, 100 + b, rank)
            dist.all_reduce(engine(x, y).detach().clone())
    engine.train()
    engine.save_checkpoint(os.path.join(root, name), tag="t")


def overlap_run(configs: dict, root: str, drain: bool = True, model_cfg=None, inside: bool = False) -> dict:
    """For each config: build the engine, run ``_script`` with every call recorded, and report
    the calls per (thread, communicator), the conflicts the checker finds, and the drains.
    ``drain`` False: the runtime's drain before a foreign collective is switched off (in this
    process only, for the control run: [Note: foreign collectives] in zeropp_hier/comm/foreign.py)."""
    from zeropp_hier.comm import foreign

    out = {}
    real_drain = foreign.drain_for
    if not drain:
        foreign.drain_for = lambda name: None
    try:
        for name, cfg in configs.items():
            engine = app_run.build_engine(cfg) if model_cfg is None else app_run.build_engine(cfg, model_cfg)
            rt = engine.hier_runtime
            pending: list = []
            undo = _drains(pending)
            before = dict(foreign.counts)
            recorder = CallRecorder(_labels(rt)).start()
            try:
                _script(engine, root, name, inside)
            finally:
                calls = recorder.stop()
                for u in undo:
                    u()
            main = threading.current_thread().name
            try:
                found = [describe(p) for p in conflicts(calls)]
                refused = None
            except OpenCallError as e:
                found, refused = [], str(e)
            by: dict[str, int] = {}
            for cl in calls:
                key = f"{'training' if cl.thread == main else 'lane'} {cl.comm}"
                by[key] = by.get(key, 0) + 1
            out[name] = {
                "mode": rt.issue_mode.name,
                "calls": by,
                "ops": sorted({(cl.op, cl.comm) for cl in calls}),
                "conflicts": found[:5],
                "n_conflicts": len(found),
                "refused": refused,
                "drains": pending,
                "foreign_drains": {k: foreign.counts[k] - before[k] for k in before},
                "max_outstanding": rt.executor.max_outstanding,
                "threads": sorted({cl.thread for cl in calls if cl.thread != main}),
            }
            app_run.release(engine)
    finally:
        foreign.drain_for = real_drain
    return out
