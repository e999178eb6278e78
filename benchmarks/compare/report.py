"""The comparison benchmark's report: the ranks' results summarised per configuration and phase
(``summarize``), link use per shaped configuration, the tables printed and the bar chart. Pure
but for the chart's file: it reads what the ranks and the interface counters recorded."""

from __future__ import annotations

import statistics

from benchmarks.cluster.spec import ClusterSpec
from benchmarks.compare import linkuse
from benchmarks.compare.shapes import DEFAULT_SHAPE
from benchmarks.compare.variants import ORDER, VARIANTS, issue_mode_label
from zeropp_hier.core.vocab import TIERS

# what the summary keeps of each candidate ``auto`` ranked (the first four always)
AUTO_RANKING_KEYS = (
    "name",
    "predicted_comm_s",
    "predicted_pipelined_s",
    "link_bound_s",
    "predicted_link_s",
    "predicted_host_s",
    "predicted_s",
    "combine",
    "host_work",
    "chunks",
    "issue_mode",
)


def summarize(results: list, wire: dict, plan: dict, links: dict | None = None) -> dict:
    """Per configuration and phase: median step time (slowest rank per step), wire and
    comm_stats bytes per step, peak RSS; with ``links`` ({run label: {"ns/if": tx bytes}}) the
    bytes per step on every shaped link direction, and the executor's busy fractions where
    the ranks sent them ([Note: link use] in benchmarks/compare/linkuse.py)."""
    tokens = plan["world"] * plan["micro_batch"] * plan["model"]["seq_len"]
    out: dict = {}
    for res in results:
        if "name" not in res:
            continue
        d = out.setdefault(res["phase"], {}).setdefault(
            res["name"], {"step_times": [], "wire": [], "stats": [], "peak_rss": [], "losses": []}
        )
        per_rank = res["per_rank"]
        steps = len(per_rank[0]["times"])
        d["step_times"] += [max(r["times"][i] for r in per_rank) for i in range(steps)]
        d["losses"] += per_rank[0]["losses"]
        d["peak_rss"].append(max(r["peak_rss"] for r in per_rank))
        d.setdefault("build_s", []).append(max(r.get("build_s", 0.0) for r in per_rank))
        auto = per_rank[0].get("stats", {}).get("auto")
        if auto is not None:  # what "auto" chose this time, and how long its probe took
            d.setdefault("auto", []).append(
                {
                    "chosen": auto["chosen"],
                    "seconds": auto["seconds"],
                    "runner_up": auto["runner_up"],
                    "rates_gbps": auto["rates_gbps"],
                    "chunks": auto.get("chunks"),
                    # what it predicted for each candidate, and what it ranks on ([Note: host
                    # term] in zeropp_hier/planner/host.py: the host's rates, and per candidate
                    # its link and host seconds and their combination)
                    "ranks": auto.get("ranks"),
                    "host": auto.get("host"),
                    "ranking": [
                        {k: c.get(k) for k in AUTO_RANKING_KEYS if k in c or AUTO_RANKING_KEYS.index(k) < 4}
                        for c in auto.get("ranking", [])
                    ],
                }
            )
        w = wire[f"{res['label']} end"]
        d["wire"].append({t: v / steps for t, v in w.items()})
        if links is not None and res["label"] in links:
            d.setdefault("links", []).append({k: v / steps for k, v in links[res["label"]].items()})
        if "busy" in per_rank[0]:
            d.setdefault("busy", []).extend(r["busy"] for r in per_rank)
        if "stats" in per_rank[0]:
            d["stats"].append(
                {
                    t: sum(sum(r["stats"]["bytes"][p][t] for p in r["stats"]["bytes"]) for r in per_rank) / steps
                    for t in ("gcd", "gpu", "node")
                }
            )
            if "link_bytes" in per_rank[0]["stats"]:  # what crosses each link ([Note: bytes per link])
                d.setdefault("link_stats", []).append(
                    {
                        t: sum(sum(v[t] for v in r["stats"]["link_bytes"].values()) for r in per_rank) / steps
                        for t in ("gcd", "gpu", "node")
                    }
                )
            if "link_messages" in per_rank[0]["stats"]:
                d.setdefault("link_messages", []).append(
                    {
                        t: sum(sum(v[t] for v in r["stats"]["link_messages"].values()) for r in per_rank) / steps
                        for t in ("gcd", "gpu", "node")
                    }
                )
            if "link_bytes" in per_rank[0]["stats"]:  # the link view per phase (issue 49 item 7)
                d.setdefault("phase_link_stats", []).append(
                    {
                        p: {t: sum(r["stats"]["link_bytes"][p][t] for r in per_rank) / steps for t in TIERS}
                        for p in per_rank[0]["stats"]["link_bytes"]
                    }
                )
            # per phase too: how much of the backward re-gathers (DeepSpeed's prefetch keeps the
            # last layers of the forward gathered into the backward where it reaches that far)
            d.setdefault("phase_stats", []).append(
                {
                    p: {t: sum(r["stats"]["bytes"][p][t] for r in per_rank) / steps for t in ("gcd", "gpu", "node")}
                    for p in per_rank[0]["stats"]["bytes"]
                }
            )
    for phase in out.values():
        for d in phase.values():
            d["median_step_s"] = statistics.median(d["step_times"])
            d["tokens_per_s"] = tokens / d["median_step_s"]
            d["wire_per_step"] = {t: statistics.mean(x[t] for x in d["wire"]) for t in ("gcd", "gpu", "node")}
            if d["stats"]:
                d["stats_per_step"] = {t: statistics.mean(x[t] for x in d["stats"]) for t in ("gcd", "gpu", "node")}
            if d.get("link_stats"):
                d["link_stats_per_step"] = {
                    t: statistics.mean(x[t] for x in d["link_stats"]) for t in ("gcd", "gpu", "node")
                }
            if d.get("link_messages"):
                d["link_messages_per_step"] = {
                    t: statistics.mean(x[t] for x in d["link_messages"]) for t in ("gcd", "gpu", "node")
                }
            if d.get("phase_stats"):
                first = d["phase_stats"][0]
                d["phase_stats_per_step"] = {
                    p: {t: statistics.mean(x[p][t] for x in d["phase_stats"]) for t in first[p]} for p in first
                }
            if d.get("phase_link_stats"):
                first = d["phase_link_stats"][0]
                d["phase_link_stats_per_step"] = {
                    p: {t: statistics.mean(x[p][t] for x in d["phase_link_stats"]) for t in first[p]} for p in first
                }
            d["peak_rss_mb"] = max(d["peak_rss"]) / 2**20
            if d.get("links"):
                d["links_per_step"] = {k: statistics.mean(x[k] for x in d["links"]) for k in d["links"][0]}
            if d.get("busy"):
                d["busy_fractions"] = linkuse.busy_fractions(d["busy"])
    return out


def link_uses(spec: ClusterSpec, per_step: dict, per_node_mbit: bool = False) -> list:
    """``LinkUse`` of every shaped link direction from its bytes per step; with
    ``per_node_mbit`` capacities are per Mbit/s of node rate ([Note: link-bound calibration])."""
    scale = spec.node_mbit if per_node_mbit else 1.0
    return [
        linkuse.LinkUse(f"{e.namespace}/{e.ifname}", e.tier, e.mbit / scale, per_step[f"{e.namespace}/{e.ifname}"])
        for e in spec.shaped_egress()
    ]


def add_link_use(summary: dict, spec: ClusterSpec) -> None:
    """Per shaped configuration: link utilisation at its median step, the ideal step and the
    efficiency ([Note: link use]). The CPU work that cannot hide is the same configuration's
    time per step outside every collective on the unshaped pass (None without one, or for
    stock DeepSpeed, whose collectives the executor does not see)."""
    un = summary.get("unshaped", {})
    for name, d in summary.get("shaped", {}).items():
        if "links_per_step" not in d:
            continue
        use = linkuse.utilisation(link_uses(spec, d["links_per_step"]), d["median_step_s"])
        cpu = un.get(name, {}).get("busy_fractions", {}).get("outside_s")
        use["cpu_outside_s"] = cpu
        use["ideal_s"] = linkuse.ideal(use["links_s"], cpu)
        use["efficiency"] = linkuse.efficiency(use["ideal_s"], d["median_step_s"])
        d["link_use"] = use


def link_table(summary: dict, names: list, mode: str | None = None) -> list:
    """The printed columns of [Note: link use], one row per shaped configuration; ``mode``: the
    issue mode's label (``issue_mode_label``; default: a file that did not record it)."""
    s = summary["shaped"]
    pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
    sec = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    lines = [
        f"Link use, ours in {mode or issue_mode_label({})}. Per tier (gcd / gpu / node; a gpu link is "
        "a package veth direction, it carries the node tier's bytes too): busy = time with a "
        "collective of the tier in flight (executor, mean over ranks; a hop spanning several tiers "
        "counts under its slowest); util = wire bytes / (capacity x step), mean over the tier's links; ideal = "
        "busiest link's bytes / capacity + unshaped CPU time outside every collective:",
        "",
        "| configuration | wire MB/step | busy | 2+ tiers busy | mean util | busiest link util | "
        "links s | CPU outside s | ideal s | measured s | efficiency |",
        "|" + "---|" * 11,
    ]
    for n in names:
        d = s[n]
        u = d.get("link_use")
        if u is None:
            continue
        w = d["wire_per_step"]
        bf = d.get("busy_fractions")
        tri = lambda f: " / ".join(f(t) for t in linkuse.TIERS)  # noqa: E731
        lines.append(
            f"| {n} | {tri(lambda t: f'{w[t] / 1e6:.1f}')} | "
            f"{tri(lambda t: pct(bf['busy'][t])) if bf else 'n/a (stock)'} | "
            f"{pct(bf['together']) if bf else '-'} | {tri(lambda t: pct(u['mean'].get(t)))} | "
            f"{tri(lambda t: pct(u['busiest'].get(t)))} | {u['links_s']:.2f} | {sec(u['cpu_outside_s'])} | "
            f"{sec(u['ideal_s'])} | {d['median_step_s']:.2f} | {sec(u['efficiency'])} |"
        )
    return lines


def regime_check(summary: dict, slowest: str) -> dict | None:
    """What the measured run says of the link-bound choice: the largest unshaped step over the
    slowest preset's shaped step (None without the unshaped pass)."""
    un = summary.get("unshaped", {})
    shaped = summary["shaped"].get(slowest)
    if not un or shaped is None:
        return None
    t = max(d["median_step_s"] for d in un.values())
    return {"unshaped_max_s": t, "slowest_shaped_s": shaped["median_step_s"], "share": t / shaped["median_step_s"]}


def report(summary: dict, pred: dict, meta: dict) -> str:
    """The tables and notes; ``meta``: ``notes``, and ``issue_mode`` (the label every table
    names, ``issue_mode_label``; a result file without one ran lanes, and the tables say so)."""
    mode = meta.get("issue_mode") or issue_mode_label({})
    s = summary["shaped"]
    un = summary.get("unshaped", {})
    names = [n for n in ORDER + list(VARIANTS) if n in s]
    # ratios against stock where it ran, else against our own presets of the same layouts
    b3 = next((n for n in ("ds-zero3", "zero3") if n in s), names[0])
    bpp = next((n for n in ("ds-zeropp", "zeropp") if n in s), names[0])
    base3, basepp = s[b3]["median_step_s"], s[bpp]["median_step_s"]
    mb = lambda x: f"{x / 1e6:.1f}"  # noqa: E731
    lines = [
        f"Step time and bytes, ours in {mode}:",
        "",
        f"| configuration | median step s | tokens/s | vs {b3} | vs {bpp} | node MB/step (wire) | "
        "gpu MB/step (wire) | gcd MB/step (wire) | node MB/step (comm_stats payload) | "
        "node MB/step (comm_stats link) | peak RSS/rank MB | unshaped step s | exposed comm s |",
        "|" + "---|" * 13,
    ]
    for n in names:
        d = s[n]
        st = d.get("stats_per_step")
        lk = d.get("link_stats_per_step")  # [Note: bytes per link]; files before it: none
        unshaped = f"{un[n]['median_step_s']:.2f}" if n in un else "-"
        # what the links added to the step: communication that compute did not hide
        exposed = f"{d['median_step_s'] - un[n]['median_step_s']:.2f}" if n in un else "-"
        lines.append(
            f"| {n} | {d['median_step_s']:.2f} | {d['tokens_per_s']:.0f} | "
            f"{base3 / d['median_step_s']:.2f}x | {basepp / d['median_step_s']:.2f}x | "
            f"{mb(d['wire_per_step']['node'])} | {mb(d['wire_per_step']['gpu'])} | "
            f"{mb(d['wire_per_step']['gcd'])} | {mb(st['node']) if st else 'n/a (stock)'} | "
            f"{mb(lk['node']) if lk else ('n/a (stock)' if not st else 'not recorded')} | "
            f"{d['peak_rss_mb']:.0f} | {unshaped} | {exposed} |"
        )
    if "auto" in s:
        fixed = [n for n in names if n in ("zero3", "zeropp", "frontier")]
        best = min(fixed, key=lambda n: s[n]["median_step_s"]) if fixed else None
        a = s["auto"]
        chosen = sorted({x["chosen"] for x in a.get("auto", [])})
        probe = [x["seconds"] for x in a.get("auto", [])]
        lines += [
            "",
            f"auto chose {', '.join(chosen)} (probe + choice {max(probe):.2f} s at most); "
            + (
                f"best fixed preset {best} {s[best]['median_step_s']:.2f} s/step; auto / best = "
                f"{a['median_step_s'] / s[best]['median_step_s']:.3f}"
                if best
                else ""
            ),
        ]
    lines += [
        "",
        f"Planner beside measurement, ours in {mode} (step-time ratios; the planner's node bytes are wire "
        "bytes; scheduled: the step laid out in each configuration's issue mode, [Note: step schedule] in "
        "zeropp_hier/planner/schedule.py, at least the busiest link at its tbf capacity):",
        "",
        f"| configuration | measured s | predicted s | measured vs {b3} | predicted vs {b3} | "
        f"measured vs {bpp} | predicted vs {bpp} | node MB/step measured | predicted | "
        "scheduled s | scheduled / measured | busiest link at capacity s |",
        "|" + "---|" * 12,
    ]
    p3, ppp = pred.get(b3, {}).get("step_s"), pred.get(bpp, {}).get("step_s")
    for n in names:
        if n not in pred:
            continue
        m, p = s[n]["median_step_s"], pred[n]["step_s"]
        lines.append(
            f"| {n} | {m:.2f} | {p:.2f} | {base3 / m:.2f}x | {p3 / p:.2f}x | {basepp / m:.2f}x | "
            f"{ppp / p:.2f}x | {mb(s[n]['wire_per_step']['node'])} | {mb(pred[n]['node_bytes'])} | "
            + (
                f"{pred[n]['scheduled_s']:.2f} | {pred[n]['scheduled_s'] / m:.2f} | {pred[n]['link_bound_s']:.2f} |"
                if "scheduled_s" in pred[n]
                else "- | - | - |"
            )
        )
    if any("link_use" in s[n] for n in names):
        lines += ["", *link_table(summary, names, mode)]
    lines += ["", *meta["notes"]]
    return "\n".join(lines)


def bar_chart(summary: dict, path: str, shape: str = DEFAULT_SHAPE, mode: str | None = None) -> str | None:
    """Step time and node bytes per configuration of ``ORDER``; the title names the issue mode
    (``mode``, ``issue_mode_label``; default: a file that did not record it). Returns the title
    (None without matplotlib)."""
    try:
        import matplotlib
    except ImportError:  # optional: the table and the JSON carry every number
        print(f"(matplotlib not installed: no chart at {path})")
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary["shaped"]
    names = [n for n in ORDER if n in s]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    title = f"ours in {mode or issue_mode_label({})}"
    fig.suptitle(title, fontsize=10)
    a1.bar(
        names,
        [s[n]["median_step_s"] for n in names],
        color=["#888", "#aaa", "#4a7", "#39c", "#c63", "#a5c"][: len(names)],
    )
    a1.set_ylabel("median step time (s)")
    a1.set_title(f"step time, emulated cluster, shape {shape}")
    a2.bar(names, [s[n]["wire_per_step"]["node"] / 1e6 for n in names], color="#c63")
    a2.set_ylabel("node-tier wire MB per step")
    a2.set_title("inter-node bytes (interface counters)")
    for a in (a1, a2):
        a.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return title
