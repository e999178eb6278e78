"""One run in the monitor across a chain's jobs (app/monitoring/monitor_run.py), its pure parts and file
operations: which directory and wandb id a job takes, how the run's metrics.jsonl and csv files
are cut back to the resumed step, and the wandb environment that resumes the run by its id. The
jobs themselves: tests/dist/test_monitor_chain.py."""

import csv
import json
import re
from pathlib import Path

from zeropp_hier.app.monitoring import monitor, monitor_run
from zeropp_hier.app.monitoring.monitor import MonitorSpec
from zeropp_hier.app.monitoring.monitor_run import MonitorRun


def test_a_fresh_job_writes_in_its_own_directory_with_a_new_wandb_id(tmp_path):
    run, line = monitor_run.choose(str(tmp_path / "a"), None, 0, "abc12345")
    assert run == MonitorRun(str(tmp_path / "a"), "abc12345", 0) and line == ""
    assert run.state() == {"dir": str(tmp_path / "a"), "wandb_id": "abc12345"}
    ids = {monitor_run.new_wandb_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"[a-z0-9]{8}", i) for i in ids)


def test_a_resumed_job_continues_the_saved_directory_and_id_or_says_it_is_gone(tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    saved = {"dir": str(first), "wandb_id": "runid001"}
    run, line = monitor_run.choose(str(tmp_path / "second"), saved, 7, "fresh000")
    assert (run.dir, run.wandb_id, run.start, run.continued) == (str(first), "runid001", 7, True)
    assert str(first) in line and "runid001" in line
    # moved away: this job's own directory, the same wandb run
    gone = {"dir": str(tmp_path / "moved"), "wandb_id": "runid001"}
    run, line = monitor_run.choose(str(tmp_path / "second"), gone, 7, "fresh000")
    assert (run.dir, run.wandb_id, run.continued) == (str(tmp_path / "second"), "runid001", False)
    assert "is gone" in line and str(tmp_path / "moved") in line
    # a job without a run directory writes none, whatever the checkpoint says
    assert monitor_run.choose(None, saved, 7, "fresh000")[0].dir is None


def _write_rows(path, steps):
    path.write_text("".join(json.dumps({"step": s, "loss": float(s)}) + "\n" for s in steps))


def test_the_metrics_file_keeps_the_rows_below_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write_rows(path, range(6))
    with open(path, "a") as f:
        f.write('{"step": 6, "lo')  # a row cut by the kill
    run = monitor_run.continue_metrics(MonitorRun(str(tmp_path), "x", 4, continued=True))
    assert run.logged_to == 5 and run.retrained
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2, 3]
    # a row cut by the kill after the last whole one: removed, so that the next row starts a line
    _write_rows(path, range(4))
    with open(path, "a") as f:
        f.write('{"step": 4, "lo')
    run = monitor_run.continue_metrics(MonitorRun(str(tmp_path), "x", 4, continued=True))
    assert run.logged_to == 3 and [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2, 3]
    # resumed where the file ends (a save in time): nothing to cut, nothing re-trained
    _write_rows(path, range(4))
    run = monitor_run.continue_metrics(MonitorRun(str(tmp_path), "x", 4, continued=True))
    assert run.logged_to == 3 and not run.retrained and len(path.read_text().splitlines()) == 4
    # a fresh directory is never touched
    assert monitor_run.continue_metrics(MonitorRun(str(tmp_path), "x", 0)).logged_to == -1


def test_csv_files_are_cut_by_step_and_deepspeeds_by_sample(tmp_path):
    for name, header, steps in (("train_loss", "loss", range(6)), ("Train_Samples_lr", "lr", range(0, 96, 16))):
        with open(tmp_path / f"{name}.csv", "w", newline="") as f:
            csv.writer(f).writerows([["step", header], *[[s, 0.5] for s in steps]])
    names = monitor_run.continue_csv(str(tmp_path), 4, 64)
    assert names == ["Train_Samples_lr", "train_loss"]

    def steps(name):
        with open(tmp_path / f"{name}.csv", newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0][0] == "step"
        return [int(r[0]) for r in rows[1:]]

    assert steps("train_loss") == [0, 1, 2, 3] and steps("Train_Samples_lr") == [0, 16, 32, 48]


def test_wandb_resumes_the_run_by_its_id_and_deepspeed_writes_into_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    env = monitor.wandb_env(MonitorSpec(wandb=True), str(tmp_path), "runid001")
    assert env["WANDB_RUN_ID"] == "runid001" and env["WANDB_RESUME"] == "allow" and env["WANDB_DIR"] == str(tmp_path)
    assert "WANDB_RUN_ID" not in monitor.wandb_env(MonitorSpec(wandb=True), str(tmp_path))
    sections = monitor.ds_sections(MonitorSpec(tensorboard=True, csv=True, wandb=True), "/link2")
    run = MonitorRun("/link0", "runid001", 3, continued=True)
    assert monitor_run.ds_paths(sections, run) == {
        "tensorboard": {"output_path": "/link0"},
        "csv_monitor": {"output_path": "/link0"},
    }


def test_the_frontier_environment_installs_every_monitor_package():
    root = Path(__file__).parents[2]
    # the extra's one line (tomllib is Python >= 3.11; the package supports 3.9)
    line = re.search(r"^frontier = \[(.*)\]$", (root / "pyproject.toml").read_text(), re.MULTILINE)
    assert line is not None
    names = {re.split(r"[<>=\[ ;]", req.strip().strip('"'))[0] for req in line.group(1).split(",")}
    packages = {pkg for _, pkg in monitor.BACKENDS.values() if pkg is not None}
    assert packages == {"tensorboard", "wandb"} and packages <= names, names
    install = (root / "scripts" / "frontier" / "install.sh").read_text()
    assert '"$ROOT[frontier]"' in install  # the packed environment installs that extra
