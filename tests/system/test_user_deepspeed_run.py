"""The main job with a user's DeepSpeed JSON, end to end: ``zeropp-hier train`` (the Hydra app, as
a user types it) on 4 CPU ranks (topology=sim_1x2x2) with DeepSpeed's ZeRO-3 example config
(tests/data/deepspeed_configs/ds_zero3_example.json) and one ``+deepspeed.`` key trains the tiny
model for 4 steps, and the DeepSpeed config it ran is written beside the metrics and named."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from zeropp_hier.app.spec import JobSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "data" / "deepspeed_configs" / "ds_zero3_example.json"


def test_the_job_trains_with_deepspeeds_zero3_example(tmp_path):
    user = json.loads(EXAMPLE.read_text())
    # a key added to DeepSpeed after the installed 0.19 (whose config refuses unknown keys)
    del user["zero_optimization"]["sdma_allgather"]
    path = tmp_path / "user.json"
    path.write_text(json.dumps(user))
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "zeropp_hier.app.train",
        "topology=sim_1x2x2",
        "steps=4",
        "progress=off",
        # the example's micro-batch (1) and bf16 are keys the job owns: the command line agrees with them
        "data.micro_batch=1",
        "dtype=bf16",
        f"deepspeed_config={path}",
        # their WarmupLR, shortened so that 4 steps learn: lr 0 for two steps (DeepSpeed's warm-up
        # starts at warmup_min_lr and moves after each step), then 1e-2
        "+deepspeed.scheduler.params.warmup_max_lr=1e-2",
        "+deepspeed.scheduler.params.warmup_num_steps=2",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"DeepSpeed config: {run_dir / 'ds_config.json'}" in p.stdout
    ran = json.loads((run_dir / "ds_config.json").read_text())
    # what ran is the job's config with the user's merged in, as JobSpec builds it without ranks
    spec = JobSpec(
        micro_batch=1,
        dtype="bf16",
        steps=4,
        topology={"gpus_per_node": 2, "gcds_per_gpu": 2},
        local_world=4,
        deepspeed_config=str(path),
        deepspeed={"scheduler": {"params": {"warmup_max_lr": 1e-2, "warmup_num_steps": 2}}},
    )
    assert ran == spec.ds_config(world=4)
    assert ran["optimizer"]["type"] == "AdamW" and ran["zero_optimization"]["overlap_comm"] is True
    assert ran["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 1e-2, "warmup_num_steps": 2}
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows]
    print("losses:", losses)
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and all(math.isfinite(x) for x in losses)
    assert not any(r["skipped"] for r in rows)
    assert losses[3] < min(losses[:3])  # the one step with lr 1e-2 learned (seeded: same batches every run)


def _train(tmp_path, *overrides, name="run"):
    run_dir = tmp_path / name
    cmd = [sys.executable, "-m", "zeropp_hier.app.train", "progress=off", *overrides, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ran = json.loads((run_dir / "ds_config.json").read_text())
    losses = [json.loads(ln)["loss"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return p, ran, losses


def test_a_users_scheduler_replaces_the_recipes(tmp_path):
    """The issue's case: recipe=neox20b (WarmupCosineLR) with DeepSpeed's example, whose scheduler is
    WarmupLR: merged key by key every rank failed in WarmupLR.__init__ (total_num_steps); read as
    DeepSpeed reads it, the job trains with the user's scheduler and optimizer whole."""
    user = json.loads(EXAMPLE.read_text())
    del user["zero_optimization"]["sdma_allgather"]  # newer than the installed DeepSpeed 0.19
    path = tmp_path / "user.json"
    path.write_text(json.dumps(user))
    p, ran, losses = _train(
        tmp_path,
        "recipe=neox20b",
        "model=tiny",
        "global_batch=null",
        "activation_checkpointing=none",
        "topology=sim_1x2x2",
        "steps=3",
        "data.micro_batch=1",
        f"deepspeed_config={path}",
    )
    assert ran["scheduler"] == user["scheduler"] and ran["optimizer"] == user["optimizer"]
    assert "scheduler 'WarmupLR' replaces the job's 'WarmupCosineLR' whole" in p.stdout
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)


def test_hf_zero3_config_with_its_autos_runs_in_the_job(tmp_path):
    """Hugging Face's ds_config_zero3.json (every Trainer key "auto", optimizer and parameter
    offload to the CPU) under DeepSpeed's own ZeRO-3 (preset=stock: our presets refuse parameter
    offload, tests/unit/test_hf_deepspeed_json.py)."""
    hf = ROOT / "tests" / "data" / "deepspeed_configs" / "hf_ds_config_zero3.json"
    p, ran, losses = _train(
        tmp_path, "preset=stock", "dtype=bf16", "topology=sim_1x2x2", "steps=3", f"deepspeed_config={hf}"
    )
    assert "auto" not in json.dumps(ran) and ran["train_batch_size"] == 4 * 4
    spec = JobSpec(preset="stock", dtype="bf16", steps=3, local_world=4, deepspeed_config=str(hf))
    assert ran["optimizer"]["params"] == {
        "lr": spec.lr,
        "betas": list(spec.betas),
        "eps": spec.eps,
        "weight_decay": 0.01,
    }
    assert ran["zero_optimization"]["reduce_bucket_size"] == spec.model.hidden**2
    assert "'auto' filled from the job" in p.stdout
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)


def test_the_repositorys_frontier_config_runs_in_the_job(tmp_path):
    """configs/frontier_bf16.json, with the options it names (its dtype, accumulation and auto
    topology), on 8 CPU ranks: detected as 1 node x 4 x 2, as the file declares."""
    path = ROOT / "configs" / "frontier_bf16.json"
    p, ran, losses = _train(
        tmp_path, "dtype=bf16", "grad_accum=8", "topology=auto", "steps=2", f"deepspeed_config={path}"
    )
    user = json.loads(path.read_text())
    assert ran["zeropp_hier"]["topology"] == user["zeropp_hier"]["topology"]
    assert ran["scheduler"] == user["scheduler"] and ran["gradient_accumulation_steps"] == 8
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
