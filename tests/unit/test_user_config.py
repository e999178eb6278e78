"""The user's DeepSpeed keys (app/user_config.py): DeepSpeed's own example configs and GPT-NeoX-20B's
DeepSpeed section (tests/data/deepspeed_configs/, sources in its README) merged into the job's
config, and each key the job owns refused, naming the field, their value, ours and the fix."""

import json
from pathlib import Path

import pytest

from zeropp_hier.app import launch
from zeropp_hier.app.spec import JobSpec
from zeropp_hier.app.train import spec_from_overrides
from zeropp_hier.app.user_config import deep_merge, merge_user
from zeropp_hier.core.errors import HierConfigError

DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed_configs"
ZERO3 = str(DATA / "ds_zero3_example.json")  # DeepSpeed's ZeRO-3 example: micro-batch 1, bf16
ZERO0 = str(DATA / "ds_zero0_example.json")  # DeepSpeed's stage-0 example
NEOX20B = str(DATA / "neox_20b_deepspeed.json")  # GPT-NeoX-20B: ZeRO-1, micro 4 x 32, fp16


def _compose(overrides):
    return spec_from_overrides(overrides)


def _refusal(spec, world=4) -> HierConfigError:
    with pytest.raises(HierConfigError) as e:
        spec.ds_config(world=world)
    return e.value


def test_deepspeed_zero3_example_merges_when_the_job_agrees():
    spec = JobSpec(micro_batch=1, dtype="bf16", deepspeed_config=ZERO3)
    cfg = spec.ds_config(world=4)
    user = json.loads(Path(ZERO3).read_text())
    # every key of theirs is in the config the job builds, with their value ("_source", the
    # fixture's note of its origin, is dropped as every "_" key is)
    assert "_source" not in cfg
    for key, value in ((k, v) for k, v in user.items() if not k.startswith("_")):
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, dict):
                    assert cfg[key][k] == {**cfg[key][k], **v}
                else:
                    assert cfg[key][k] == v, (key, k)
        else:
            assert cfg[key] == value, key
    # their optimizer and scheduler are theirs whole, as DeepSpeed reads them (no torch_adam of ours)
    assert cfg["optimizer"] == user["optimizer"] and cfg["scheduler"] == user["scheduler"]
    # and the job's own keys they do not name are kept
    assert cfg["zeropp_hier"]["preset"] == "frontier" and cfg["zero_optimization"]["stage"] == 3
    assert cfg["zero_allow_untested_optimizer"] is True


def test_deepspeed_zero3_example_refused_on_the_demo_micro_batch():
    err = _refusal(JobSpec(dtype="bf16", deepspeed_config=ZERO3))
    assert err.field == "deepspeed.train_micro_batch_size_per_gpu" and err.value == 1
    msg = str(err)
    assert "the job's value is 4" in msg and "data.micro_batch=1" in msg and ZERO3 in msg


def test_deepspeed_zero3_example_refused_on_dtype():
    err = _refusal(JobSpec(micro_batch=1, deepspeed_config=ZERO3))  # the demo trains fp32
    assert err.field == "deepspeed.bf16.enabled" and "dtype=fp32" in str(err) and "dtype=" in err.fix


def test_a_zero_stage_other_than_3_is_refused():
    err = _refusal(JobSpec(dtype="bf16", deepspeed_config=ZERO0))
    assert err.field == "deepspeed.zero_optimization.stage" and err.value == 0
    assert "the job's value is 3" in str(err) and "preset=stock" in str(err)


def test_gpt_neox_20b_section_with_the_recipe():
    # 20B.yml's 4 x 32 were per rank of a 12-way data group: on 384 ranks the recipe's 1536
    # sequences are 4 x 1, so its accumulation is refused, naming both values and the fix
    spec = _compose(["recipe=neox20b", "model=neox_20b", f"deepspeed_config={NEOX20B}"])
    err = _refusal(spec, world=384)
    assert err.field == "deepspeed.gradient_accumulation_steps" and err.value == 32
    assert "the job's value is 1" in str(err) and "grad_accum=32" in err.fix and "global_batch" in err.fix
    user = json.loads(Path(NEOX20B).read_text())
    del user["gradient_accumulation_steps"]
    spec = _compose(["recipe=neox20b", "model=neox_20b"])
    with pytest.raises(HierConfigError) as e:
        merge_user(spec.ds_config(world=384), None, user, world=384)
    assert e.value.field == "deepspeed.zero_optimization.stage" and e.value.value == 1  # GPT-NeoX ran ZeRO-1
    # without the stage (the fix), its fp16 does not agree with the recipe's bf16 ...
    del user["zero_optimization"]["stage"]
    with pytest.raises(HierConfigError, match="'deepspeed.fp16.enabled'") as e:
        merge_user(spec.ds_config(world=384), None, user, world=384)
    assert "dtype=bf16" in str(e.value)
    # ... so with dtype=fp16 it merges: their buckets, clipping, loss scaling; our stage and section
    job = _compose(["recipe=neox20b", "model=neox_20b", "dtype=fp16"]).ds_config(world=384)
    cfg = merge_user(job, None, user, world=384)
    z = cfg["zero_optimization"]
    assert z["stage"] == 3 and z["reduce_bucket_size"] == 1260000000 and z["overlap_comm"] is True
    assert cfg["fp16"]["initial_scale_power"] == 12 and cfg["gradient_clipping"] == 1.0
    assert cfg["optimizer"]["params"]["lr"] == 0.97e-4 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["zeropp_hier"]["preset"] == "frontier"


def test_train_batch_size_must_be_micro_batch_times_accumulation_times_world():
    spec = JobSpec(micro_batch=2, grad_accum=3, deepspeed={"train_batch_size": 100})
    err = _refusal(spec, world=4)
    assert err.field == "deepspeed.train_batch_size" and err.value == 100 and "the job's value is 24" in str(err)
    assert (
        JobSpec(micro_batch=2, grad_accum=3, deepspeed={"train_batch_size": 24}).ds_config(world=4)["train_batch_size"]
        == 24
    )
    # "auto" (Hugging Face's configs) is the job's value, as HF's Trainer fills it; before the
    # ranks are known train_batch_size is left to DeepSpeed
    cfg = JobSpec(deepspeed={"train_batch_size": "auto", "gradient_accumulation_steps": "auto"}).ds_config(world=4)
    assert cfg["train_batch_size"] == 16 and cfg["gradient_accumulation_steps"] == 1
    assert "train_batch_size" not in JobSpec(deepspeed={"train_batch_size": "auto"}).ds_config()
    err = _refusal(JobSpec(deepspeed={"gradient_accumulation_steps": 8}))
    assert err.field == "deepspeed.gradient_accumulation_steps" and "grad_accum=8" in err.fix


def test_zeropp_hier_section_owned_keys_and_free_keys():
    err = _refusal(JobSpec(deepspeed={"zeropp_hier": {"preset": "zeropp"}}))
    assert err.field == "deepspeed.zeropp_hier.preset" and err.value == "zeropp" and "'frontier'" in str(err)
    assert "preset=" in err.fix
    err = _refusal(JobSpec(deepspeed={"zeropp_hier": {"compression": "int8"}}))
    assert err.field == "deepspeed.zeropp_hier.compression" and "compression=" in err.fix
    err = _refusal(JobSpec(deepspeed={"zeropp_hier": {"topology": {"gpus_per_node": 4, "gcds_per_gpu": 2}}}))
    assert err.field == "deepspeed.zeropp_hier.topology"
    err = _refusal(JobSpec(preset="stock", deepspeed={"zeropp_hier": {"preset": "frontier"}}))
    assert err.field == "deepspeed.zeropp_hier.preset" and "preset=stock" in err.fix
    # a key of the section the job does not set is theirs to set
    cfg = JobSpec(deepspeed={"zeropp_hier": {"numerics": {"residual_dtype": "bf16"}}}).ds_config(world=8)
    assert cfg["zeropp_hier"]["numerics"] == {"residual_dtype": "bf16"} and cfg["zeropp_hier"]["preset"] == "frontier"


def test_hydra_overrides_nested_keys_and_the_file(tmp_path):
    f = tmp_path / "mine.json"
    f.write_text(
        json.dumps({"_source": "a note", "wall_clock_breakdown": True, "zero_optimization": {"overlap_comm": True}})
    )
    spec = _compose(
        [
            f"deepspeed_config={f}",
            "+deepspeed.zero_optimization.stage3_max_live_parameters=1000",
            "+deepspeed.steps_per_print=5",
        ]
    )
    assert spec.deepspeed == {"zero_optimization": {"stage3_max_live_parameters": 1000}, "steps_per_print": 5}
    cfg = spec.ds_config(world=8)
    z = cfg["zero_optimization"]
    assert z["overlap_comm"] is True and z["stage3_max_live_parameters"] == 1000 and z["stage"] == 3
    assert z["stage3_prefetch_bucket_size"] == 0  # the demo's own key survives a nested merge
    assert cfg["wall_clock_breakdown"] is True and cfg["steps_per_print"] == 5 and "_source" not in cfg
    # the single keys go last: they win over the file
    spec = _compose([f"deepspeed_config={f}", "+deepspeed.wall_clock_breakdown=false"])
    assert spec.ds_config()["wall_clock_breakdown"] is False


def test_refused_before_any_rank_starts(monkeypatch, capsys):
    for key in ("RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    spec = JobSpec(local_world=8, micro_batch=2, deepspeed={"train_batch_size": 8})
    with pytest.raises(HierConfigError, match="the job's value is 16"):
        launch.memory_lines(spec, None, 0)  # the memory check's step, before LocalWorld
    assert "memory per rank" not in capsys.readouterr().out


def test_a_missing_or_malformed_file_names_itself(tmp_path):
    with pytest.raises(HierConfigError, match="'deepspeed_config'.*no such file"):
        JobSpec(deepspeed_config=str(tmp_path / "nope.json")).ds_config()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(HierConfigError, match="not JSON"):
        JobSpec(deepspeed_config=str(bad)).ds_config()
    bad.write_text("[1, 2]")
    with pytest.raises(HierConfigError, match="one JSON object"):
        JobSpec(deepspeed_config=str(bad)).ds_config()


def test_deep_merge_is_nested_and_leaves_its_inputs_alone():
    ours = {"a": {"b": 1, "c": {"d": 2}}, "e": [1]}
    theirs = {"a": {"c": {"f": 3}}, "e": [2], "g": 4}
    out = deep_merge(ours, theirs)
    assert out == {"a": {"b": 1, "c": {"d": 2, "f": 3}}, "e": [2], "g": 4}
    assert ours == {"a": {"b": 1, "c": {"d": 2}}, "e": [1]}
