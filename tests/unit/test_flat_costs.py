"""Per-step costs of one rank at all of Frontier (9,408 nodes x 4 packages x 2 GCDs = 75,264
ranks), computed by the pure code: element counts, list lengths and bytes, never times
([Note: per-rank costs flat in the world] in core/layout.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zeropp_hier.comm import gather
from zeropp_hier.comm.numerics import Location, bitmap_bytes, verdict_of
from zeropp_hier.comm.stats import CommStats
from zeropp_hier.core import layout
from zeropp_hier.core.ranks_text import ranks_text
from zeropp_hier.core.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
NODES, GPUS, GCDS = 9408, 4, 2
WORLD = NODES * GPUS * GCDS
BLOCK = 256


def gpt_numels(vocab=2048, d=256, layers=3, ctx=256):
    """A GPT of about 3M parameters (the model of issue 59's measurement)."""
    per_layer = [d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d]
    return [vocab * d, ctx * d, *per_layer * layers, d, d]


def test_a_gradient_buckets_rows_stay_near_its_values_at_75264_ranks():
    numels = gpt_numels()
    grads = [torch.ones(n) for n in numels]
    packed = layout.pack_grad_rows(grads, WORLD, BLOCK, align_chunks=True)
    values = WORLD * sum(packed.chunk)  # DeepSpeed's own partitioning: ceil(numel / world) each
    # at most the values twice and one block per row; the whole-block slots would be 40 blocks
    # per row (771 M elements, 3.1 GB in fp32)
    assert packed.rows.numel() <= 2 * values + WORLD * BLOCK
    assert WORLD * sum(layout.aligned(c, BLOCK) for c in packed.chunk) > 30 * packed.rows.numel()
    # rows are still whole blocks: of the packed row's block ([Note: a packed row's block]), a power
    # of two from 32 to BLOCK
    assert 32 <= packed.block <= BLOCK and packed.block & (packed.block - 1) == 0
    assert packed.rows.shape[1] % packed.block == 0
    mine = layout.unpack_my_chunks(packed.rows[WORLD - 1], numels, packed.chunk, WORLD - 1, packed.slots)
    assert [t.numel() for t in mine] == [max(0, min(c, n - (WORLD - 1) * c)) for n, c in zip(numels, packed.chunk)]


def test_whole_block_slots_are_kept_where_they_cost_little():
    # a 20B-like bucket of large tensors at the same world: each chunk is many blocks, so the
    # alignment costs less than the values and every tensor keeps its own blocks
    numels = [6144 * 24576, 24576, 6144 * 6144 * 3, 6144] * 4
    chunks = [-(-n // WORLD) for n in numels]
    assert layout.block_slots(chunks, BLOCK, WORLD) == tuple(layout.aligned(c, BLOCK) for c in chunks)
    # and at test sizes (16 ranks) the padding is under the allowance: unchanged layout
    small = [-(-n // 16) for n in gpt_numels()]
    assert layout.block_slots(small, BLOCK, 16) == tuple(layout.aligned(c, BLOCK) for c in small)
    assert layout.block_slots(small, 1, WORLD) == tuple(small)  # nothing quantizes: no padding


def test_a_gathered_bucket_stays_near_its_values_at_75264_ranks():
    numels = [3 * 256 * 256, 3 * 256]  # one attention projection: weight and bias
    sizes = [-(-n // WORLD) for n in numels]
    slots = gather.slots_of(sizes, BLOCK, WORLD)
    assert sum(slots) % BLOCK == 0
    assert WORLD * sum(slots) <= 2 * WORLD * sum(sizes) + WORLD * BLOCK
    valid = layout.valid_of(sizes, slots)
    assert valid is not None and valid.count == sum(sizes)


def test_valid_columns_of_a_send_block_hold_one_rows_runs():
    numels = gpt_numels()
    chunks = [-(-n // 16) for n in numels]
    slots = layout.block_slots(chunks, BLOCK, 16)
    row = layout.valid_of(chunks, slots)
    assert row is not None
    block = row.tiled(WORLD // 2)  # a first stage's send block: half the world's rows
    assert len(block.runs) == len(row.runs) <= len(numels)  # one row's runs, whatever the rows
    assert block.count == row.count * (WORLD // 2) and block.length == row.length * (WORLD // 2)
    # the index is the same as the rows' runs spelled out (checked on a few rows)
    few = row.tiled(5)
    want = layout.Valid(few.tiled_runs(), few.length).index(1, torch.device("cpu"))
    assert torch.equal(few.index(1, torch.device("cpu")), want)
    want2 = layout.Valid(few.tiled_runs(), few.length).index(2, torch.device("cpu"))
    assert torch.equal(few.index(2, torch.device("cpu")), want2)


def test_byte_counters_look_at_a_world_group_once():
    topo = Topology(NODES, GPUS, GCDS)
    stats = CommStats(topo, 0)
    calls = {"n": 0}
    real = topo.tier_between

    class Counting:  # the topology, counting the per-peer lookups
        def __getattr__(self, name):
            return getattr(topo, name)

        def tier_between(self, a, b):
            calls["n"] += 1
            return real(a, b)

    stats.topo = Counting()  # type: ignore[assignment]
    peers = tuple(range(WORLD))  # a flat hop's group: the world
    stats.record_payload("grad_reduce", peers, 4)
    first = calls["n"]
    for _ in range(3):
        stats.record_payload("grad_reduce", peers, 4)
    assert calls["n"] == first  # every later call: no per-peer work
    assert stats.calls["grad_reduce"]["node"] == 4
    assert sum(stats.bytes["grad_reduce"].values()) == 4 * 4 * (WORLD - 1)


def test_a_verdict_names_the_first_and_last_ten_of_75264_ranks():
    locs = (Location("grad_reduce", None, "local"), Location("grad_reduce", "node", "stage 2"))
    bits = torch.zeros(len(locs), bitmap_bytes(WORLD), dtype=torch.uint8)
    bits[1] = 0xFF  # every rank flagged after the node stage
    v = verdict_of(locs, bits, WORLD)
    ((loc, ranks),) = v.seen
    assert loc == locs[1] and len(ranks) == 20 and ranks[:2] == (0, 1) and ranks[-1] == WORLD - 1
    assert v.as_list() == [{"phase": "grad_reduce", "tier": "node", "ranks": list(ranks), "count": WORLD}]
    assert bitmap_bytes(WORLD) == 9408  # the second round: one bit per rank and location


def test_rank_lists_in_messages_are_bounded():
    text = ranks_text(range(WORLD))
    assert len(text) < 200 and text.endswith(f"({WORLD} ranks)") and "75263" in text
    assert ranks_text([3, 7]) == "[3, 7]"  # a short list reads as before
    from zeropp_hier.comm.failures import HierCommError

    err = HierCommError(
        rank=0,
        phase="grad_reduce",
        tier="node",
        axes=("node",),
        peers=range(WORLD),
        kind="error",
        timeout_s=5.0,
        cause="",
    )
    assert len(str(err)) < 1000


AGREE = r"""
import json, sys
import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from zeropp_hier.comm.numerics import NonFiniteMonitor, Location

world = int(sys.argv[1])
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
sizes = []
real = dist.all_reduce
def counted(t, *a, **k):  # records the bytes, then runs the fake backend's all-reduce
    sizes.append(t.numel() * t.element_size())
    return real(t, *a, **k)
dist.all_reduce = counted
locs = tuple(Location("grad_reduce", t, t or "local") for t in (None, "gcd", "gpu", "node"))
m = NonFiniteMonitor(locs)
m.note(0, torch.ones(3))
clean = m.agree(0, world)
quiet = list(sizes)
m.note(2, torch.tensor([float("nan")]))
seen = m.agree(0, world)
print(json.dumps({"quiet": quiet, "all": sizes, "clean": clean.any, "seen": seen.as_list()}))
"""


def test_the_nonfinite_agreement_is_fixed_size_until_something_is_set():
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-c", AGREE, str(WORLD)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["quiet"] == [4 * 4]  # one all-reduce of a count per location (4 locations), any world
    assert not r["clean"]
    # a flag set: the same round, then one bit per rank and location to name them
    assert r["all"] == [16, 16, 4 * bitmap_bytes(WORLD)]
    assert r["seen"] == [{"phase": "grad_reduce", "tier": "gpu", "ranks": [0]}]


def test_a_packed_row_is_one_small_block_at_75264_ranks():
    # [Note: a packed row's block]: the 1.3 M-parameter GPT of the dry run (hidden 160, 4 layers),
    # one layer's bucket: a few values per rank, so the row is one block of the smallest size
    # that holds them, not 256
    d, inter = 160, 640
    layer = [d, d, 3 * d * d, 3 * d, d * d, d, d, d, inter * d, inter, inter * d, d]
    sizes = [-(-n // WORLD) for n in layer]
    lay = layout.bucket_layout(sizes, BLOCK, WORLD)
    assert lay.packed and lay.block < BLOCK
    values = sum(sizes)
    assert sum(lay.slots) == lay.block <= max(layout.SMALLEST_BLOCK, 2 * values)
    # whole-block slots would be 12 blocks per rank: 96 times the row
    assert sum(layout.aligned(n, BLOCK) for n in sizes) >= 96 * sum(lay.slots)
    # the gathered bucket (every rank's row) and a tertiary copy (node x gpu rows of it), in
    # elements: about twice the same bucket's at 48 nodes (384 ranks), in its whole-block slots
    # there (the values themselves are the same; 32 elements per rank at most are padding)
    at48 = layout.bucket_layout([-(-n // 384) for n in layer], BLOCK, 384)
    assert not at48.packed
    assert WORLD * sum(lay.slots) <= 2.1 * 384 * sum(at48.slots)
    assert NODES * GPUS * sum(lay.slots) <= 2.1 * 48 * GPUS * sum(at48.slots)
    # the codes are the ones the 256 block made: one block holds every value either way
    x = torch.zeros(BLOCK)
    x[:values] = torch.linspace(-1, 1, values)
    from zeropp_hier import quant

    big = quant.quantize(x, 8, BLOCK)
    small = quant.quantize(x[: lay.block], 8, lay.block)
    assert torch.equal(big.data[: lay.block], small.data) and torch.equal(big.scales[:1], small.scales)


def test_a_packed_rows_block_is_bounded_by_the_hops_block():
    assert layout.packed_block(1, BLOCK) == layout.SMALLEST_BLOCK
    assert layout.packed_block(33, BLOCK) == 64
    assert layout.packed_block(256, BLOCK) == BLOCK and layout.packed_block(5000, BLOCK) == BLOCK
    assert layout.packed_block(7, 1) == 1  # nothing quantizes
    from zeropp_hier.quant import _checks

    assert layout.SMALLEST_BLOCK == _checks.MIN_BLOCK
    # rows past a block keep the hops' block and are padded to it, as before
    big = layout.bucket_layout([300] * 3, BLOCK, WORLD)
    assert big.block == BLOCK and sum(big.slots) % BLOCK == 0
    # whole-block slots where they cost little: the layout and block of every test size
    assert layout.bucket_layout([5, 9], BLOCK, 16) == layout.BucketLayout((BLOCK, BLOCK), BLOCK, False)


def test_a_packed_buckets_hops_take_its_block():
    from zeropp_hier.core.plan import Hop

    hops = (Hop(("node",), "int8", 256, False, 128), Hop(("gpu",), "none", 256, False, 0))
    small = gather.with_block(hops, 32)
    assert small[0].block_size == 32 and small[0].rotate == 32
    assert small[1] == hops[1]  # an exact hop has no block
    assert gather.with_block(hops, 256) == hops


def test_an_identity_topology_holds_no_table_of_the_world():
    """``Topology`` kept a tuple of every rank's index even for the identity map (75,264 ints per
    topology object at Frontier's size); it keeps one only for a given ``rank_map``."""
    topo = Topology(NODES, GPUS, GCDS)
    assert topo._index_of_rank is None
    last = WORLD - 1
    assert topo.index_of_rank(last) == last and topo.coord(last) == (NODES - 1, GPUS - 1, GCDS - 1)
    for bad in (-1, WORLD):
        try:
            topo.index_of_rank(bad)
        except IndexError:
            continue
        raise AssertionError(f"rank {bad} was accepted in a world of {WORLD}")
    mapped = Topology(2, GPUS, GCDS, rank_map=tuple(reversed(range(2 * GPUS * GCDS))))
    assert mapped._index_of_rank is not None and mapped.index_of_rank(0) == 2 * GPUS * GCDS - 1


def test_a_log_step_exchanges_indices_are_cached_by_two_numbers_not_by_lists_of_the_members():
    """A log-step exchange over a node group of 9,408 members made, at every call, a Python list
    of the positions it sends (about 4,704 per step) and one of every member's position at its
    end, and the index cache held each list as its key. The indices are now made once per
    (members, step) and (members, me) by tensor ops: the same positions, keys of two numbers."""
    from zeropp_hier.comm.tick import executor as tick_exec
    from zeropp_hier.comm.tick import plan as tick_plan

    cpu = torch.device("cpu")
    tick_exec._exchange_index.cache_clear()
    tick_exec._from_member_index.cache_clear()
    steps = tick_plan.step_count(NODES, tick_plan.LOG)
    for step in range(steps):
        got = tick_exec._exchange_index(NODES, step, cpu)
        assert got.tolist() == tick_plan.exchange_blocks(NODES, step)
        assert got.numel() == tick_plan.exchange_block_count(NODES, step)
    for me in (0, 1, NODES - 1):
        assert tick_exec._from_member_index(NODES, me, cpu).tolist() == [(me - m) % NODES for m in range(NODES)]
    for step in range(steps):  # a second hop of the same group: no new entry
        tick_exec._exchange_index(NODES, step, cpu)
    assert tick_exec._exchange_index.cache_info().currsize == steps
    assert tick_exec._from_member_index.cache_info().currsize == 3


def test_the_coordinators_gather_is_one_buffer_parsed_once_at_75264_ranks():
    """Rank 0 of a save receives every rank's digests ([Note: a coordinator, not a world
    gather]): it allocated a tensor per rank and parsed each rank's JSON on its own (75,264 of
    each); it now receives into the rows of one buffer and parses them as one array. The rows
    decode to each rank's object as before, an empty slot to None."""
    from zeropp_hier.comm import _coordinator as coord

    objs = [{f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt": r % 1000} for r in range(WORLD)]
    objs[7] = None
    blobs = [coord._encode(o) for o in objs]
    width = max(len(b) for b in blobs)
    rows = coord._pad_rows(blobs, width, torch.device("cpu"))
    assert rows.shape == (WORLD, width + coord._LEN) and rows.is_contiguous()
    assert rows.untyped_storage().nbytes() == WORLD * (width + coord._LEN)  # one storage for all
    for r in (0, 7, WORLD - 1):  # each row is what _pad makes for that rank alone
        assert torch.equal(rows[r], coord._pad(blobs[r], width, torch.device("cpu")))
    assert coord._unpad_rows(rows) == objs
    empty = torch.zeros(3, width + coord._LEN, dtype=torch.uint8)
    assert coord._unpad_rows(empty) == [None, None, None]


@pytest.mark.parametrize(
    "runs,period,reps,per_unit",
    [
        ([(0, 10)], 32, 1, 1),  # a packed row: its values, then padding (the slice path)
        ([(0, 11)], 32, 1, 2),  # int4: the half-used last byte is kept
        ([(0, 5), (8, 3)], 32, 1, 1),  # two runs: the index path
        ([(0, 10)], 32, 3, 1),  # rows of a send block side by side: the index path
        ([(2, 10)], 32, 1, 1),  # a run that starts later: the index path
    ],
)
def test_keep_and_restore_by_slice_equal_the_index_path(runs, period, reps, per_unit):
    """``_keep`` / ``_restore`` take a slice where the valid units are one run from the row's
    start (``Valid.prefix_units``); they must give exactly what the index path gives."""
    from zeropp_hier.comm.collectives import _keep, _restore

    valid = layout.Valid(runs, period, reps)
    rows = torch.randint(
        0, 255, (7, valid.length // per_unit), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    idx = valid.index(per_unit, torch.device("cpu"))
    kept = rows.index_select(1, idx)
    got = _keep(rows, valid, per_unit)
    assert torch.equal(got, kept) and got.is_contiguous()
    assert torch.equal(
        _restore(kept, valid, rows.shape[1], per_unit), torch.zeros_like(rows).index_copy_(1, idx, kept)
    )
    assert (valid.prefix_units(per_unit) is not None) == (len(runs) == 1 and runs[0][0] == 0 and reps == 1)
