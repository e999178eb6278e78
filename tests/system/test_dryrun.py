"""The dry run of the job (``zeropp-hier train ... dryrun.nodes=N``, zeropp_hier/dryrun/): rank 0
of 48 nodes x 4 packages x 2 GCDs for ``frontier``, ``zeropp`` and ``zero3`` (and of 2 nodes for
``frontier``), the hand-written GPT of 1.3M parameters: start-up, 2 steps, a save and a load of
that save, each in its own process (one fake world per process, as a job has one world): the
2-node case as the user's command in a fresh interpreter, the others the same command forked from
the session's preloaded fork server (tests/system/forked_cli.py), which spares each ~7 CPU-seconds
of imports. Counts and sizes are asserted, never times. On one core each: the module's fixture
runs the selected ones two at a time, and each test asserts on its own run."""

import concurrent.futures as cf
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import forked_cli

ROOT = Path(__file__).resolve().parents[2]
# the hand-written GPT (quick to build); the job's GPT-NeoX has its own case below
MODEL = ["model.arch=gpt", "model.hidden=160", "model.heads=4", "model.layers=4", "model.intermediate=640"]
NEOX = ["model=tiny"]
NEOX_CASE = (48, "frontier", "neox")
# CPU-seconds of a case in a full run of the suite (the others ~27): the longest start first, so that
# the last two to start, side by side, are short
COST = {(9408, "frontier", "gpt"): 54, NEOX_CASE: 44, (9408, "zeropp", "gpt"): 43, (2, "frontier", "gpt"): 29}


# the case run as the user's command, a fresh ``python -m zeropp_hier`` process; the others are the
# same command forked from the session's preloaded fork server (forked_cli: the imports once)
FRESH_CASE = (2, "frontier", "gpt")


def _dry_run(
    tmp_path: Path, preset: str, nodes: int, model: list[str], fresh: bool
) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "dryrun.json"
    args = ["train", f"preset={preset}", *model, f"dryrun.nodes={nodes}"]
    args += [f"dryrun.out={out}", f"checkpoint_dir={tmp_path / 'ckpt'}"]
    if not fresh:
        return forked_cli.run(args, tmp_path, timeout=1800), out
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "zeropp_hier", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1800)
    return proc, out


def _selected(session) -> list[tuple]:
    """The cases of this module's tests that the session runs (-k and the like respected)."""
    cases = []
    for item in session.items:
        if Path(str(item.path)) != Path(__file__) or not hasattr(item, "originalname"):
            continue
        if item.originalname == "test_a_neox_dry_run_reports_what_the_engine_holds_beside_the_planner":
            cases.append(NEOX_CASE)
        elif item.originalname == "test_dry_run_of_the_job_steps_saves_and_loads":
            cases.append((item.callspec.params["nodes"], item.callspec.params["preset"], "gpt"))
    return cases


@pytest.fixture(scope="module")
def dry_runs(request, tmp_path_factory) -> dict:
    """Every selected dry run of this module, two at a time: each is one process on one core, so
    one after another they would leave the other core of a 2-core machine idle. Each process has
    its own directory and output; a failed one fails its own test only."""
    cases = sorted(_selected(request.session), key=lambda c: -COST.get(c, 27))

    def one(case):
        nodes, preset, arch = case
        work = tmp_path_factory.mktemp(f"dry-{nodes}-{preset}-{arch}")
        try:
            return _dry_run(work, preset, nodes, {"gpt": MODEL, "neox": NEOX}[arch], fresh=case == FRESH_CASE)
        except subprocess.TimeoutExpired as e:  # its own test fails, the others still get theirs
            return e, work / "dryrun.json"

    with cf.ThreadPoolExecutor(2) as pool:
        return dict(zip(cases, pool.map(one, cases)))


def _report(dry_runs: dict, case: tuple) -> dict:
    proc, out = dry_runs[case]
    assert not isinstance(proc, subprocess.TimeoutExpired), f"{case}: {proc}"
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    assert "dry run: rank 0 of" in proc.stdout and "not shown" in proc.stdout  # the printed table
    return json.loads(out.read_text())


# 9,408 nodes (75,264 ranks), all of Frontier: there every bucket of this model is packed
# ([Note: per-rank costs flat in the world]) in a row of one small block ([Note: a packed row's
# block]) and `frontier` and `zeropp` keep whole rows ([Note: kept copies of packed buckets] in
# comm/gather.py), a path no smaller world takes; zero3 quantizes nothing (no padding)
# 2 nodes for `frontier` only: below 32 nodes its hops run without log steps, which the 48-node
# runs do not take; `zeropp` and `zero3` there add nothing the 8-rank tests in tests/dist do not
# run in real worlds, for ~30 CPU-seconds each
CASES = [(2, "frontier")] + [(48, p) for p in ("frontier", "zeropp", "zero3")] + [(9408, "frontier"), (9408, "zeropp")]


@pytest.mark.system
@pytest.mark.parametrize(("nodes", "preset"), CASES)
def test_dry_run_of_the_job_steps_saves_and_loads(dry_runs, preset, nodes):
    rep = _report(dry_runs, (nodes, preset, "gpt"))
    assert rep["world"] == {"nodes": nodes, "gpus": 4, "gcds": 2, "ranks": nodes * 8} and rep["rank"] == 0
    assert rep["preset"] == preset
    # on this CPU machine the mirror's subnormals are flushed ([Note: subnormals in a CPU dry run])
    assert rep["device"] == "cpu" and rep["subnormals_flushed"] is True
    res = rep["result"]
    assert 1_000_000 < res["params"] < 3_000_000
    assert len(res["losses"]) == 2 and all(0 < loss < 20 for loss in res["losses"])  # mirrored sums stay in range
    assert res["loaded_step"] == 2  # the load read back the save's job state
    ph = rep["phases"]
    for name in ("process_group", "engine", "step0", "step1", "save", "load"):
        assert name in ph, name
    for step in ("step0", "step1"):
        s = ph[step]
        assert s["collective_calls"] > 0 and s["largest_payload_bytes"] > 0
        assert set(s["split"]) == {"forward", "backward", "step"}
        assert s["unmatched_receives"] == 0  # every receive of a grouped call had its mirrored send
        assert s["object_collectives"] == {}  # no object collective inside a step
        # the process's CPU seconds and the mirror's share are reported beside the host seconds
        assert s["cpu_seconds"] > 0 and s["mirror_seconds"] >= 0 and s["collective_calls"] > 0
    # save and load: each rank writes, hashes and checks only its own files, and the coordinator's
    # exchanges are fixed-size tensors: no world object gather, and the files one rank touches do
    # not grow with the world (the same bound at 2 and 48 nodes; at 48 the old load stat'ed 784)
    for name in ("save", "load"):
        phase = ph[name]
        assert phase["files_opened"] > 0 and phase["files_stated"] > 0, name
        assert "all_gather_object" not in phase["object_collectives"], (name, phase["object_collectives"])
        assert phase["object_buffer_bytes"] < 4096, (name, phase["object_buffer_bytes"])
        files = (phase["files_opened"], phase["files_listed"], phase["files_stated"])
        assert files[0] <= 32 and files[1] <= 4 and files[2] <= 40, (name, files)
    # groups as a GPU job makes them: one split per hop axes (5 at most, the union of every
    # preset's), whatever the world ([Note: groups at scale])
    assert 1 <= ph["engine"]["collectives"].get("split_group", 0) <= 5, ph["engine"]["collectives"]
    assert set(rep["per_step"]) >= {"host_seconds", "cpu_seconds", "mirror_seconds"}
    mem = rep["memory"]
    assert mem["tracemalloc_peak_bytes"] > 0 and mem["peak_rss_bytes"] > mem["tracemalloc_peak_bytes"]
    assert rep["limits"] and all(isinstance(x, str) for x in rep["limits"])


@pytest.mark.system
def test_a_neox_dry_run_reports_what_the_engine_holds_beside_the_planner(dry_runs):
    """transformers' GPT-NeoX (the job's ``tiny``, hidden 64) at 48 nodes: its weights are
    initialised under GatheredParameters(modifier_rank=0), whose broadcast views each gathered
    parameter as bytes; every LayerNorm (64 elements, 384 ranks) gathers from one-element
    partitions, which once came back strided and stopped the run here. The report holds what the
    engine holds by part beside the planner's table for the same job."""
    rep = _report(dry_runs, NEOX_CASE)
    assert rep["result"]["loaded_step"] == 2
    held = rep["memory"]["engine_memory"]
    # primary: this rank's share of the weights (fp32: 4 bytes each), padded to whole partitions
    params = rep["result"]["params"]
    # (each of its ~50 tensors rounds its partition up; alignment pads the flat buffer)
    assert params * 4 / 384 <= held["primary"] < params * 4 / 384 + 4 * 4096
    # fp32 master and Adam's two moments for the same partitions, at least
    assert held["optimizer"] >= 2 * held["primary"]
    assert held["gradients"] > 0
    # at least one whole block (the embedding's), gathered at once
    assert held["gathered parameters (peak)"] >= 4 * 64 * rep["model"]["hidden"]
    assert held["kept copies (peak)"] > 0  # frontier keeps package copies for the backward
    (row,) = rep["memory"]["planner_memory"].values()
    assert row["total"] > 0 and "primary" in row and "gathered layers" in row
