"""The comparison benchmark's per-rank code (benchmarks/compare/rank.py) outside the emulated
cluster: every configuration trains through the job's code (``zeropp_hier.app.run.Run``), and
stock DeepSpeed trains the identical model on identical data (a fair comparison): stock ZeRO-3,
stock ZeRO++ (hpZ) and our ``zero3`` without compression give the same losses."""

import dataclasses
import math

from benchmarks.compare import rank as compare_rank
from benchmarks.compare.shapes import planner_model
from zeropp_hier.app.spec import ModelSpec

from ..helpers import assert_losses_close

# a small GPT-NeoX (the benchmark's shapes are larger; the code path is the same)
SPEC = ModelSpec(vocab_size=128, seq_len=16, hidden=64, heads=2, layers=3, intermediate=256)
PLAN = {
    "shape": "test",
    "model": planner_model(SPEC),
    "model_spec": dataclasses.asdict(SPEC),
    "micro_batch": 2,
    "regather": True,
    "dtype": "fp32",
    "prefetch_bucket": 0,
    "reduce_bucket": 0,
    "device_ms": 1.0,  # the device-time hooks go into the job's model's blocks
    "warmup": 1,
    "steps": 2,
    "world": 8,
    "topology": {"gpus_per_node": 2, "gcds_per_gpu": 2},
}
CONFIGS = {
    "ds-zero3": {"kind": "stock"},
    "ds-zeropp": {"kind": "stock", "zero": {"zero_hpz_partition_size": 4}},
    "zero3": {"kind": "ours", "preset": "zero3", "compression": "none"},
    "frontier": {"kind": "ours", "preset": "frontier"},
}


def test_compare_ranks_run_the_job_fairly(world8):
    res = {n: world8.run(compare_rank.run_one, n, c, PLAN, f"shaped/0/{n}", marks=False) for n, c in CONFIGS.items()}
    for name, per_world in res.items():
        for rank, r in enumerate(per_world):  # every rank gathered every rank's result
            assert r["name"] == name and len(r["per_rank"]) == 8, (name, rank)
        for rank, out in enumerate(per_world[0]["per_rank"]):
            what = f"{name} rank {rank}"
            assert len(out["times"]) == PLAN["steps"] and all(t > 0 for t in out["times"]), what
            assert len(out["losses"]) == PLAN["steps"] and all(math.isfinite(x) for x in out["losses"]), what
            assert ("stats" in out) == (CONFIGS[name]["kind"] == "ours"), what
    stock = res["ds-zero3"][0]["per_rank"][0]["losses"]
    # the job's row is the mean loss over ranks: the same on every rank
    assert all(r["losses"] == stock for r in res["ds-zero3"][0]["per_rank"])
    for name in ("ds-zeropp", "zero3"):
        assert_losses_close(res[name][0]["per_rank"][0]["losses"], stock, 1e-5, f"{name} against stock ZeRO-3")
    # the busy intervals cover exactly the measured steps' windows (the warm-up step is not in them)
    ours = res["frontier"][0]["per_rank"][0]
    assert ours["stats"]["calls"]["forward_gather"]["node"] > 0
    assert ours["busy"]["steps"] == PLAN["steps"]
    assert abs(ours["busy"]["steps_s"] - sum(ours["times"])) < 1e-6
    assert sum(ours["busy"]["busy_s"].values()) > 0
