"""The emulated cluster: the root check, and teardown after a killed run (its pure layout is
tested in tests/unit/test_cluster_spec.py).

The teardown tests build real namespaces, veths and tbf qdiscs (root, as in CI), start
processes inside them, kill the driver half-way (SIGKILL: no handler runs; SIGTERM: the
driver's own handler tears down) and check that nothing with the test's prefix survives.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.cluster import netns
from benchmarks.cluster.spec import ClusterSpec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- root ---------------------------------------------------------------------------------------
def test_non_root_gets_a_clear_error_and_nonzero_exit():
    assert "needs root" in netns.root_problem(euid=1000)
    assert netns.root_problem(euid=0) is None
    res = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "benchmarks.cluster",
            "setup",
            "--prefix",
            "ztnobody",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert res.returncode == 2, res.stderr
    assert "needs root" in res.stderr and "uid 65534" in res.stderr
    assert not [ns for ns in netns.list_namespaces() if ns.startswith("ztnobody-")]


# -- teardown after a run killed half-way -------------------------------------------------------
def _start_driver(prefix):
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.system.cluster_sleepers", prefix], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    ready, _, _ = select.select([proc.stdout], [], [], 600)  # a loaded machine starts slowly
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("READY"):
        proc.kill()
        subprocess.run([sys.executable, "-m", "benchmarks.cluster", "teardown", "--prefix", prefix], cwd=REPO)
    assert line.startswith("READY"), f"driver did not start: {line!r}"
    pids = [int(x) for x in line.split()[1:]]
    # half-way: the cluster is up, shaped, and holds live processes (a process started just now
    # may still be entering its namespace: give it a moment on a loaded machine)
    deadline = time.monotonic() + 30
    left = netns.leftovers(prefix)
    while len(left["processes"]) < len(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
        left = netns.leftovers(prefix)
    assert len(left["namespaces"]) == 5 and len(left["processes"]) >= len(pids)
    spec = ClusterSpec.scaled(prefix=prefix, nodes=2, gpus_per_node=1, gcds_per_gpu=2)
    assert set(netns.qdiscs(spec).values()) >= {"tbf"}
    # every namespace runs the cluster's TCP, whatever the host's ([Note: pinned TCP] in spec.py)
    for ns in spec.namespaces():
        keys = ["net.ipv4.tcp_congestion_control", "net.ipv4.tcp_slow_start_after_idle"]
        got = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n", *keys], capture_output=True, text=True)
        assert got.stdout.split() == ["reno", "0"], (ns, got.stdout, got.stderr)
    return proc, pids


def _gone(pids, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(netns._alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_teardown_after_driver_killed_with_sigkill():
    prefix = f"ztk{os.getpid() % 10000}"
    proc, pids = _start_driver(prefix)
    proc.kill()  # no handler can run: the namespaces stay behind
    proc.wait(timeout=30)
    assert _gone(pids[:-1]), "ranks did not die with their launcher (PR_SET_PDEATHSIG)"
    assert netns.leftovers(prefix)["namespaces"], "expected leftovers after SIGKILL"
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.cluster", "teardown", "--prefix", prefix],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert netns.leftovers(prefix) == {"namespaces": [], "processes": [], "links": []}
    assert _gone(pids), "a process inside a namespace survived teardown"


def test_driver_tears_down_itself_on_sigterm():
    prefix = f"ztt{os.getpid() % 10000}"
    proc, pids = _start_driver(prefix)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert netns.leftovers(prefix) == {"namespaces": [], "processes": [], "links": []}
    assert _gone(pids)
    # and nothing of ours is left in the root namespace either
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout)
    assert not [e["ifname"] for e in links if e["ifname"] in ("pkg", "nic", "br0")]


def test_failing_rank_ends_the_run_and_teardown_leaves_nothing(tmp_path):
    from benchmarks.cluster.driver import RankFailure, run_marked
    from benchmarks.cluster.runner import Cluster

    prefix = f"ztf{os.getpid() % 10000}"
    spec = ClusterSpec.scaled(prefix=prefix, nodes=2, gpus_per_node=1, gcds_per_gpu=1)
    script = tmp_path / "rank.py"
    # rank 1 fails while rank 0 waits on it forever: the run must end with rank 1's error
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n    sys.exit('rank 1 broke on purpose')\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(RankFailure, match="rank 1 broke on purpose"):
        with Cluster(spec):
            run_marked(spec, [str(script)], timeout=300)
    assert netns.leftovers(prefix) == {"namespaces": [], "processes": [], "links": []}


# -- teardown touches only what setup created ------------------------------------------------------
def test_teardown_leaves_namespaces_it_did_not_create():
    """A namespace named like ours but made by someone else (here: by hand, with a process in it)
    survives ``teardown --prefix``, process and all; setup refuses to build over one; ours go."""
    prefix = f"ztm{os.getpid() % 10000}"
    spec = ClusterSpec.scaled(prefix=prefix, nodes=1, gpus_per_node=1, gcds_per_gpu=1)
    other = f"{prefix}-other"
    clash = spec.core_ns
    sleeper = None
    try:
        for ns in (other, clash):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        sleeper = subprocess.Popen(["ip", "netns", "exec", other, "sleep", "600"])
        deadline = time.monotonic() + 30
        while not netns.namespace_pids(other) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert netns.namespace_pids(other), "the foreign process did not start"
        # setup refuses to build over a namespace it did not create, and touches nothing
        with pytest.raises(RuntimeError, match=rf"\['{clash}'\] exist but were not created by this tool"):
            netns.setup(spec)
        assert {other, clash} <= set(netns.list_namespaces()) and netns.ours(prefix) == []
        subprocess.run(["ip", "netns", "delete", clash], check=True)
        netns.setup(spec)
        assert sorted(netns.ours(prefix)) == sorted(spec.namespaces()) and netns.foreign(prefix) == [other]
        res = subprocess.run(
            [sys.executable, "-m", "benchmarks.cluster", "teardown", "--prefix", prefix],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        assert f"not touched: ['{other}']" in res.stderr
        assert netns.leftovers(prefix) == {"namespaces": [], "processes": [], "links": []}
        assert other in netns.list_namespaces() and sleeper.poll() is None, "teardown touched a foreign namespace"
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait(timeout=30)
        for ns in (other, clash):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        netns.teardown(prefix)
