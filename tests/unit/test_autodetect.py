"""``"topology": "auto"``: parsing of recorded ``rocm-smi --showtopo`` outputs and Slurm
variable sets (tests/data/), and the topology built from them — including inputs that must be
refused. Pure: no processes."""

import json
from pathlib import Path

import pytest

from zeropp_hier.core.errors import HierTopologyError
from zeropp_hier.detect.autodetect import build_topology, local_record
from zeropp_hier.detect.rocm_topo import packages_from_showtopo, parse_showtopo
from zeropp_hier.detect.slurm_env import expand_hostlist, parse_tasks_per_node, slurm_task

DATA = Path(__file__).parent.parent / "data"
SMI = DATA / "rocm_smi"
SLURM = DATA / "slurm_env"


def smi(name):
    return (SMI / name).read_text()


def test_frontier_showtopo_pairs_gcds_of_each_mi250x():
    st = parse_showtopo(smi("frontier_mi250x.txt"))
    assert st.gpus == tuple(range(8))
    assert st.link_types is not None and st.link_types[0][1] == "XGMI"
    assert packages_from_showtopo(st) == {0: 0, 1: 0, 2: 2, 3: 2, 4: 4, 5: 4, 6: 6, 7: 6}


def test_packages_are_read_not_assumed_consecutive():
    pk = packages_from_showtopo(parse_showtopo(smi("pairs_not_consecutive.txt")))
    assert pk == {0: 0, 4: 0, 1: 1, 5: 1, 2: 2, 6: 2, 3: 3, 7: 3}


def test_pcie_only_machine_has_one_gcd_per_package():
    assert packages_from_showtopo(parse_showtopo(smi("pcie_only_4gpu.txt"))) == {0: 0, 1: 1, 2: 2, 3: 3}


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("refuse_chain.txt", "do not form separate packages"),
        ("refuse_unequal_packages.txt", "packages of different sizes"),
        ("refuse_asymmetric.txt", "not symmetric"),
        ("refuse_truncated.txt", "truncated or garbled"),
        ("refuse_no_weight_table.txt", "no 'Weight between two GPUs' table"),
    ],
)
def test_bad_showtopo_is_refused(name, fragment):
    with pytest.raises(HierTopologyError) as e:
        packages_from_showtopo(parse_showtopo(smi(name)))
    assert e.value.field == "rocm-smi --showtopo"
    assert fragment in str(e.value)
    assert "got " in str(e.value)


def test_hostlist_and_tasks_per_node():
    assert expand_hostlist("frontier[08001-08002,08005],login1") == (
        "frontier08001",
        "frontier08002",
        "frontier08005",
        "login1",
    )
    assert expand_hostlist("cn[1-3]") == ("cn1", "cn2", "cn3")
    assert expand_hostlist("vm") == ("vm",)
    assert parse_tasks_per_node("8(x2),4") == (8, 8, 4)
    with pytest.raises(HierTopologyError, match="SLURM_TASKS_PER_NODE"):
        parse_tasks_per_node("8x2")


def test_batch_step_is_not_a_task():
    """The batch script itself has SLURM_PROCID but no step id: not one rank of many."""
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "8",
        "SLURM_NNODES": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_TASKS_PER_NODE": "8",
        "SLURM_JOB_NODELIST": "vm",
    }
    assert slurm_task(env) is None
    assert slurm_task({**env, "SLURM_STEP_ID": "0"}).ntasks == 8


def _records(case):
    showtopo = smi(case["showtopo"]) if case["showtopo"] else None
    out = []
    for t in case["tasks"]:
        env = {**case["common"], **t}
        out.append(
            local_record(int(t["SLURM_PROCID"]), env, "ignored-" + t["SLURMD_NODENAME"], case["gpu_count"], showtopo)
        )
    return out


def _case_names(prefix_refuse):
    return sorted(p.name for p in SLURM.glob("*.json") if p.name.startswith("refuse_") == prefix_refuse)


@pytest.mark.parametrize("name", _case_names(False))
def test_slurm_variable_sets_give_the_expected_topology(name):
    case = json.loads((SLURM / name).read_text())
    det = build_topology(_records(case), **case["declared"])
    t, exp = det.topology, case["expect"]
    assert list(t.dims) == exp["dims"], case["description"]
    assert (None if t.is_identity_map else list(t.rank_map)) == exp["rank_map"]
    assert exp["source"] in det.source
    # properties, whatever the expected map says: ranks of one node share a host, ranks of one
    # package share a package (GPU: the same MI250X per the recorded topology)
    by_rank = {int(t_["SLURM_PROCID"]): t_ for t_ in case["tasks"]}
    for r in range(t.world_size):
        for s in range(t.world_size):
            tier = t.tier_between(r, s)
            same_host = by_rank[r]["SLURMD_NODENAME"] == by_rank[s]["SLURMD_NODENAME"]
            if tier in ("gcd", "gpu"):
                assert same_host
            if tier == "gcd" and case["gpu_count"]:
                assert int(by_rank[r]["ROCR_VISIBLE_DEVICES"]) // 2 == int(by_rank[s]["ROCR_VISIBLE_DEVICES"]) // 2
    assert "auto topology: {} nodes x {} GPUs x {} GCDs".format(*t.dims) in det.describe()


@pytest.mark.parametrize("name", _case_names(True))
def test_inconsistent_slurm_variable_sets_are_refused(name):
    case = json.loads((SLURM / name).read_text())
    with pytest.raises(HierTopologyError) as e:
        build_topology(_records(case), **case["declared"])
    assert e.value.field == case["refuse"]["field"], str(e.value)
    assert case["refuse"]["fragment"] in str(e.value)


def test_cpu_hosts_of_different_shapes_are_refused():
    recs = [
        local_record(r, {"LOCAL_RANK": str(r if r < 4 else r - 4)}, "a" if r < 4 else "b", 0, None) for r in range(6)
    ]
    with pytest.raises(HierTopologyError, match="hosts run different numbers of ranks"):
        build_topology(recs)
