"""The arithmetic of benchmarks/gpu/tick_work.py (benchmarks/cpu/tick_work.py): ticks per phase of
one layer from the runtime's schedule and chunking, the bytes its kernels encode and decode, and
the per-tick summary, at Frontier's 48 x 4 x 2 for one GPT-NeoX-20B layer ([Note: tick work of
one layer])."""

import pytest

from benchmarks.cpu import layer_cost as lc
from benchmarks.cpu import tick_work as tw
from zeropp_hier import planner
from zeropp_hier.app.spec import MODELS, n_params
from zeropp_hier.core.config import MAX_PIPELINE_CHUNKS
from zeropp_hier.core.topology import Topology

FRONTIER = Topology(48, 4, 2)
NEOX_20B = MODELS["neox_20b"]


def _layer():
    numels = lc.neox_layer_numels(NEOX_20B.hidden, NEOX_20B.intermediate)
    plan = lc.plan_of("frontier", FRONTIER)
    return numels, plan, lc.shard_elems(numels, FRONTIER.world_size, 256)


def test_ticks_of_one_20b_layer_follow_chunks_plus_sub_hops_minus_one():
    numels, plan, width = _layer()
    got = tw.layer_ticks(plan, FRONTIER, width, 8)
    # forward: 8 chunks over node (48 members > 32: log2 48 -> 6 log steps), gpu, gcd: 8 sub-hops
    assert [h.tier for h in plan.forward] == ["node", "gpu", "gcd"]
    assert got["forward_gather"] == 8 + (6 + 1 + 1) - 1
    # backward: from the copy kept over node and gpu, the gcd hop only
    assert [h.tier for h in plan.backward_for(plan.kept_axes)] == ["gcd"]
    assert got["backward_gather"] == 8 + 1 - 1
    # reduce: streamed column chunks of at most 2^24 elements over the 384 rows (1/8 of the row
    # is more: 384 x width / 8 > 2^24), each through three direct stages (48 <= 256 members)
    w = FRONTIER.world_size
    assert w * -(-width // 8) > 2**24
    per_row = -(-(2**24) // w)  # ceil(2^24 / W) columns, then whole 256-element blocks
    step = -(-per_row // 256) * 256
    assert got["grad_reduce"] == -(-width // step) + 3 - 1


def test_ticks_where_one_chunk_per_eighth_of_the_row_binds():
    topo = Topology(4, 4, 2)  # 32 ranks: every hop direct
    plan = lc.plan_of("frontier", topo)
    width = 256 * 64
    got = tw.layer_ticks(plan, topo, width, 8)
    assert got == {"forward_gather": 8 + 3 - 1, "backward_gather": 8 + 1 - 1, "grad_reduce": 8 + 3 - 1}
    assert tw.reduce_chunks(width, 256, 32, 8) == 8
    assert tw.reduce_chunks(width, 256, 32, 1) == 1  # 32 x 16384 elements: one streamed chunk
    assert tw.piece_ticks(topo, plan.forward, "gather", 0) == 0


def test_bytes_encoded_and_decoded_are_the_plans_payloads():
    assert tw.payload_bytes(512, 8, 256) == 512 + 2 * 4
    assert tw.payload_bytes(512, 4, 256) == 256 + 2 * 4
    numels, plan, width = _layer()
    w = FRONTIER.world_size
    got = tw.codec_bytes(lc.layer_kernels(numels, FRONTIER, "frontier", 8).calls)
    int8 = lambda n: n + 4 * n // 256  # noqa: E731 - bytes of n int8 elements and their scales
    # forward: this rank's share encoded once (int8 at the node hop), the whole layer decoded
    assert got["forward_gather"] == (int8(width), int8(w * width))
    # backward: nothing encoded (the kept copy is), the whole layer decoded again
    assert got["backward_gather"] == (0, int8(w * width))
    # reduce: each stage encodes its whole buffer and decodes the k payloads it receives: the
    # same bytes (a stage receives as many as it sends), gcd int8 over W x C, gpu int8 over
    # W x C / 2, node int8 over W x C / 8
    enc, dec = got["grad_reduce"]
    assert enc == dec == int8(w * width) + int8(w * width // 2) + int8(w * width // 8)


def test_summary_per_tick_and_which_side_bounds():
    s = tw.summarise(4, [0.008, 0.004, 0.006], [0.002, 0.002, 0.003], [0.001, 0.003])
    assert s.host_ms_per_tick == pytest.approx(1.5) and s.device_ms_per_tick == pytest.approx(0.5)
    assert s.host_over_device == pytest.approx(3.0) and s.host_ms_max_interval == pytest.approx(3.0)
    assert tw.summarise(0, [0.0], [0.0], []).host_over_device is None
    row = {"ticks": 4, "grouped_calls": 5, "host_ms_per_tick": 1.5, "device_ms_per_tick": None}
    lines = tw.table({"grad_reduce": {**row, "host_over_device": None, "bytes_encoded": 2e6, "bytes_decoded": 0}})
    assert lines[1].split()[:4] == ["grad_reduce", "4", "5", "1.500"] and "2.00" in lines[1]
    assert lines[1].split()[-1] == "-"  # host syncs not checked (no CUDA)
    synced = {**row, "host_over_device": None, "bytes_encoded": 0, "bytes_decoded": 0, "host_syncs": {"a": 2, "b": 1}}
    assert tw.table({"forward_gather": synced})[1].split()[-1] == "3"


def test_plan_chunks_is_the_planners_choice_for_frontier_at_48_nodes():
    n = tw.plan_chunks(48)
    assert 1 <= n <= MAX_PIPELINE_CHUNKS
    # the frontier row of the planner's ranking for the same workload carries the same count
    spec = NEOX_20B
    wl = planner.gpt_workload(n_params(spec), spec.layers, spec.hidden, spec.seq_len, 1)
    rows = {p.candidate.name: p for p in planner.rank(planner.frontier(48), wl)}
    assert rows["frontier"].chunks == n
    _, plan, width = _layer()
    assert tw.layer_ticks(plan, FRONTIER, width, n)["forward_gather"] == n + 8 - 1
