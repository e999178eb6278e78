"""Rank lists in messages and reports, bounded: the first and last ten of a long list.

A list of every rank of a 75,264-rank job is about half a million characters on one line; a
message names the ranks a reader can act on and says how many there are ([Note: per-rank costs
flat in the world] in core/layout.py). ``launch/rendezvous.missing_text`` shortens the same way.
"""

from __future__ import annotations

from typing import Iterable

SHOWN = 10  # ranks shown from each end of a long list


def shortened(items: Iterable[object], shown: int = SHOWN) -> list[str]:
    """The items as text; more than ``2 * shown`` become the first and last ``shown`` around "..."."""
    text = [str(x) for x in items]
    if len(text) > 2 * shown:
        return [*text[:shown], "...", *text[-shown:]]
    return text


def ranks_text(ranks: Iterable[int]) -> str:
    """``[3, 7]`` -> "[3, 7]" (as a list prints); a long list -> its first and last ten around
    "...", then how many: "[0, 1, ..., 75263] (75264 ranks)"."""
    ranks = list(ranks)
    text = "[" + ", ".join(shortened(ranks)) + "]"
    return text if len(ranks) <= 2 * SHOWN else f"{text} ({len(ranks)} ranks)"
