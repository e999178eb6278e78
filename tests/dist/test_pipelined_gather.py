"""Pipelined hops ([Note: chunked gathers] in comm/gather.py) on 8 real gloo ranks (2 nodes x 2
GPUs x 2 GCDs, a permuted rank map) without DeepSpeed: a gather cut into column chunks, one job
per chunk on the executor's lanes, gives bit for bit the unchunked gather's values, kept copies
and bytes (exact and int8/int4), and its tiers' collectives of different chunks are in flight
together (busy intervals, comm/busy.py), where one unchunked gather's never are."""

RANK_MAP = [5, 0, 7, 2, 1, 4, 3, 6]
NUMELS = [1000, 37, 4096, 7, 513]  # tails, a tensor smaller than the world, one over a block
CASES = {
    "frontier/none": ("frontier", "none"),
    "frontier/int8": ("frontier", "int8"),
    "frontier/int4-node": ("frontier", {"weights": {"node": "int4"}, "gradients": {"node": "int4"}, "block_size": 64}),
    "zeropp/int8": ("zeropp", "int8"),
}
CHUNKS = (2, 3, 4, 64)  # 64: more chunks than blocks, so one block each


def _setup(preset, compression, rank_map):
    import torch
    import torch.distributed as dist

    from zeropp_hier.comm import gather
    from zeropp_hier.comm.collectives import HierCollectives
    from zeropp_hier.comm.context import CommContext
    from zeropp_hier.comm.executor import CommExecutor
    from zeropp_hier.comm.groups import build_hop_groups
    from zeropp_hier.comm.numerics import Numerics
    from zeropp_hier.comm.stats import CommStats
    from zeropp_hier.core.config import parse_section
    from zeropp_hier.core.plan import make_plan
    from zeropp_hier.core.topology import Topology

    rank, world = dist.get_rank(), dist.get_world_size()
    topo = Topology.for_world(world, 2, 2, rank_map)
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
    return ctx, plan, backward, groups, stats


def _teardown(ctx, groups):
    import torch.distributed as dist

    ctx.executor.close()
    for hg in groups.values():
        dist.destroy_process_group(hg.group)


def _partitions(rank: int, world: int, seed: int):
    """This rank's partition of each of NUMELS random tensors, as DeepSpeed holds them: ceil(n /
    world) elements each, the tail past the tensor's end garbage (NaN); and the generator, for
    more values from the same stream."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    fulls = [torch.randn(n, generator=gen) for n in NUMELS]
    sizes = [-(-n // world) for n in NUMELS]
    parts = []
    for full, n in zip(fulls, sizes):
        part = torch.full((n,), float("nan"))  # DeepSpeed's tail past the end: garbage
        mine = full[rank * n : (rank + 1) * n]
        part[: mine.numel()] = mine
        parts.append(part)
    return sizes, parts, gen


def _run(ctx, hops, start, phase, dtype, sizes, slots, keep, chunks):
    """One gather of ``start``: unchunked (``chunks`` None) or pipelined in ``chunks``; the bytes
    it moved per tier."""
    from zeropp_hier.comm import gather
    from zeropp_hier.comm.collectives import Encoded
    from zeropp_hier.core import layout

    before = ctx.coll.stats.snapshot()["bytes"].get(phase, {})
    before = dict(before)
    ex = ctx.executor
    lanes = [h.axes for h in hops]
    if chunks is None:
        finish = gather.finish_bucket(ctx, dtype, sizes, slots, NUMELS, keep)
        valid = layout.valid_of(sizes, slots)
        got = ex.result(ex.submit(gather.gather_bucket(ctx, hops, start, phase, finish, valid=valid), lanes))
        njobs = 1
    else:
        align = gather.chunk_align(hops, start.block_size if isinstance(start, Encoded) else 1)
        ranges = gather.column_ranges(sum(slots), align, chunks)
        finish = gather.finish_bucket(ctx, dtype, sizes, slots, NUMELS, keep)
        valid = layout.valid_of(sizes, slots)  # as the runtime passes it ([Note: padding stays off the wire])
        jobs = gather.chunk_jobs(ctx, hops, lambda: start, ranges, phase, finish, valid=valid)
        futures = [ex.submit(j, lanes) for j in jobs]
        results = [ex.result(f) for f in futures]
        assert all(r is None for r in results[:-1])
        got = results[-1]
        njobs = len(ranges)
    after = ctx.coll.stats.snapshot()["bytes"][phase]
    return got, {t: after[t] - before.get(t, 0) for t in after}, njobs


def pipelined_run(cases: dict, rank_map: list) -> dict:
    import sys

    import torch
    import torch.distributed as dist

    from zeropp_hier.comm import gather
    from zeropp_hier.comm.collectives import Encoded

    from .rows import same_rows

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, (preset, compression) in cases.items():
        ctx, plan, backward, groups, stats = _setup(preset, compression, rank_map)
        sizes, parts, _ = _partitions(rank, world, 1234)
        hops = gather.hops_for(plan, (), "forward_gather")
        slots = gather.slots_of(sizes, gather.slot_align((*plan.forward, *backward)))
        start = gather.primary_buffer(parts, sizes, NUMELS, slots, rank)
        keep = [plan.kept_axes] * len(NUMELS)
        ref, ref_bytes, _ = _run(ctx, hops, start, "forward_gather", torch.float32, sizes, slots, keep, None)
        r: dict = {"cases": {}}
        # the unchunked gather really is the flat all-gather (exact case), so "same as unchunked"
        # is "right"
        if name.endswith("/none"):
            ok = True
            for part, n, numel, value in zip(parts, sizes, NUMELS, ref.values):
                flat = torch.empty(world * n)
                dist.all_gather_into_tensor(flat, part)
                ok &= torch.equal(value, flat[:numel])
            r["unchunked_exact"] = ok
        bhops = gather.hops_for(plan, plan.kept_axes, "backward_gather")
        kept_start = Encoded.cat(ref.kept) if isinstance(ref.kept[0], Encoded) else torch.cat(ref.kept, dim=3)
        bref, bref_bytes, _ = _run(ctx, bhops, kept_start, "backward_gather", torch.float32, sizes, slots, None, None)
        r["kept_encoded"] = isinstance(ref.kept[0], Encoded)
        for chunks in CHUNKS:
            got, got_bytes, njobs = _run(ctx, hops, start, "forward_gather", torch.float32, sizes, slots, keep, chunks)
            bgot, bgot_bytes, bjobs = _run(
                ctx, bhops, kept_start, "backward_gather", torch.float32, sizes, slots, None, chunks
            )
            r["cases"][chunks] = {
                "jobs": (njobs, bjobs),
                "values": all(torch.equal(a, b) for a, b in zip(got.values, ref.values)),
                "kept": all(same_rows(a, b) for a, b in zip(got.kept, ref.kept)),
                "bytes": got_bytes == ref_bytes and bgot_bytes == bref_bytes,
                "backward": all(torch.equal(a, b) for a, b in zip(bgot.values, bref.values)),
            }
        r["tiers"] = sorted(t for t, b in ref_bytes.items() if b)
        out[name] = r
        _teardown(ctx, groups)
    out["deepspeed_loaded"] = sorted(m for m in sys.modules if m.split(".")[0] == "deepspeed")
    return out


def test_pipelined_gather_is_bit_identical_to_unchunked(bare8):
    for rank, r in enumerate(bare8.run(pipelined_run, CASES, RANK_MAP)):
        assert r.pop("deepspeed_loaded") == [], f"rank {rank} imported DeepSpeed"
        for name, c in r.items():
            what = f"rank {rank} {name}"
            assert c["tiers"] == ["gcd", "gpu", "node"], (what, c["tiers"])
            assert c.get("unchunked_exact", True), f"{what}: the unchunked gather is not the flat one"
            assert c["kept_encoded"] == (not name.endswith("/none")), what
            for chunks, k in c["cases"].items():
                assert k["jobs"][0] > 1 and k["jobs"][1] > 1, f"{what} chunks={chunks}: not chunked: {k['jobs']}"
                for check in ("values", "kept", "bytes", "backward"):
                    assert k[check], f"{what} chunks={chunks}: {check} differ from the unchunked gather"


def _overlaps(intervals):
    """Pairs (lane a, chunk i, lane b, chunk j) of intervals on different lanes that overlap in
    time; chunk = position on its lane (a lane runs its slots in submission order)."""
    by_lane: dict = {}
    for lane, a, b in sorted(intervals, key=lambda x: x[1]):
        by_lane.setdefault(lane, []).append((a, b))
    out = []
    lanes = sorted(by_lane)
    for x, la in enumerate(lanes):
        for lb in lanes[x + 1 :]:
            for i, (a0, a1) in enumerate(by_lane[la]):
                for j, (b0, b1) in enumerate(by_lane[lb]):
                    if max(a0, b0) < min(a1, b1):
                        out.append((la, i, lb, j))
    return out, by_lane


def busy_run(rank_map: list, chunks: int, tries: int) -> dict:
    import torch

    from zeropp_hier.comm import gather

    ctx, plan, backward, groups, stats = _setup("frontier", "none", rank_map)
    hops = gather.hops_for(plan, (), "forward_gather")
    ex = ctx.executor
    lanes = [h.axes for h in hops]
    width = 1 << 17  # per rank: 128 Ki fp32, the full buffer 4 MiB
    start = torch.arange(width, dtype=torch.float32).add_(ctx.rank * width).view(1, 1, 1, -1)
    ranges = gather.column_ranges(width, 1, chunks)
    r: dict = {"tries": 0}

    def keep(full):
        return full

    # one unchunked gather: its hops one after another, never two tiers at once
    ex.record_busy()
    whole = ex.result(ex.submit(gather.hop_steps(ctx, hops, start, "forward_gather"), lanes))
    r["unchunked_overlaps"], by_lane = _overlaps(ex.busy_log.intervals())
    r["unchunked_per_lane"] = {"-".join(k): len(v) for k, v in by_lane.items()}
    for _ in range(tries):  # the same gather pipelined, until two tiers were seen together
        r["tries"] += 1
        ex.record_busy()
        futures = [
            ex.submit(j, lanes) for j in gather.chunk_jobs(ctx, hops, lambda: start, ranges, "forward_gather", keep)
        ]
        full = [ex.result(f) for f in futures][-1]
        overlaps, by_lane = _overlaps(ex.busy_log.intervals())
        r["same"] = torch.equal(full, whole)
        r["per_lane"] = {"-".join(k): len(v) for k, v in by_lane.items()}
        # within a chunk the hops are in order: node, then gpu, then gcd
        order = [("node",), ("gpu",), ("gcd",)]
        r["in_order"] = all(
            by_lane[order[t]][i][1] <= by_lane[order[t + 1]][i][0] for i in range(len(ranges)) for t in range(2)
        )
        r["overlaps"] = [(la, i, lb, j) for la, i, lb, j in overlaps if i != j]
        if r["overlaps"]:
            break
    ex.record_busy(False)
    _teardown(ctx, groups)
    return r


def test_pipelined_chunks_put_two_tiers_on_their_links_at_once(bare8):
    chunks = 8
    for rank, r in enumerate(bare8.run(busy_run, RANK_MAP, chunks, 5)):
        what = f"rank {rank}"
        assert r["unchunked_per_lane"] == {"node": 1, "gpu": 1, "gcd": 1}, (what, r)
        assert r["unchunked_overlaps"] == [], f"{what}: one job's hops overlapped: {r['unchunked_overlaps']}"
        assert r["same"], f"{what}: the pipelined gather differs from the unchunked one"
        assert r["per_lane"] == {"node": chunks, "gpu": chunks, "gcd": chunks}, (what, r["per_lane"])
        assert r["in_order"], f"{what}: a chunk's hops ran out of order"
        # a later chunk's earlier hop beside an earlier chunk's later hop, on two links at once
        assert r["overlaps"], (
            f"{what}: no two tiers' collectives of different chunks in flight together in {r['tries']} gathers"
        )


def reduce_run(cases: dict, rank_map: list, pipeline_chunks: int) -> dict:
    """A gradient bucket's stages as one job per column chunk (``ctx.pipeline_chunks``) against
    ``reduce_rows`` over the same chunks in one job, and (exact) against the unchunked job."""
    import torch

    from zeropp_hier.comm import reduce
    from zeropp_hier.core import layout

    out = {}
    for name, (preset, compression) in cases.items():
        ctx, plan, backward, groups, stats = _setup(preset, compression, rank_map)
        world, ex = ctx.world, ctx.executor
        exact = all(h.scheme == "none" for h in plan.reduce)
        gen = torch.Generator().manual_seed(99 + ctx.rank)
        if exact:  # integers: every summation order gives one sum
            grads = [torch.randint(-64, 65, (n,), generator=gen).float() for n in NUMELS]
        else:
            grads = [torch.randn(n, generator=gen) for n in NUMELS]
        whole = ex.result(reduce.submit_reduce_scatter(ctx, grads, torch.float32))
        # the chunks the pipelined path cuts (as submit_reduce_scatter does), in one job
        pad = reduce.row_pad(ctx)
        packed = layout.pack_grad_rows(grads, world, pad, scale=1.0 / world, align_chunks=pad > 1)
        width = packed.rows.shape[1]
        chunks = reduce.column_chunks(width, pad, world, world * -(-width // pipeline_chunks))
        lanes = [h.axes for _ in chunks for h in plan.reduce]
        numels = [g.numel() for g in grads]
        one_job = ex.result(
            ex.submit(reduce.reduce_rows(ctx, reduce.Bucket(packed, chunks, numels, torch.float32)), lanes)
        )
        ctx.pipeline_chunks = pipeline_chunks
        ex.record_busy()
        piped = ex.result(reduce.submit_reduce_scatter(ctx, grads, torch.float32))
        per_lane: dict = {}
        for lane, _, _ in ex.busy_log.intervals():
            per_lane["-".join(lane)] = per_lane.get("-".join(lane), 0) + 1
        ex.record_busy(False)
        out[name] = {
            "chunks": len(chunks),
            "per_lane": per_lane,
            "outstanding": ex.outstanding,
            "same_chunks": all(torch.equal(a, b) for a, b in zip(piped, one_job)),
            "same_whole": all(torch.equal(a, b) for a, b in zip(piped, whole)),
            "exact": exact,
        }
        _teardown(ctx, groups)
    return out


def test_pipelined_gradient_stages_are_bit_identical(bare8):
    chunks = 4
    for rank, r in enumerate(bare8.run(reduce_run, CASES, RANK_MAP, chunks)):
        for name, c in r.items():
            what = f"rank {rank} {name}"
            assert c["chunks"] > 1, what
            # one collective per stage per chunk, each on its stage's lane
            assert set(c["per_lane"].values()) == {c["chunks"]}, (what, c["per_lane"])
            assert c["outstanding"] == 0, f"{what}: submit_all left {c['outstanding']} jobs outstanding"
            assert c["same_chunks"], f"{what}: pipelined stages differ from the same chunks in one job"
            if c["exact"]:
                assert c["same_whole"], f"{what}: pipelined exact stages differ from the unchunked job"
