"""Layout maths against direct, element-by-element constructions (no processes)."""

import pytest
import torch

from zeropp_hier.core import layout
from zeropp_hier.core.topology import Topology
from zeropp_hier.core.vocab import AXES


def _simulate_gather(t: Topology, hops, payload=3):
    """Run the gather layout for every rank of a simulated world; return each rank's result."""
    chunks = {r: torch.arange(payload, dtype=torch.float32) + 100 * r for r in range(t.world_size)}
    bufs = {r: chunks[r].view(1, 1, 1, payload) for r in range(t.world_size)}
    for axes in hops:
        new = {}
        for r in range(t.world_size):
            blocks = [bufs[peer].reshape(-1) for peer in t.peers(r, axes)]
            out = torch.cat(blocks)
            new[r] = layout.merge_gathered(out, tuple(bufs[r].shape[:3]), layout.hop_dims(t, axes), payload)
        bufs = new
    return bufs, chunks


@pytest.mark.parametrize("shape", [(2, 2, 2), (3, 1, 2), (1, 2, 2), (2, 3, 2)])
@pytest.mark.parametrize(
    "hops",
    [
        [("node",), ("gpu",), ("gcd",)],
        [("gcd",), ("node",), ("gpu",)],
        [("node", "gpu", "gcd")],
        [("node",), ("gpu", "gcd")],
    ],
)
def test_hop_gathers_give_every_chunk_at_its_coordinate(shape, hops):
    t = Topology(*shape)
    bufs, chunks = _simulate_gather(t, hops)
    for _r, buf in bufs.items():
        assert tuple(buf.shape[:3]) == t.dims
        for rr in range(t.world_size):
            c = t.coord(rr)
            assert torch.equal(buf[c.node, c.gpu, c.gcd], chunks[rr])


def test_kept_shard_then_backward_hop_reconstructs():
    t = Topology(2, 2, 2)
    bufs, chunks = _simulate_gather(t, [("node",), ("gpu",), ("gcd",)])
    kept = {r: layout.kept_shard(bufs[r], t.coord(r), ("node", "gpu")) for r in range(8)}
    for r in range(8):
        assert kept[r].shape[:3] == (2, 2, 1)
        out = torch.cat([kept[p].reshape(-1) for p in t.peers(r, ("gcd",))])
        full = layout.merge_gathered(out, (2, 2, 1), layout.hop_dims(t, ("gcd",)), 3)
        assert torch.equal(full, bufs[r])


@pytest.mark.parametrize("shape", [(2, 2, 2), (3, 1, 2)])
@pytest.mark.parametrize("stages", [[("gcd",), ("gpu",), ("node",)], [("gpu", "gcd"), ("node",)], [AXES]])
def test_staged_reduce_scatter_layout(shape, stages):
    t = Topology(*shape)
    W, C = t.world_size, 4
    inputs = {r: torch.randn(W, C, dtype=torch.float64) for r in range(W)}  # rows by destination
    bufs = {r: inputs[r].view(*t.dims, C) for r in range(W)}
    for axes in stages:
        sends = {r: layout.split_for_stage(bufs[r], axes) for r in range(W)}
        new = {}
        for r in range(W):
            peers = t.peers(r, axes)
            j = peers.index(r)
            total = sum(sends[p][j] for p in peers)
            new[r] = total.view(*layout.dims_after_stage(tuple(bufs[r].shape[:3]), axes), C)
        bufs = new
    for r in range(W):
        expect = sum(inputs[s][r] for s in range(W))
        assert torch.allclose(bufs[r].reshape(-1), expect)


def test_pack_and_unpack_match_deepspeed_chunking():
    W = 8
    grads = [torch.arange(n, dtype=torch.float32) for n in (5, 17, 8, 1)]
    packed = layout.pack_grad_rows(grads, W, pad_to=32)
    assert packed.rows.shape == (W, 32) and packed.chunk == (1, 3, 1, 1)
    for r in range(W):
        mine = layout.unpack_my_chunks(packed.rows[r], [g.numel() for g in grads], packed.chunk, r)
        for g, c, m in zip(grads, packed.chunk, mine):
            assert torch.equal(m, g[r * c : (r + 1) * c])  # same slice reduce_scatter_coalesced returns


def test_index_orders_are_inverse():
    t = Topology.for_world(8, 2, 2, [3, 6, 0, 5, 2, 7, 1, 4])
    io, ro = layout.index_order(t), layout.rank_order(t)
    assert torch.equal(io[ro], torch.arange(8)) and torch.equal(ro[io], torch.arange(8))
    assert layout.index_order(Topology(2, 2, 2)) is None


def test_aligned_chunks_start_on_block_boundaries_and_unpack_the_same():
    W, B = 8, 32
    grads = [torch.arange(n, dtype=torch.float32) + 1 for n in (5, 300, 8, 1, 70)]
    packed = layout.pack_grad_rows(grads, W, pad_to=B, align_chunks=True)
    # every tensor's chunk sits in a slot of whole blocks, so no block mixes two tensors
    assert packed.slots == tuple(layout.aligned(c, B) for c in packed.chunk)
    assert all(slot % B == 0 for slot in packed.slots) and packed.rows.shape == (W, sum(packed.slots))
    starts = [sum(packed.slots[:i]) for i in range(len(grads))]
    for r in range(W):
        for start, c, slot in zip(starts, packed.chunk, packed.slots):
            assert torch.count_nonzero(packed.rows[r, start + c : start + slot]) == 0  # padding is zeros
        mine = layout.unpack_my_chunks(packed.rows[r], [g.numel() for g in grads], packed.chunk, r, packed.slots)
        for g, c, m in zip(grads, packed.chunk, mine):
            assert torch.equal(m, g[r * c : (r + 1) * c])
