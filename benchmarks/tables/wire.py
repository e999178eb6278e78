"""docs/benchmarks.md's bytes on the wire: per shape, preset and link class with traffic, the
interface counters, the same less the transport's framing, comm_stats' link view (and its ratio
to the wire less framing), the payload view and the planner (wire_links_<shape>.json)."""

from __future__ import annotations

from . import fmt, sources

FILES = [f"{sources.RESULTS}/wire_links_8x1x2.json", f"{sources.RESULTS}/wire_links_2x4x2.json"]
HEADER = ["shape", "preset", "link", "wire", "wire less framing", "link view", "payload view", "planner"]


def render() -> str:
    body = []
    for path in FILES:
        doc = sources.load(path)
        t = doc["topology"]
        label = fmt.shape_label(t["nodes"], t["gpus_per_node"], t["gcds_per_gpu"])
        for preset, c in doc["configs"].items():
            less = c["wire_less_headers_per_step"]
            for link in ("node", "gpu", "gcd"):
                if not c["link_view_per_step"][link]:
                    continue
                lv, pv = c["link_view_per_step"][link], c["payload_view_per_step"][link]
                body.append(
                    [
                        label,
                        f"`{preset}`",
                        link,
                        fmt.mb(c["wire_per_step"][link]),
                        fmt.mb(less[link]),
                        f"**{fmt.mb(lv)}** ({lv / less[link]:.3f})",
                        f"{fmt.mb(pv)} ({pv / less[link]:.2f})",
                        fmt.mb(c["planner_bytes_per_step"][link]),
                    ]
                )
    return fmt.table(HEADER, body) + "\n" + sources.cite(FILES) + "\n"
