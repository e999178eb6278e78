"""[Note: padding stays off the wire] (core/layout.py) on 8 real gloo ranks (2 nodes x 2 GPUs x
2 GCDs, a permuted rank map) without DeepSpeed: a gather and a gradient bucket's stages that send
only the elements that can hold a value deliver bit for bit what the same collectives deliver
sending the slots' padding, with fewer bytes on every tier."""

from .rows import same_rows
from .test_pipelined_gather import CASES, NUMELS, RANK_MAP, _partitions, _setup, _teardown


def _bytes(ctx, phase, before):
    after = ctx.coll.stats.snapshot()["bytes"].get(phase, {})
    return {t: after.get(t, 0) - before.get(t, 0) for t in after}


def padding_run(cases: dict, rank_map: list) -> dict:
    import torch
    import torch.distributed as dist

    from zeropp_hier.comm import gather
    from zeropp_hier.comm.collectives import Encoded
    from zeropp_hier.comm.reduce import row_pad
    from zeropp_hier.core import layout

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, (preset, compression) in cases.items():
        ctx, plan, backward, groups, _ = _setup(preset, compression, rank_map)
        ex = ctx.executor
        sizes, parts, gen = _partitions(rank, world, 99)
        r: dict = {}
        # a gather quantizes wherever the preset does; "/none" has no padding (nothing quantized),
        # so it is run with the slots of an int8 neighbour to have some
        align = max(gather.slot_align((*plan.forward, *backward)), 256)
        slots = gather.slots_of(sizes, align)
        valid = layout.valid_of(sizes, slots)
        start = gather.primary_buffer(parts, sizes, NUMELS, slots, rank)
        got = {}
        for mode, v in (("padded", None), ("kept", valid)):
            for phase, hops, src in (
                ("forward_gather", plan.forward, start),
                ("backward_gather", gather.hops_for(plan, plan.kept_axes, "backward_gather"), None),
            ):
                if src is None:  # the backward starts from this rank's part of the forward's result
                    full = got[(mode, "forward_gather")]
                    cut = gather.cut_kept(ctx, full, slots, [plan.kept_axes] * len(sizes))
                    src = Encoded.cat(cut) if isinstance(cut[0], Encoded) else torch.cat(cut, dim=3)
                before = dict(ctx.coll.stats.snapshot()["bytes"].get(phase, {}))
                job = gather.hop_steps(ctx, hops, src, phase, valid=v)
                got[(mode, phase)] = ex.result(ex.submit(job, [h.axes for h in hops]))
                got[(mode, phase, "bytes")] = _bytes(ctx, phase, before)
        for phase in ("forward_gather", "backward_gather"):
            a, b = got[("padded", phase)], got[("kept", phase)]
            pa, pb = got[("padded", phase, "bytes")], got[("kept", phase, "bytes")]
            r[phase] = {
                "same": same_rows(a, b),
                "fewer": all(pb[t] < pa[t] for t in pa if pa[t]) and any(pa.values()),
            }
        # a gradient bucket's stages, one column chunk, with and without the padding on the wire
        pad = max(row_pad(ctx), 64)
        grads = [torch.randn(n, generator=gen) for n in NUMELS]
        packed = layout.pack_grad_rows(grads, world, pad, scale=1.0 / world, align_chunks=True)
        gvalid = layout.valid_of(packed.chunk, packed.slots)
        sums = {}
        for mode, v in (("padded", None), ("kept", gvalid)):
            before = dict(ctx.coll.stats.snapshot()["bytes"].get("grad_reduce", {}))
            buf = ctx.rows_by_coord(packed.rows).contiguous().view(*ctx.topo.dims, -1)
            for hop in plan.reduce:
                buf = ctx.coll.drive(ctx.coll.reduce_stage_steps(buf, hop, hop.block_size, torch.float32, valid=v))
            sums[mode] = (buf.reshape(-1), _bytes(ctx, "grad_reduce", before))
        (a, pa), (b, pb) = sums["padded"], sums["kept"]
        r["grad_reduce"] = {
            "same": torch.equal(a, b),
            "fewer": all(pb[t] < pa[t] for t in pa if pa[t]) and any(pa.values()),
        }
        out[name] = r
        _teardown(ctx, groups)
    return out


def test_padding_off_the_wire_is_bit_identical_with_fewer_bytes(bare8):
    for rank, r in enumerate(bare8.run(padding_run, CASES, RANK_MAP)):
        for name, phases in r.items():
            for phase, c in phases.items():
                assert c["same"], f"rank {rank} {name} {phase}: values differ from the padded collectives"
                assert c["fewer"], f"rank {rank} {name} {phase}: not fewer bytes on every tier used"
