"""One arm at one seed, on one rank: the training job (``zeropp_hier.app.run.Run``) under the
arm's preset and compression, held-out losses of its exact weights at the protocol's last steps,
and fingerprints that prove the pairing (same initial weights and samples for every arm of a seed).

Collective: every rank of the world calls ``train_arm`` with the same arguments.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from zeropp_hier.app.spec import JobSpec, ModelSpec
from zeropp_hier.planner.tables import plan_lines


def model_spec(run: dict) -> ModelSpec:
    """The byte-level GPT-NeoX the protocol names (vocabulary 256: the stdlib token files')."""
    return ModelSpec(
        vocab_size=256,
        seq_len=run["seq_len"],
        hidden=run["hidden"],
        heads=run["heads"],
        layers=run["layers"],
        intermediate=4 * run["hidden"],
    )


def job_spec(arm: dict, run: dict, seed: int, data: str) -> JobSpec:
    """The job for one arm and seed: ``seed`` sets the initial weights and the training sample
    order (``JobSpec.seed``), and nothing else differs between the arms of that seed."""
    return JobSpec(
        preset=arm["preset"],
        compression=arm["compression"],
        steps=run["steps"],
        micro_batch=run["micro_batch"],
        model=model_spec(run),
        data_path=data,
        lr=run["lr"],
        lr_decay=run["lr_decay"],
        min_lr_ratio=run["min_lr_ratio"],
        warmup_steps=run["warmup_steps"],
        seed=seed,
        local_world=8,
        progress="off",
    )


def state_digest(state: dict) -> str:
    """sha256 of every parameter's name and fp32 bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].contiguous().numpy().tobytes())
    return h.hexdigest()


def train_arm(name: str, arm: dict, run: dict, seed: int, data: str, eval_at: list[int]) -> dict[str, Any]:
    """Train one arm at one seed on this rank; returns what ``run.py`` records (losses as every
    rank's mean, so rank 0's answer is the world's)."""
    import torch
    import torch.distributed as dist

    from zeropp_hier.app import run as app_run
    from zeropp_hier.app.data.tokens import Loader, TokenData
    from zeropp_hier.app.model import models

    rank, world = dist.get_rank(), dist.get_world_size()
    spec = model_spec(run)
    # the held-out set is fixed (eval_seed, not the training seed): the same sequences for every
    # arm and every seed. A plain PyTorch copy evaluates the exact fp32 weights, so that an arm's
    # compressed weight gathers do not enter its held-out loss. Built before the job (models.build
    # reseeds torch's generator), so the job's own initialisation is untouched.
    plain = models.build(spec, {}, seed=0)
    plain.eval()
    val = Loader(TokenData(data, "val"), spec.seq_len, run["micro_batch"], rank, world, run["eval_seed"])
    val_batches = [val.batch(i) for i in range(run["eval_batches"])]

    job = app_run.Run(job_spec(arm, run, seed, data))
    # the job's own plan of hops (schemes, feedback per tier): proof that the arm compresses
    # what the protocol says; stock (no hierarchical runtime) has none
    plan = None if job.runtime is None else plan_lines(job.runtime.plan, job.runtime.topo)
    init_digest = state_digest(app_run.gathered_state(job.engine))
    assert job.loader is not None
    order = hashlib.sha256(repr([job.loader.sample_ids(i) for i in range(4)]).encode()).hexdigest()
    held_out: dict[int, float] = {}
    lrs: list[float] = []

    def on_row(row: dict) -> None:
        lrs.append(float(job.engine.get_lr()[0]))
        done = row["step"] + 1
        if done not in eval_at:
            return
        state = app_run.gathered_state(job.engine)  # collective: every rank at the same step
        total = 0.0
        with torch.no_grad():
            for p_name, p in plain.named_parameters():
                p.copy_(state[p_name])
            for x, y in val_batches:
                total += float(plain(x, y))
        t = torch.tensor([total], dtype=torch.float64)
        dist.all_reduce(t)
        held_out[done] = float(t) / (len(val_batches) * world)

    t0 = time.perf_counter()
    rows = job.train(run["steps"], on_row=on_row)
    seconds = time.perf_counter() - t0
    orders: list = [None] * world
    dist.all_gather_object(orders, order)
    job.release()
    return {
        "arm": name,
        "seed": seed,
        "losses": [r["loss"] for r in rows],
        "lr": lrs,
        "held_out": {str(k): v for k, v in sorted(held_out.items())},
        "init_sha256": init_digest,
        "order_sha256": hashlib.sha256("".join(orders).encode()).hexdigest(),
        "seconds": seconds,
        "params": job.n_params,
        "plan": plan,
    }
