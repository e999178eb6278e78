"""Per-tier byte and collective counters.

[Note: byte accounting]
Bytes are counted from the payload tensors each collective actually sends (a quantized payload
counts its packed data plus its fp32 scales). A rank's block destined for a peer is counted once
for that peer, under the slowest tier between the two ranks (``Topology.tier_between``): this is
what a direct (non-relayed) algorithm puts on each link, independent of the library's ring or
tree choice. A collective is counted once, under the slowest tier it spans.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Sequence, TypedDict

from ..core.topology import Topology
from ..core.vocab import TIERS

PHASES = ("forward_gather", "backward_gather", "grad_reduce", "other_gather")


class StatsSnapshot(TypedDict):
    bytes: dict[str, dict[str, int]]  # phase -> tier -> bytes this rank sent
    calls: dict[str, dict[str, int]]  # phase -> tier -> collectives it issued
    kept_bytes_peak: int  # most bytes of kept copies held at once


class CommStats:
    def __init__(self, topo: Topology, rank: int):
        self.topo = topo
        self.rank = rank
        self.bytes: dict[str, dict[str, int]] = {p: defaultdict(int) for p in PHASES}
        self.calls: dict[str, dict[str, int]] = {p: defaultdict(int) for p in PHASES}
        self.kept_bytes_peak = 0  # most bytes of kept copies held at once (encoded at their size)
        # the executor's lanes record from their own threads ([Note: one order of hop collectives])
        self._lock = threading.Lock()

    def note_kept(self, nbytes: int) -> None:
        with self._lock:
            self.kept_bytes_peak = max(self.kept_bytes_peak, nbytes)

    def record(self, phase: str, peers: Sequence[int], bytes_per_peer: int) -> None:
        """One collective in which this rank sends ``bytes_per_peer`` to each other member."""
        slowest = None
        with self._lock:
            for peer in peers:
                tier = self.topo.tier_between(self.rank, peer)
                if tier is None:
                    continue
                self.bytes[phase][tier] += bytes_per_peer
                if slowest is None or TIERS.index(tier) > TIERS.index(slowest):
                    slowest = tier
            if slowest is not None:
                self.calls[phase][slowest] += 1

    def snapshot(self) -> StatsSnapshot:
        """{"bytes": {phase: {tier: int}}, "calls": {...}} with every phase and tier present, and
        "kept_bytes_peak"."""
        return {
            "bytes": {p: {t: int(self.bytes[p][t]) for t in TIERS} for p in PHASES},
            "calls": {p: {t: int(self.calls[p][t]) for t in TIERS} for p in PHASES},
            "kept_bytes_peak": self.kept_bytes_peak,
        }

    def reset(self) -> None:
        for p in PHASES:
            self.bytes[p].clear()
            self.calls[p].clear()
        self.kept_bytes_peak = 0
