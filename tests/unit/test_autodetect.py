"""``"topology": "auto"``: parsing of recorded ``rocm-smi --showtopo`` outputs and Slurm
variable sets (tests/data/), and the topology built from them — including inputs that must be
refused. Pure: no processes."""

import json
from pathlib import Path

import pytest

from zeropp_hier.core.errors import HierTopologyError
from zeropp_hier.detect.autodetect import RankRecord, build_topology, local_record, node_packages
from zeropp_hier.detect.node_maps import SOURCE as DOCUMENTED_MAP
from zeropp_hier.detect.node_maps import recognised_node, table_mismatch
from zeropp_hier.detect.node_read import read_xgmi_num_links
from zeropp_hier.detect.rocm_topo import packages_from_showtopo, parse_showtopo
from zeropp_hier.detect.slurm_env import expand_hostlist, parse_tasks_per_node, slurm_task
from zeropp_hier.detect.xgmi_links import packages_from_link_counts, parse_link_counts

DATA = Path(__file__).parent.parent / "data"
SMI = DATA / "rocm_smi"
SLURM = DATA / "slurm_env"
SYSFS = DATA / "amdgpu_sysfs"
MI250X_LINKS = "rocm_systems5763_mi250x_xgmi_num_links.txt"


def smi(name):
    return (SMI / name).read_text()


FRONTIER_ENV = {"SLURM_CLUSTER_NAME": "frontier"}
OVERRIDE = '"topology": {"gcds_per_gpu": 2, "gpus_per_node": 4}'


def test_real_mi250x_weights_do_not_single_out_the_package_sibling():
    """openmm/openmm#3940 (EPYC 7A53 + 4x MI250X): GPU0 is at the smallest weight, 15, to three
    GCDs, so a rule "package = GCDs at the smallest weight" cannot work; the published row still
    fits the documented map (GPU1, its package sibling, is among the direct links)."""
    text = smi("openmm3940_epyc7a53_4xmi250x_excerpt.txt")
    header, gpu0 = (line.split() for line in text.splitlines()[-2:])  # the column header, the GPU0 row
    assert gpu0[0] == "GPU0"
    row = {int(g.removeprefix("GPU")): int(w) for g, w in zip(header, gpu0[1:], strict=True)}
    closest = min(w for g, w in row.items() if g != 0)
    assert closest == 15
    assert sorted(g for g, w in row.items() if g != 0 and w == closest) == [1, 2, 6]
    # the excerpt holds one row of eight: the strict reader refuses it rather than guess
    with pytest.raises(HierTopologyError, match="truncated or garbled"):
        parse_showtopo(text)


def test_real_mi250x_link_counts_give_the_packages():
    """rocm-systems#5763: the amdgpu XGMI link counts of an MI250X node; 4 links join the two GCDs
    of a package, 1 or 2 (or none) join GCDs of different packages."""
    counts = parse_link_counts((SYSFS / MI250X_LINKS).read_text())
    assert len(counts) == 8 and counts[0] == (0, 4, 1, 0, 0, 0, 2, 0)
    assert packages_from_link_counts(counts) == {0: 0, 1: 0, 2: 2, 3: 2, 4: 4, 5: 4, 6: 6, 7: 6}


def _relabel(counts, perm):
    """The same node with its GPUs numbered perm[i] instead of i (rows and columns together)."""
    n = len(counts)
    inv = {perm[i]: i for i in range(n)}
    return tuple(tuple(counts[inv[a]][inv[b]] for b in range(n)) for a in range(n))


def test_link_count_packages_follow_the_counts_not_the_numbering():
    counts = parse_link_counts((SYSFS / MI250X_LINKS).read_text())
    perm = [0, 4, 1, 5, 2, 6, 3, 7]  # GCDs of one package numbered i and i+4
    pk = packages_from_link_counts(_relabel(counts, perm))
    assert pk == {0: 0, 4: 0, 1: 1, 5: 1, 2: 2, 6: 2, 3: 3, 7: 3}


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda rows: rows[:-1], "expected a square table"),  # truncated
        (lambda rows: rows[1:] + rows[:1], "not symmetric with a zero diagonal"),  # rows shifted
        (lambda rows: [rows[0][:-1] + "x"] + rows[1:], "expected whole numbers"),
    ],
)
def test_garbled_link_counts_are_refused(edit, fragment):
    rows = [ln for ln in (SYSFS / MI250X_LINKS).read_text().splitlines() if not ln.startswith("#")]
    with pytest.raises(HierTopologyError) as e:
        parse_link_counts("\n".join(edit(rows)))
    assert e.value.field == "xgmi_num_links" and fragment in str(e.value)


def test_link_counts_without_clean_packages_give_none():
    chain = ((0, 4, 0), (4, 0, 4), (0, 4, 0))  # 1 is 0's and 2's closest: no partition
    assert packages_from_link_counts(chain) is None
    tie = ((0, 2, 2, 0), (2, 0, 2, 0), (2, 2, 0, 0), (0, 0, 0, 0))  # a GPU with no link at all
    assert packages_from_link_counts(tie) is None
    # a hive of single-die GPUs joined all-to-all (no link leaves the group): not a package
    hive = tuple(tuple(0 if i == j else 1 for j in range(4)) for i in range(4))
    assert packages_from_link_counts(hive) is None
    assert packages_from_link_counts(((0, 1), (1, 0))) is None


def test_link_counts_on_a_recognised_node_agree_with_the_documented_map():
    text = (SYSFS / MI250X_LINKS).read_text()
    pk, source = node_packages(FRONTIER_ENV, "frontier08001", None, text)
    assert pk == {0: 0, 1: 0, 2: 2, 3: 2, 4: 4, 5: 4, 6: 6, 7: 6}
    assert source.startswith("XGMI link counts") and "agreeing with the documented" in source
    # the same counts on a node nobody recognises: the counts alone
    pk2, source2 = node_packages({}, "gpu-node-17", None, text)
    assert pk2 == pk and source2 == "XGMI link counts (amdgpu sysfs xgmi_num_links)"


def test_recognised_node_whose_link_counts_disagree_falls_back_to_the_documented_map():
    counts = parse_link_counts((SYSFS / MI250X_LINKS).read_text())
    moved = "\n".join(" ".join(f"{c:02d}" for c in r) for r in _relabel(counts, [0, 4, 1, 5, 2, 6, 3, 7]))
    pk, source = node_packages(FRONTIER_ENV, "frontier08001", None, moved)
    assert pk == {0: 0, 1: 0, 2: 2, 3: 2, 4: 4, 5: 4, 6: 6, 7: 6}
    assert "documented Frontier/LUMI node map" in source and "group the GCDs otherwise (0-4 1-5 2-6 3-7)" in source
    # and on an unrecognised node the counts are what is used (they are what the driver says)
    assert node_packages({}, "gpu-node-17", None, moved)[0] == {0: 0, 4: 0, 1: 1, 5: 1, 2: 2, 6: 2, 3: 3, 7: 3}


def test_unclean_link_counts_on_an_unrecognised_node_are_refused():
    with pytest.raises(HierTopologyError) as e:
        node_packages({}, "gpu-node-17", None, "00 04 00\n04 00 04\n00 04 00\n")
    assert e.value.field == "xgmi_num_links" and OVERRIDE in str(e.value)


def test_read_xgmi_num_links_reads_cards_in_numeric_order(tmp_path):
    for n in (0, 1, 2, 10):
        d = tmp_path / f"card{n}" / "device"
        d.mkdir(parents=True)
        (d / "xgmi_num_links").write_text(f"row{n}\n")
    (tmp_path / "card0-DP-1").mkdir()  # a connector, not a card
    (tmp_path / "renderD128").mkdir()
    (tmp_path / "card3" / "device").mkdir(parents=True)  # a card without XGMI
    assert read_xgmi_num_links(tmp_path) == "row0\nrow1\nrow2\nrow10\n"
    assert read_xgmi_num_links(tmp_path / "missing") is None
    assert read_xgmi_num_links(tmp_path / "card3") is None


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


def test_unrecognised_node_with_xgmi_links_is_refused_with_the_override():
    text = smi("frontier_mi250x.txt")  # hand-written: used here only to be refused
    with pytest.raises(HierTopologyError) as e:
        node_packages({}, "gpu-node-17", text, None)
    assert e.value.field == "rocm-smi --showtopo" and OVERRIDE in str(e.value)
    assert "not recognised as Frontier or LUMI" in str(e.value)
    assert recognised_node(FRONTIER_ENV, "x") == "frontier"
    assert recognised_node({"SLURM_CLUSTER_NAME": "LUMI"}, "nid005000") == "lumi"
    assert recognised_node({}, "frontier00256") == "frontier"  # OLCF's own job output names hosts so
    assert recognised_node({"SLURMD_NODENAME": "frontier08001"}, "login") == "frontier"
    assert recognised_node({"SLURM_CLUSTER_NAME": "perlmutter"}, "nid001") is None


@pytest.mark.parametrize(
    "name, reason",
    [
        # real captures whose tables do not settle the packages: the stated fallback, with why
        ("openmm3940_epyc7a53_4xmi250x_excerpt.txt", "rocm-smi table unreadable"),
        ("rocm_smi_lib108_4gpu_pcie.txt", "rocm-smi table: it lists GPUs [0, 1, 2, 3], not the 8 GCDs 0..7"),
    ],
)
def test_recognised_node_falls_back_to_the_documented_map_and_says_why(name, reason):
    pk, source = node_packages(FRONTIER_ENV, "frontier08001", smi(name), None)
    assert pk == {0: 0, 1: 0, 2: 2, 3: 2, 4: 4, 5: 4, 6: 6, 7: 6}
    assert source.startswith("the documented Frontier/LUMI node map") and reason in source
    assert "no XGMI link counts" in source


def test_table_that_splits_a_documented_pair_over_numa_nodes_is_flagged():
    st = parse_showtopo(smi("frontier_mi250x.txt"))  # hand-written; only the flagged case is checked
    assert st.numa == {0: 3, 1: 3, 2: 1, 3: 1, 4: 0, 5: 0, 6: 2, 7: 2}  # OLCF's NUMA note, as printed
    assert table_mismatch(st._replace(numa={**st.numa, 1: 0})) == "GPU0 and GPU1 sit on NUMA nodes 3 and 0"
    skew = st._replace(
        weights=tuple(
            tuple(30 if (i, j) in ((0, 1), (1, 0)) else w for j, w in enumerate(r)) for i, r in enumerate(st.weights)
        )
    )
    assert table_mismatch(skew) == "GPU0 and GPU1 are not directly linked (weight 30, smallest 15)"


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
    counts = (SYSFS / case["link_counts"]).read_text() if case.get("link_counts") else None
    out = []
    for t in case["tasks"]:
        env = {**case["common"], **t}
        rank, host = int(t["SLURM_PROCID"]), "ignored-" + t["SLURMD_NODENAME"]
        out.append(local_record(rank, env, host, case["gpu_count"], showtopo, counts))
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
