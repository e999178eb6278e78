"""A two-point Hydra sweep of the main job (``python -m zeropp_hier train -m``, a real
subprocess), then the ``zeropp_hier.tools.sweep_report`` command's ``main`` over it: both runs trained
on real 4-rank worlds and the aggregated table has one row per run, in markdown and CSV."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from zeropp_hier.tools import sweep_report

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2


def _run(args, cwd, timeout):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, not another installed copy
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_two_point_sweep_and_report(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    p = _run(
        [
            "zeropp_hier",
            "train",
            "-m",
            "preset=zero3,frontier",
            "topology=sim_1x2x2",
            f"steps={STEPS}",
            "progress=off",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
        timeout=1500,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    for job in ("0", "1"):
        assert len((sweep / job / "metrics.jsonl").read_text().splitlines()) == STEPS
    # the command's main, in this process (a second interpreter importing DeepSpeed costs ~10 s)
    assert sweep_report.main([str(sweep)]) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader((sweep / "sweep_report.csv").open()))
    assert [row["preset"] for row in rows] == ["zero3", "frontier"]
    md = (sweep / "sweep_report.md").read_text()
    assert md in printed
    assert len([ln for ln in md.splitlines() if ln.startswith("| 0 ") or ln.startswith("| 1 ")]) == 2
    for row, job in zip(rows, ("0", "1")):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert row["overrides"] == " ".join(summary["spec"]["label"]["overrides"])
        assert int(row["world"]) == 4 and row["topology"] == "1x2x2"
        assert float(row["final_loss"]) == summary["final_loss"]
        for tier in ("gcd", "gpu", "node"):
            total = sum(per[tier] for per in summary["bytes_per_step"].values())
            assert float(row[f"{tier}_bytes_per_step"]) == total
    zero3, frontier = rows
    # same model and data; uncompressed zero3 and compressed frontier land on nearly the same loss
    assert abs(float(zero3["final_loss"]) - float(frontier["final_loss"])) < 0.05
    # frontier keeps the backward re-gather on the GCD link: less traffic on the gpu tier
    assert float(frontier["gpu_bytes_per_step"]) < float(zero3["gpu_bytes_per_step"])
