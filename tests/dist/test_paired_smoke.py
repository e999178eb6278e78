"""Smoke test of the paired convergence harness (benchmarks/cpu/paired): two arms of the
protocol (stock DeepSpeed ZeRO-3 and the A/A control, our zero3 preset) at one seed and a second
seed of stock, a few steps of the real job on 8 ranks (2 x 2 x 2) and a small corpus of stdlib
files. Checked: the arms of one seed start from the same weights and see the same samples, the
other seed does not; the held-out losses land at the pilot's evaluation steps; the lr decays on
the cosine schedule; the result file is written and analysed."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.cpu.paired import analyze
from benchmarks.cpu.paired import protocol as proto
from benchmarks.cpu.paired import run as paired_run
from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import stdlib_files


def test_two_arms_one_seed_run_paired_and_are_analysed(world8, tmp_path):
    index = data.prepare(stdlib_files()[:41], str(tmp_path / "data"))  # 3 of the 41 files held out
    p = proto.load()
    run = proto.pilot_run(p.run, 6, 2, 2)
    run["eval_batches"] = 2
    record = paired_run.new_record(p, run, True, index, {})
    out = str(tmp_path / "paired.json")
    paired_run.execute(world8, p, [1], ["stock", "A/A"], record, str(tmp_path / "data"), out)
    paired_run.execute(world8, p, [2], ["stock"], record, str(tmp_path / "data"), out)

    with open(out) as f:
        saved = json.load(f)
    assert saved["pilot"] and saved["protocol_sha256"] == p.sha256
    runs = saved["runs"]
    stock, aa, other = runs["1"]["stock"], runs["1"]["A/A"], runs["2"]["stock"]
    assert stock["init_sha256"] == aa["init_sha256"] and stock["order_sha256"] == aa["order_sha256"]
    assert other["init_sha256"] != stock["init_sha256"] and other["order_sha256"] != stock["order_sha256"]
    assert list(stock["held_out"]) == ["4", "6"] == list(aa["held_out"])
    for r in (stock, aa, other):
        assert len(r["losses"]) == 6 and all(math.isfinite(x) for x in r["losses"])
        assert all(0 < v < math.log(256) + 1 for v in r["held_out"].values())
        # warm-up from 0, then cosine down to min_lr_ratio x lr at the last step
        assert r["lr"][0] < max(r["lr"]) and r["lr"][-1] == pytest.approx(run["min_lr_ratio"] * run["lr"])

    result = analyze.analyze({**p.data, "run": run}, runs, pilot=True)
    assert not result["problems"]
    aa_row = next(r for r in result["rows"] if r["arm"] == "A/A" and r["against"] == "stock")
    assert list(aa_row["held_out_d"]) == ["1"]  # one seed: a difference, no interval
    assert "(needs 2 seeds)" in analyze.table(result)
