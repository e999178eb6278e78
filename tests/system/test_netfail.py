"""A network that fails rather than a process (issue 13, item 6), on the emulated cluster.

Both runs train a small GPT on 4 ranks = 2 nodes x 1 package x 2 GCDs (the smallest cluster with
two nodes and a tier below the node), one process per GCD inside its package's namespace.

- Uplink down: in the middle of step 1 (rank 0 prints ``EVENT`` from inside the forward pass) the
  driver takes node 1's uplink down. Every rank must end on its own with ``HierCommError``, within
  the timeout plus a bound, naming the tier and the peers it waited on; nothing may be left.
- Lossy uplink: 10 % of the packets in each direction of node 1's uplink are dropped. The run
  must complete with every loss equal to an undisturbed run's in the same world; it is slower.

Needs root (network namespaces, veth, tc), like tests/test_cluster.py.
"""

import json
import os
import re
import subprocess
import time
import uuid

import pytest

from benchmarks.cluster import netns
from benchmarks.cluster.spec import SKF_AD_RANDOM, ClusterSpec, loss_bytecode
from zeropp_hier.app.spec import ds_config
from zeropp_hier.core.topology import Topology

from ..dist.test_failures import parse_error
from ..helpers import marked_processes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK_SCRIPT = ["-m", "tests.system.netfail_rank"]  # run from the repository root, as a module
SHAPE = dict(nodes=2, gpus_per_node=1, gcds_per_gpu=2)
# collective_timeout_s of the uplink-down run, which waits it out on purpose: the shorter, the
# sooner the test ends; 10 s is still 20 steps of this model (~0.5 s each; a few s on a loaded machine)
TIMEOUT_S = 10.0
LOSSY_TIMEOUT_S = 20.0  # the lossy run's: retransmissions may stall a collective, it must not time out
# How long after the link goes down every rank must have ended: TIMEOUT_S, plus up to one step
# before the wait that times out begins (~0.5 s; a few s on a loaded machine), plus the exit of
# the rank that times out (interpreter and torch teardown: 3-9 s measured on a busy 2-core
# machine) and of a rank behind it in a faster tier, which fails when that exit closes its
# sockets. Measured: every rank ended 24-30 s after the link went down with a timeout of 20 s.
BOUND_S = TIMEOUT_S + 30.0
LOSS_PCT = 10.0

_ROOT_MARKS = (
    pytest.mark.root,  # python -m pytest -m root tests (docs/usage.md lists the host-gated tests)
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="needs root: builds network namespaces, veth pairs and tc qdiscs (run the suite as root, as CI does)",
    ),
)


def needs_root(test):
    for mark in _ROOT_MARKS:
        test = mark(test)
    return test


def _config(timeout_s: float):
    cfg = ds_config("frontier", gpus_per_node=SHAPE["gpus_per_node"], gcds_per_gpu=SHAPE["gcds_per_gpu"])
    cfg["zeropp_hier"]["collective_timeout_s"] = timeout_s
    return cfg


def _assert_nothing_left(spec: ClusterSpec, mark: str) -> None:
    assert netns.leftovers(spec.prefix) == {"namespaces": [], "processes": [], "links": []}
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [line for line in listed.splitlines() if line.startswith(spec.prefix + "-")], listed
    assert marked_processes(mark) == [], "a rank of the run is still alive"
    # every veth, bridge and qdisc lived in the namespaces: none of their names in the root one
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout)
    ours = {"pkg", "nic", "br0"} | {f"n{n}" for n in range(spec.nodes)} | {f"p{g}" for g in range(spec.gpus_per_node)}
    assert not [e["ifname"] for e in links if e["ifname"] in ours]
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    assert not [line for line in qdiscs.splitlines() if any(f"dev {i} " in line for i in ours)], qdiscs


# -- pure: the commands that disturb a link -----------------------------------------------------
def _run_bytecode(code: str, rand: int) -> int:
    """Execute tc's classic-BPF bytecode string for one packet whose ``ld rand`` gives ``rand``."""
    n, *ins = code.split(",")
    prog = [tuple(int(x) for x in i.split()) for i in ins]
    assert len(prog) == int(n)
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = prog[pc]
        if op == 0x20:
            assert k == SKF_AD_RANDOM
            acc, pc = rand, pc + 1
        elif op == 0x35:
            pc += 1 + (jt if acc >= k else jf)
        elif op == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {op}")


def test_loss_filter_drops_the_given_fraction():
    for pct in (0.5, 5, 10, 50, 100):
        code = loss_bytecode(pct)
        dropped = sum(_run_bytecode(code, r) == 2 for r in range(0, 2**32, 2**20))  # 4096 samples
        assert abs(dropped / 4096 - pct / 100) <= 1 / 4096, (pct, dropped)
        assert {_run_bytecode(code, 0), _run_bytecode(code, 2**32 - 1)} <= {0, 2}
    for bad in (0, -1, 101, float("nan")):
        with pytest.raises(ValueError, match="loss percent"):
            loss_bytecode(bad)


def test_uplink_commands_touch_only_that_uplink():
    spec = ClusterSpec.scaled(prefix="zt", **SHAPE)
    lk = spec.uplink(1)
    assert (lk.ns_a, lk.if_a, lk.ns_b, lk.if_b, lk.tier) == ("zt-sw1", "nic", "zt-core", "n1", "node")
    assert spec.uplink_down_commands(1) == [["ip", "-n", "zt-sw1", "link", "set", "nic", "down"]]
    loss = spec.uplink_loss_commands(1, 5)
    # both directions: the switch's end and the core's end, each a clsact + one filter
    assert [(c[2], c[6]) for c in loss] == [("zt-sw1", "nic")] * 2 + [("zt-core", "n1")] * 2
    assert all(c[:2] == ["tc", "-n"] and "root" not in c for c in loss)  # the root tbf stays
    assert loss[1][-2:] == ["bytecode", loss_bytecode(5)] and "da" in loss[1]
    assert spec.uplink_clear_loss_commands(1) == [
        ["tc", "-n", "zt-sw1", "qdisc", "del", "dev", "nic", "clsact"],
        ["tc", "-n", "zt-core", "qdisc", "del", "dev", "n1", "clsact"],
    ]
    with pytest.raises(ValueError, match="node 2"):
        spec.uplink(2)


# -- root: a real run on the emulated cluster ---------------------------------------------------
@needs_root
def test_uplink_down_mid_step_fails_every_rank_with_named_tier_and_peers():
    from benchmarks.cluster.driver import RankFailure, run_marked
    from benchmarks.cluster.runner import Cluster

    spec = ClusterSpec.scaled(prefix=f"ztd{os.getpid() % 10000}", **SHAPE)
    topo = Topology(spec.nodes, spec.gpus_per_node, spec.gcds_per_gpu)
    mark = f"ZEROPP_NETFAIL_RUN={uuid.uuid4().hex}"
    plan = {"config": _config(TIMEOUT_S), "runs": ["down"], "steps": 3, "event_step": 1}
    down = {}

    def on_event(label):
        assert label == "step 1"
        netns.uplink_down(spec, 1)
        down["at"], down["wall"] = time.monotonic(), time.time()
        lk = spec.uplink(1)
        down["state"] = (netns.link_is_up(lk.ns_a, lk.if_a), netns.link_is_up(lk.ns_b, lk.if_b))

    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        with Cluster(spec):
            # the driver ends a rank only after TIMEOUT_S + 15 s without any rank ending: each
            # rank must end on its own
            run_marked(
                spec,
                [*RANK_SCRIPT, json.dumps(plan)],
                on_event=on_event,
                timeout=600,
                failure_grace_s=TIMEOUT_S + 15,
                extra_env={mark.split("=")[0]: mark.split("=")[1]},
            )
    err = info.value
    total = time.monotonic() - t0
    _assert_nothing_left(spec, mark)

    assert down.get("state") == (False, False), f"the uplink was not taken down: {down}"
    assert err.killed == [], f"ranks {err.killed} had to be ended by the driver: {err.tails}"
    assert err.returncodes == {r: 1 for r in range(spec.world_size)}, err.returncodes
    parsed, report = {}, []
    for rank in range(spec.world_size):
        p = parse_error(err.tails[rank])
        assert p is not None, f"rank {rank} did not end with a HierCommError:\n{err.tails[rank]}"
        raised = [float(x) for x in re.findall(r"FAILED_AT ([\d.]+)", err.tails[rank])] or [float("nan")]
        after = err.exit_at[rank] - down["at"]
        report.append(
            f"rank {rank}: tier {p['tier']} peers {p['peers']} raised "
            f"{raised[-1] - down['wall']:.1f} s, ended {after:.1f} s after the link went down"
        )
        assert after <= BOUND_S, report[-1]
        # the named peers are exactly the other members of that tier's group around this rank
        assert p["rank"] == rank and p["peers"] == [r for r in topo.peers(rank, p["axes"]) if r != rank], p
        parsed[rank] = p
    print(f"\nuplink down, collective_timeout_s = {TIMEOUT_S:g}, run {total:.0f} s:\n  " + "\n  ".join(report))

    node_of = lambda r: topo.coord(r).node  # noqa: E731
    at_cut = {r for r, p in parsed.items() if p["tier"] == "node"}
    assert at_cut, f"no rank named the node tier: {parsed}"
    for r in at_cut:
        p = parsed[r]
        # waits across the cut: peers on the other node, and since a downed link sends
        # nothing back (no FIN, no RST), only the timeout ended the wait
        assert any(node_of(q) != node_of(r) for q in p["peers"]), p
        assert p["reason"].startswith(f"no progress within collective_timeout_s = {TIMEOUT_S:g} s"), p
        assert f"Timed out waiting {int(TIMEOUT_S * 1000)}ms" in err.tails[r]
        assert err.exit_at[r] - down["at"] >= TIMEOUT_S - 5, "ended before its timeout could"
    for r, p in parsed.items():
        if r in at_cut:
            continue
        # a rank behind the cut waited in a faster tier on a partner of its own node, and that
        # partner's error names the node tier (the partner either exited first: "closed its
        # connection", or timed out beside it)
        assert p["tier"] in ("gcd", "gpu") and all(node_of(q) == node_of(r) for q in p["peers"]), p
        assert any(q in at_cut for q in p["peers"]), (r, parsed)


@needs_root
def test_lossy_uplink_slows_the_run_and_leaves_every_loss_unchanged():
    from benchmarks.cluster.driver import run_marked
    from benchmarks.cluster.runner import Cluster

    spec = ClusterSpec.scaled(prefix=f"ztl{os.getpid() % 10000}", **SHAPE)
    mark = f"ZEROPP_NETFAIL_RUN={uuid.uuid4().hex}"
    plan = {"config": _config(LOSSY_TIMEOUT_S), "runs": ["reference", "lossy"], "steps": 4}
    retrans, seen = {}, {}

    def on_mark(label, _wire):
        # every rank waits here: the network changes between the two runs, never inside one
        retrans[label] = netns.tcp_retransmits(spec)
        if label == "lossy":
            netns.uplink_loss(spec, 1, LOSS_PCT)
            lk = spec.uplink(1)
            seen["qdiscs"] = netns.qdiscs(spec)
            seen["filters"] = [
                subprocess.run(
                    ["tc", "-n", ns, "filter", "show", "dev", dev, "egress"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                for ns, dev in ((lk.ns_a, lk.if_a), (lk.ns_b, lk.if_b))
            ]
        elif label == "done":
            netns.uplink_clear_loss(spec, 1)

    t0 = time.monotonic()
    with Cluster(spec):
        results, _ = run_marked(
            spec,
            [*RANK_SCRIPT, json.dumps(plan)],
            on_mark=on_mark,
            timeout=600,
            extra_env={mark.split("=")[0]: mark.split("=")[1]},
        )
    total = time.monotonic() - t0
    _assert_nothing_left(spec, mark)

    lk = spec.uplink(1)
    # the loss sits in front of the shaping: both ends of the uplink still have their tbf
    assert seen["qdiscs"][(lk.ns_a, lk.if_a)] == seen["qdiscs"][(lk.ns_b, lk.if_b)] == "tbf"
    assert all("direct-action" in f and "bytecode" in f for f in seen["filters"]), seen["filters"]
    runs = {r["label"]: r["per_rank"] for r in results}
    ref, lossy = runs["reference"], runs["lossy"]
    # the loss reached the ranks' connections: TCP retransmitted many more segments
    ref_retrans, lossy_retrans = retrans["lossy"] - retrans["reference"], retrans["done"] - retrans["lossy"]
    ref_wall, lossy_wall = max(p["wall"] for p in ref), max(p["wall"] for p in lossy)
    print(
        f"\n{LOSS_PCT:g} % loss on node 1's uplink: {plan['steps']} steps took {lossy_wall:.2f} s "
        f"(undisturbed {ref_wall:.2f} s), TCP retransmits {lossy_retrans} (undisturbed "
        f"{ref_retrans}); whole test {total:.0f} s"
    )
    assert lossy_retrans > ref_retrans + 10, retrans
    # slower, never wrong: every rank's every loss is bit-identical to the undisturbed run's
    for rank in range(spec.world_size):
        assert lossy[rank]["losses"] == ref[rank]["losses"], (rank, ref[rank]["losses"], lossy[rank]["losses"])
    assert len(ref[0]["losses"]) == plan["steps"]
