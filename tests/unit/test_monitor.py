"""The pure parts of the job's monitoring and evaluation settings (app/monitoring/monitor.py): the ETA, the
scalar names, DeepSpeed's monitor sections (parsed by DeepSpeed's own config model), the checks
of the settings and the Hydra keys that set them."""

import importlib.util
import math
import re

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from zeropp_hier.app import report
from zeropp_hier.app.monitoring import monitor
from zeropp_hier.app.monitoring.monitor import MonitorSpec
from zeropp_hier.app.spec import JobSpec, ModelSpec
from zeropp_hier.app.train import spec_from_config
from zeropp_hier.core.vocab import TIERS

PHASES = ("forward_gather", "backward_gather", "grad_reduce", "other_gather")


def _row(**kw):
    row = {
        "step": 4,
        "loss": 2.5,
        "tokens_per_s": 1000.0,
        "seconds": 0.5,
        "tflops_per_gcd": 1.5,
        "mfu": 0.25,
        "peak_memory_bytes": 123,
        "bytes": {t: 10 for t in TIERS},
        "skipped": False,
        "lr": 1e-4,
        "grad_norm": 0.75,
        "bytes_by_phase": {p: {t: i for i, t in enumerate(TIERS)} for p in PHASES},
        "eta_s": 125.0,
    }
    row.update(kw)
    return row


def test_eta_is_steps_left_times_the_mean_step_so_far():
    assert monitor.eta_seconds(6.0, 3, 10) == pytest.approx(20.0)
    assert monitor.eta_seconds(6.0, 3, 0) == 0.0
    assert monitor.eta_seconds(0.0, 0, 10) == 0.0  # nothing measured yet
    assert [monitor.fmt_duration(s) for s in (0, 42.4, 184, 7500, 3 * 86400 + 4 * 3600)] == [
        "0s",
        "42s",
        "3m04s",
        "2h05m",
        "3d04h",
    ]
    assert monitor.fmt_duration(math.inf) == "?"


def test_due_every_n_steps_and_never_for_zero():
    assert [d for d in range(1, 8) if monitor.due(d, 3)] == [3, 6]
    assert [d for d in range(1, 4) if monitor.due(d, 1)] == [1, 2, 3]
    assert not any(monitor.due(d, 0) for d in range(1, 10))


def test_scalars_name_every_metric_and_each_phase_and_tier():
    names = dict(monitor.scalars(_row(val_loss=2.75)))
    expected = {
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "val/loss",
        "perf/tokens_per_s",
        "perf/tflops_per_gcd",
        "perf/mfu",
        "memory/peak_bytes",
    } | {f"bytes/{p}/{t}" for p in PHASES for t in TIERS}
    assert set(names) == expected
    assert names["train/lr"] == 1e-4 and names["val/loss"] == 2.75 and names["bytes/grad_reduce/node"] == 2.0
    assert all(isinstance(v, float) for v in names.values())


def test_scalars_leave_out_what_the_row_does_not_have():
    names = dict(monitor.scalars(_row(mfu=None, grad_norm=None, bytes_by_phase=None)))
    assert "perf/mfu" not in names and "train/grad_norm" not in names and "val/loss" not in names
    assert not any(n.startswith("bytes/") for n in names)


def test_ds_sections_are_deepspeeds_and_write_under_the_run_directory(tmp_path):
    from deepspeed.monitor.config import get_monitor_config

    out = str(tmp_path)
    assert monitor.ds_sections(MonitorSpec(), out) == {}
    sections = monitor.ds_sections(MonitorSpec(tensorboard=True, csv=True, wandb=True), out)
    assert set(sections) == {"tensorboard", "csv_monitor", "wandb"}
    parsed = get_monitor_config(sections)  # DeepSpeed's own config model reads them
    assert parsed.enabled and parsed.tensorboard.enabled and parsed.csv_monitor.enabled and parsed.wandb.enabled
    assert (parsed.tensorboard.output_path, parsed.tensorboard.job_name) == (out, "tensorboard")
    assert (parsed.csv_monitor.output_path, parsed.csv_monitor.job_name) == (out, "csv_monitor")
    assert parsed.wandb.project == monitor.WANDB_PROJECT


def test_the_jobs_config_carries_the_sections_and_only_when_asked(tmp_path):
    assert not {"tensorboard", "csv_monitor", "wandb"} & set(JobSpec().ds_config())
    cfg = JobSpec(out_dir=str(tmp_path), monitor=MonitorSpec(csv=True)).ds_config()
    assert cfg["csv_monitor"] == {"enabled": True, "output_path": str(tmp_path), "job_name": "csv_monitor"}
    # the user's own keys (deepspeed_config / +deepspeed.KEY=value) merge over the job's section
    spec = JobSpec(
        out_dir=str(tmp_path), monitor=MonitorSpec(csv=True), deepspeed={"csv_monitor": {"job_name": "mine"}}
    )
    assert spec.ds_config()["csv_monitor"] == {"enabled": True, "output_path": str(tmp_path), "job_name": "mine"}


def test_wandb_runs_offline_in_the_run_directory_unless_the_user_chose(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_ERROR_REPORTING", raising=False)
    assert monitor.wandb_env(MonitorSpec(), str(tmp_path)) == {}
    assert monitor.wandb_env(MonitorSpec(wandb=True), str(tmp_path)) == {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_ERROR_REPORTING": "false",  # offline: nothing over the network, crash reports included
    }
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "true")
    assert monitor.wandb_env(MonitorSpec(wandb=True), str(tmp_path))["WANDB_ERROR_REPORTING"] == "true"
    monkeypatch.setenv("WANDB_MODE", "online")
    assert monitor.wandb_env(MonitorSpec(wandb=True), str(tmp_path)) == {
        "WANDB_MODE": "online",
        "WANDB_DIR": str(tmp_path),
    }


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_monitor_whose_package_is_missing_is_refused_naming_it(name, tmp_path):
    spec = JobSpec(out_dir=str(tmp_path), monitor=MonitorSpec(**{name: True}))
    if importlib.util.find_spec(name) is not None:
        spec.check()  # installed here: accepted
        return
    with pytest.raises(ValueError, match=rf"'monitor.{name}'.*pip install {name}.*monitor.csv=true"):
        spec.check()


def test_bad_monitoring_settings_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="'monitor.csv'.*set out_dir"):
        JobSpec(monitor=MonitorSpec(csv=True)).check()
    with pytest.raises(ValueError, match="'log_every': got 0"):
        JobSpec(log_every=0).check()
    with pytest.raises(ValueError, match="'eval_every': got 5.*data=tokens data.path=DIR, or eval_every=0"):
        JobSpec(eval_every=5).check()
    with pytest.raises(ValueError, match="'eval_every': got -1"):
        JobSpec(eval_every=-1, data_path=str(tmp_path)).check()
    with pytest.raises(ValueError, match="'eval_batches': got 0"):
        JobSpec(eval_batches=0, data_path=str(tmp_path)).check()
    with pytest.raises(ValueError, match="'monitor.csv': got 'yes'"):
        JobSpec(out_dir=str(tmp_path), monitor=MonitorSpec(csv="yes")).check()  # type: ignore[arg-type]
    JobSpec(out_dir=str(tmp_path), monitor=MonitorSpec(csv=True), eval_every=2, data_path=str(tmp_path)).check()


def test_hydra_keys_set_the_monitoring_fields():
    with initialize_config_module(version_base="1.3", config_module="zeropp_hier.app.configs"):
        cfg = compose(
            "train",
            overrides=[
                "monitor.csv=true",
                "monitor.tensorboard=true",
                "log_every=10",
                "eval_every=50",
                "eval_batches=8",
                "data=tokens",
                "data.path=/tmp/x",
            ],
        )
    spec = spec_from_config(OmegaConf.to_container(cfg, resolve=True))
    assert spec.monitor == MonitorSpec(csv=True, tensorboard=True)
    assert (spec.log_every, spec.eval_every, spec.eval_batches) == (10, 50, 8)


def test_the_step_line_shows_lr_grad_norm_val_loss_and_eta():
    line = report.step_line(_row(val_loss=2.75), hier=True, device_name=None)
    assert line.endswith("| lr 0.0001 | grad norm 0.75 | val loss 2.7500 | ETA 2m05s"), line
    # the head as it always read (tests/system/test_slurm.py parses it)
    assert re.match(r"step +4 \| loss 2.5000 \| +1000 tok/s \| [\d.e+-]+ TFLOP/s/GCD [^|]*\| sent/rank node", line)
    line = report.step_line(_row(grad_norm=None), hier=False, device_name=None)
    assert "grad norm n/a" in line and "val loss" not in line


def _texts(tmp_path, sizes):
    files = []
    for i, n in enumerate(sizes):
        f = tmp_path / f"doc{i:02d}.txt"
        f.write_text("".join(chr(97 + (i + j) % 26) for j in range(n)))
        files.append(f)
    return files


def test_val_batches_are_sharded_over_ranks_and_the_same_at_every_evaluation(tmp_path):
    from zeropp_hier.app.data import tokens as data
    from zeropp_hier.app.monitoring import evaluate

    data.prepare(_texts(tmp_path, [4000] + [500] * 19), str(tmp_path / "d"))  # file 0 is the val split
    spec = JobSpec(data_path=str(tmp_path / "d"), eval_every=1, micro_batch=2, model=ModelSpec(seq_len=32))
    assert evaluate.val_loader(JobSpec(data_path=str(tmp_path / "d")), 0, 4) is None  # eval_every=0
    loaders = [evaluate.val_loader(spec, r, 4) for r in range(4)]
    assert all(ld is not None and ld.data.count == 4001 for ld in loaders)  # the val document + its newline
    ids = [i for ld in loaders for b in range(3) for i in ld.sample_ids(b)]  # 3 batches x 4 ranks x 2
    assert len(set(ids)) == len(ids) == 24  # of 125 samples: no two ranks read the same one
    x, y = loaders[1].batch(2)
    x2, _ = evaluate.val_loader(spec, 1, 4).batch(2)
    assert x.shape == (2, 32) and (x == x2).all() and (x[:, 1:] == y[:, :-1]).all()


def test_a_val_split_too_small_for_one_sample_is_refused_naming_eval_every(tmp_path):
    from zeropp_hier.app.data import tokens as data
    from zeropp_hier.app.monitoring import evaluate

    data.prepare(_texts(tmp_path, [10] + [500] * 19), str(tmp_path / "d"))
    spec = JobSpec(data_path=str(tmp_path / "d"), eval_every=5, model=ModelSpec(seq_len=32))
    with pytest.raises(ValueError, match=r"'eval_every': got 5; the val split .* has 11 tokens.*eval_every=0"):
        evaluate.val_loader(spec, 0, 4)
