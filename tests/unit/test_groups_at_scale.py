"""Every hop group of a Frontier-sized world (48 nodes x 4 packages x 2 GCDs = 384 ranks), built
by the one group-building place (``comm/groups.build_hop_groups``) on PyTorch's fake
process-group backend, as FSDP2 and torchtitan check group construction at scale: no process
and no message per rank, but the same ``new_group`` calls in the same order as a real job.

A rank's view is built in a fresh interpreter (``init_process_group`` once per process, as in a
job) for a sample of ranks: the first, the last and one in the middle; its groups are checked
against ``core/topology.py`` directly (coordinates, not ``Topology.peers``, which the builder
itself uses)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODES, GPUS, GCDS = 48, 4, 2
WORLD = NODES * GPUS * GCDS
SAMPLE = (0, WORLD // 2 + 3, WORLD - 1)

CHILD = r"""
import json, sys
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from zeropp_hier.comm.groups import build_hop_groups
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.policy import CompressionConfig
from zeropp_hier.core.topology import Topology

rank, nodes, gpus, gcds, reverse, mirror = (int(a) for a in sys.argv[1:7])
world = nodes * gpus * gcds
topo = Topology(nodes, gpus, gcds, tuple(reversed(range(world))) if reverse else None)
# every hop of every preset, each kept level included: the union a job of any preset may build
axes_sets = []
for preset in ("zero3", "zeropp", "frontier"):
    plan = make_plan(preset, CompressionConfig(), topo)
    hops = [*plan.forward, *plan.reduce, *(h for _, level in plan.by_level for h in level)]
    axes_sets += [h.axes for h in hops]
dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=topo.world_size)
if mirror:  # the dry run's stand-in: groups split as on GPUs
    from zeropp_hier.dryrun.meters import Meters
    from zeropp_hier.dryrun.mirror import Mirror
    Mirror(Meters(trace_memory=False)).install()
calls = []
real_new_group = dist.new_group
def counted(*args, **kwargs):  # records, then creates the group for real (fake backend)
    ranks = kwargs["ranks"]
    calls.append([len(ranks), bool(kwargs.get("use_local_synchronization")), rank in ranks])
    return real_new_group(*args, **kwargs)
dist.new_group = counted
groups = build_hop_groups(topo, axes_sets, rank)
out = {"_calls": calls}
for axes, hg in groups.items():
    torch_ranks = dist.get_process_group_ranks(hg.group)
    out["+".join(axes)] = {
        "peers": list(hg.peers) if len(hg.peers) <= 4096 else [],
        "peer_count": len(hg.peers),
        "torch_ranks": torch_ranks if len(torch_ranks) <= 4096 else [],
        "group_size": hg.group.size(),
        "my_group_rank": hg.group.rank(),
    }
out["_asked"] = sorted({"+".join(a) for a in axes_sets})
from zeropp_hier.comm.groups import creation_mode
out["_mode"] = creation_mode()
dist.destroy_process_group()
print(json.dumps(out))
"""


def _view(rank: int, nodes: int = NODES, reverse: bool = False, mirror: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(rank),
            str(nodes),
            str(GPUS),
            str(GCDS),
            str(int(reverse)),
            str(int(mirror)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _expected(rank: int, axes: tuple[str, ...]) -> list[int]:
    """The ranks that share every coordinate of ``rank`` but those along ``axes``, from the
    identity rank map (rank = gcd + GCDS * (gpu + GPUS * node)), ascending."""
    node, gpu, gcd = rank // (GPUS * GCDS), (rank // GCDS) % GPUS, rank % GCDS
    nodes = range(NODES) if "node" in axes else [node]
    gpus = range(GPUS) if "gpu" in axes else [gpu]
    gcds = range(GCDS) if "gcd" in axes else [gcd]
    return sorted(c + GCDS * (p + GPUS * n) for n in nodes for p in gpus for c in gcds)


@pytest.mark.parametrize("rank", SAMPLE)
def test_hop_groups_of_a_frontier_sized_world(rank):
    from zeropp_hier.core.topology import Topology

    view = _view(rank)
    asked = view.pop("_asked")
    view.pop("_calls")
    assert view.pop("_mode") == "per_group"  # the fake backend binds no device
    topo = Topology(NODES, GPUS, GCDS)
    # every hop every preset takes is built (none spans a single rank at this size)
    assert sorted(view) == asked
    assert set(view) == {"gcd", "gpu", "node", "gpu+gcd", "node+gpu+gcd"}
    for name, g in view.items():
        axes = tuple(name.split("+"))
        want = _expected(rank, axes)
        assert g["torch_ranks"] == want, name  # membership, ranks ascending
        assert g["peers"] == want, name  # the identity map: block order is rank order too
        assert g["group_size"] == len(want) == topo.axes_size(axes)
        assert g["my_group_rank"] == want.index(rank)
        # the peers differ from this rank only along the hop's axes
        me = topo.coord(rank)
        for peer in g["peers"]:
            c = topo.coord(peer)
            for i, axis in enumerate(("node", "gpu", "gcd")):
                if axis not in axes:
                    assert c[i] == me[i], (name, peer)


def test_group_plans_partition_the_world():
    """The plans every rank walks to create its groups (the same sequence on every rank): for
    each hop's axes the groups are disjoint, cover all 384 ranks, and are the coordinate sets."""
    from zeropp_hier.core.topology import Topology

    topo = Topology(NODES, GPUS, GCDS)
    for axes in [("gcd",), ("gpu",), ("node",), ("gpu", "gcd"), ("node", "gpu"), ("node", "gpu", "gcd")]:
        plan = topo.group_plan(axes)
        flat = [r for members in plan for r in members]
        assert sorted(flat) == list(range(WORLD)), axes
        assert len(plan) == WORLD // topo.axes_size(axes)
        for members in plan:
            assert sorted(members) == _expected(members[0], axes)


@pytest.mark.parametrize("reverse", [False, True])
def test_group_construction_at_all_of_frontier_is_one_call_per_group_of_the_world(reverse):
    """[Note: groups at scale]: at 9,408 nodes x 4 x 2 a rank enters ``new_group`` once per
    group of the world (every rank must), gets its own five groups right, and computes the node
    group's orders without a quadratic search (a reversed rank map makes block order differ
    from torch's order)."""
    from zeropp_hier.core.topology import Topology

    nodes = 9408
    world = nodes * GPUS * GCDS
    rank = 75_261  # near the end of the 75,264 ranks
    view = _view(rank, nodes, reverse)
    calls = view.pop("_calls")
    asked = view.pop("_asked")
    view.pop("_mode")
    topo = Topology(nodes, GPUS, GCDS, tuple(reversed(range(world))) if reverse else None)
    assert sorted(view) == asked and len(asked) == 5
    # every group of every hop, in the one order: the count is the world's, not this rank's
    assert (
        len(calls) == sum(world // topo.axes_size(tuple(n.split("+"))) for n in asked) == 65_865
    )  # the union of every preset
    assert sum(member for _, _, member in calls) == 5 and not any(local for _, local, _ in calls)
    _assert_groups_are_this_ranks(view, topo, rank)


def _assert_groups_are_this_ranks(view: dict, topo, rank: int) -> None:
    """Each hop's group as the rank sees it: its size, and where it has peers, the topology's
    peers of ``rank`` in order, torch's ranks of the group and this rank's place in it."""
    for name, g in view.items():
        axes = tuple(name.split("+"))
        assert g["group_size"] == g["peer_count"] == topo.axes_size(axes), name
        if g["peers"]:
            assert g["peers"] == list(topo.peers(rank, axes)) and g["torch_ranks"] == sorted(g["peers"])
            assert g["my_group_rank"] == sorted(g["peers"]).index(rank)


def test_the_dry_run_splits_as_a_gpu_job_and_makes_only_its_own_groups_at_all_of_frontier():
    """[Note: groups at scale], [Note: the SPMD mirror]: under the dry run's mirror a rank takes
    the GPU job's path, one split per hop axes, each answered by a ``new_group`` of its own
    group alone (local synchronization: no other member calls it), not one call per group of
    the world; its five groups are the same as the per-group path's, under a reversed map."""
    from zeropp_hier.core.topology import Topology

    nodes = 9408
    world = nodes * GPUS * GCDS
    rank = 75_261
    view = _view(rank, nodes, reverse=True, mirror=True)
    calls = view.pop("_calls")
    asked = view.pop("_asked")
    assert view.pop("_mode") == "split"
    topo = Topology(nodes, GPUS, GCDS, tuple(reversed(range(world))))
    assert sorted(view) == asked and len(asked) == 5
    assert len(calls) == 5 and all(local and member for _, local, member in calls)
    assert sorted(n for n, _, _ in calls) == sorted(topo.axes_size(tuple(a.split("+"))) for a in asked)
    _assert_groups_are_this_ranks(view, topo, rank)


def test_split_creation_is_one_call_per_hop_axes_at_all_of_frontier():
    """[Note: groups at scale]: where the device is bound (GPUs), one ``split_group`` per hop
    axes, each carrying the whole partition, against one ``new_group`` per group of the world
    elsewhere; both walk the same groups in the same order."""
    from zeropp_hier.comm.groups import PER_GROUP, SPLIT, group_calls
    from zeropp_hier.core.plan import make_plan
    from zeropp_hier.core.policy import CompressionConfig
    from zeropp_hier.core.topology import Topology

    topo = Topology(9408, GPUS, GCDS)
    axes_sets = []
    for preset in ("zero3", "zeropp", "frontier"):
        plan = make_plan(preset, CompressionConfig(), topo)
        hops = [*plan.forward, *plan.reduce, *(h for _, level in plan.by_level for h in level)]
        axes_sets += [h.axes for h in hops]
    split = group_calls(topo, axes_sets, SPLIT)
    per_group = group_calls(topo, axes_sets, PER_GROUP)
    assert len(split) == 5 and len(per_group) == 65_865
    assert [g for c in split for g in c.groups] == [c.groups[0] for c in per_group]
    for call in split:  # each call a partition of the world: every rank in exactly one group
        flat = sorted(r for members in call.groups for r in members)
        assert flat == list(range(topo.world_size)), call.axes
    with pytest.raises(ValueError, match="how"):
        group_calls(topo, axes_sets, "local")


def test_creation_mode_without_a_bound_device_is_one_call_per_group():
    """gloo and the fake backend bind no device: torch cannot split there."""
    view = _view(0, nodes=2)
    assert view["_mode"] == "per_group"


def test_a_split_partition_alive_is_shared_and_destroyed_with_its_last_user():
    """torch names a split group by its members and refuses two live groups of one name: a
    partition still alive is shared (a second hop with the same members, a second engine), and
    destroyed once, with its last user; a group the registry never made is destroyed at once."""
    from zeropp_hier.comm.groups import SharedGroups

    made, destroyed = [], []

    def make(tag):
        def fn():
            made.append(tag)
            return object()

        return fn

    reg: SharedGroups[object] = SharedGroups()
    a = reg.acquire(((0, 1), (2, 3)), make("a"))
    b = reg.acquire(((0, 1), (2, 3)), make("b"))  # same members: no second split
    c = reg.acquire(((0, 2), (1, 3)), make("c"))
    assert a is b and a is not c and made == ["a", "c"] and len(reg) == 2
    reg.release(a, destroyed.append)
    assert destroyed == []  # one user left
    reg.release(b, destroyed.append)
    assert destroyed == [a] and len(reg) == 1
    d = reg.acquire(((0, 1), (2, 3)), make("d"))  # released: made anew
    assert d is not a and made == ["a", "c", "d"]
    stranger = object()
    reg.release(stranger, destroyed.append)
    assert destroyed == [a, stranger]
