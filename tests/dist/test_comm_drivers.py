"""The gather and reduce-scatter drivers of ``comm/`` on their own: 8 real gloo ranks (2 nodes x
2 GPUs x 2 GCDs, a permuted rank map) that never import DeepSpeed, plain tensors, a ``CommPlan``,
the project's executor, groups, collectives and numerics hooks. Each result is checked against
the flat collective computed directly on the world group: all-gather of each tensor's
partitions, all-reduce of each gradient then this rank's chunk (what DeepSpeed's
``reduce_scatter_coalesced`` hands back). Exact without compression (integer-valued gradients,
so no summation order can change a sum); within the quantization bounds with int8/int4."""

RANK_MAP = [5, 0, 7, 2, 1, 4, 3, 6]
NUMELS = [1000, 37, 4096, 7, 513]  # tails, a tensor smaller than the world, one over a block
QMAX = {"int8": 127, "int4": 7}
CASES = {
    "frontier/none": ("frontier", "none"),
    "zeropp/none": ("zeropp", "none"),
    "zero3/none": ("zero3", "none"),
    "frontier/int8": ("frontier", "int8"),
    "frontier/int4-node": ("frontier", {"weights": {"node": "int4"}, "gradients": {"node": "int4"}, "block_size": 64}),
    "zeropp/int8": ("zeropp", "int8"),
}


def _gather_bound(hops, values) -> float:
    """A gather quantizes once ([Note: quantize once per gather]): each element is off by at
    most half a step of its block, absmax(block) / qmax / 2 <= max|w| / qmax / 2."""
    for h in hops:
        if h.scheme in QMAX:
            return float(values.abs().max()) / QMAX[h.scheme] / 2 * (1 + 1e-5)
    return 0.0


def _reduce_bound(plan, topo, m: float) -> float:
    """Stage s sums k_s received blocks, each quantized with half a step of error,
    absmax / qmax / 2, where absmax <= (ranks already summed) * m (m: the largest |g| / world),
    and carries k_s times the error of the stage before."""
    err, summed = 0.0, 1
    for h in plan.reduce:
        k = topo.axes_size(h.axes)
        err = k * err
        if h.scheme in QMAX:
            err += k * (summed * m + err) / QMAX[h.scheme] / 2
        summed *= k
    return err * 1.01


def drivers_run(cases: dict, rank_map: list) -> dict:
    import sys

    import torch
    import torch.distributed as dist

    from zeropp_hier.comm import gather, reduce
    from zeropp_hier.comm.collectives import Encoded, HierCollectives
    from zeropp_hier.comm.context import CommContext
    from zeropp_hier.comm.executor import CommExecutor
    from zeropp_hier.comm.groups import build_hop_groups
    from zeropp_hier.comm.numerics import Numerics
    from zeropp_hier.comm.stats import CommStats
    from zeropp_hier.core import layout
    from zeropp_hier.core.config import parse_section
    from zeropp_hier.core.plan import make_plan
    from zeropp_hier.core.topology import Topology

    rank, world = dist.get_rank(), dist.get_world_size()
    topo = Topology.for_world(world, 2, 2, rank_map)
    out = {}
    for name, (preset, compression) in cases.items():
        cfg = parse_section(
            {"enabled": True, "preset": preset, "compression": compression, "topology": {"gpus_per_node": 2}}
        )
        plan = make_plan(preset, cfg.compression, topo)
        backward = gather.backward_hops(plan, all_levels=False)
        groups = build_hop_groups(topo, [h.axes for h in (*plan.forward, *backward, *plan.reduce)], rank)
        stats = CommStats(topo, rank)
        executor = CommExecutor(f"rank{rank}", torch.device("cpu"), overlap=True)
        numerics = Numerics(cfg.numerics, plan, topo, rank)
        ctx = CommContext(topo, rank, plan, HierCollectives(topo, groups, stats), executor, hooks=numerics)
        r: dict = {}

        # -- gather: each rank holds DeepSpeed's partition of every tensor (ceil(numel/world)
        # elements; the tail past the tensor's end is garbage, NaN here)
        gen = torch.Generator().manual_seed(1234)
        fulls = [torch.randn(n, generator=gen) for n in NUMELS]
        sizes = [-(-n // world) for n in NUMELS]
        parts = []
        for full, n in zip(fulls, sizes):
            part = torch.full((n,), float("nan"))
            mine = full[rank * n : (rank + 1) * n]
            part[: mine.numel()] = mine
            parts.append(part)
        hops = gather.hops_for(plan, (), "forward_gather")
        slots = gather.slots_of(sizes, gather.slot_align((*plan.forward, *backward)))
        start = gather.primary_buffer(parts, sizes, NUMELS, slots, rank)
        keep = [plan.kept_axes] * len(NUMELS) if plan.kept_axes is not None else None
        valid = layout.valid_of(sizes, slots)
        finish = gather.finish_bucket(ctx, torch.float32, sizes, slots, NUMELS, keep)
        job = gather.gather_bucket(ctx, hops, start, "forward_gather", finish, valid=valid)
        got = executor.result(executor.submit(job, [h.axes for h in hops]))
        r["gather_err"], r["gather_bound"] = [], []
        for part, n, numel, value in zip(parts, sizes, NUMELS, got.values):
            flat = torch.empty(world * n)
            dist.all_gather_into_tensor(flat, part)  # the flat reference, on the world group
            ref = flat[:numel]
            r["gather_err"].append(float((value - ref).abs().max()))
            r["gather_bound"].append(_gather_bound(hops, ref))
        # the backward gather from the kept copies hands out exactly what the forward did
        if keep is not None:
            pieces = got.kept
            src = plan.kept_axes
            bhops = gather.hops_for(plan, src, "backward_gather")
            kept_start = Encoded.cat(pieces) if isinstance(pieces[0], Encoded) else torch.cat(pieces, dim=3)
            finish = gather.finish_bucket(ctx, torch.float32, sizes, slots, NUMELS)
            job = gather.gather_bucket(ctx, bhops, kept_start, "backward_gather", finish, valid=valid)
            again = executor.result(executor.submit(job, [h.axes for h in bhops]))
            r["backward_same"] = all(torch.equal(a, b) for a, b in zip(again.values, got.values))
            r["kept_encoded"] = isinstance(pieces[0], Encoded)

        # -- reduce-scatter: every rank's gradients, laid out as DeepSpeed's
        exact = all(h.scheme == "none" for h in plan.reduce)
        gen = torch.Generator().manual_seed(99 + rank)
        if exact:  # integers (and /world = /8 is exact): every summation order gives one sum
            grads = [torch.randint(-64, 65, (n,), generator=gen).float() for n in NUMELS]
        else:
            grads = [torch.randn(n, generator=gen) for n in NUMELS]
        chunks = executor.result(reduce.submit_reduce_scatter(ctx, grads, torch.float32))
        m = torch.tensor([max(float(g.abs().max()) for g in grads) / world])
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        r["reduce_err"], r["reduce_sizes_ok"] = [], True
        for g, chunk in zip(grads, chunks):
            total = g.clone()
            dist.all_reduce(total)  # the flat reference
            c = -(-g.numel() // world)
            ref = (total / world)[rank * c : (rank + 1) * c]
            r["reduce_sizes_ok"] &= chunk.numel() == ref.numel()
            r["reduce_err"].append(float((chunk - ref).abs().max()) if ref.numel() else 0.0)
        r["reduce_bound"] = _reduce_bound(plan, topo, float(m))
        r["reduce_exact"] = exact
        # the streamed path (many column chunks) gives the same chunks bit for bit
        ctx.stream_chunk_elems = 8 * 64
        streamed = executor.result(reduce.submit_reduce_scatter(ctx, grads, torch.float32))
        r["streamed_same"] = all(torch.equal(a, b) for a, b in zip(streamed, chunks))
        r["bytes"] = stats.snapshot()["bytes"]
        out[name] = r
        executor.close()
        for hg in groups.values():
            dist.destroy_process_group(hg.group)
    out["deepspeed_loaded"] = sorted(m for m in sys.modules if m.split(".")[0] == "deepspeed")
    return out


def test_gather_and_reduce_scatter_through_comm_without_deepspeed(bare8):
    for rank, r in enumerate(bare8.run(drivers_run, CASES, RANK_MAP)):
        assert r.pop("deepspeed_loaded") == [], f"rank {rank} imported DeepSpeed"
        for name, c in r.items():
            what = f"rank {rank} {name}"
            for i, (err, bound) in enumerate(zip(c["gather_err"], c["gather_bound"])):
                assert err <= bound, f"{what}: gathered tensor {i} off by {err} (bound {bound})"
            if name.endswith("/none"):
                assert c["gather_bound"] == [0.0] * len(NUMELS)  # exact: bit for bit
            else:
                assert max(c["gather_err"]) > 0, f"{what}: nothing was quantized"
            if "backward_same" in c:
                assert c["backward_same"], f"{what}: the backward gather differs from the forward"
                assert c["kept_encoded"] == (not name.endswith("/none")), what
            assert c["reduce_sizes_ok"], what
            if c["reduce_exact"]:
                assert c["reduce_err"] == [0.0] * len(NUMELS), f"{what}: {c['reduce_err']}"
            else:
                assert 0 < max(c["reduce_err"]) <= c["reduce_bound"], f"{what}: {c['reduce_err']} {c['reduce_bound']}"
            assert c["streamed_same"], what
            # every tier carried traffic in both directions (the hierarchy ran, not a shortcut)
            tiers = {t for t, b in c["bytes"]["forward_gather"].items() if b}
            assert tiers == {"node", "gpu", "gcd"}, (what, c["bytes"])
            assert {t for t, b in c["bytes"]["grad_reduce"].items() if b} == {"node", "gpu", "gcd"}, what
