"""The job's monitoring and evaluation, real: 4 ranks (one simulated node of 2 GPUs x 2 GCDs,
``topology=sim_1x2x2``), the tiny model on prepared token data, 3 steps through
``zeropp_hier.app.run.rank_main``; DeepSpeed's own monitor writes the scalars, read back here
from its files; the val split is evaluated every step.

The monitor is TensorBoard where the ``tensorboard`` package is installed (its event file read
back with TensorBoard's ``EventAccumulator``), else DeepSpeed's ``csv_monitor`` (its CSV files),
as ``torch.utils.tensorboard`` cannot write without that package.

wandb, offline, where the ``wandb`` package is installed (the ``test`` extra installs both, so CI
takes these paths): the run's ``.wandb`` file read back with wandb's own reader of it, the
``wandb leet inspect --json`` command (one JSON object per record: ``history`` records with the
step and the scalars, ``summary``, ``exit``), run as a subprocess, offline. Without the package
the job is refused before any rank starts, which is what is checked then."""

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import stdlib_files
from zeropp_hier.app.monitoring.monitor import WANDB_PROJECT, MonitorSpec
from zeropp_hier.app.run import rank_main
from zeropp_hier.app.spec import JobSpec
from zeropp_hier.core.errors import HierConfigError
from zeropp_hier.core.vocab import TIERS

from ..helpers import data_job_spec

STEPS = 3
PHASES = ("forward_gather", "backward_gather", "grad_reduce", "other_gather")
KIND = "tensorboard" if importlib.util.find_spec("tensorboard") is not None else "csv"
WANDB = importlib.util.find_spec("wandb") is not None
# every scalar a step without MFU (a CPU has no peak) writes -> its metrics.jsonl key, or the
# (phase, tier) of its bytes_by_phase
EXPECTED: list[tuple[str, str | tuple[str, str]]] = [
    ("train/loss", "loss"),
    ("train/lr", "lr"),
    ("train/grad_norm", "grad_norm"),
    ("val/loss", "val_loss"),
    ("perf/tokens_per_s", "tokens_per_s"),
    ("perf/tflops_per_gcd", "tflops_per_gcd"),
    ("memory/peak_bytes", "peak_memory_bytes"),
] + [(f"bytes/{p}/{t}", (p, t)) for p in PHASES for t in TIERS]


def _spec(tmp_path, name, **kw) -> JobSpec:
    # sim_1x2x2: 4 ranks
    kw = {"topology": {"gpus_per_node": 2, "gcds_per_gpu": 2}, "local_world": 4, **kw}
    return data_job_spec(tmp_path, name, **{"steps": STEPS, **kw})


def _read_scalars(out_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar DeepSpeed's monitor wrote: name -> [(step, value), ...]."""
    if KIND == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(out_dir / "tensorboard"))
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    out = {}
    for path in sorted((out_dir / "csv_monitor").glob("*.csv")):
        with open(path) as f:
            rows = list(csv.reader(f))[1:]  # a header, then (step, value) rows
        out[path.stem] = [(int(s), float(v)) for s, v in rows]
    return out


def _rows(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def _want(row: dict, key: str | tuple[str, str]) -> float:
    """The value a scalar should have: the row's, or its bytes for (phase, tier)."""
    return row["bytes_by_phase"][key[0]][key[1]] if isinstance(key, tuple) else row[key]


def _wandb_records(out_dir: Path) -> tuple[str, list[dict]]:
    """The job's one offline wandb run under ``out_dir/wandb``: its directory's name and every
    record of its ``.wandb`` file, as wandb's own reader prints them."""
    runs = sorted((out_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs  # this job's run, one, in its own run directory
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false"}
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(runs[0])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # an unfinished run's file ends mid-way: the reader says so on stderr
    assert "incomplete" not in done.stderr, done.stderr
    return runs[0].name, [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def _name(scalar: str) -> str:
    """The key ``_read_scalars`` gives a scalar: its tag, or csv_monitor's file name of it."""
    return scalar if KIND == "tensorboard" else scalar.replace("/", "_")


def test_monitor_holds_every_scalar_per_step_and_val_loss_is_one_number_on_every_rank(world4, tmp_path):
    data.prepare(stdlib_files()[:41], str(tmp_path / "data"))  # 3 of the 41 files are held out as val
    print(f"monitor: {KIND}")
    mon = MonitorSpec(**{KIND: True})
    got = world4.run(rank_main, _spec(tmp_path, "mon", monitor=mon, eval_every=1, eval_batches=3))
    plain = world4.run(rank_main, _spec(tmp_path, "plain"))

    # the val loss: all-reduced, so the same number on every rank, at every step
    vals = [r["val_losses"] for r in got]
    assert list(vals[0]) == list(range(STEPS)) and all(v == vals[0] for v in vals), vals
    assert all(0.0 < v < math.log(256) + 1 for v in vals[0].values()), vals[0]
    assert len(set(vals[0].values())) == STEPS  # the model changes between evaluations
    # evaluating changes nothing in training: the same losses as the run without it
    assert got[0]["losses"] == pytest.approx(plain[0]["losses"], rel=1e-6)
    assert plain[0]["val_losses"] == {}

    out = tmp_path / "mon"
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for r in rows:
        assert r["lr"] == pytest.approx(3e-3) and r["grad_norm"] > 0 and r["eta_s"] >= 0
        assert r["val_loss"] == vals[0][r["step"]]
        # the per-phase bytes add up to the row's per-tier bytes; the evaluation's are apart
        for t in TIERS:
            assert sum(r["bytes_by_phase"][p][t] for p in PHASES) == r["bytes"][t]
        assert r["val_bytes"]["forward_gather"]["gcd"] > 0  # its forward gathered weights
    assert rows[-1]["eta_s"] == 0.0
    # summary.json's bytes per step are the steps' own: the rows' sum, the evaluations' apart
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_val_loss"] == vals[0][STEPS - 1]
    for p in PHASES:
        for t in TIERS:
            steps_sum = sum(r["bytes_by_phase"][p][t] for r in rows)
            assert summary["bytes_per_step"][p][t] * STEPS == pytest.approx(steps_sum, abs=1e-6), (p, t)

    scalars = _read_scalars(out)
    for scalar, key in EXPECTED:
        series = scalars.get(_name(scalar))
        assert series is not None, f"{scalar} missing from {sorted(scalars)}"
        assert [s for s, _ in series] == list(range(STEPS)), (scalar, series)
        assert [v for _, v in series] == pytest.approx([_want(r, key) for r in rows], rel=1e-6), scalar
    # MFU needs the device's peak, which a CPU has none of: left out, not written as a placeholder
    assert all(r["mfu"] is None for r in rows) and _name("perf/mfu") not in scalars


def test_wandb_offline_run_holds_every_scalar_per_step_and_each_job_has_its_own_run(world4, tmp_path):
    data.prepare(stdlib_files()[:41], str(tmp_path / "data"))
    mon = MonitorSpec(wandb=True)
    print(f"wandb: {'installed, its offline runs read back' if WANDB else 'not installed, the refusal checked'}")
    if not WANDB:  # as the csv path stands in for TensorBoard's: the job never starts a rank
        with pytest.raises(HierConfigError, match=r"'monitor.wandb'.*pip install wandb"):
            _spec(tmp_path, "wb", monitor=mon).check()
        return
    # two jobs on the same 4 processes: the second must not log into the first's run
    world4.run(rank_main, _spec(tmp_path, "wb", monitor=mon, eval_every=1, eval_batches=3))
    world4.run(rank_main, _spec(tmp_path, "wb2", monitor=mon))

    names = []
    for job, evaluated in (("wb", True), ("wb2", False)):
        rows = _rows(tmp_path / job)
        name, records = _wandb_records(tmp_path / job)
        names.append(name)
        runs = [r["run"] for r in records if r["type"] == "run"]
        assert [r["project"] for r in runs] == [WANDB_PROJECT], runs
        history = [r["history"] for r in records if r["type"] == "history"]
        # one history row per step, at metrics.jsonl's step (DeepSpeed's own sample-count events,
        # which would push wandb's step past ours, are not in wandb: StepMonitor writes it alone)
        assert [h["step"].get("num", 0) for h in history] == list(range(STEPS)), history
        for scalar, key in EXPECTED:
            if scalar == "val/loss" and not evaluated:
                assert all(scalar not in h["item"] for h in history), job
                continue
            got = [h["item"].get(scalar) for h in history]
            assert None not in got, f"{job}: {scalar} missing from {history}"
            assert got == pytest.approx([_want(r, key) for r in rows], rel=1e-6), (job, scalar)
        assert all("perf/mfu" not in h["item"] for h in history)  # no peak on a CPU
        # the job finished its run: an exit record, and the summary holds the last step's values
        assert [r["exit"].get("exit_code", 0) for r in records if r["type"] == "exit"] == [0], job
        summary: dict = {}
        for r in records:
            if r["type"] == "summary":
                summary.update(r["summary"].get("update", {}))
        assert summary["train/loss"] == pytest.approx(rows[-1]["loss"], rel=1e-6), job
    assert names[0] != names[1]
