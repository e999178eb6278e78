"""``"topology": "auto"``: parsing of recorded ``rocm-smi --showtopo`` outputs and Slurm
variable sets (tests/data/), and the topology built from them — including inputs that must be
refused. Pure: no processes."""

import json
from pathlib import Path

import pytest

from zeropp_hier.core.errors import HierTopologyError
from zeropp_hier.detect.autodetect import RankRecord, build_topology, local_record
from zeropp_hier.detect.node_maps import SOURCE as DOCUMENTED_MAP
from zeropp_hier.detect.node_maps import documented_packages, recognised_node
from zeropp_hier.detect.rocm_topo import packages_from_showtopo, parse_showtopo, weight_rows
from zeropp_hier.detect.slurm_env import expand_hostlist, parse_tasks_per_node, slurm_task

DATA = Path(__file__).parent.parent / "data"
SMI = DATA / "rocm_smi"
SLURM = DATA / "slurm_env"


def smi(name):
    return (SMI / name).read_text()


FRONTIER_ENV = {"SLURM_CLUSTER_NAME": "frontier"}
OVERRIDE = '"topology": {"gcds_per_gpu": 2, "gpus_per_node": 4}'


def test_real_mi250x_weights_do_not_single_out_the_package_sibling():
    """openmm/openmm#3940 (EPYC 7A53 + 4x MI250X): GPU0 is at the smallest weight, 15, to three
    GCDs, so a rule "package = GCDs at the smallest weight" cannot work; the published row still
    fits the documented map (GPU1, its package sibling, is among the direct links)."""
    text = smi("openmm3940_epyc7a53_4xmi250x_excerpt.txt")
    row = weight_rows(text)[0]
    closest = min(w for g, w in row.items() if g != 0)
    assert closest == 15
    assert sorted(g for g, w in row.items() if g != 0 and w == closest) == [1, 2, 6]
    # the excerpt holds one row of eight: the strict reader refuses it rather than guess
    with pytest.raises(HierTopologyError, match="truncated or garbled"):
        parse_showtopo(text)


def test_pcie_only_machine_has_one_gcd_per_package():
    st = parse_showtopo(smi("rocm_smi_lib108_4gpu_pcie.txt"))  # a real capture (PCIe only)
    assert packages_from_showtopo(st) == {0: 0, 1: 1, 2: 2, 3: 3}


def test_xgmi_links_alone_never_give_packages():
    # whatever the weights, XGMI links do not identify packages: "not known", never a guess
    for name in (
        "frontier_mi250x.txt",
        "pairs_not_consecutive.txt",
        "refuse_chain.txt",
        "refuse_unequal_packages.txt",
    ):
        assert packages_from_showtopo(parse_showtopo(smi(name))) is None, name


def test_documented_map_only_on_a_recognised_node():
    st = parse_showtopo(smi("frontier_mi250x.txt"))  # hand-written: used here only to be refused
    with pytest.raises(HierTopologyError) as e:
        documented_packages(st, {}, "gpu-node-17")
    assert e.value.field == "rocm-smi --showtopo" and OVERRIDE in str(e.value)
    assert "not recognised as Frontier or LUMI" in str(e.value)
    assert recognised_node(FRONTIER_ENV, "x") == "frontier"
    assert recognised_node({"SLURM_CLUSTER_NAME": "LUMI"}, "nid005000") == "lumi"
    assert recognised_node({}, "frontier00256") == "frontier"  # OLCF's own job output names hosts so
    assert recognised_node({"SLURMD_NODENAME": "frontier08001"}, "login") == "frontier"
    assert recognised_node({"SLURM_CLUSTER_NAME": "perlmutter"}, "nid001") is None


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("pairs_not_consecutive.txt", "GPU0 and GPU1 are not directly linked"),
        ("refuse_unequal_packages.txt", "not the 8 GCDs 0..7"),
        ("rocm_smi_lib108_4gpu_pcie.txt", "not the 8 GCDs 0..7"),
    ],
)
def test_recognised_node_whose_table_does_not_fit_the_documented_map_is_refused(name, fragment):
    with pytest.raises(HierTopologyError) as e:
        documented_packages(parse_showtopo(smi(name)), FRONTIER_ENV, "frontier08001")
    assert fragment in str(e.value) and OVERRIDE in str(e.value)


def test_recognised_node_with_numa_pairs_split_is_refused():
    st = parse_showtopo(smi("frontier_mi250x.txt"))
    assert st.numa == {0: 3, 1: 3, 2: 1, 3: 1, 4: 0, 5: 0, 6: 2, 7: 2}  # OLCF's NUMA note, as printed
    split = st._replace(numa={**st.numa, 1: 0})
    with pytest.raises(HierTopologyError, match="GPU0 and GPU1 sit on NUMA nodes 3 and 0"):
        documented_packages(split, FRONTIER_ENV, "frontier08001")


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("refuse_chain.txt", "not recognised as Frontier or LUMI"),
        ("refuse_unequal_packages.txt", "not recognised as Frontier or LUMI"),
        ("refuse_asymmetric.txt", "not symmetric"),
        ("refuse_truncated.txt", "truncated or garbled"),
        ("refuse_no_weight_table.txt", "no 'Weight between two GPUs' table"),
    ],
)
def test_bad_showtopo_is_refused(name, fragment):
    """Through the rank's own record, as ``detect`` builds it: every refusal names the field."""
    with pytest.raises(HierTopologyError) as e:
        local_record(0, {"LOCAL_RANK": "0", "ROCR_VISIBLE_DEVICES": "0"}, "gpu-node-17", 1, smi(name))
    assert e.value.field == "rocm-smi --showtopo"
    assert fragment in str(e.value)
    assert "got " in str(e.value)


def test_documented_map_is_named_in_the_one_line_rank_zero_logs():
    """Records whose packages came from the documented map: describe() (the line rank 0 logs)
    says so, once."""
    devices = [4, 5, 2, 3, 6, 7, 0, 1]  # --gpu-bind=closest order (OLCF hello_jobstep output)
    recs = [
        RankRecord(r, "frontier08001", r, d, d // 2 * 2, None, None, DOCUMENTED_MAP) for r, d in enumerate(devices)
    ]
    line = build_topology(recs).describe()
    assert line.count("documented Frontier/LUMI node map") == 1
    assert "1 nodes x 4 GPUs x 2 GCDs" in line and "rank_map identity" in line


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
