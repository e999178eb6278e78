"""Process groups for the hops of a plan: the only module that creates groups.

One function, ``build_hop_groups``, creates the groups a rank needs.

[Note: groups at scale]
``torch.distributed.new_group`` is entered by every rank for every group, members or not, in the
same order; so a rank makes one call per group of the world: 56,456 for the `frontier` hops at
Frontier's 9,408 nodes x 4 x 2 (1.4 s of one core and 240 MB on PyTorch's fake backend,
tests/unit/test_groups_at_scale.py), 296 at 48 nodes. On gloo and on NCCL/RCCL without a bound
device a non-member's call returns at once. With the device bound to the default group (as the
launcher does on GPUs, so that groups are split from it), PyTorch makes each non-member call a
no-colour ``ncclCommSplit`` of the world, a collective: cheap at 48 nodes, a start-up cost that
grows with the world at thousands of nodes (not measured: no GPU). Creating each rank's own
groups only (``use_local_synchronization``) would end the loop but cannot be used as is: the
split is a collective of the whole parent, and a group re-created in one process (``auto``'s
probe, then the engine) gets the same hashed name and meets its predecessor's stale rendezvous
keys (seen as gloo "Connection refused" on 8 ranks).
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
    for axes in wanted:  # same order on every rank ([Note: groups at scale])
        for members in topo.group_plan(axes):
            torch_order = sorted(members)
            pg = dist.new_group(ranks=torch_order, timeout=as_timedelta(setup_timeout(timeout_s)))
            if rank in members:
                if timeout_s is not None:
                    set_group_timeout(pg, timeout_s)
                if torch_order == list(members):
                    peer_from_torch = torch_from_peer = None
                else:
                    # O(n log n): the node group holds every node at Frontier's size
                    torch_from_peer = torch.argsort(torch.tensor(members))  # torch's i-th member's block
                    peer_from_torch = torch.argsort(torch_from_peer)  # block i's place in torch's order
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
