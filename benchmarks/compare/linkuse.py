"""How busy the tiers were, and how far a step is from its links' bound: pure arithmetic.

[Note: link use]
Three views of one measured step, per tier (gcd, gpu, node):

* **busy fraction**: the time at least one collective of that tier was in flight on a rank
  (the executor's busy intervals, [Note: busy intervals] in zeropp_hier/comm/busy.py), over
  the step time; and the time two or more tiers were busy together (hops of different jobs
  side by side). Measured per rank and averaged over ranks.
* **mean utilisation** of the tier's links: wire bytes per step from the interface counters over
  (link capacity x step time), averaged over the tier's links (each direction of a veth is its
  own link; a package's ``lo`` is one link for both directions), and the busiest link's.
* **ideal**: the step no schedule can beat on these links, ``max over links (bytes / capacity)``,
  plus the CPU work that cannot hide behind any link: what a step does before its first
  collective starts and after its last one ends (the batch before the first gather, the
  optimizer step after the last gradient reduction), measured on the unshaped pass, where no
  collective waits on a link. Efficiency = ideal / measured.

A gcd link (``lo``) carries the gcd tier's bytes, a package veth the gpu tier's and the node
tier's (everything that leaves the package), a node uplink the node tier's.
"""

from __future__ import annotations

import math
from typing import Hashable, Iterable, NamedTuple, Sequence

from zeropp_hier.core.vocab import TIERS

Interval = tuple[float, float]


def tier_of_lane(lane: Hashable) -> str:
    """The tier of a hop group's collectives: the slowest axis it spans (a lane is the hop's
    axes, e.g. ``("gpu", "gcd")``, or one axis name)."""
    axes = lane if isinstance(lane, tuple) else (lane,)
    tiers = [a for a in axes if a in TIERS]
    if not tiers or len(tiers) != len(axes):
        raise ValueError(f"lane {lane!r} is not a set of tier axes {TIERS}")
    return max(tiers, key=TIERS.index)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time (empty and reversed ones dropped)."""
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def clip(intervals: Iterable[Interval], windows: Iterable[Interval]) -> list[Interval]:
    """The parts of ``intervals`` inside ``windows`` (both may overlap themselves)."""
    ws = union(windows)
    out = []
    for a, b in union(intervals):
        for wa, wb in ws:
            lo, hi = max(a, wa), min(b, wb)
            if hi > lo:
                out.append((lo, hi))
    return out


def time_at_least(k: int, busy: Sequence[Iterable[Interval]]) -> float:
    """Time during which at least ``k`` of the interval lists are busy (each list is merged
    first, so one list counts once however many of its intervals overlap)."""
    events: list[tuple[float, int]] = []
    for lst in busy:
        for a, b in union(lst):
            events += [(a, 1), (b, -1)]
    events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    total, depth, last = 0.0, 0, 0.0
    for t, d in events:
        if depth >= k:
            total += t - last
        depth += d
        last = t
    return total


def busy_summary(records: Iterable[tuple[Hashable, float, float]], steps: Sequence[Interval]) -> dict:
    """One rank's measured steps: per tier the busy seconds inside the steps, the seconds two or
    more tiers were busy together, the steps' total time, and the seconds of each step before
    its first collective started and after its last one ended (``outside_s``, summed).
    ``records`` are (lane, start, end) from the executor; ``steps`` (start, end) per step."""
    by_tier: dict[str, list[Interval]] = {t: [] for t in TIERS}
    for lane, a, b in records:
        by_tier[tier_of_lane(lane)].append((a, b))
    inside = {t: clip(v, steps) for t, v in by_tier.items()}
    outside = 0.0
    every = [iv for v in by_tier.values() for iv in v]
    for s0, s1 in steps:
        mine = clip(every, [(s0, s1)])
        outside += (mine[0][0] - s0) + (s1 - mine[-1][1]) if mine else s1 - s0
    return {
        "busy_s": {t: length(v) for t, v in inside.items()},
        "together_s": time_at_least(2, list(inside.values())),
        "steps_s": length(steps),
        "steps": len(steps),
        "outside_s": outside,
    }


def busy_fractions(per_rank: Sequence[dict]) -> dict:
    """Mean over ranks of ``busy_summary`` as fractions of the step time, and the CPU time per
    step outside every collective (``outside_s``, mean over ranks)."""
    n = len(per_rank)
    if not n:
        raise ValueError("busy_fractions needs at least one rank's summary")
    frac = lambda s, x: x / s["steps_s"] if s["steps_s"] > 0 else 0.0  # noqa: E731
    return {
        "busy": {t: sum(frac(s, s["busy_s"][t]) for s in per_rank) / n for t in TIERS},
        "together": sum(frac(s, s["together_s"]) for s in per_rank) / n,
        "outside_s": sum(s["outside_s"] / max(s["steps"], 1) for s in per_rank) / n,
    }


class LinkUse(NamedTuple):
    """One shaped link direction over the measured steps."""

    name: str  # "<namespace>/<interface>"
    tier: str
    mbit: float  # capacity, Mbit/s
    bytes_per_step: float


def link_seconds(nbytes: float, mbit: float) -> float:
    """Seconds ``nbytes`` occupy a link of ``mbit`` Mbit/s."""
    if not mbit > 0:
        raise ValueError(f"link capacity must be positive, got {mbit!r} Mbit/s")
    return nbytes * 8 / (mbit * 1e6)


def utilisation(links: Sequence[LinkUse], step_s: float) -> dict:
    """Per tier: mean and busiest link utilisation at ``step_s`` per step; and the step's link
    bound (max over links of bytes / capacity) with the link that sets it."""
    if not step_s > 0:
        raise ValueError(f"step time must be positive, got {step_s!r} s")
    out: dict = {"mean": {}, "busiest": {}}
    for t in TIERS:
        use = [link_seconds(lk.bytes_per_step, lk.mbit) / step_s for lk in links if lk.tier == t]
        if use:
            out["mean"][t] = sum(use) / len(use)
            out["busiest"][t] = max(use)
    bound = max(links, key=lambda lk: link_seconds(lk.bytes_per_step, lk.mbit)) if links else None
    out["links_s"] = link_seconds(bound.bytes_per_step, bound.mbit) if bound else 0.0
    out["bound_by"] = bound.name if bound else None
    return out


def ideal(links_s: float, cpu_s: float | None) -> float | None:
    """The ideal step: the busiest link's time plus CPU work that cannot hide; None when that
    CPU work was not measured."""
    return None if cpu_s is None else links_s + cpu_s


def efficiency(ideal_s: float | None, measured_s: float) -> float | None:
    return None if ideal_s is None or not measured_s > 0 else ideal_s / measured_s


# [Note: link-bound calibration]
# The link-bound regime picks rates so that communication dominates: a short unshaped pass gives
# each configuration's CPU-bound step T and its bytes per step on every link; at node rate r
# (Mbit/s per GCD, the other tiers at their fixed ratios) link l takes b_l / (m_l * r) per step,
# with m_l its capacity at r = 1. The slowest preset is the one with the largest link bound
# X = max_l b_l / m_l; its shaped step is at least X / r, so choosing r <= share * X / T_max
# (T_max: the largest unshaped step of the calibrated configurations) keeps every unshaped step
# <= share of the slowest preset's shaped step. r is rounded down to two significant digits.
def link_bound_rate(calibration: dict[str, dict], share: float = 0.3) -> dict:
    """``calibration``: {config: {"unshaped_s": T, "links": [LinkUse at node rate 1]}} (a LinkUse's
    ``mbit`` is then its capacity per Mbit/s of node rate). Returns the chosen node rate and how
    it was derived."""
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1), got {share!r}")
    if not calibration:
        raise ValueError("link_bound_rate needs at least one calibrated configuration")
    bound = {n: utilisation(c["links"], 1.0)["links_s"] for n, c in calibration.items()}  # X, at r = 1
    slowest = max(bound, key=lambda n: bound[n])
    if not bound[slowest] > 0:
        raise ValueError("the calibration saw no bytes on any link: nothing to make link-bound")
    t_max = max(c["unshaped_s"] for c in calibration.values())
    if not t_max > 0:
        raise ValueError(f"unshaped step time must be positive, got {t_max!r} s")
    exact = share * bound[slowest] / t_max
    digits = 1 - math.floor(math.log10(exact))
    rate = math.floor(exact * 10**digits) / 10**digits
    return {
        "node_mbit": rate,
        "share": share,
        "slowest": slowest,
        "unshaped_max_s": t_max,
        "link_bound_at_1mbit_s": bound,
        # the largest unshaped step over the slowest preset's link bound: <= share by construction
        "predicted_share": t_max / (bound[slowest] / rate),
        # each configuration's unshaped step over its own link bound (above share: less link-bound)
        "own_share": {
            n: c["unshaped_s"] / (bound[n] / rate) if bound[n] > 0 else None for n, c in calibration.items()
        },
        "predicted_links_s": {n: b / rate for n, b in bound.items()},
    }
