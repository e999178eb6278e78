"""Rank functions of tests/dist/test_ticks.py: the tick mode against today's hop-by-hop path, in
one world, plain tensors and the project's own executor, groups and collectives (no DeepSpeed)."""

from __future__ import annotations

import sys
import threading

import torch
import torch.distributed as dist

from .rows import same_rows

RANK_MAP = [5, 0, 7, 2, 1, 4, 3, 6]
NUMELS = [1000, 37, 4096, 7, 513]  # tails, a tensor smaller than the world, one over a block


class CallLog:
    """Every hop transfer call while on: the grouped point-to-point calls (their group, issuing
    thread, and whether an earlier call's work was still in flight) and any hop collective. The
    real functions run underneath: this only watches."""

    def __init__(self, tick_group):
        from zeropp_hier.comm import collectives

        self.tick_group = tick_group
        self.on = False
        self.groups: list[str] = []
        self.threads: set[int] = set()
        self.hop_collectives = 0
        self.pending_at_issue = 0
        self.most_ops = 0  # the most ops in one grouped call ([Note: bounded calls])
        self._works: list = []
        self._real = {
            "batch": dist.batch_isend_irecv,
            "gather": collectives._all_gather_tensor,
            "a2a": dist.all_to_all_single,
        }

        def batch(ops):
            if self.on:
                self.groups.append("tick" if ops[0].group is self.tick_group else repr(ops[0].group))
                self.threads.add(threading.get_ident())
                self.pending_at_issue += sum(1 for w in self._works if not w.is_completed())
                self.most_ops = max(self.most_ops, len(ops))
            works = self._real["batch"](ops)
            if self.on:
                self._works = list(works)
            return works

        def counted(real):
            def call(*args, **kwargs):
                if self.on:
                    self.hop_collectives += 1
                return real(*args, **kwargs)

            return call

        dist.batch_isend_irecv = batch
        collectives._all_gather_tensor = counted(self._real["gather"])
        dist.all_to_all_single = counted(self._real["a2a"])

    def restore(self) -> None:
        from zeropp_hier.comm import collectives

        dist.batch_isend_irecv = self._real["batch"]
        collectives._all_gather_tensor = self._real["gather"]
        dist.all_to_all_single = self._real["a2a"]


def _setup(preset, compression, rank_map, shape=(2, 2)):
    from zeropp_hier.comm import gather
    from zeropp_hier.comm.groups import build_hop_groups, build_tick_group
    from zeropp_hier.core.config import parse_section
    from zeropp_hier.core.plan import make_plan
    from zeropp_hier.core.topology import Topology

    rank, world = dist.get_rank(), dist.get_world_size()
    topo = Topology.for_world(world, shape[0], shape[1], rank_map)
    section = {"enabled": True, "preset": preset, "topology": {"gpus_per_node": shape[0]}}
    if compression is not None:
        section["compression"] = compression
    cfg = parse_section(section)
    plan = make_plan(preset, cfg.compression, topo)
    backward = gather.backward_hops(plan, all_levels=False)
    groups = build_hop_groups(topo, [h.axes for h in (*plan.forward, *backward, *plan.reduce)], rank)
    tick_group = build_tick_group(topo)
    return cfg, topo, plan, backward, groups, tick_group


def _ctx(cfg, topo, plan, groups, tick_group, ticks: bool, chunks: int, steps: str = "auto"):
    from zeropp_hier.comm.collectives import HierCollectives
    from zeropp_hier.comm.context import CommContext
    from zeropp_hier.comm.executor import CommExecutor
    from zeropp_hier.comm.numerics import Numerics
    from zeropp_hier.comm.stats import CommStats
    from zeropp_hier.comm.tick import TickExecutor, TickTransport

    rank = dist.get_rank()
    stats = CommStats(topo, rank)
    cpu = torch.device("cpu")
    if ticks:
        transport = TickTransport(tick_group, rank, topo, stats, steps=steps)
        transport.log = []
        executor: CommExecutor = TickExecutor(f"rank{rank}-ticks", cpu, transport)
    else:
        executor = CommExecutor(f"rank{rank}", cpu, overlap=True)
    numerics = Numerics(cfg.numerics, plan, topo, rank)
    return CommContext(
        topo, rank, plan, HierCollectives(topo, groups, stats), executor, hooks=numerics, pipeline_chunks=chunks
    )


def _gather(ctx, hops, start, phase, sizes, slots, keep, chunks):
    """One gather as the runtime submits it: one job unchunked; chunked, a job per chunk on the
    lanes and one piece of work (``submit_all``) in ticks."""
    from zeropp_hier.comm import gather
    from zeropp_hier.comm.collectives import Encoded
    from zeropp_hier.core import layout

    ex = ctx.executor
    lanes = [h.axes for h in hops]
    if chunks == 1:
        finish = gather.finish_bucket(ctx, torch.float32, sizes, slots, NUMELS, keep)
        job = gather.gather_bucket(ctx, hops, start, phase, finish, valid=layout.valid_of(sizes, slots))
        return ex.result(ex.submit(job, lanes))
    align = gather.chunk_align(hops, start.block_size if isinstance(start, Encoded) else 1)
    ranges = gather.column_ranges(sum(slots), align, chunks)
    finish = gather.finish_bucket(ctx, torch.float32, sizes, slots, NUMELS, keep)
    jobs = gather.chunk_jobs(ctx, hops, lambda: start, ranges, phase, finish, valid=layout.valid_of(sizes, slots))
    if ex.yields_wires:
        return ex.result(ex.submit_all(jobs, lanes))
    return [ex.result(ex.submit(j, lanes)) for j in jobs][-1]


def _bytes(ctx, phase, before, view="bytes"):
    after = ctx.coll.stats.snapshot()[view][phase]
    return {t: after[t] - before.get(t, 0) for t in after}


def _check_log(ctx, topo, rank, axes, kind, phase_bytes):
    """The transport's log of one piece against the pure schedule: the (tick, peer, sends?,
    receives?) sequence, and the bytes it sent per tier against the stats' count."""
    from zeropp_hier.comm.tick import plan as tick_plan
    from zeropp_hier.core.vocab import TIERS

    transport = ctx.executor.transport
    log = transport.log
    seq = [(t, p, o > 0, i > 0) for t, _, moved in log for p, o, i in moved]
    subs = tick_plan.sub_hops([topo.axes_size(a) for a in axes], transport.steps, kind)
    n_chunks = len(log) - len(subs) + 1
    pure = tick_plan.rank_sequence(topo, rank, axes, kind, max(n_chunks, 1), transport.steps)
    want = [(x.tick, x.peer, x.send > 0, x.recv > 0) for x in pure]
    sent = dict.fromkeys(TIERS, 0)
    for _, _, moved in log:
        for p, out, _ in moved:
            sent[topo.tier_between(rank, p)] += out
    ok = seq == want and (n_chunks >= 1 or not subs)
    return {"sequence": seq, "sequence_ok": ok, "sent": sent, "bytes": phase_bytes, "sub_hops": len(subs)}


def parity_run(cases: dict, rank_map: list, chunk_counts, steps_modes=("auto",), shape=(2, 2)) -> dict:
    """Each case at each (hop steps, chunk count): ticks against hop by hop. ``shape``: GPUs per
    node and GCDs per GPU of the 8 ranks."""
    from zeropp_hier.comm import gather
    from zeropp_hier.comm.collectives import Encoded
    from zeropp_hier.comm.reduce import submit_reduce_scatter
    from zeropp_hier.comm.tick import agree_schedule, plan_pieces
    from zeropp_hier.comm.tick import plan as tick_plan

    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"cases": {}, "agreed": True}
    for name, (preset, compression) in cases.items():
        cfg, topo, plan, backward, groups, tick_group = _setup(preset, compression, rank_map, shape)
        calls = CallLog(tick_group)
        per: dict = {}
        try:
            for steps, chunks in [(s, c) for s in steps_modes for c in chunk_counts]:
                out["agreed"] &= bool(agree_schedule(topo, rank, plan_pieces(plan, backward), chunks, steps))
                ref = _ctx(cfg, topo, plan, groups, tick_group, False, chunks)
                tck = _ctx(cfg, topo, plan, groups, tick_group, True, chunks, steps)
                gen = torch.Generator().manual_seed(1234)
                fulls = [torch.randn(n, generator=gen) for n in NUMELS]
                sizes = [-(-n // world) for n in NUMELS]
                parts = []
                for full, n in zip(fulls, sizes):
                    part = torch.full((n,), float("nan"))  # DeepSpeed's tail past the end: garbage
                    mine = full[rank * n : (rank + 1) * n]
                    part[: mine.numel()] = mine
                    parts.append(part)
                slots = gather.slots_of(sizes, gather.slot_align((*plan.forward, *backward)))
                start = gather.primary_buffer(parts, sizes, NUMELS, slots, rank)
                keep = [plan.kept_axes] * len(NUMELS) if plan.kept_axes is not None else None
                c: dict = {}
                counters = {"ticks": 0, "most_hops_in_a_tick": 0}

                def piece(label, run, axes, kind, phase, c=c, counters=counters, ref=ref, tck=tck):
                    before_r = dict(ref.coll.stats.snapshot()["bytes"][phase])
                    got_r = run(ref)
                    ref_bytes = _bytes(ref, phase, before_r)
                    tck.executor.transport.log = []
                    before_t = dict(tck.coll.stats.snapshot()["bytes"][phase])
                    before_links = dict(tck.coll.stats.snapshot()["link_bytes"][phase])
                    calls.on = True
                    try:
                        got_t = run(tck)
                    finally:
                        calls.on = False
                    log = tck.executor.transport.log
                    counters["ticks"] += len(log)
                    counters["most_hops_in_a_tick"] = max([counters["most_hops_in_a_tick"], *(h for _, h, _ in log)])
                    c[label] = _check_log(tck, topo, rank, axes, kind, _bytes(tck, phase, before_t))
                    c[label]["ref_bytes"] = ref_bytes
                    c[label]["link_bytes"] = _bytes(tck, phase, before_links, "link_bytes")
                    return got_r, got_t

                fhops = gather.hops_for(plan, (), "forward_gather")
                fwd_r, fwd_t = piece(
                    "forward",
                    lambda ctx: _gather(ctx, fhops, start, "forward_gather", sizes, slots, keep, chunks),
                    [h.axes for h in fhops],
                    tick_plan.GATHER,
                    "forward_gather",
                )
                c["forward"]["values"] = all(torch.equal(a, b) for a, b in zip(fwd_r.values, fwd_t.values))
                c["forward"]["kept"] = all(same_rows(a, b) for a, b in zip(fwd_r.kept, fwd_t.kept))
                # backward: from the kept copies (zero3 keeps none and re-gathers the primary)
                if plan.kept_axes is not None:
                    bhops = gather.hops_for(plan, plan.kept_axes, "backward_gather")
                    kept = fwd_r.kept
                    bstart = Encoded.cat(kept) if isinstance(kept[0], Encoded) else torch.cat(kept, dim=3)
                else:
                    bhops, bstart = gather.hops_for(plan, (), "backward_gather"), start
                bwd_r, bwd_t = piece(
                    "backward",
                    lambda ctx: _gather(ctx, bhops, bstart, "backward_gather", sizes, slots, None, chunks),
                    [h.axes for h in bhops],
                    tick_plan.GATHER,
                    "backward_gather",
                )
                c["backward"]["values"] = all(torch.equal(a, b) for a, b in zip(bwd_r.values, bwd_t.values))
                # gradients: a different bucket per rank, the same stream on both paths
                ggen = torch.Generator().manual_seed(99 + rank)
                grads = [torch.randn(n, generator=ggen) for n in NUMELS]
                red_r, red_t = piece(
                    "reduce",
                    lambda ctx: ctx.executor.result(
                        submit_reduce_scatter(ctx, [g.clone() for g in grads], torch.float32, key=("bucket",))
                    ),
                    [h.axes for h in plan.reduce],
                    tick_plan.EXCHANGE,
                    "grad_reduce",
                )
                c["reduce"]["values"] = len(red_r) == len(red_t) and all(
                    torch.equal(a, b) for a, b in zip(red_r, red_t)
                )
                c["calls"] = {
                    "groups": sorted(set(calls.groups)),
                    "threads": len(calls.threads),
                    "hop_collectives": calls.hop_collectives,
                    "pending_at_issue": calls.pending_at_issue,
                    "batches": len(calls.groups),
                    "most_ops": calls.most_ops,
                    # sub-hops of a forward chunk: more than one puts chunks side by side in a tick
                    "sub_hops": len(tick_plan.sub_hops([topo.axes_size(h.axes) for h in fhops], steps)),
                    **counters,
                }
                calls.groups.clear()
                calls.threads.clear()
                calls.hop_collectives = 0
                calls.most_ops = 0
                per[(steps, chunks)] = c
                ref.executor.close()
                tck.executor.close()
        finally:
            calls.restore()
            for hg in groups.values():
                dist.destroy_process_group(hg.group)
            dist.destroy_process_group(tick_group)
        out["cases"][name] = per
    out["deepspeed_loaded"] = sorted(m for m in sys.modules if m.split(".")[0] == "deepspeed")
    return out


def _pieces_of_data(world: int, rank: int, plan, backward, count: int):
    """``count`` forward gathers' primary buffers, each from its own random tensors."""
    from zeropp_hier.comm import gather

    sizes = [-(-n // world) for n in NUMELS]
    slots = gather.slots_of(sizes, gather.slot_align((*plan.forward, *backward)))
    starts = []
    for i in range(count):
        gen = torch.Generator().manual_seed(4321 + i)
        parts = []
        for n, s in zip(NUMELS, sizes):
            full = torch.randn(n, generator=gen)
            part = torch.full((s,), float("nan"))
            mine = full[rank * s : (rank + 1) * s]
            part[: mine.numel()] = mine
            parts.append(part)
        starts.append(gather.primary_buffer(parts, sizes, NUMELS, slots, rank))
    return sizes, slots, starts


def stream_run(cases: dict, rank_map: list, chunk_counts, count: int) -> dict:
    """[Note: one tick stream per call] in comm/tick/executor.py: ``count`` forward gathers submitted
    inside ``fused()`` against each alone hop by hop; then a forward gather and a backward one
    (other hops) inside one ``fused()``, which must start a second stream."""
    from zeropp_hier.comm import gather
    from zeropp_hier.comm.collectives import Encoded
    from zeropp_hier.comm.tick import plan as tick_plan
    from zeropp_hier.core import layout

    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {}
    for name, (preset, compression) in cases.items():
        cfg, topo, plan, backward, groups, tick_group = _setup(preset, compression, rank_map)
        per: dict = {}
        try:
            for chunks in chunk_counts:
                ref = _ctx(cfg, topo, plan, groups, tick_group, False, chunks)
                tck = _ctx(cfg, topo, plan, groups, tick_group, True, chunks)
                ex = tck.executor
                sizes, slots, starts = _pieces_of_data(world, rank, plan, backward, count)
                keep = [plan.kept_axes] * len(NUMELS) if plan.kept_axes is not None else None
                fhops = gather.hops_for(plan, (), "forward_gather")
                lanes = [h.axes for h in fhops]

                def jobs_of(ctx, hops, start, phase, keep_, chunks=chunks):
                    align = gather.chunk_align(hops, start.block_size if isinstance(start, Encoded) else 1)
                    ranges = gather.column_ranges(sum(slots), align, chunks)
                    finish = gather.finish_bucket(ctx, torch.float32, sizes, slots, NUMELS, keep_)
                    valid = layout.valid_of(sizes, slots)
                    return gather.chunk_jobs(ctx, hops, lambda: start, ranges, phase, finish, valid=valid)

                want = [_gather(ref, fhops, s, "forward_gather", sizes, slots, keep, chunks) for s in starts]
                ex.transport.log = []
                settled: list = []  # ticks run when each piece's future was settled
                futures = []
                before = dict(tck.coll.stats.snapshot()["bytes"]["forward_gather"])
                streams = ex.streams
                with ex.fused():
                    for s in starts:
                        f = ex.submit_all(jobs_of(tck, fhops, s, "forward_gather", keep), lanes)
                        f.add_done_callback(lambda _f: settled.append(len(ex.transport.log)))
                        futures.append(f)
                    held = not any(f.done() for f in futures)  # nothing runs before the context ends
                got = [ex.result(f) for f in futures]
                log = ex.transport.log
                c: dict = {
                    "held": held,
                    "streams": ex.streams - streams,
                    "ticks": len(log),
                    "want_ticks": count * chunks + len(lanes) - 1,
                    "settled": settled,
                    "want_settled": [(i + 1) * chunks + len(lanes) - 1 for i in range(count)],
                    "values": all(torch.equal(a, b) for w, g in zip(want, got) for a, b in zip(w.values, g.values)),
                    "kept": all(same_rows(a, b) for w, g in zip(want, got) for a, b in zip(w.kept, g.kept)),
                    "most_hops_in_a_tick": max(h for _, h, _ in log),
                }
                seq = [(t, p) for t, _, moved in log for p, _, _ in moved]
                rs = tick_plan.rank_sequence(topo, rank, lanes, tick_plan.GATHER, count * chunks)
                c["sequence_ok"] = seq == [(x.tick, x.peer) for x in rs]
                before_r = {}  # the reference's bytes for the same gathers, once more
                for s in starts:
                    b0 = dict(ref.coll.stats.snapshot()["bytes"]["forward_gather"])
                    _gather(ref, fhops, s, "forward_gather", sizes, slots, keep, chunks)
                    for t, v in _bytes(ref, "forward_gather", b0).items():
                        before_r[t] = before_r.get(t, 0) + v
                c["bytes"], c["ref_bytes"] = _bytes(tck, "forward_gather", before), before_r
                # other hops break the stream: a forward gather, then a backward one from the
                # primary, inside one context
                bhops = gather.hops_for(plan, (), "backward_gather")
                streams = ex.streams
                with ex.fused():
                    f1 = ex.submit_all(jobs_of(tck, fhops, starts[0], "forward_gather", None), lanes)
                    f2 = ex.submit_all(
                        jobs_of(tck, bhops, starts[1], "backward_gather", None), [h.axes for h in bhops]
                    )
                r1, r2 = ex.result(f1), ex.result(f2)
                w1 = _gather(ref, fhops, starts[0], "forward_gather", sizes, slots, None, chunks)
                w2 = _gather(ref, bhops, starts[1], "backward_gather", sizes, slots, None, chunks)
                c["split_streams"] = ex.streams - streams
                c["split_values"] = all(torch.equal(a, b) for a, b in zip(w1.values, r1.values)) and all(
                    torch.equal(a, b) for a, b in zip(w2.values, r2.values)
                )
                c["split_hops"] = (tuple(lanes), tuple(h.axes for h in bhops))
                per[chunks] = c
                ref.executor.close()
                tck.executor.close()
        finally:
            for hg in groups.values():
                dist.destroy_process_group(hg.group)
            dist.destroy_process_group(tick_group)
        out[name] = per
    return out


def engine_run(configs: dict, steps: int) -> dict:
    """Train each config from the same seed; record every hop transfer call of the run (its
    group, issuing thread, in-flight work at issue, and any hop collective)."""
    import zeropp_hier
    from zeropp_hier.app import run as training

    out = {}
    for name, cfg in configs.items():
        engine = training.build_engine(cfg)
        calls = CallLog(engine.hier_runtime.tick_group)
        calls.on = True
        try:
            losses = training.train_steps(engine, steps)
        finally:
            calls.on = False
            calls.restore()
        out[name] = {
            "losses": losses,
            "state": training.gathered_state(engine),
            "stats": zeropp_hier.comm_stats(engine),
            "mode": engine.hier_runtime.issue_mode.name,
            "chunks": engine.hier_runtime.chunks,  # pipeline.chunks as the mode ran them
            # [Note: one tick stream per call]: pieces submitted and tick streams run
            "pieces": getattr(engine.hier_runtime.executor, "pieces", None),
            "streams": getattr(engine.hier_runtime.executor, "streams", None),
            "calls": {
                "groups": sorted(set(calls.groups)),
                "batches": len(calls.groups),
                "threads": len(calls.threads),
                "training_thread": threading.get_ident() in calls.threads,
                "hop_collectives": calls.hop_collectives,
                "pending_at_issue": calls.pending_at_issue,
            },
        }
        training.release(engine)
    return out


def die_mid_tick(config: dict, victim: int, kill_call: int) -> str:
    """Train in the tick mode; on ``victim``, the ``kill_call``-th grouped call posts its
    transfers and then the process SIGKILLs itself: a rank dead in the middle of a tick."""
    import os
    import signal

    from zeropp_hier.app import run as training

    engine = training.build_engine(config)
    real = dist.batch_isend_irecv
    seen = [0]

    def batch(ops):
        works = real(ops)
        seen[0] += 1
        if dist.get_rank() == victim and seen[0] == kill_call:
            os.kill(os.getpid(), signal.SIGKILL)
        return works

    dist.batch_isend_irecv = batch
    training.train_steps(engine, 4)
    return "finished"  # never reached: the test fails if it is


def disagree_run(rank_map: list, odd_rank: int) -> dict:
    """Every rank agrees the tick schedule at start-up; ``odd_rank`` runs another chunk count."""
    from zeropp_hier.comm import gather
    from zeropp_hier.comm.tick import agree_schedule, plan_pieces
    from zeropp_hier.core.config import parse_section
    from zeropp_hier.core.plan import make_plan
    from zeropp_hier.core.topology import Topology

    rank = dist.get_rank()
    topo = Topology.for_world(dist.get_world_size(), 2, 2, rank_map)
    plan = make_plan("frontier", parse_section({"enabled": True, "preset": "frontier"}).compression, topo)
    pieces = plan_pieces(plan, gather.backward_hops(plan, all_levels=False))
    same = agree_schedule(topo, rank, pieces, 3).digest  # alike everywhere: passes, one digest
    try:
        agree_schedule(topo, rank, pieces, 4 if rank == odd_rank else 3)
    except Exception as e:  # noqa: BLE001 - handed to the test
        return {"digest": same, "error": type(e).__name__, "failed": sorted(getattr(e, "failed", {})), "text": str(e)}
    return {"digest": same, "error": None}
