"""The block rotation on the wire ([Note: rotation policy], [Note: block rotation]) on 8 real gloo
ranks (2 nodes x 2 GPUs x 2 GCDs, a permuted rank map) without DeepSpeed: with rotation on some
hops, a gather and a gradient bucket's stages that keep the padding off the wire ([Note: padding
stays off the wire]) still deliver bit for bit what the padded collectives deliver (for the
gradients: with the padding zeroed between stages, which the kept stages do themselves), and the
rotated gradient sum is as close to the exact one as quantization allows."""

from .rows import same_rows
from .test_pipelined_gather import NUMELS, RANK_MAP, _partitions, _setup, _teardown

ROTATED = {
    "weights": {"node": "int4"},
    "gradients": {"gcd": "int8", "gpu": "int4", "node": "int4"},
    "block_size": 64,
    # a plain int8 first stage, then two rotated int4 stages; the node weight gather rotated
    "rotation": {"weights": {"node": 32}, "gradients": {"gpu": 32, "node": 64}},
}


def rotation_run(rank_map: list) -> dict:
    import torch
    import torch.distributed as dist

    from zeropp_hier.comm import gather
    from zeropp_hier.comm.reduce import row_pad
    from zeropp_hier.core import layout

    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {}
    ctx, plan, backward, groups, _ = _setup("frontier", ROTATED, rank_map)
    out["rotates"] = [(h.tier, h.rotate) for h in (*plan.forward, *plan.reduce)]
    ex = ctx.executor
    sizes, parts, gen = _partitions(rank, world, 7)
    align = max(gather.slot_align((*plan.forward, *backward)), 256)
    slots = gather.slots_of(sizes, align)
    valid = layout.valid_of(sizes, slots)
    start = gather.primary_buffer(parts, sizes, NUMELS, slots, rank)
    got = {}
    for mode, v in (("padded", None), ("kept", valid)):
        job = gather.hop_steps(ctx, plan.forward, start, "forward_gather", valid=v)
        got[mode] = ex.result(ex.submit(job, [h.axes for h in plan.forward]))
    out["gather_same"] = same_rows(got["padded"], got["kept"])
    out["gather_rotate"] = got["kept"].rotate
    pad = max(row_pad(ctx), 64)
    grads = [torch.randn(n, generator=torch.Generator().manual_seed(1000 + n)) * (1 + rank) for n in NUMELS]
    packed = layout.pack_grad_rows(grads, world, pad, scale=1.0 / world, align_chunks=True)
    gvalid = layout.valid_of(packed.chunk, packed.slots)
    assert gvalid is not None
    pad_cols = torch.ones(gvalid.length, dtype=torch.bool)
    pad_cols[gvalid.index(1, torch.device("cpu"))] = False
    sums = {}
    for mode, v in (("padded", None), ("kept", gvalid)):
        buf = ctx.rows_by_coord(packed.rows).contiguous().view(*ctx.topo.dims, -1)
        for hop in plan.reduce:
            buf = ctx.coll.drive(ctx.coll.reduce_stage_steps(buf, hop, hop.block_size, torch.float32, valid=v))
            if v is None:
                # rotating back leaves noise in the padding, which the padded collective sends on
                # (it has no way to know it is padding) and the kept one zeroes: zeroed here too,
                # the padded run is what the kept one must equal bit for bit
                buf[..., pad_cols] = 0
        sums[mode] = buf.reshape(-1)
    exact = packed.rows.clone()
    dist.all_reduce(exact)
    mine = exact[rank]  # row r: what rank r owns, summed over the ranks
    assert mine.numel() == sums["kept"].numel()
    idx = gvalid.index(1, torch.device("cpu"))
    pad_mask = torch.ones(sums["kept"].numel(), dtype=torch.bool)
    pad_mask[idx] = False
    a, b = sums["padded"], sums["kept"]
    out["grad_same"] = torch.equal(a, b)
    out["grad_padding_zero"] = bool((b[pad_mask] == 0).all())
    out["grad_has_padding"] = bool(pad_mask.any())
    out["grad_finite"] = bool(torch.isfinite(b).all())
    out["rel_err"] = float((b[idx] - mine[idx]).norm() / mine[idx].norm())
    _teardown(ctx, groups)
    return out


def test_rotated_hops_keep_the_padding_off_the_wire(bare8):
    for rank, r in enumerate(bare8.run(rotation_run, RANK_MAP)):
        what = f"rank {rank}"
        assert r["rotates"] == [("node", 32), ("gpu", 0), ("gcd", 0), ("gcd", 0), ("gpu", 32), ("node", 64)], (
            what,
            r["rotates"],
        )
        assert r["gather_rotate"] == 32, what
        assert r["gather_same"], f"{what}: the rotated gather differs with the padding off the wire"
        assert r["grad_has_padding"], f"{what}: the case has no padding to test"
        assert r["grad_same"], f"{what}: rotated gradient sums differ with the padding off the wire"
        assert r["grad_padding_zero"], f"{what}: the padding of a rotated sum is not zero"
        assert r["grad_finite"], what
        # two int4 stages at block 64 (one 8-bit): ~10% each; a wrong de-rotation would be ~100%
        assert r["rel_err"] < 0.25, (what, r["rel_err"])
