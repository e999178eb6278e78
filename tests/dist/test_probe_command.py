"""``zeropp-hier probe`` end to end on 2 real gloo ranks (one package of two GCDs): the command
parses its options, times every tier, writes the JSON on rank 0 and returns 0 on every rank. It
ends the process group itself, so it runs in a world of its own."""

import json

from zeropp_hier.launch.world import LocalWorld


def probe_command(out: str) -> int:
    from zeropp_hier.tools import cli

    return cli.main(
        ["probe", "--gpus-per-node", "1", "--gcds-per-gpu", "2", "--sizes", "4096,65536", "--reps", "1"]
        + ["--out", out, "--quiet"]
    )


def test_probe_command_writes_every_tier(tmp_path):
    out = str(tmp_path / "probe.json")
    with LocalWorld(2, timeout=300, preload=True) as w:
        codes = w.run(probe_command, out)
    assert codes == [0, 0]
    probe = json.loads(open(out).read())
    assert probe["world"] == 2 and probe["topology"] == {"gpus_per_node": 1, "gcds_per_gpu": 2}
    gcd = probe["tiers"]["gcd"]
    assert gcd["group_size"] == 2
    assert gcd["bandwidth"] > 0 and gcd["all_to_all_s"] > 0
