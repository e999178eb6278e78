"""The emulated cluster's pure layout (benchmarks/cluster/spec.py): names, rates, placement, the
split of wire bytes by tier; nothing is built (tests/system/test_cluster.py builds it)."""

import pytest

from benchmarks.cluster.spec import FRONTIER_RATIO, ClusterSpec, wire_bytes


def test_layout_names_rates_and_placement():
    spec = ClusterSpec.scaled(node_mbit=5, prefix="zt")
    cmds = spec.setup_commands()
    veths = [c for c in cmds if c[:3] == ["ip", "link", "add"]]
    tbfs = {(c[2], c[6]): float(c[10].removesuffix("mbit")) for c in cmds if c[0] == "tc"}
    assert len(veths) == len(spec.links()) == spec.packages + spec.nodes
    for lk in spec.links():
        # shaped on both ends, i.e. in both directions, at the tier's per-GCD rate x sharing GCDs
        assert tbfs[(lk.ns_a, lk.if_a)] == tbfs[(lk.ns_b, lk.if_b)] == lk.mbit
        assert "up" not in (lk.if_a, lk.if_b)
        assert len(lk.if_a) <= 15 and len(lk.if_b) <= 15
    assert tbfs[(spec.package_ns(0, 0), "pkg")] == 2 * 5 * FRONTIER_RATIO["gpu"]
    assert tbfs[(spec.switch_ns(0), "nic")] == 4 * 5
    assert tbfs[(spec.package_ns(1, 1), "lo")] == 2 * 5 * FRONTIER_RATIO["gcd"]
    # nothing is created in the root namespace: every link end names its namespace
    assert all("netns" in c for c in veths)
    addrs = [spec.place(r).address for r in range(spec.world_size)]
    assert len(set(addrs)) == spec.packages  # the GCDs of a package share its address
    from zeropp_hier.core.topology import Topology

    topo = Topology(spec.nodes, spec.gpus_per_node, spec.gcds_per_gpu)
    for r in range(spec.world_size):
        c = topo.coord(r)
        assert spec.place(r).namespace == spec.package_ns(c.node, c.gpu)
        assert spec.place(r).local_rank == c.gcd


def test_wire_bytes_split_by_tier():
    spec = ClusterSpec(prefix="zt")
    tx = {k: 0 for v in spec.counter_interfaces().values() for k in v}
    tx[(spec.switch_ns(0), "nic")] = 100  # left node 0
    tx[(spec.package_ns(0, 0), "pkg")] = 130  # 100 of it to the other node, 30 to package (0, 1)
    tx[(spec.package_ns(1, 1), "lo")] = 7
    assert wire_bytes(tx, spec) == {"gcd": 7, "gpu": 30, "node": 100}


def test_bad_spec_is_refused():
    with pytest.raises(ValueError, match="prefix"):
        ClusterSpec(prefix="bad-prefix!")
    with pytest.raises(ValueError, match="nodes"):
        ClusterSpec(nodes=0)


def test_queues_hold_200_ms_and_never_less_than_the_floor():
    # [Note: deep queues]: at link-bound rates 200 ms is less than one probe message; the floor keeps
    # the eight flows of a node uplink from dropping. At the CPU-bound rates 200 ms is above it.
    from benchmarks.cluster.spec import QUEUE_FLOOR_BYTES, tbf_command

    def limit(mbit):
        c = tbf_command("ns", "lo", mbit)
        return int(c[c.index("limit") + 1])

    assert QUEUE_FLOOR_BYTES >= 8 * 64 * 1024  # the eight flows of an uplink, each a 64 KiB probe message
    assert limit(0.16 * 8) == QUEUE_FLOOR_BYTES  # a node uplink at link share 0.15
    assert limit(2 * 160.0) == int(2 * 160e6 / 8 * 0.2) > QUEUE_FLOOR_BYTES  # a package lo, CPU-bound


def test_every_namespace_pins_its_tcp():
    # [Note: pinned TCP]: a namespace would otherwise take the host's congestion control
    spec = ClusterSpec.scaled(node_mbit=0.12, prefix="zt")
    cmds = spec.setup_commands()
    pinned = {
        c[3]
        for c in cmds
        if c[:2] == ["ip", "netns"]
        and "net.ipv4.tcp_congestion_control=reno" in c
        and "net.ipv4.tcp_slow_start_after_idle=0" in c
    }
    assert pinned == set(spec.namespaces())
    # before any link exists, so no connection ever runs the host's
    first_link = next(i for i, c in enumerate(cmds) if c[:3] == ["ip", "link", "add"])
    assert all(i < first_link for i, c in enumerate(cmds) if "net.ipv4.tcp_congestion_control=reno" in c)
