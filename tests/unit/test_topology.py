"""Topology maths, exhaustively over small shapes (no processes)."""

import itertools

import pytest

from zeropp_hier.core.errors import HierTopologyError
from zeropp_hier.core.topology import Topology
from zeropp_hier.core.vocab import AXES

SHAPES = [(1, 1, 1), (2, 2, 2), (1, 2, 2), (3, 1, 2), (2, 4, 2), (3, 2, 1)]


@pytest.mark.parametrize("shape", SHAPES)
def test_default_map_formula_and_roundtrip(shape):
    n, p, g = shape
    t = Topology(n, p, g)
    for r in range(t.world_size):
        c = t.coord(r)
        assert r == c.gcd + g * (c.gpu + p * c.node)
        assert t.rank_of(c) == r


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("axes", [a for k in range(1, 4) for a in itertools.combinations(AXES, k)])
def test_group_plan_partitions_the_world(shape, axes):
    t = Topology(*shape)
    plan = t.group_plan(axes)
    members = [r for grp in plan for r in grp]
    assert sorted(members) == list(range(t.world_size))  # every rank in exactly one group
    for grp in plan:
        assert len(grp) == t.axes_size(axes)
        coords = [t.coord(r) for r in grp]
        for axis in AXES:  # members agree on every axis outside the hop
            if axis not in axes:
                assert len({getattr(c, axis) for c in coords}) == 1
        for r in grp:
            assert t.peers(r, axes) == grp  # same order seen from every member


def _plan_by_peers(t: Topology, axes) -> tuple:
    """The group plan as first defined: walk the coordinate indices, each unseen rank's peers."""
    seen: set[int] = set()
    plan = []
    for index in range(t.world_size):
        r = t.rank_of_index(index)
        if r not in seen:
            members = t.peers(r, axes)
            seen.update(members)
            plan.append(members)
    return tuple(plan)


@pytest.mark.parametrize("shape", SHAPES + [(7, 2, 3), (4, 4, 2)])
@pytest.mark.parametrize("mapping", ["identity", "reversed", "shuffled"])
def test_group_plan_by_index_arithmetic_is_the_walk_over_peers(shape, mapping):
    """Every rank creates the groups in this order: the arithmetic (one pass, no per-rank peers
    lists) must give the walk's groups, members and order exactly, under any rank map."""
    import random

    n, p, g = shape
    w = n * p * g
    rank_map = {"identity": None, "reversed": list(range(w))[::-1], "shuffled": random.Random(w).sample(range(w), w)}
    t = Topology.for_world(w, p, g, rank_map=rank_map[mapping])
    for axes in [a for k in range(1, 4) for a in itertools.combinations(AXES, k)]:
        assert t.group_plan(axes) == _plan_by_peers(t, axes), axes


def _peers_by_coordinates(t: Topology, rank: int, axes) -> tuple:
    """``peers`` as first defined: every combination of coordinates along ``axes`` (row-major,
    canonical order), the others ``rank``'s, each mapped to its rank."""
    c = t.coord(rank)._asdict()
    out = []
    for vals in itertools.product(*(range(t.axis_size(a)) for a in axes)):
        cc = {**c, **dict(zip(axes, vals))}
        out.append(t.rank_of((cc["node"], cc["gpu"], cc["gcd"])))
    return tuple(out)


@pytest.mark.parametrize("shape", SHAPES + [(7, 2, 3), (4, 4, 2)])
@pytest.mark.parametrize("mapping", ["identity", "reversed", "shuffled"])
def test_peers_by_index_arithmetic_are_the_coordinate_walk(shape, mapping):
    """``peers`` (index arithmetic, O(group)) gives, for every rank and hop, the members and
    order of the walk over coordinates, under any rank map."""
    import random

    n, p, g = shape
    w = n * p * g
    rank_map = {
        "identity": None,
        "reversed": list(range(w))[::-1],
        "shuffled": random.Random(w + 1).sample(range(w), w),
    }
    t = Topology.for_world(w, p, g, rank_map=rank_map[mapping])
    for axes in [a for k in range(1, 4) for a in itertools.combinations(AXES, k)]:
        for r in range(w):
            assert t.peers(r, axes) == _peers_by_coordinates(t, r, axes), (axes, r)


def test_rank_map_is_honoured_and_validated():
    rank_map = [3, 6, 0, 5, 2, 7, 1, 4]
    t = Topology.for_world(8, 2, 2, rank_map)
    for i, r in enumerate(rank_map):
        assert t.index_of_rank(r) == i and t.rank_of_index(i) == r
    assert t.coord(3) == (0, 0, 0) and t.coord(4) == (1, 1, 1)
    assert t.tier_between(3, 6) == "gcd" and t.tier_between(3, 0) == "gpu" and t.tier_between(3, 2) == "node"
    with pytest.raises(HierTopologyError, match="rank_map.*permutation of 0..7"):
        Topology.for_world(8, 2, 2, [0, 1, 2, 3, 4, 5, 6, 6])
    with pytest.raises(HierTopologyError, match="exactly 8 entries"):
        Topology.for_world(8, 2, 2, [0, 1, 2])


def test_world_not_divisible_names_sizes_and_fix():
    with pytest.raises(HierTopologyError) as e:
        Topology.for_world(6, 4, 2)
    msg = str(e.value)
    assert "world size 6 is not a multiple of gpus_per_node*gcds_per_gpu = 8" in msg
    assert "launch a multiple of 8 ranks" in msg


def test_tier_between():
    t = Topology(2, 2, 2)
    assert t.tier_between(0, 0) is None
    assert t.tier_between(0, 1) == "gcd"
    assert t.tier_between(0, 2) == "gpu"
    assert t.tier_between(1, 7) == "node"
