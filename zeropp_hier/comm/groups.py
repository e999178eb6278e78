"""Process groups for the hops of a plan: the only module that creates groups.

One function, ``build_hop_groups``, creates the groups a rank needs.

[Note: groups at scale]
Every rank creates the same groups in the same order (``group_calls``, pure), in one of two ways:

* split (``SPLIT``): where torch can split groups from the default one (a device bound to it, as
  the launcher does on GPUs, and a backend that splits: NCCL, RCCL), one ``dist.split_group`` per
  hop axes with every group of that partition: every rank is in exactly one, so each call is one
  ``ncclCommSplit`` of the world with this rank's colour. 5 calls for every hop of every preset at
  any size (tests/unit/test_groups_at_scale.py counts them at 9,408 nodes).
* one call per group (``PER_GROUP``): everywhere else (gloo, the CPU), ``dist.new_group`` entered
  by every rank for every group of the world, members or not: 65,865 calls for the union of every
  preset's hops at Frontier's 9,408 nodes x 4 x 2 (56,456 for `frontier`'s; 1.4 s of one core on
  PyTorch's fake backend), 296 at 48 nodes. A non-member's call returns at once on gloo.

Why not ``new_group`` on GPUs: with a bound device, torch makes each of those calls a split of
the default group, a collective of the whole world (the non-members' a no-colour split), so the
loop would be 65,865 world-wide collectives at full scale. Why not each rank's own groups only
(``use_local_synchronization``): on a bound device the split is still a collective of the whole
parent, so the non-members' absence hangs it; and a group re-created in one process (``auto``'s
probe, then the engine) gets the same hashed name and meets its predecessor's stale rendezvous
keys (gloo "Connection refused" on 8 ranks). The split path has not run yet: no GPU machine with
two or more devices has been lent to this project (docs/gpu.md); on the CPU torch cannot split (it needs an
accelerator), so ``creation_mode`` takes one call per group there. The dry run (dryrun/mirror.py)
takes the split path, each split answered by this rank's own group: what a Frontier rank's start-up
pays, not the CPU loop's.

A split group is named by torch from its members alone, and two live groups may not share a
name; so a partition split before and still alive (a second hop with the same members, as
("node",) and ("node", "gpu") are with one package per node, or a second engine in the process)
is not split again but shared, counted in ``SPLITS``, and destroyed when its last user releases it
(``release_hop_groups``). A partition is known there by its topology and its axes that span more
than one rank (the same groups exactly), not by a copy of its groups: that would keep every rank
of the world in memory for each hop.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, Iterable, NamedTuple, Sequence, TypeVar

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


SPLIT = "split"
PER_GROUP = "per_group"


G = TypeVar("G")


class SharedGroups(Generic[G]):
    """Live groups by key with a count of users ([Note: groups at scale]): ``acquire`` makes a
    group once per key while it is alive; ``release`` destroys it with its last user."""

    def __init__(self) -> None:
        self._by_key: dict[Hashable, list] = {}  # key -> [group, users]
        self._key_of: dict[int, Hashable] = {}  # id(group) -> key

    def acquire(self, key: Hashable, make: Callable[[], G]) -> G:
        entry = self._by_key.get(key)
        if entry is None:
            entry = self._by_key[key] = [make(), 0]
            self._key_of[id(entry[0])] = key
        entry[1] += 1
        return entry[0]

    def release(self, group: G, destroy: Callable[[G], object]) -> None:
        """One user fewer for ``group``; a group this registry never made is destroyed now."""
        key = self._key_of.get(id(group))
        if key is None:
            destroy(group)
            return
        entry = self._by_key[key]
        entry[1] -= 1
        if entry[1] == 0:
            del self._by_key[key], self._key_of[id(group)]
            destroy(group)

    def __len__(self) -> int:
        return len(self._by_key)


SPLITS: SharedGroups[dist.ProcessGroup | None] = SharedGroups()  # this process's split hop groups


class GroupCall(NamedTuple):
    """One group-creating call every rank makes: ``groups`` holds one group (``new_group``) or
    every group of a partition (``split_group``), each in block (coordinate) order."""

    axes: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]


def wanted_axes(topo: Topology, axes_sets: Iterable[Iterable[str]]) -> list[tuple[str, ...]]:
    """The distinct hop axes that span more than one rank, first-seen order."""
    wanted: list[tuple[str, ...]] = []
    for axes in axes_sets:
        axes = normalize_axes(axes)
        if axes not in wanted and topo.axes_size(axes) > 1:
            wanted.append(axes)
    return wanted


def group_calls(topo: Topology, axes_sets: Iterable[Iterable[str]], how: str) -> list[GroupCall]:
    """Every group-creating call of a rank, in the one order of every rank ([Note: groups at
    scale]). Pure."""
    if how not in (SPLIT, PER_GROUP):
        raise ValueError(f"group_calls how = {how!r}: use {SPLIT!r} or {PER_GROUP!r}")
    calls = []
    for axes in wanted_axes(topo, axes_sets):
        plan = topo.group_plan(axes)
        if how == SPLIT:
            calls.append(GroupCall(axes, plan))
        else:
            calls.extend(GroupCall(axes, (members,)) for members in plan)
    return calls


def creation_mode() -> str:
    """``SPLIT`` where torch can split the default group (a bound device and a backend that
    splits), else ``PER_GROUP``. The same on every rank: every rank binds its device, or none."""
    default = dist.distributed_c10d._get_default_group()
    device = default.bound_device_id
    if device is None:
        return PER_GROUP
    try:
        backend = default._get_backend(device)
    except RuntimeError:
        return PER_GROUP
    return SPLIT if getattr(backend, "supports_splitting", False) else PER_GROUP


def _hop_group(
    axes: tuple[str, ...], pg: dist.ProcessGroup, members: Sequence[int], timeout_s: float | None
) -> HopGroup:
    if timeout_s is not None:
        set_group_timeout(pg, timeout_s)
    torch_order = sorted(members)
    if torch_order == list(members):
        return HopGroup(axes, pg, tuple(members), None, None, timeout_s)
    # O(n log n): the node group holds every node at Frontier's size
    torch_from_peer = torch.argsort(torch.tensor(members))  # torch's i-th member's block
    peer_from_torch = torch.argsort(torch_from_peer)  # block i's place in torch's order
    return HopGroup(axes, pg, tuple(members), peer_from_torch, torch_from_peer, timeout_s)


def build_hop_groups(
    topo: Topology, axes_sets: Iterable[Iterable[str]], rank: int, timeout_s: float | None = None
) -> dict[tuple[str, ...], HopGroup]:
    how = creation_mode()
    setup = as_timedelta(setup_timeout(timeout_s))
    out: dict[tuple[str, ...], HopGroup] = {}
    for call in group_calls(topo, axes_sets, how):  # same order on every rank
        if how == SPLIT:
            mine = next(m for m in call.groups if rank in m)  # each rank is in one group of a partition
            split_ranks = [sorted(m) for m in call.groups]
            # the partition's identity without a copy of it (every rank of the world) kept
            # alive: its axes that span more than one rank, in this topology
            key = (topo, tuple(a for a in call.axes if topo.axis_size(a) > 1))
            desc = "hop:" + "+".join(call.axes)
            pg = SPLITS.acquire(key, lambda: dist.split_group(split_ranks=split_ranks, timeout=setup, group_desc=desc))
            if not isinstance(pg, dist.ProcessGroup):  # a partition holds every rank: torch said otherwise
                raise RuntimeError(f"split_group returned no group for rank {rank} on hop {call.axes}")
            out[call.axes] = _hop_group(call.axes, pg, mine, timeout_s)
            continue
        (members,) = call.groups
        pg = dist.new_group(ranks=sorted(members), timeout=setup)
        if rank in members:
            out[call.axes] = _hop_group(call.axes, pg, members, timeout_s)
    return out


def release_hop_groups(groups: dict[tuple[str, ...], HopGroup]) -> None:
    """Destroy the groups ``build_hop_groups`` made (a shared split group with its last user),
    and empty ``groups`` in place."""
    for hg in groups.values():
        SPLITS.release(hg.group, dist.destroy_process_group)
    groups.clear()


def build_tick_group(topo: Topology, timeout_s: float | None = None) -> dist.ProcessGroup:
    """The one group of every rank that carries every hop's transfers in the tick mode ([Note:
    ticks] in comm/tick/plan.py); collective: every rank creates it, after its hop groups.
    Our own, not the default group, so that it gets ``collective_timeout_s`` ([Note: failure
    detection]) and DeepSpeed's collectives never share its communicator."""
    pg = dist.new_group(ranks=list(range(topo.world_size)), timeout=as_timedelta(setup_timeout(timeout_s)))
    if timeout_s is not None:
        set_group_timeout(pg, timeout_s)
    return pg
