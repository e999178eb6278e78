"""A run of three jobs, as a chain's links run it ([Note: one run in the monitor] in
zeropp_hier/app/monitoring/monitor_run.py), is one run in the monitor: real ranks (4, one simulated node of
2 GPUs x 2 GCDs), ``zeropp_hier.app.run.rank_main`` three times with ``resume=latest``, each job
in its own run directory as Hydra gives each link one.

The second job trains up to step 5 and saves at 4 and 5; its save of 5 is then taken away (the
tag removed, ``latest`` naming step4 again: what a job killed during that save leaves, as the
commit is the last thing a save does), so the third job resumes at 4 and trains step 4 again
after the second one logged it. Read back:

- ``metrics.jsonl``: one file, in the first job's directory, one row per step 0..5, step 4 the
  third job's;
- TensorBoard: the one directory read with TensorBoard's ``EventAccumulator`` (every event file
  in it, the restart marker applied): each series at steps 0..5 once, step 4 the third job's;
- csv (DeepSpeed's csv_monitor): one file per series in the one directory, one header, steps 0..5
  once, step 4 the third job's;
- wandb (offline): every job's offline run under the first job's ``wandb/`` carries one run id,
  read with wandb's own reader (``wandb leet inspect --json``); their history rows together hold
  steps 0..5 once each (wandb refuses a step it holds: step 4 is the second job's).

The ``test`` extra installs tensorboard and wandb; without them the test is skipped, naming it."""

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import stdlib_files
from zeropp_hier.app.monitoring.monitor import MonitorSpec
from zeropp_hier.app.run import rank_main

from ..helpers import data_job_spec

MISSING = [p for p in ("tensorboard", "wandb") if importlib.util.find_spec(p) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"needs the {MISSING} package(s) (the test extra)")
# (the step the job resumes at, the step it trains up to, its save_every): the second saves at 4 and 5
LINKS = [(0, 2, 2), (2, 5, 2), (4, 6, 2)]
SERIES = ("train/loss", "train/lr", "perf/tokens_per_s")


def _spec(tmp_path, name, steps, save_every, **kw):
    mon = MonitorSpec(tensorboard=True, csv=True, wandb=True)
    topo = {"gpus_per_node": 2, "gcds_per_gpu": 2}
    ck = str(tmp_path / "ck")
    kw = {"topology": topo, "local_world": 4, "monitor": mon, "checkpoint_dir": ck, **kw}
    return data_job_spec(tmp_path, name, steps=steps, save_every=save_every, **kw)


def _wandb_runs(wandb_dir: Path) -> list[tuple[str, list[int], dict[int, float]]]:
    """Each offline run's (run id, history steps, train/loss by step), read by wandb's reader."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false"}
    out = []
    for run in sorted(wandb_dir.glob("offline-run-*")):
        cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "incomplete" not in done.stderr, done.stderr
        records = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        ids = [r["run"]["run_id"] for r in records if r["type"] == "run"]
        assert len(ids) == 1, records[:3]
        history = [r["history"] for r in records if r["type"] == "history"]
        steps = [h["step"].get("num", 0) for h in history]
        out.append((ids[0], steps, {s: h["item"]["train/loss"] for s, h in zip(steps, history)}))
    return out


def test_three_jobs_of_one_run_are_one_metrics_file_one_tensorboard_run_and_one_wandb_run(world4, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data.prepare(stdlib_files()[:41], str(tmp_path / "data"))
    ck = tmp_path / "ck"
    trained: list[dict[int, float]] = []  # each job's losses by step, as rank_main returned them
    for i, (start, steps, every) in enumerate(LINKS):
        resume = "latest" if i else None
        got = world4.run(rank_main, _spec(tmp_path, f"link{i}", steps, every, resume=resume))
        trained.append(dict(zip(range(start, steps), got[0]["losses"])))
        if i == 1:  # the save of step 5 did not commit: the third job resumes at 4
            shutil.rmtree(ck / "step5")
            (ck / "latest").write_text("step4")
    assert sorted(trained[2]) == [4, 5] and sorted(trained[1]) == [2, 3, 4], trained

    run = tmp_path / "link0"
    # one metrics file, in the first job's directory; the later jobs' directories have their own summary
    for i in (1, 2):
        assert not (tmp_path / f"link{i}" / "metrics.jsonl").exists()
        assert (tmp_path / f"link{i}" / "summary.json").is_file()
        assert not (tmp_path / f"link{i}" / "tensorboard").exists() and not (tmp_path / f"link{i}" / "wandb").exists()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6)), [r["step"] for r in rows]
    want = {**trained[0], **trained[1], **trained[2]}  # step 4: the third job's
    assert {r["step"]: r["loss"] for r in rows} == pytest.approx(want, rel=1e-12)

    # one TensorBoard run: every event file of the one directory, the restart marker applied
    files = sorted((run / "tensorboard").rglob("events.out.tfevents.*"))
    assert len(files) == 3, files  # one per job, in the one directory
    acc = EventAccumulator(str(files[0].parent))
    acc.Reload()
    for tag in SERIES:
        assert [e.step for e in acc.Scalars(tag)] == list(range(6)), (tag, acc.Scalars(tag))
    assert {e.step: e.value for e in acc.Scalars("train/loss")} == pytest.approx(want, rel=1e-6)

    # csv: one header, each step once (DeepSpeed's csv monitor writes a header into a file it has not
    # written yet: the resumed job's is told the files are started)
    with open(run / "csv_monitor" / "train_loss.csv", newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == ["step", "loss"] and [int(r[0]) for r in table[1:]] == list(range(6)), table
    assert {int(r[0]): float(r[1]) for r in table[1:]} == pytest.approx(want, rel=1e-6)
    assert not (tmp_path / "link1" / "csv_monitor").exists()

    # one wandb run: three offline files of one id, steps 0..5 once among them
    runs = _wandb_runs(run / "wandb")
    assert len(runs) == 3 and len({rid for rid, _, _ in runs}) == 1, runs
    steps = [s for _, ss, _ in runs for s in ss]
    assert steps == list(range(6)), runs
    first = {**trained[0], **trained[1], 5: trained[2][5]}  # step 4 as first logged: the second job's
    logged = {s: v for _, _, by_step in runs for s, v in by_step.items()}
    assert logged == pytest.approx(first, rel=1e-6)
