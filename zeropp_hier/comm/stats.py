"""Per-tier byte and collective counters.

[Note: byte accounting]
Bytes are counted from the payload tensors each collective actually sends (a quantized payload
counts its packed data plus its fp32 scales). A rank's block destined for a peer is counted once
for that peer, under the slowest tier between the two ranks (``Topology.tier_between``): this is
what a direct (non-relayed) algorithm puts on each link, independent of the library's ring or
tree choice. A collective is counted once, under the slowest tier it spans.

This is the payload view: what each rank contributes per tier of its group. What crosses each
link depends on the algorithm that moves it (a ring all-gather sends everything to one neighbour);
``link_bytes`` counts that, per phase and link class, from the same calls ([Note: bytes per
link] in core/wire.py). Summed over ranks it is what the interface counters of the emulated
cluster see, headers aside.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Sequence, TypedDict

from ..core import wire
from ..core.topology import Topology
from ..core.vocab import TIERS

PHASES = ("forward_gather", "backward_gather", "grad_reduce", "other_gather")


class StatsSnapshot(TypedDict):
    bytes: dict[str, dict[str, int]]  # phase -> tier -> bytes this rank sent (payload view)
    link_bytes: dict[str, dict[str, int]]  # phase -> link class -> bytes this rank put on it
    link_messages: dict[str, dict[str, int]]  # phase -> link class -> messages it sent there
    calls: dict[str, dict[str, int]]  # phase -> tier -> collectives it issued
    kept_bytes_peak: int  # most bytes of kept copies held at once


class CommStats:
    def __init__(self, topo: Topology, rank: int):
        self.topo = topo
        self.rank = rank
        self.bytes: dict[str, dict[str, int]] = {p: defaultdict(int) for p in PHASES}
        self.calls: dict[str, dict[str, int]] = {p: defaultdict(int) for p in PHASES}
        self.link_bytes: dict[str, dict[str, int]] = {p: defaultdict(int) for p in PHASES}
        self.link_messages: dict[str, dict[str, int]] = {p: defaultdict(int) for p in PHASES}
        # (members, op, algorithm) -> receivers per link class for one unit of edge bytes: a
        # group's split is the same for every call, so a call costs O(1) after its group's first
        self._split: dict[tuple, dict[str, int]] = {}
        self._split_by_id: dict[tuple, tuple[Sequence[int], dict[str, int]]] = {}
        # id(peers) -> (peers, peers per tier, slowest tier): ``_tiers_of``
        self._tiers: dict[int, tuple[Sequence[int], dict[str, int], str | None]] = {}
        self.kept_bytes_peak = 0  # most bytes of kept copies held at once (encoded at their size)
        # the executor's lanes record from their own threads ([Note: one order of hop collectives])
        self._lock = threading.Lock()

    def note_kept(self, nbytes: int) -> None:
        with self._lock:
            self.kept_bytes_peak = max(self.kept_bytes_peak, nbytes)

    def record(
        self,
        phase: str,
        peers: Sequence[int],
        bytes_per_peer: int,
        op: str = "all_to_all",
        algorithm: wire.Algorithm = "direct",
        library: str = "gloo",
    ) -> None:
        """One collective in which this rank sends ``bytes_per_peer`` to each other member
        (payload view), moved by ``algorithm`` on ``library`` (link view, [Note: bytes per
        link])."""
        self.record_payload(phase, peers, bytes_per_peer)
        with self._lock:
            edge = wire.edge_bytes(op, algorithm, len(peers), bytes_per_peer)
            per_receiver = wire.messages(algorithm, library, len(peers))
            for tier, receivers in self._receivers(peers, op, algorithm).items():
                self.link_bytes[phase][tier] += int(round(receivers * edge))
                self.link_messages[phase][tier] += receivers * per_receiver

    def _receivers(self, peers: Sequence[int], op: str, algorithm: wire.Algorithm) -> dict[str, int]:
        # looked up by the group's peers object first: hashing a world-sized tuple per call is O(N)
        fast = (id(peers), op, algorithm)
        hit = self._split_by_id.get(fast)
        if hit is not None and hit[0] is peers:
            return hit[1]
        key = (tuple(peers), op, algorithm)
        split = self._split.get(key)
        if split is None:
            receivers = [(p, 1) for p, _ in wire.sends(self.rank, peers, op, algorithm, 1)]
            counts = wire.per_link(self.topo, self.rank, receivers)
            split = self._split[key] = {t: int(n) for t, n in counts.items() if n}
        # the peers are kept with their split: the id stays theirs while the entry lives
        self._split_by_id[fast] = (peers, split)
        return split

    def record_sent(self, phase: str, messages: Sequence[tuple[int, int]]) -> None:
        """Point-to-point messages (receiver, bytes) as sent (the tick transport's): link view only;
        the transport records the payload view with ``record_payload``."""
        with self._lock:
            for tier, nbytes in wire.per_link(self.topo, self.rank, messages).items():
                self.link_bytes[phase][tier] += int(nbytes)
            for tier, count in wire.per_link(self.topo, self.rank, [(p, 1) for p, _ in messages]).items():
                self.link_messages[phase][tier] += int(count)

    def record_payload(self, phase: str, peers: Sequence[int], bytes_per_peer: int) -> None:
        """The payload view of one collective whose wire bytes ``record_sent`` counts."""
        with self._lock:
            per_tier, slowest = self._tiers_of(peers)
            for tier, count in per_tier.items():
                self.bytes[phase][tier] += count * bytes_per_peer
            if slowest is not None:
                self.calls[phase][slowest] += 1

    def _tiers_of(self, peers: Sequence[int]) -> tuple[dict[str, int], str | None]:
        """How many of ``peers`` sit across each tier from this rank, and the slowest tier: once
        per group (its peers are one tuple object for its life), then a lookup, so a call over
        a group of the whole world costs O(1) ([Note: per-rank costs flat in the world] in
        core/layout.py). Other sequences (a tick's few receivers) are counted each time."""
        hit = self._tiers.get(id(peers))
        if hit is not None and hit[0] is peers:
            return hit[1], hit[2]
        per_tier: dict[str, int] = {}
        for peer in peers:
            tier = self.topo.tier_between(self.rank, peer)
            if tier is not None:
                per_tier[tier] = per_tier.get(tier, 0) + 1
        slowest = max(per_tier, key=TIERS.index) if per_tier else None
        if isinstance(peers, tuple):
            self._tiers[id(peers)] = (peers, per_tier, slowest)
        return per_tier, slowest

    def snapshot(self) -> StatsSnapshot:
        """{"bytes": {phase: {tier: int}}, "calls": {...}} with every phase and tier present, and
        "kept_bytes_peak"."""
        return {
            "bytes": {p: {t: int(self.bytes[p][t]) for t in TIERS} for p in PHASES},
            "calls": {p: {t: int(self.calls[p][t]) for t in TIERS} for p in PHASES},
            "link_bytes": {p: {t: int(self.link_bytes[p][t]) for t in TIERS} for p in PHASES},
            "link_messages": {p: {t: int(self.link_messages[p][t]) for t in TIERS} for p in PHASES},
            "kept_bytes_peak": self.kept_bytes_peak,
        }

    def reset(self) -> None:
        for p in PHASES:
            self.bytes[p].clear()
            self.calls[p].clear()
            self.link_bytes[p].clear()
            self.link_messages[p].clear()
        self.kept_bytes_peak = 0
