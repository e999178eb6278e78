"""The paired test's statistics, pure: per-seed relative differences, their mean with a Student-t
interval, and the equivalence decision against a margin written down before the runs.

No SciPy (not a dependency of the project): the t quantile comes from the t distribution's
closed-form CDF for whole degrees of freedom, inverted by bisection ([Note: t quantile]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

Decision = Literal["equivalent", "not equivalent", "inconclusive"]


def paired_relative_differences(arm: Sequence[float], reference: Sequence[float]) -> list[float]:
    """d_s = (L_arm,s - L_ref,s) / L_ref,s for each seed s; the two lists are in the same seed
    order (the caller pairs them by seed)."""
    if len(arm) != len(reference):
        raise ValueError(f"paired lists differ in length: {len(arm)} arm values, {len(reference)} reference values")
    out = []
    for a, r in zip(arm, reference):
        if not (math.isfinite(a) and math.isfinite(r)) or r <= 0:
            raise ValueError(f"a loss pair ({a}, {r}) is not finite or the reference is not positive")
        out.append((a - r) / r)
    return out


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` (whole, >= 1) degrees of freedom.

    [Note: t quantile] For whole df the CDF has a finite series (Abramowitz & Stegun 26.7.3/4):
    with theta = atan(t / sqrt(df)), A = 2/pi (theta + sin cos (1 + 2/3 cos^2 + ...)) for odd df
    and A = sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...) for even df, where A = P(|T| < |t|).
    Exact to rounding, so the quantile needs only bisection; the tests check it against printed
    tables."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a whole number >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    c2 = c * c
    if df % 2:  # odd
        term, total = c, c if df > 1 else 0.0
        for k in range(3, df, 2):  # c (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ...), df - 2 terms in all
            term *= c2 * (k - 1) / k
            total += term
        a = 2.0 / math.pi * (theta + s * total)
    else:
        term, total = 1.0, 1.0
        for k in range(2, df, 2):  # 1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...
            term *= c2 * (k - 1) / k
            total += term
        a = s * total
    return 0.5 + 0.5 * a if t >= 0 else 0.5 - 0.5 * a


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (0.5 < p < 1)."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"p must be in (0.5, 1), got {p}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Interval:
    """Mean of paired differences with its standard error and two-sided ``level`` t-interval."""

    n: int
    mean: float
    sd: float
    se: float
    t: float
    low: float
    high: float
    level: float

    @property
    def half_width(self) -> float:
        return self.high - self.mean


def t_interval(diffs: Sequence[float], level: float = 0.95) -> Interval:
    """Mean, sample sd (n - 1), standard error and the two-sided t-interval of ``diffs``."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"an interval needs at least 2 paired differences (seeds), got {n}")
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    t = t_quantile(0.5 + level / 2.0, n - 1)
    return Interval(n, mean, sd, se, t, mean - t * se, mean + t * se, level)


def equivalence(interval: Interval, margin: float) -> Decision:
    """The protocol's rule (two one-sided tests at 2.5% each, i.e. the 95% interval): equivalent
    when the whole interval lies inside (-margin, +margin); not equivalent when it lies wholly
    outside on one side (the difference is larger than the margin with 97.5% confidence);
    otherwise inconclusive."""
    if margin <= 0:
        raise ValueError(f"margin must be positive, got {margin}")
    if -margin < interval.low and interval.high < margin:
        return "equivalent"
    if interval.low >= margin or interval.high <= -margin:
        return "not equivalent"
    return "inconclusive"


def detectable_half_width(sd: float, seeds: int, level: float = 0.95) -> float:
    """The interval half-width ``seeds`` paired runs give when the differences' sd is ``sd``:
    what the planned run resolves (an arm is called equivalent only if |mean| + this < margin)."""
    return t_quantile(0.5 + level / 2.0, seeds - 1) * sd / math.sqrt(seeds)
