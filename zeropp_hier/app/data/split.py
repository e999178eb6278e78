"""Megatron's ``--split`` (``data.split``): its three parts, normalised, and the sequence ranges
they cut a pair into ([Note: blends and splits] in blend.py gives the rules).

Its own module because both a single pair (indexed.py: which documents a split reads) and a
blend of pairs (blend.py) need it; in blend.py it made indexed.py and blend.py import each other.
"""

from __future__ import annotations

import re

import numpy as np

from ...core.errors import HierConfigError

SPLIT_NAMES = ("train", "val", "test")


def parse_split(split: str) -> list[float]:
    """Megatron's ``--split``: three non-negative parts, normalised."""
    text = str(split)
    parts = re.split(r"[,/]", text)
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if not 1 <= len(values) <= 3 or any(not np.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise HierConfigError(
            "data.split", split, "give train,val,test parts as Megatron's --split does, e.g. 969,30,1"
        )
    values += [0.0] * (3 - len(values))
    return [v / sum(values) for v in values]


def split_bounds(parts: list[float], n: int) -> list[int]:
    """The four range boundaries of ``n`` sequences ([Note: blends and splits])."""
    bounds = [0]
    for part in parts:
        bounds.append(bounds[-1] + int(round(part * float(n))))
    excess = bounds[-1] - n
    return [bounds[0]] + [b - excess for b in bounds[1:]]
