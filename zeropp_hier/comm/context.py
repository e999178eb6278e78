"""What the gather and reduce-scatter drivers run on, for one rank of one job: the plan, the
collectives over this rank's hop groups, the executor that orders them, the hooks, and the map
between global ranks and coordinate order. Plain state: no DeepSpeed, no parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, TypeVar

import torch

from ..core import layout
from ..core.plan import CommPlan
from ..core.topology import Coord, Topology
from .collectives import HierCollectives, Steps, Wire
from .executor import CommExecutor
from .hooks import NO_HOOKS, HookSource

R = TypeVar("R")


@dataclass
class CommContext:
    topo: Topology
    rank: int
    plan: CommPlan
    coll: HierCollectives
    executor: CommExecutor
    hooks: HookSource = NO_HOOKS
    # elements (all rows together) of one column chunk of a gradient bucket's stages
    # ([Note: streamed gradient stages] in comm/reduce.py)
    stream_chunk_elems: int = layout.STREAM_CHUNK_ELEMS
    # column chunks of a gradient bucket run as separate, pipelined jobs (``zeropp_hier.pipeline``,
    # [Note: chunked gathers] in comm/gather.py); 1: one job
    pipeline_chunks: int = 1
    me: Coord = field(init=False)
    _index_order: torch.Tensor | None = field(init=False, repr=False)
    _rank_order: torch.Tensor | None = field(init=False, repr=False)
    _perms: layout.DevicePerms = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.me = self.topo.coord(self.rank)
        self._index_order = layout.index_order(self.topo)  # host copies; per device in _perms
        self._rank_order = layout.rank_order(self.topo)
        self._perms = layout.DevicePerms()  # [Note: no host traffic in the hot path]

    def wire(self, steps: Steps[R]) -> Generator[Wire, torch.Tensor, R]:
        """A hop's transfer ([Note: collectives as steps] in comm/collectives.py): issued here by
        the hop group's collective, or, when the executor runs ticks ([Note: ticks] in
        comm/tick/plan.py), yielded to it (the job's driver sends the received rows back)."""
        if self.executor.yields_wires:
            return (yield from steps)
        return self.coll.drive(steps)

    @property
    def world(self) -> int:
        return self.topo.world_size

    def rows_by_rank(self, rows: torch.Tensor) -> torch.Tensor:
        """[world, ...] rows in coordinate order -> in global rank order."""
        if self._rank_order is None:
            return rows
        return rows.index_select(0, self._perms.get("rank", self._rank_order, rows.device))

    def rows_by_coord(self, rows: torch.Tensor) -> torch.Tensor:
        """[world, ...] rows in global rank order -> in coordinate order."""
        if self._index_order is None:
            return rows
        return rows.index_select(0, self._perms.get("index", self._index_order, rows.device))
