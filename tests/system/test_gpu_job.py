"""benchmarks/gpu/job.py end to end on CPU (``--device cpu``): the main job started twice at world
size 1 on gloo, stock DeepSpeed ZeRO-3 and our exact ZeRO-3, with the GPU recipe at the tiny size;
the same code path the GPU run takes, so that the GPU run cannot fail on what runs here."""

import json
import math
import subprocess
import sys

from benchmarks.gpu import job as G

from .processes import ROOT, cpu_env

STEPS, WARMUP = 4, 1


def test_cpu_mode_trains_both_configurations_and_writes_the_comparison(tmp_path):
    out = tmp_path / "gpu_job.json"
    cmd = [sys.executable, "-m", "benchmarks.gpu.job", "--device", "cpu", "--steps", str(STEPS)]
    cmd += ["--warmup", str(WARMUP), "--timeout", "240", "--out", str(out), "--work", str(tmp_path / "runs")]
    p = subprocess.run(cmd, cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "ours/stock" in p.stdout and "elapsed" in p.stdout
    r = json.loads(out.read_text())

    # the size: the tiny model on CPU; the ladder is the job's memory check against the budget
    assert r["size"]["name"] == G.TINY and r["device"]["kind"] == "cpu"
    room = (1 - r["size"]["margin"]) * r["device"]["budget_bytes"]
    for rung in r["size"]["ladder"]:
        assert rung["fits"] == (rung["need_bytes"] <= room)
    needs = {x["name"]: x["need_bytes"] for x in r["size"]["ladder"]}
    params = {x["name"]: x["params"] for x in r["size"]["ladder"]}
    assert r["size"]["largest_fitting"] == G.choose_size(
        needs, params, r["device"]["budget_bytes"], r["size"]["margin"]
    )
    assert (r["settings"]["dtype"], r["settings"]["activation_checkpointing"]) == ("bf16", "torch")

    # both runs trained, each the engine it names
    assert sorted(run["config"] for run in r["runs"]) == ["ours", "stock"]
    for run in r["runs"]:
        assert run["returncode"] == 0 and "error" not in run
        assert run["hier"] == (run["config"] == "ours")
    for name in ("stock", "ours"):
        c = r["configs"][name]
        assert len(c["losses"]) == STEPS and all(math.isfinite(x) for x in c["losses"])
        assert c["timed_steps"] == STEPS - WARMUP
        assert math.isclose(c["tokens_per_s"] * c["step_s"], c["tokens_per_step"])
        assert c["peak_memory_bytes"] > 0 and c["mfu"] is None  # no bf16 peak for a CPU

    # the exact preset gives stock's losses (the repo's bf16 parity tolerance)
    cmp = r["comparison"]
    assert cmp["loss_rtol"] == G.LOSS_RTOL["bf16"]
    assert cmp["loss_max_rel_diff"] <= cmp["loss_rtol"] and cmp["losses_match"]
    stock, ours = r["configs"]["stock"], r["configs"]["ours"]
    assert math.isclose(cmp["overhead_per_step"], ours["step_s"] / stock["step_s"] - 1)
    assert cmp["target_met"] == (cmp["overhead_per_step"] <= G.TARGET)
