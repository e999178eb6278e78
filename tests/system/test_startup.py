"""A rank that dies before it joins ends the job promptly, with the missing rank named, however
the ranks were started ([Note: a bounded join] in zeropp_hier/launch/rendezvous.py).

The fault is real and early: the rank's interpreter exits with status 3 from ``sitecustomize``
(imported by Python itself at start, before any of the job's code), as a rank whose node cannot
import its dependencies would. No collective or launcher is mocked."""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

from zeropp_hier.launch.ports import free_port
from zeropp_hier.launch.world import LocalWorld, WorldError

from .processes import rank_env, run_all

ROOT = Path(__file__).resolve().parents[2]
JOIN_TIMEOUT_S = 15


def test_ranks_started_by_a_launcher_end_within_the_join_bound_naming_the_missing_rank(tmp_path):
    """4 ranks of the main job started torchrun-style (one process each, RANK/WORLD_SIZE set, no
    agent watching them); rank 3 exits at interpreter start. Ranks 0-2 must each end on their own
    with ``HierStartupError`` naming rank 3, bounded by their own start-up + the join bound
    (ZEROPP_HIER_JOIN_TIMEOUT_S) + rank 0's wait for the verdict to be read (10 s); before the
    bounded join they waited out DeepSpeed's 600 s rendezvous and said only "3/4 clients
    joined"."""
    dies = tmp_path / "dies_at_start"
    dies.mkdir()
    (dies / "sitecustomize.py").write_text("import os\nos._exit(3)\n")
    port = free_port()
    cmds = {}
    for rank in range(4):
        env = rank_env(rank, 4, port, ZEROPP_HIER_JOIN_TIMEOUT_S=str(JOIN_TIMEOUT_S))
        if rank == 3:
            env["PYTHONPATH"] = f"{dies}:{ROOT}"
        argv = [
            sys.executable,
            "-m",
            "zeropp_hier.app.train",
            "topology=sim_1x2x2",
            "steps=1",
            "progress=off",
            f"hydra.run.dir={tmp_path / 'run'}",
            "hydra.output_subdir=null",
        ]
        cmds[("rank", rank)] = (argv, env, rank)  # a group each: nothing is ended for them
    logs = tmp_path / "logs"
    logs.mkdir()
    # the hang bound of this test, far above the join bound and far below the old 600 s
    runs = run_all(cmds, logs, deadline_s=300, cwd=ROOT)
    assert runs[("rank", 3)].returncode == 3
    for rank in range(3):
        run = runs[("rank", rank)]
        print(f"rank {rank}: exit {run.returncode} after {run.seconds:.1f} s (join bound {JOIN_TIMEOUT_S} s)")
        assert run.returncode not in (0, None), f"rank {rank}: {run.ended_because}\n{run.out[-3000:]}"
        assert f"rank 3 of 4 never joined within {JOIN_TIMEOUT_S} s, seen from rank {rank}" in run.out, run.out[-3000:]
        assert "ZEROPP_HIER_JOIN_TIMEOUT_S" in run.out


def test_local_world_ends_at_once_when_a_rank_dies_before_it_joins():
    """The local launcher (what ``zeropp-hier train`` uses without srun or torchrun): one rank
    is SIGKILLed while the ranks are still starting; the world ends as soon as the launcher sees
    the exit, naming the rank and its cause, and no rank of it survives."""
    errors: list = []

    def start():
        try:
            with LocalWorld(4, timeout=600):
                pass
        except WorldError as exc:
            errors.append((time.monotonic(), exc))

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    t = threading.Thread(target=start)
    t.start()
    victim = None
    deadline = time.monotonic() + 120
    while victim is None and time.monotonic() < deadline:
        for p in me.children(recursive=True):
            try:
                if p.pid not in before and "ZEROPP_HIER_WORLD_ID" in p.environ():
                    victim = p
                    break
            except psutil.Error:
                continue
        time.sleep(0.05)
    assert victim is not None, "no rank process of the world appeared"
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    t.join(timeout=300)
    assert not t.is_alive(), "the launcher kept waiting after a rank died"
    assert errors, "start-up succeeded although a rank was killed"
    ended_at, exc = errors[0]
    print(f"world ended {ended_at - killed_at:.2f} s after the rank was killed")
    died = [r for r, why in exc.failures.items() if "died without reporting: killed by SIGKILL" in why]
    assert len(died) == 1, str(exc)
    assert f"start-up failed on rank {died[0]}" in str(exc)
    survivors = [p for p in me.children(recursive=True) if p.pid not in before and p.is_running()]
    alive = []
    for p in survivors:
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "ZEROPP_HIER_WORLD_ID" in p.environ():
                alive.append(p.pid)
        except psutil.Error:
            pass
    assert not alive, f"ranks still running: {alive}"
