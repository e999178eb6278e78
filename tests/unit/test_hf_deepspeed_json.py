"""A user's DeepSpeed JSON read as DeepSpeed and Hugging Face read it (app/user_config.py,
[Note: a user's DeepSpeed JSON]): optimizer and scheduler replaced whole, "auto" filled where HF's
Trainer fills it, the repository's own configs/*.json accepted under the options they name, and
every refusal naming the key, both values and the fix, as one line from the command. Fixtures:
tests/data/deepspeed_configs/ (sources in its README). The jobs themselves run in
tests/system/test_user_deepspeed_run.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zeropp_hier.app.spec import JobSpec, ModelSpec
from zeropp_hier.app.train import spec_from_overrides
from zeropp_hier.app.user_config import AUTO_KEYS, deep_merge
from zeropp_hier.core.config import hier_config_from_ds
from zeropp_hier.core.errors import HierConfigError

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "deepspeed_configs"
HF_ZERO3 = str(DATA / "hf_ds_config_zero3.json")  # HF's ZeRO-3 config, every Trainer key "auto"
DS_ZERO3 = str(DATA / "ds_zero3_example.json")  # DeepSpeed's ZeRO-3 example: AdamW, WarmupLR, bf16, micro 1


def _opt():
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)


def test_a_users_scheduler_replaces_the_recipes_whole():
    """The issue's case: recipe=neox20b (WarmupCosineLR) with a file whose scheduler is WarmupLR."""
    from deepspeed.runtime.lr_schedules import WarmupLR

    spec = spec_from_overrides(
        ["recipe=neox20b", "model=tiny", "global_batch=null", "data.micro_batch=1", f"deepspeed_config={DS_ZERO3}"]
    )
    user = json.loads(Path(DS_ZERO3).read_text())
    cfg = spec.ds_config(world=4)
    assert cfg["scheduler"] == user["scheduler"] and cfg["optimizer"] == user["optimizer"]
    WarmupLR(_opt(), **cfg["scheduler"]["params"])  # DeepSpeed's own class takes them
    # merged key by key (before) the recipe's cosine parameters reached it: every rank's TypeError
    recipe = spec_from_overrides(["recipe=neox20b", "model=tiny"]).ds_config()["scheduler"]
    with pytest.raises(TypeError, match="total_num_steps"):
        WarmupLR(_opt(), **deep_merge(recipe, user["scheduler"])["params"])
    # the recipe's sections stay where the user gives none
    spec = spec_from_overrides(
        ["recipe=neox20b", "model=tiny", "global_batch=null", "+deepspeed.wall_clock_breakdown=true"]
    )
    assert spec.ds_config()["scheduler"]["type"] == "WarmupCosineLR"


def test_single_keys_merge_into_a_section_unless_they_change_its_type():
    spec = spec_from_overrides(["recipe=neox20b", "model=tiny", "+deepspeed.scheduler.params.cos_min_ratio=0.05"])
    sched = spec.ds_config()["scheduler"]
    assert sched["type"] == "WarmupCosineLR" and sched["params"]["cos_min_ratio"] == 0.05
    assert sched["params"]["total_num_steps"] == spec.steps  # the recipe's other parameters stay
    spec = spec_from_overrides(
        [
            "recipe=neox20b",
            "model=tiny",
            "+deepspeed.scheduler.type=WarmupLR",
            "+deepspeed.scheduler.params.warmup_num_steps=3",
        ]
    )
    assert spec.ds_config()["scheduler"] == {"type": "WarmupLR", "params": {"warmup_num_steps": 3}}


def test_auto_is_filled_where_hf_fills_it_from_the_jobs_values():
    spec = JobSpec(
        dtype="bf16",
        micro_batch=2,
        grad_accum=3,
        lr=2e-4,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=0.1,
        clip=1.0,
        warmup_steps=5,
        steps=100,
        model=ModelSpec(hidden=64),
        deepspeed={
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto",
            "gradient_clipping": "auto",
            "optimizer": {"type": "AdamW", "params": {k: "auto" for k in ("lr", "betas", "eps", "weight_decay")}},
            "scheduler": {
                "type": "WarmupDecayLR",
                "params": {
                    k: "auto" for k in ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "total_num_steps")
                },
            },
            "fp16": {"enabled": "auto"},
            "bf16": {"enabled": "auto"},
            "zero_optimization": {
                k: "auto"
                for k in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
            },
        },
    )
    notes: list[str] = []
    cfg = spec.ds_config(world=4, notes=notes)
    got = {}
    for key in AUTO_KEYS:
        node = cfg
        for part in key.split("."):
            node = node[part]
        got[key] = node
    # HF's trainer_config_process / trainer_config_finalize, with the job's values as its arguments
    assert got == {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 3,
        "train_batch_size": 24,
        "gradient_clipping": 1.0,
        "optimizer.params.lr": 2e-4,
        "optimizer.params.betas": [0.9, 0.95],
        "optimizer.params.eps": 1e-8,
        "optimizer.params.weight_decay": 0.1,
        "scheduler.params.warmup_min_lr": 0.0,
        "scheduler.params.warmup_max_lr": 2e-4,
        "scheduler.params.warmup_num_steps": 5,
        "scheduler.params.total_num_steps": 100,
        "fp16.enabled": False,
        "bf16.enabled": True,
        "zero_optimization.reduce_bucket_size": 64 * 64,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * 64 * 64),
        "zero_optimization.stage3_param_persistence_threshold": 640,
    }
    assert "auto" not in json.dumps(cfg)
    assert any("'auto' filled from the job" in n and "optimizer.params.lr=0.0002" in n for n in notes), notes
    assert any("scheduler 'WarmupDecayLR' replaces the job's 'WarmupLR' whole" in n for n in notes), notes


def test_hf_zero3_config_runs_under_stock_zero3_and_is_refused_by_the_presets_with_the_fix():
    """HF's ds_config_zero3.json: every "auto" filled; DeepSpeed's own (strict) config accepts
    the result with preset=stock; our presets refuse its parameter offload, naming the key, both
    values and the fix."""
    from deepspeed.runtime.config import DeepSpeedConfig

    spec = JobSpec(preset="stock", dtype="bf16", micro_batch=1, deepspeed_config=HF_ZERO3)
    cfg = spec.ds_config(world=1)
    assert "auto" not in json.dumps(cfg) and cfg["optimizer"]["type"] == "AdamW"
    assert cfg["bf16"] == {"enabled": True} and cfg["fp16"]["enabled"] is False
    ds = DeepSpeedConfig(cfg)
    assert ds.zero_config.stage == 3 and ds.train_batch_size == 1
    with pytest.raises(HierConfigError) as e:
        hier_config_from_ds(JobSpec(dtype="bf16", deepspeed_config=HF_ZERO3).ds_config(world=8))
    err = e.value
    assert err.field == "zero_optimization.offload_param.device" and err.value == "cpu"
    assert "'none'" in err.fix and "remove offload_param" in err.fix and "preset=stock" in err.fix


def _refusals():
    """(JobSpec, the key, theirs, ours) for each key the job owns; the last two are hand-written
    refusal cases (an "auto" HF's Trainer does not fill; a section key)."""
    return [
        (JobSpec(deepspeed={"train_micro_batch_size_per_gpu": 1}), "deepspeed.train_micro_batch_size_per_gpu", 1, 4),
        (JobSpec(deepspeed={"gradient_accumulation_steps": 8}), "deepspeed.gradient_accumulation_steps", 8, 1),
        (JobSpec(deepspeed={"train_batch_size": 100}), "deepspeed.train_batch_size", 100, 16),
        (JobSpec(deepspeed={"zero_optimization": {"stage": 2}}), "deepspeed.zero_optimization.stage", 2, 3),
        (JobSpec(deepspeed={"bf16": {"enabled": True}}), "deepspeed.bf16.enabled", True, False),
        (JobSpec(dtype="bf16", deepspeed={"fp16": {"enabled": True}}), "deepspeed.fp16.enabled", True, False),
        (
            JobSpec(deepspeed={"zeropp_hier": {"preset": "zeropp"}}),
            "deepspeed.zeropp_hier.preset",
            "zeropp",
            "frontier",
        ),
        (
            JobSpec(deepspeed={"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": "auto"}}),
            "deepspeed.zero_optimization.stage3_gather_16bit_weights_on_model_save",
            "auto",
            None,
        ),
    ]


@pytest.mark.parametrize("spec, key, theirs, ours", _refusals(), ids=[r[1] for r in _refusals()])
def test_every_refusal_names_the_key_both_values_and_the_fix(spec, key, theirs, ours):
    with pytest.raises(HierConfigError) as e:
        spec.ds_config(world=4)
    msg = str(e.value)
    assert e.value.field == key and e.value.value == theirs and "\n" not in msg
    assert f"at '{key}': got {theirs!r}" in msg
    assert (f"the job's value is {ours!r}" if ours is not None else "the job has no value for it") in msg
    fix = msg.split(": ")[-1]
    assert any(w in fix for w in ("set ", "drop ", "give ", "choose ")), msg


# The repository's own DeepSpeed configs and the job options under which the job runs them (its
# batch, dtype and section come from these options; the files are for zeropp_hier.initialize in
# a training script of one's own, docs/usage.md#your-deepspeed-json)
REPO_CONFIGS = {
    "cpu_sim_2x2x2.json": ["data.micro_batch=2"],
    "frontier_bf16.json": ["dtype=bf16", "grad_accum=8", "topology=auto"],
    "zeropp_baseline_bf16.json": ["dtype=bf16", "grad_accum=8", "preset=zeropp", "topology=frontier"],
    "zero3_stock_bf16.json": ["dtype=bf16", "grad_accum=8", "preset=stock"],
}


@pytest.mark.parametrize("name", sorted(REPO_CONFIGS))
def test_the_repositorys_configs_run_in_the_job_under_the_options_they_name(name):
    from deepspeed.runtime.config import DeepSpeedConfig

    path = ROOT / "configs" / name
    assert {p.name for p in (ROOT / "configs").glob("*.json")} == set(REPO_CONFIGS)  # none left unchecked
    user = json.loads(path.read_text())
    cfg = spec_from_overrides([*REPO_CONFIGS[name], f"deepspeed_config={path}"]).ds_config(world=8)
    for key, value in user.items():
        if key not in ("zeropp_hier", "zero_optimization"):
            assert cfg[key] == value, key
    hier_config_from_ds(cfg)
    DeepSpeedConfig({k: v for k, v in cfg.items() if k not in ("zeropp_hier", "train_batch_size")})
    # without those options the job says which to set
    with pytest.raises(HierConfigError) as e:
        spec_from_overrides([f"deepspeed_config={path}"]).ds_config(world=8)
    assert "on the command line" in str(e.value) or "option" in str(e.value)


def test_a_refusal_reaches_the_user_as_one_line_without_a_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "zeropp_hier.app.train", "dtype=bf16", f"deepspeed_config={HF_ZERO3}"]
    p = subprocess.run(
        [*cmd, f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    err = [ln for ln in p.stderr.splitlines() if "zeropp_hier config error" in ln]
    assert err == [
        "zeropp_hier config error at 'zero_optimization.offload_param.device': got 'cpu'; "
        + err[0].split("got 'cpu'; ")[1]
    ], p.stderr
    assert "Traceback" not in p.stderr and "HYDRA_FULL_ERROR" not in p.stderr, p.stderr[-2000:]
    assert "starting" not in p.stdout  # before any rank
