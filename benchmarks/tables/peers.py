"""docs/design.md's tick peers at Frontier's size: per preset, the distinct peers of a rank at each
end and in the middle and the most ops in one grouped call, from benchmarks/cpu/tick_peers.py's
pure schedule (tick_peers.json)."""

from __future__ import annotations

from . import fmt, sources

FILES = [f"{sources.RESULTS}/tick_peers.json"]


def render() -> str:
    doc = sources.load(FILES[0])
    ranks = [str(r) for r in doc["ranks"]]
    header = ["preset"] + [f"peers of rank {int(r):,}" for r in ranks] + ["most ops in one grouped call"]
    body = [
        [f"`{preset}`"] + [str(per[r]["peers"]) for r in ranks] + [str(max(per[r]["max_ops_per_call"] for r in ranks))]
        for preset, per in doc["presets"].items()
    ]
    c = doc["meta"]["conditions"]
    cond = f"{c['nodes']:,} nodes × {c['packages_per_node']} × {c['gcds_per_package']}, {c['chunks']} chunks."
    return fmt.table(header, body) + "\n" + cond + " " + sources.cite(FILES) + "\n"
