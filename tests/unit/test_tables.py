"""The tables the main job and ``zeropp-hier plan --hops`` print (zeropp_hier.planner.tables)."""

from zeropp_hier.core.config import parse_section
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.topology import Topology
from zeropp_hier.planner import tables


def test_columns_align_and_numbers_are_right_aligned():
    lines = tables.table(["name", "n"], [["a", 5], ["longer", 123]])
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule equally wide
    assert lines[2].endswith("  5") and lines[3].endswith("123")


def test_plan_table_lists_every_hop_in_order():
    topo = Topology(2, 2, 2)
    cfg = parse_section({"enabled": True, "preset": "frontier"})
    text = "\n".join(tables.plan_lines(make_plan("frontier", cfg.compression, topo), topo))
    assert "kept shard spans node+gpu" in text
    body = [line.split() for line in text.splitlines()[3:]]
    assert [row[0] if row[0] in ("forward", "backward", "grad") else "" for row in body][:1] == ["forward"]
    assert "CommPlan(" not in text and "Hop(" not in text
    node_stage = text.splitlines()[-1].split()  # the gradient's last hop: int8, no feedback
    assert node_stage[:4] == ["node", "node", "2", "int8"] and "on" not in node_stage
    cfg = parse_section({"enabled": True, "preset": "frontier", "compression": {"gradients": {"node": "int4"}}})
    text = "\n".join(tables.plan_lines(make_plan("frontier", cfg.compression, topo), topo))
    assert any("int4" in line and "on" in line.split() for line in text.splitlines())  # int4 node stage, feedback


def test_topology_and_bytes_tables():
    topo = Topology(2, 2, 2, rank_map=(1, 0, 2, 3, 4, 5, 6, 7))
    text = "\n".join(tables.topology_lines(topo, "auto"))
    assert "auto-detected" in text and "rank_map 1 0 2" in text
    per = {
        "forward_gather": {"gcd": 1.0, "gpu": 2000.0, "node": 3e6},
        "grad_reduce": {"gcd": 0.0, "gpu": 0.0, "node": 1e6},
    }
    lines = tables.bytes_lines(per, "bytes:")
    assert lines[1].split() == ["phase", "node", "gpu", "gcd"]
    assert lines[-1].split()[:3] == ["total", "4", "MB"]
