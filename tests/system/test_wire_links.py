"""``comm_stats``' link view against live interface counters ([Note: bytes per link] in
zeropp_hier/core/wire.py): benchmarks/compare/wire_links.py on an emulated 2 x 1 x 2 cluster (4 ranks,
links unshaped, one measured step of zeropp and frontier; about 30 s on 2 idle cores). The
recorded 16-rank runs are re-checked in tests/unit/test_wire.py."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="needs root: builds network namespaces, veth pairs and tc qdiscs (run the suite as root, as CI does)",
)


@needs_root
def test_link_view_matches_live_wire_counters_and_the_payload_view_does_not(tmp_path):
    out = tmp_path / "wire.json"
    cmd = [sys.executable, "-m", "benchmarks.compare.wire_links", "--nodes", "2", "--gpus-per-node", "1"]
    cmd += ["--steps", "1", "--prefix", "ztwire", "--out", str(out)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    d = json.loads(out.read_text())
    assert set(d["configs"]) == {"zeropp", "frontier"}
    for name, row in d["configs"].items():
        for tier in ("gcd", "node"):  # 2 x 1 x 2 has no package-to-package link inside a node
            wire, link = row["wire_less_headers_per_step"][tier], row["link_view_per_step"][tier]
            assert link > 0, (name, tier)
            assert abs(link / wire - 1) <= 0.05, (name, tier, link, wire)
    # zeropp's flat gather is gloo's ring 0 -> 1 -> 2 -> 3 -> 0: two of its four edges leave a
    # node, each carrying 3 shards (6 in all), where the payload view counts 2 per rank (8)
    zpp = d["configs"]["zeropp"]
    assert zpp["payload_view_per_step"]["node"] > 1.15 * zpp["wire_less_headers_per_step"]["node"]
