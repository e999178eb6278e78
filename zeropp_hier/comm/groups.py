"""Process groups for the hops of a plan: the only module that creates groups.

One function, ``build_hop_groups``, creates every group every rank needs, in the same order on
every rank (``torch.distributed.new_group`` must be entered by all ranks for every group).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import torch
import torch.distributed as dist

from ..core.topology import Topology, normalize_axes
from .failures import as_timedelta, set_group_timeout, setup_timeout


class HopGroup(NamedTuple):
    axes: tuple[str, ...]
    group: dist.ProcessGroup
    peers: tuple[int, ...]  # members in block (coordinate) order
    # torch orders a group's members by global rank. ``x.index_select(0, peer_from_torch)``
    # turns blocks in torch's order into peer order, ``torch_from_peer`` the other way round
    # (both None when the two orders agree, as with the default rank map).
    peer_from_torch: torch.Tensor | None
    torch_from_peer: torch.Tensor | None
    timeout_s: float | None = None  # the group's collective timeout ([Note: failure detection])


def build_hop_groups(
    topo: Topology, axes_sets: Iterable[Iterable[str]], rank: int, timeout_s: float | None = None
) -> dict[tuple[str, ...], HopGroup]:
    wanted = []
    for axes in axes_sets:
        axes = normalize_axes(axes)
        if axes not in wanted and topo.axes_size(axes) > 1:
            wanted.append(axes)
    out: dict[tuple[str, ...], HopGroup] = {}
    for axes in wanted:  # same order on every rank
        for members in topo.group_plan(axes):
            pg = dist.new_group(ranks=sorted(members), timeout=as_timedelta(setup_timeout(timeout_s)))
            if rank in members:
                if timeout_s is not None:
                    set_group_timeout(pg, timeout_s)
                torch_order = sorted(members)
                if list(torch_order) == list(members):
                    peer_from_torch = torch_from_peer = None
                else:
                    peer_from_torch = torch.tensor([torch_order.index(r) for r in members])
                    torch_from_peer = torch.tensor([members.index(r) for r in torch_order])
                out[axes] = HopGroup(axes, pg, members, peer_from_torch, torch_from_peer, timeout_s)
    return out


def build_tick_group(topo: Topology, timeout_s: float | None = None) -> dist.ProcessGroup:
    """The one group of every rank that carries every hop's transfers in the tick mode ([Note:
    ticks] in comm/tick_plan.py); collective: every rank creates it, after its hop groups.
    Our own, not the default group, so that it gets ``collective_timeout_s`` ([Note: failure
    detection]) and DeepSpeed's collectives never share its communicator."""
    pg = dist.new_group(ranks=list(range(topo.world_size)), timeout=as_timedelta(setup_timeout(timeout_s)))
    if timeout_s is not None:
        set_group_timeout(pg, timeout_s)
    return pg
