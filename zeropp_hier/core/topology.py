"""Pure description of where each rank sits: (node, gpu, gcd).

No torch.distributed here: everything is integer maths, tested exhaustively in
tests/unit/test_topology.py. Process groups are made from the plans this module returns, by
``zeropp_hier.comm.groups``.

Axes are always listed in the canonical order ``AXES`` = ``("node", "gpu", "gcd")`` (slowest
link first; ``core/vocab.py`` names them).
A *coordinate index* is the row-major index of a rank's (node, gpu, gcd) in a
``[num_nodes, gpus_per_node, gcds_per_gpu]`` array; layouts in ``zeropp_hier.core.layout`` are
expressed in that order, and ``rank_of_index`` translates back to global ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, NamedTuple, Sequence

from .errors import HierTopologyError
from .vocab import AXES


class Coord(NamedTuple):
    node: int
    gpu: int
    gcd: int


def normalize_axes(axes: Iterable[str]) -> tuple[str, ...]:
    """Axes as a tuple in canonical order; unknown names raise."""
    axes = set(axes)
    unknown = axes - set(AXES)
    if unknown:
        raise ValueError(f"unknown axes {sorted(unknown)}; expected a subset of {AXES}")
    return tuple(a for a in AXES if a in axes)


@dataclass(frozen=True)
class Topology:
    num_nodes: int
    gpus_per_node: int
    gcds_per_gpu: int
    # rank_map[i] = global rank placed at coordinate index i. None means the identity:
    # rank = gcd + gcds_per_gpu * (gpu + gpus_per_node * node).
    rank_map: tuple[int, ...] | None = None
    # the inverse of ``rank_map``; None for the identity (no table of the world for it:
    # [Note: per-rank costs flat in the world] in core/layout.py)
    _index_of_rank: tuple[int, ...] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("num_nodes", "gpus_per_node", "gcds_per_gpu"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise HierTopologyError(f"topology.{name}", v, "use a positive integer")
        w = self.world_size
        if self.rank_map is not None:
            if sorted(self.rank_map) != list(range(w)):
                raise HierTopologyError(
                    "topology.rank_map", list(self.rank_map), f"give a permutation of 0..{w - 1} (one entry per rank)"
                )
            inv = [0] * w
            for i, r in enumerate(self.rank_map):
                inv[r] = i
            object.__setattr__(self, "_index_of_rank", tuple(inv))
        else:
            object.__setattr__(self, "_index_of_rank", None)

    @classmethod
    def for_world(
        cls, world_size: int, gpus_per_node: int, gcds_per_gpu: int, rank_map: Sequence[int] | None = None
    ) -> Topology:
        """Derive the node count from the world size; refuse a world the enclosures do not divide."""
        per_node = gpus_per_node * gcds_per_gpu
        if per_node < 1 or world_size % per_node != 0:
            raise HierTopologyError(
                "topology",
                {"gpus_per_node": gpus_per_node, "gcds_per_gpu": gcds_per_gpu},
                f"world size {world_size} is not a multiple of gpus_per_node*gcds_per_gpu = "
                f"{per_node}; launch a multiple of {per_node} ranks or change the topology",
            )
        if rank_map is not None and len(rank_map) != world_size:
            raise HierTopologyError(
                "topology.rank_map", list(rank_map), f"give exactly {world_size} entries, one per rank"
            )
        return cls(
            world_size // per_node,
            gpus_per_node,
            gcds_per_gpu,
            None if rank_map is None else tuple(int(r) for r in rank_map),
        )

    # -- sizes ------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node * self.gcds_per_gpu

    @property
    def dims(self) -> tuple[int, int, int]:
        """Sizes along (node, gpu, gcd)."""
        return (self.num_nodes, self.gpus_per_node, self.gcds_per_gpu)

    def axis_size(self, axis: str) -> int:
        return self.dims[AXES.index(axis)]

    def axes_size(self, axes: Iterable[str]) -> int:
        n = 1
        for a in normalize_axes(axes):
            n *= self.axis_size(a)
        return n

    # -- rank <-> coordinate ----------------------------------------------------------------
    def index_of_rank(self, rank: int) -> int:
        if self._index_of_rank is not None:
            return self._index_of_rank[rank]
        if not 0 <= rank < self.world_size:
            raise IndexError(f"rank {rank} is outside the world of {self.world_size}")
        return rank

    def rank_of_index(self, index: int) -> int:
        return index if self.rank_map is None else self.rank_map[index]

    def coord(self, rank: int) -> Coord:
        i = self.index_of_rank(rank)
        n, p, g = self.dims
        return Coord(i // (p * g), (i // g) % p, i % g)

    def rank_of(self, coord: Coord | tuple[int, int, int]) -> int:
        node, gpu, gcd = coord
        n, p, g = self.dims
        return self.rank_of_index((node * p + gpu) * g + gcd)

    @property
    def is_identity_map(self) -> bool:
        return self.rank_map is None or list(self.rank_map) == list(range(self.world_size))

    def tier_between(self, a: int, b: int) -> str | None:
        """The slowest link a message from rank a to rank b crosses (None when a == b)."""
        ca, cb = self.coord(a), self.coord(b)
        if ca.node != cb.node:
            return "node"
        if ca.gpu != cb.gpu:
            return "gpu"
        if ca.gcd != cb.gcd:
            return "gcd"
        return None

    # -- group plans ------------------------------------------------------------------------
    def peers(self, rank: int, axes: Iterable[str]) -> tuple[int, ...]:
        """Ranks that share every coordinate of ``rank`` except those along ``axes``.

        Ordered row-major by their coordinates along ``axes`` (canonical axis order), which is
        the order every layout function assumes for the blocks of a collective. Index
        arithmetic, O(group): the node group holds every node at Frontier's size, and a rank's
        start-up computes it for itself and its tick peers ([Note: tick agreement]).
        """
        axes = normalize_axes(axes)
        i = self.index_of_rank(rank)
        strides = self._strides()
        c = self.coord(rank)._asdict()
        base = i - sum(c[a] * strides[a] for a in axes)  # the member with zeros along ``axes``
        rmap = self.rank_map
        if rmap is None:
            return tuple(base + o for o in self._offsets(axes))
        return tuple(rmap[base + o] for o in self._offsets(axes))

    def _strides(self) -> dict[str, int]:
        _, p, g = self.dims
        return {"node": p * g, "gpu": g, "gcd": 1}

    def _offsets(self, which: Sequence[str]) -> list[int]:
        """Coordinate-index offsets of every combination along ``which``, row-major."""
        strides = self._strides()
        out = [0]
        for a in which:  # canonical order: the last axis varies fastest
            steps = [v * strides[a] for v in range(self.axis_size(a))]
            out = [o + s for o in out for s in steps]
        return out

    def group_plan(self, axes: Iterable[str]) -> tuple[tuple[int, ...], ...]:
        """Every group of ranks that differ only along ``axes``; deterministic order, so every
        rank creates the same groups in the same sequence: groups in row-major order of the other
        axes' coordinates (the order of each group's first coordinate index), members as
        ``peers`` orders them. Index arithmetic, one pass over the world: every rank computes
        this at start-up for every hop ([Note: groups at scale] in comm/groups.py), 56,448
        groups at Frontier's size."""
        axes = normalize_axes(axes)
        within = self._offsets(axes)  # a group's members, row-major along ``axes``
        bases = self._offsets([a for a in AXES if a not in axes])  # each group's first index
        rmap = self.rank_map
        if rmap is None:
            return tuple(tuple(b + o for o in within) for b in bases)
        return tuple(tuple(rmap[b + o] for o in within) for b in bases)
