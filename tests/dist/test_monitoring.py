"""The job's monitoring and evaluation, real: 4 ranks (one simulated node of 2 GPUs x 2 GCDs,
``topology=sim_1x2x2``), the tiny model on prepared token data, 3 steps through
``zeropp_hier.app.run.rank_main``; DeepSpeed's own monitor writes the scalars, read back here
from its files; the val split is evaluated every step.

The monitor is TensorBoard where the ``tensorboard`` package is installed (its event file read
back with TensorBoard's ``EventAccumulator``), else DeepSpeed's ``csv_monitor`` (its CSV files),
as ``torch.utils.tensorboard`` cannot write without that package."""

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest

from zeropp_hier.app import data
from zeropp_hier.app.data import stdlib_files
from zeropp_hier.app.monitor import MonitorSpec
from zeropp_hier.app.run import rank_main
from zeropp_hier.app.spec import JobSpec
from zeropp_hier.core.vocab import TIERS

from ..helpers import data_job_spec

STEPS = 3
PHASES = ("forward_gather", "backward_gather", "grad_reduce", "other_gather")
KIND = "tensorboard" if importlib.util.find_spec("tensorboard") is not None else "csv"


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
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
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
    expected = [
        ("train/loss", "loss"),
        ("train/lr", "lr"),
        ("train/grad_norm", "grad_norm"),
        ("val/loss", "val_loss"),
        ("perf/tokens_per_s", "tokens_per_s"),
        ("perf/tflops_per_gcd", "tflops_per_gcd"),
        ("memory/peak_bytes", "peak_memory_bytes"),
    ]
    expected += [(f"bytes/{p}/{t}", (p, t)) for p in PHASES for t in TIERS]
    for scalar, key in expected:
        series = scalars.get(_name(scalar))
        assert series is not None, f"{scalar} missing from {sorted(scalars)}"
        assert [s for s, _ in series] == list(range(STEPS)), (scalar, series)
        want = [r["bytes_by_phase"][key[0]][key[1]] if isinstance(key, tuple) else r[key] for r in rows]
        assert [v for _, v in series] == pytest.approx(want, rel=1e-6), scalar
    # MFU needs the device's peak, which a CPU has none of: left out, not written as a placeholder
    assert all(r["mfu"] is None for r in rows) and _name("perf/mfu") not in scalars
