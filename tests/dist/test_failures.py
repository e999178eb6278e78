"""A dead or stuck rank ends the job within a bound, with errors naming tier and peer; no hang,
no process left behind. Each test breaks its own world on purpose (never the shared world8)."""

import re

import pytest

from zeropp_hier.app.spec import ds_config
from zeropp_hier.core.topology import Topology
from zeropp_hier.launch.world import LocalWorld, WorldError

from ..helpers import world_processes
from . import ranks_reliability as rs

TIMEOUT_S = 5.0  # collective_timeout_s of these runs
# a quiet spell this long after the last failure or exit: the rest are stuck. Survivors end within
# TIMEOUT_S of each other (a timeout on the silent rank, or at once on a closed connection; measured
# under a loaded 2-core machine: at most 4.8 s between exits), so the grace is over twice that;
# the stuck rank is terminated only after it, so each test that has one waits the grace once
GRACE_S = 12.0
BOUND_S = 60.0  # what the tests accept as "bounded" (a loaded 2-core machine; measured: ~15 s)

_ERROR = re.compile(
    r"HierCommError: zeropp_hier collective failed on rank (\d+) in (.+?), tier '(\w+)' "
    r"\(group over ([\w+]+)\), waiting on peer ranks \[([\d, ]*)\]: (.*?)\. This job"
)


def parse_error(text: str) -> dict | None:
    m = _ERROR.search(text)
    if m is None:
        return None
    return {
        "rank": int(m[1]),
        "phase": m[2],
        "tier": m[3],
        "axes": tuple(m[4].split("+")),
        "peers": [int(p) for p in m[5].split(",") if p.strip()],
        "reason": m[6],
    }


def processes_of(world: LocalWorld) -> list[int]:
    """Live processes of ``world``: its ranks and anything they started (``world_processes``)."""
    return world_processes(world)


def broken_world(size: int, fn, *args) -> tuple[LocalWorld, WorldError]:
    # forked from the session's preloaded fork server ([Note: preloaded ranks]): a world of its own,
    # without 8 fresh imports of torch and DeepSpeed (tens of CPU-seconds on a 2-core machine)
    world = LocalWorld(size, timeout=600, pg_timeout_s=60.0, failure_grace_s=GRACE_S, preload=True)
    alive_before = processes_of(world)
    try:
        with pytest.raises(WorldError) as e:
            world.run(fn, *args)
    finally:
        world.close(force=True)
    assert sorted(alive_before) == sorted(world.pids), "the liveness probe does not see the ranks"
    return world, e.value


@pytest.fixture(scope="module")
def dead_and_stuck():
    cfg = ds_config("frontier")  # 2 nodes x 2 GPUs x 2 GCDs, default (compressed) frontier
    cfg["zeropp_hier"]["collective_timeout_s"] = TIMEOUT_S
    return broken_world(8, rs.die_mid_step, cfg, 5, 2, 2)


def test_dead_rank_is_reported_and_every_survivor_exits_in_bound(dead_and_stuck):
    world, err = dead_and_stuck
    victim, stuck = 5, 2
    assert "killed by SIGKILL" in err.failures[victim]
    # only the silent rank needed the launcher: every other process ended on its own
    assert err.killed == [stuck], err
    for rank in range(8):
        if rank != stuck:
            assert err.exit_after_s[rank] <= BOUND_S, (rank, err.exit_after_s)
    assert processes_of(world) == [], "a process of the failed world is still running"


def test_each_survivor_names_tier_and_peer_it_waited_on(dead_and_stuck):
    _, err = dead_and_stuck
    topo = Topology(2, 2, 2)
    parsed = {}
    for rank in range(8):
        if rank in (5, 2):
            continue
        p = parse_error(err.failures[rank])
        assert p is not None, f"rank {rank} did not end with a HierCommError:\n{err.failures[rank]}"
        assert p["rank"] == rank and p["tier"] in ("gcd", "gpu", "node")
        # the named peers are exactly the other members of that tier's group around this rank
        assert p["peers"] == [r for r in topo.peers(rank, p["axes"]) if r != rank], p
        parsed[rank] = p
    # both ways of failing were exercised and named: a closed connection from the dead rank's
    # partners, a timeout from the partners of the silent one
    assert any(5 in p["peers"] and "closed its connection" in p["reason"] for p in parsed.values()), parsed
    assert any(
        p["peers"] == [2] and "no progress within collective_timeout_s = 5 s" in p["reason"] for p in parsed.values()
    ), parsed


def test_stuck_rank_in_deepspeed_step_times_out_on_deepspeed_group():
    """DeepSpeed's own gradient-norm all-reduce runs on its data-parallel group, created with
    torch's 30-minute default; deepspeed_group_timeout_s bounds it when the user asks."""
    cfg = ds_config("frontier", gpus_per_node=1, gcds_per_gpu=2)  # 2 ranks: 1 node x 1 GPU x 2 GCDs
    cfg["zeropp_hier"]["collective_timeout_s"] = TIMEOUT_S
    cfg["zeropp_hier"]["deepspeed_group_timeout_s"] = TIMEOUT_S
    world, err = broken_world(2, rs.stall_before_step, cfg, 1, 1)
    assert err.killed == [1]
    p = parse_error(err.failures[0])
    assert p is not None, err.failures[0]
    assert p["phase"] == "DeepSpeed step" and p["peers"] == [1], p
    # reported under the setting that gave DeepSpeed's group its timeout, not ours
    assert p["reason"].startswith("no progress within deepspeed_group_timeout_s = 5 s"), p
    # the 5 s timeout, not torch's default (1800 s), ended the wait: gloo says so itself
    assert "Timed out waiting 5000ms" in err.failures[0]
    assert err.exit_after_s[0] <= BOUND_S
    assert processes_of(world) == []
