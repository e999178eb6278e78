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
