"""A check that fails on one rank only ends every rank, at the same point, with the real cause
named ([Note: agreed local checks] in zeropp_hier/comm/agree.py); the skipped-step cap stops
every rank alike; an interrupt or a SIGTERM mid-step ends every rank with its cause, refuses a
save and leaves no process ([Note: executor failure semantics] in zeropp_hier/comm/executor.py).
Real ranks (LocalWorld, gloo), real DeepSpeed engines; 2 ranks = 1 node x 1 GPU x 2 GCDs."""

import os
import signal
import threading
import time

import pytest

from zeropp_hier.app.spec import ds_config
from zeropp_hier.launch.world import LocalWorld, WorldError

from ..helpers import world_processes
from . import ranks_errors

BOUND_S = 60.0  # "within the timeout": every rank's error within this of the first (measured: < 1 s)


def _cfg(preset="frontier", **kw):
    return ds_config(preset, gpus_per_node=1, gcds_per_gpu=2, **kw)


@pytest.fixture(scope="module")
def errors(world2, tmp_path_factory):
    probe_dir = str(tmp_path_factory.mktemp("probe"))
    cfg = _cfg()
    cfg["zeropp_hier"]["collective_timeout_s"] = 30
    return world2.run(ranks_errors.one_rank_errors, cfg, _cfg("auto"), probe_dir)


def test_bad_local_rank_on_one_rank_is_named_on_every_rank(errors):
    for rank, r in enumerate(errors):
        e = r["local_rank"]
        assert e["type"] == "HierRankError", (rank, e)
        assert "failed on rank [1]" in e["error"] and "LOCAL_RANK" in e["error"] and "'abc'" in e["error"], e
        assert "peer" not in e["error"]  # the cause, not a symptom
        assert e["seconds"] < BOUND_S


def test_probe_file_is_read_by_rank_0_for_every_rank(errors):
    # rank 1's path does not exist on "its node": it is never read, every rank plans alike
    assert [r["probe_on_rank0_only"]["error"] for r in errors] == [None, None]
    assert errors[0]["probe_on_rank0_only"]["preset"] == errors[1]["probe_on_rank0_only"]["preset"] is not None


def test_probe_file_missing_on_rank_0_is_named_on_every_rank(errors):
    texts = [r["probe_missing_on_rank0"]["error"] for r in errors]
    for t in texts:
        assert t.startswith("HierConfigError: zeropp_hier config error at 'zeropp_hier.auto.probe_file'"), t
        assert "missing.json" in t and "rank 0 read it: no such file" in t
    assert texts[0] == texts[1]


def test_ranks_with_different_plans_stop_before_any_hop_collective(errors):
    for r in errors:
        e = r["different_plan"]
        assert e["type"] == "HierRankError" and "did not reach the same plan" in e["error"], e
        assert "ranks [0]: " in e["error"] and "ranks [1]: " in e["error"] and "'preset'" in e["error"], e
        assert "preset='frontier'" in e["error"] and "preset='zeropp'" in e["error"]


def test_the_world_still_trains_after_the_refused_cases(errors):
    import math

    losses = [r["after"] for r in errors]  # each rank's own batch: its own loss
    assert all(len(x) == 1 and math.isfinite(x[0]) for x in losses), losses


def test_skip_cap_stops_every_rank_at_the_same_step_with_the_history(world2):
    cfg = _cfg(dtype="bf16")
    cfg["zeropp_hier"]["numerics"] = {"max_consecutive_skips": 3}
    out = world2.run(ranks_errors.skip_cap, cfg, 1, 1, 10)
    for r in out:
        assert r["error"] is not None and r["at_step"] == 3 and r["steps_run"] == 3, r
        assert [h["step"] for h in r["history"]] == [1, 2, 3]
        assert "first seen on rank 1" in r["history"][0]["cause"]
        assert "max_consecutive_skips = 3" in r["error"]
    assert out[0]["error"] == out[1]["error"]


# -- signals mid-step -----------------------------------------------------------------------------
def _signal_when_all_wait(world, marker_dir, sig, ranks, stop):
    """Send ``sig`` to ``ranks`` once each announced it is waiting inside the step."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not stop.is_set():
        if all(os.path.exists(os.path.join(marker_dir, f"rank{r}")) for r in ranks):
            time.sleep(0.2)  # inside the wait, not at its first line
            for r in ranks:
                os.kill(world.pids[r], sig)
            return
        time.sleep(0.05)


def _run_signalled(tmp_path, sig, ranks):
    marker_dir, save_dir = tmp_path / "marks", tmp_path / "ckpt"
    marker_dir.mkdir()
    cfg = _cfg()
    cfg["zeropp_hier"]["collective_timeout_s"] = 30
    world = LocalWorld(2, timeout=600, failure_grace_s=BOUND_S, preload=True)  # [Note: preloaded ranks]
    stop = threading.Event()
    sender = threading.Thread(target=_signal_when_all_wait, args=(world, str(marker_dir), sig, ranks, stop))
    sender.start()
    try:
        with pytest.raises(WorldError) as e:
            world.run(ranks_errors.interrupted_mid_step, cfg, 1, str(marker_dir), str(save_dir), ranks)
    finally:
        stop.set()
        sender.join()
        world.close(force=True)
    left = world_processes(world)
    return e.value, left, save_dir


def test_sigint_mid_step_ends_every_rank_with_the_cause_and_refuses_the_save(tmp_path):
    """Ctrl-C reaches every rank of the job (the terminal's process group)."""
    err, left, save_dir = _run_signalled(tmp_path, signal.SIGINT, [0, 1])
    assert err.killed == [], err  # every rank ended on its own
    for rank in range(2):
        text = err.failures[rank]
        assert f"rank {rank}: interrupted mid-step (KeyboardInterrupt)" in text, text
        assert "refusing to save a checkpoint" in text and "KeyboardInterrupt in forward" in text, text
        assert err.exit_after_s[rank] <= BOUND_S
    assert not save_dir.exists() or not any(save_dir.iterdir()), "a checkpoint was written after the interrupt"
    assert left == [], "a process of the interrupted world is still running"


def test_sigterm_to_one_rank_mid_step_ends_every_rank_with_the_cause(tmp_path):
    """SIGTERM to rank 1 (the default action: it ends at once); rank 0, waiting for it in the
    step, fails with a HierCommError naming it, and exits."""
    err, left, _ = _run_signalled(tmp_path, signal.SIGTERM, [1])
    assert err.killed == [], err
    assert "killed by SIGTERM" in err.failures[1]
    assert "HierCommError" in err.failures[0] and "waiting on peer ranks [1]" in err.failures[0], err.failures[0]
    assert err.exit_after_s[0] <= BOUND_S
    assert left == []
