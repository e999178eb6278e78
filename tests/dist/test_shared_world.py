"""One failing test must not take the others down: the session's shared 8-rank world is rebuilt
before the next task when an earlier one left it dead (here: a rank killed in a collective)."""

import os
import signal

import pytest

from zeropp_hier.launch.world import WorldError

KILLED_RANK = 5
_seen: dict = {}


def _die_in_a_collective(victim: int) -> float:
    import torch
    import torch.distributed as dist

    if dist.get_rank() == victim:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would: no report, no cleanup
    t = torch.ones(1)
    dist.all_reduce(t)  # the others block here on the dead rank until the launcher ends them
    return float(t)


def _world_sum() -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return float(t)


def test_a_rank_killed_in_a_collective_fails_the_task_loudly(world8):
    _seen["pids"] = list(world8.pids)
    _seen["rebuilds"] = world8.rebuilds
    with pytest.raises(WorldError) as e:
        world8.run(_die_in_a_collective, KILLED_RANK)
    assert f"rank {KILLED_RANK} died without reporting: killed by SIGKILL" in str(e.value)


def test_the_next_test_gets_a_working_world(world8):
    if "pids" not in _seen:
        pytest.fail("run together with the test before it, which breaks the world on purpose")
    assert world8.run(_world_sum) == [float(sum(range(8)))] * 8
    # it is a new world, not the broken one coming back to life
    assert world8.rebuilds == _seen["rebuilds"] + 1
    assert not set(world8.pids) & set(_seen["pids"])


def _gc_state() -> dict:
    import gc

    before = gc.get_freeze_count()
    gc.disable()  # no automatic collection between making the cycles and counting them
    try:
        junk = [[] for _ in range(1000)]
        for a in junk:
            a.append(a)  # cycles made after start-up: still collected
        del junk, a
        return {"frozen": before, "collected": gc.collect()}
    finally:
        gc.enable()


def test_ranks_freeze_their_start_up_objects(world2):
    # [Note: frozen start-up objects]: the imports' objects are out of every later collection,
    # and what a task makes afterwards is collected as before
    for r in world2.run(_gc_state):
        assert r["frozen"] > 100_000, r
        assert r["collected"] >= 1000, r
