"""The Hydra app's config groups and the launcher detection, without starting ranks."""

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from zeropp_hier.app.launch import launcher_env
from zeropp_hier.app.spec import MODELS, JobSpec
from zeropp_hier.app.train import spec_from_config
from zeropp_hier.launch.ports import job_port


def _compose(overrides=(), hydra_cfg=False):
    with initialize_config_module(version_base="1.3", config_module="zeropp_hier.app.configs"):
        return compose("train", overrides=list(overrides), return_hydra_config=hydra_cfg)


def test_defaults_are_the_readme_demo():
    spec = spec_from_config(OmegaConf.to_container(_compose(), resolve=True))
    assert spec.preset == "frontier" and spec.compression is None and spec.steps == 30
    assert spec.local_world == 8 and spec.topology == {"gpus_per_node": 2, "gcds_per_gpu": 2}
    assert spec.model == MODELS["tiny"] and spec.micro_batch == 4 and spec.data_path is None


def test_yaml_defaults_equal_the_typed_spec():
    """The one typed spec (JobSpec) holds the defaults; the Hydra YAML repeats them only because
    Hydra composes from files, and must agree field for field."""
    from dataclasses import fields

    spec = spec_from_config(OmegaConf.to_container(_compose(), resolve=True))
    assert spec == JobSpec(), {
        f.name: (getattr(spec, f.name), getattr(JobSpec(), f.name))
        for f in fields(JobSpec)
        if getattr(spec, f.name) != getattr(JobSpec(), f.name)
    }


def test_yaml_choices_are_the_spec_literals():
    from typing import get_args, get_type_hints

    from zeropp_hier.app import spec as job

    hints = get_type_hints(JobSpec)
    assert get_args(hints["preset"]) == job.PRESETS and get_args(hints["dtype"]) == job.DTYPES
    for preset in job.PRESETS:  # every preset of the spec has its config group option
        assert spec_from_config(OmegaConf.to_container(_compose([f"preset={preset}"]), resolve=True)).preset == preset


def test_groups_select_preset_compression_and_auto_topology():
    cfg = _compose(["preset=zeropp", "compression=hybrid", "topology=auto_sim", "model=small"])
    spec = spec_from_config(OmegaConf.to_container(cfg, resolve=True))
    assert spec.preset == "zeropp" and spec.compression["gradients"] == {"gpu": "int4", "node": "int4"}
    assert spec.topology == {"mode": "auto", "gpus_per_node": 2, "gcds_per_gpu": 2}
    assert spec.model == MODELS["small"]


def test_token_data_needs_its_path(tmp_path):
    cfg = OmegaConf.to_container(_compose(["data=tokens"]), resolve=True)
    with pytest.raises(ValueError, match="'data.path'"):
        spec_from_config(cfg)
    cfg = OmegaConf.to_container(_compose(["data=tokens", f"data.path={tmp_path}", "activation_checkpointing=torch"]))
    spec = spec_from_config(cfg)
    assert spec.data_path == str(tmp_path) and spec.activation_checkpointing == "torch"


def test_unknown_data_kind_names_the_field():
    cfg = OmegaConf.to_container(_compose(["data.kind=parquet"]), resolve=True)
    with pytest.raises(ValueError, match="'data.kind': got 'parquet'"):
        spec_from_config(cfg)


def test_unknown_group_option_is_refused_with_the_choices():
    with pytest.raises(ConfigCompositionException, match="zero4") as e:
        _compose(["preset=zero4"])
    assert "frontier" in str(e.value.__cause__ or e.value)  # Hydra lists the available options


def test_frontier_submitit_launcher_follows_olcf_task_layout():
    cfg = _compose(["launcher=frontier_submitit"], hydra_cfg=True)
    lc = cfg.hydra.launcher
    assert lc._target_.endswith("SlurmLauncher")
    assert (lc.tasks_per_node, lc.cpus_per_task, lc.gpus_per_task) == (8, 7, 1)
    assert lc.additional_parameters["gpu-bind"] == "closest"
    assert lc.additional_parameters["network"] == "disable_rdzv_get"  # with env.sh's FI_CXI_RDZV_PROTO


def test_srun_launcher_names_the_run_dir_after_the_job(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    cfg = _compose(["launcher=srun"], hydra_cfg=True)
    assert cfg.hydra.run.dir == "outputs/slurm-4242.3"


SRUN = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_NNODES": "2",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_NODELIST": "cn[07-08]",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_ID": "123456",
}


def test_launcher_env_under_srun():
    env = launcher_env(SRUN, gpus_visible=0)
    assert env == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_SIZE": "4",
        "MASTER_ADDR": "cn07",
        "MASTER_PORT": str(job_port(123456)),  # below the ephemeral range
    }
    # --gpus-per-task=1: the one visible GCD is device 0 for DeepSpeed, whatever the local id
    assert launcher_env(SRUN, gpus_visible=1)["LOCAL_RANK"] == "0"
    assert launcher_env({**SRUN, "MASTER_ADDR": "x"}, 0).get("MASTER_ADDR") is None


def test_launcher_env_elsewhere():
    assert launcher_env({"RANK": "0", "WORLD_SIZE": "2"}, 0) == {}  # torchrun set everything
    assert launcher_env({}, 0) is None  # no launcher: spawn our own ranks
    batch = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"}
    assert launcher_env(batch, 0) is None  # the batch script itself is not one of the ranks


def test_job_spec_check_names_the_field():
    with pytest.raises(ValueError, match="'steps': got 0"):
        JobSpec(steps=0).check()
