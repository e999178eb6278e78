"""The DeepSpeed side of the hierarchy, per engine: the hop groups, the kept copies, the
counters, and the gather of DeepSpeed's partitioned parameters.

One ``HierRuntime`` per engine; nothing lives in module globals. It owns the ``CommContext``
(``comm/context.py``) that the drivers run on, and maps DeepSpeed's parameters (status, ids,
partitions ``ds_tensor``, shapes) to the plain tensors of the gather driver (``comm/gather.py``)
and back. DeepSpeed's partitioned parameters call ``HierRuntime.all_gather_coalesced`` (bound in
place of DeepSpeed's closure by ``zeropp_hier.deepspeed.partition.Init``); gradients go from the
stage-3 subclass (``deepspeed/stage3.py``) straight to the reduce-scatter driver
(``comm/reduce.py``) on this runtime's context. Where each DeepSpeed method is overridden:
docs/design.md#deepspeed-hook-points.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Callable, Iterable, NamedTuple, Sequence

import torch
import torch.distributed as dist
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from ..comm import foreign, gather
from ..comm.agree import agree_same
from ..comm.collectives import Encoded, HierCollectives
from ..comm.context import CommContext
from ..comm.executors import executor_for
from ..comm.groups import build_hop_groups, build_tick_group, release_hop_groups
from ..comm.issue import (
    backend_for,
    check_tick_device,
    chunks_warning,
    default_chunks,
    one_tier_hops,
    resolve_issue_mode,
)
from ..comm.job import Job
from ..comm.numerics import Numerics
from ..comm.stats import CommStats
from ..core import layout, levels
from ..core.config import HierConfig
from ..core.errors import HierTopologyError
from ..core.levels import LevelPlan
from ..core.plan import CommPlan, Hop, make_plan
from ..core.topology import Topology
from .inflight import BackwardWindow, GatherHandle, Layer
from .zero_param import ZeroParam

log = logging.getLogger("zeropp_hier")


def topology_for(cfg: HierConfig, world_size: int) -> Topology:
    t = cfg.topology
    if t.mode == "auto":  # collective: every rank gets here (HierRuntime.create)
        from ..detect.probe import detect

        return detect(t.gcds_per_gpu, t.gpus_per_node).topology
    # manual mode: the parser has made both integers (None is "detect", auto mode only)
    assert t.gpus_per_node is not None and t.gcds_per_gpu is not None
    return Topology.for_world(world_size, t.gpus_per_node, t.gcds_per_gpu, t.rank_map)


def plan_summary(cfg: HierConfig, topo: Topology, level_plan: LevelPlan | None = None) -> dict:
    """What decides which collectives a rank issues: every rank must hold the same."""
    plan = make_plan(cfg.preset, cfg.compression, topo)
    return {
        "preset": cfg.preset,
        "chosen_by_auto": cfg.chosen_by_auto,
        "compression": repr(cfg.compression),
        "memory": repr(cfg.memory),
        "numerics": repr(cfg.numerics),
        "pipeline": repr(cfg.pipeline),  # chunks and deferral change which collectives run, and when
        "overlap": repr(cfg.overlap),  # "ticks" moves the hops' bytes by point-to-point calls instead
        "topology": [list(topo.dims), list(topo.rank_map) if topo.rank_map is not None else None],
        "hops": repr(plan),
        "levels": None if level_plan is None else dict(level_plan.levels),
    }


class _Bucket(NamedTuple):
    """What the gather jobs of one bucket run on (``HierRuntime._bucket``)."""

    hops: tuple[Hop, ...]
    make_start: Callable[[], gather.Buffer]  # the start buffer, made when the job starts
    carry: tuple[torch.Tensor, ...]  # kept copies made on other lanes that the first hop reads
    width: int  # elements of every rank's segment (the slots side by side)
    valid: layout.Valid | None  # the elements of a segment that can hold a value (None: all)
    align: int  # chunk edges on multiples of this ([Note: chunked gathers] in comm/gather.py)
    finish: Callable[[gather.Buffer], dict[int, torch.Tensor]]  # full tensors by ds_id; keeps copies


class HierRuntime:
    def __init__(self, cfg: HierConfig, topo: Topology, rank: int):
        self.cfg = cfg
        self.topo = topo
        self.rank = rank
        self.me = topo.coord(rank)
        self.plan: CommPlan = make_plan(cfg.preset, cfg.compression, topo)
        # the backward hops of every kept level a layer may take: the preset's own, and the others
        # only under a memory budget ([Note: kept levels]), so no unused group is built
        backward_hops = gather.backward_hops(self.plan, all_levels=cfg.memory.kept_shards_gb is not None)
        # slot granularity of gathered partitions ([Note: blocks never straddle])
        self._gather_align = gather.slot_align((*self.plan.forward, *backward_hops))
        axes_sets = [h.axes for h in (*self.plan.forward, *backward_hops, *self.plan.reduce)]
        self.groups = build_hop_groups(topo, axes_sets, rank, cfg.collective_timeout_s)
        # kept level per parameter ([Note: kept levels] in core/levels.py): set by set_levels
        # when a memory budget asks for a mix; otherwise every parameter keeps plan.kept_axes
        self._kept_of: dict[int, tuple[str, ...] | None] = {}
        self.level_plan: LevelPlan | None = None
        self.auto_choice: dict | None = None  # what "preset": "auto" chose, and why
        self.stats = CommStats(topo, rank)
        self.coll = HierCollectives(topo, self.groups, self.stats)
        from deepspeed.accelerator import get_accelerator

        # where tensors that our collectives (and the agreed non-finite check) send must live: the
        # accelerator's current device (the CPU on the CPU accelerator), whatever DeepSpeed's
        # optimizer device is (the CPU under offload_optimizer)
        self.comm_device = torch.device(get_accelerator().current_device_name())
        # who issues the hop collectives, chosen for the hop groups' backend in one place
        # ([Note: one issuing thread on GPUs] in comm/issue.py)
        backend = backend_for(dist.get_backend(), self.comm_device.type)
        one_tier = one_tier_hops(axes_sets)  # what overlap true means on NCCL/RCCL
        self.issue_mode = resolve_issue_mode(cfg.overlap, backend, torch.version.hip is not None, one_tier)
        check_tick_device(self.issue_mode, backend, self.comm_device.type)
        # pipeline.chunks as this mode runs it (left out: the tick mode's own count)
        self.chunks = default_chunks(cfg.pipeline.chunks, self.issue_mode)
        if rank == 0:
            log.info("zeropp_hier: hop collectives: %s", self.issue_mode.reason)
            if self.issue_mode.warning:
                log.warning("zeropp_hier: %s", self.issue_mode.warning)
            chunked = chunks_warning(self.issue_mode, self.chunks)
            if chunked:
                log.warning("zeropp_hier: %s", chunked)
        # the tick mode's one communicator, and every rank's schedule agreed before any tick
        # ([Note: ticks] in comm/tick/plan.py)
        self.tick_group = None
        transport = None
        if self.issue_mode.ticks:
            from ..comm.tick import TickTransport, agree_schedule, plan_pieces
            from ..comm.tick.connect import connect_peers

            self.tick_group = build_tick_group(topo, cfg.collective_timeout_s)
            steps = cfg.pipeline.hop_steps
            transport = TickTransport(self.tick_group, rank, topo, self.stats, cfg.collective_timeout_s, steps)
            agreed = agree_schedule(topo, rank, plan_pieces(self.plan, backward_hops), self.chunks, steps)
            # each tick peer's connection opened now, under its own bound, not inside the first
            # node tick ([Note: connections before the first step] in comm/tick/connect.py)
            connect_peers(self.tick_group, rank, topo, agreed.peers, cfg.collective_timeout_s, self.comm_device)
        self.executor = executor_for(
            self.issue_mode, f"rank{rank}", self.comm_device, timeout_s=cfg.collective_timeout_s, transport=transport
        )
        # collectives of the training thread (DeepSpeed's, the user's) drain the lanes first
        # ([Note: foreign collectives] in comm/foreign.py)
        foreign.install()
        self.numerics = Numerics(cfg.numerics, self.plan, topo, rank)
        self.phase = "other_gather"
        # ds_id -> its layer's name ([Note: a job per layer] in deepspeed/inflight.py)
        self.layer_key: dict[int, str] = {}
        # [Note: backward window] in deepspeed/inflight.py
        self.window = BackwardWindow(cfg.pipeline.backward_layers_ahead, self._submit_layer)
        # ds_id -> kept shard [n, p, g, partition_numel]; cleared whenever the primary changes
        # (or the whole row of a packed bucket, shared by its parameters: [Note: kept copies of
        # packed buckets] in comm/gather.py)
        self.shards: dict[int, torch.Tensor | Encoded | gather.KeptRow] = {}
        self._frozen: dict[int, ZeroParam] = {}  # kept shards of parameters that do not train
        # what the gather and reduce-scatter drivers run on
        self.comm = CommContext(
            topo, rank, self.plan, self.coll, self.executor, hooks=self.numerics, pipeline_chunks=self.chunks
        )

    def close(self) -> None:
        """Destroy this runtime's process groups (local: no collective).

        Each engine creates its own hop groups; without this, every engine built and destroyed in
        a process (sweeps, evaluation engines, test suites) left three gloo/RCCL groups and their
        transport threads behind, and a long-lived process slowed down as they piled up.

        A lane still inside a collective when the executor's bounded close ends may use any hop
        group: then no group is destroyed (that can crash the process under the running
        collective); they go with the process, which must exit ([Note: executor failure
        semantics] in comm/executor.py)."""
        stuck = self.executor.close()
        self.shards.clear()
        if stuck:
            log.warning(
                f"zeropp_hier: rank {self.rank}: lanes {stuck} are still inside a collective after the "
                "executor's bounded close; their process groups are left in place for the process's "
                "exit (destroying them under a running collective could crash it). Exit this process."
            )
            return
        # emptied in place: HierCollectives holds the same dict, and the groups' transport
        # threads end only when the last reference goes
        release_hop_groups(self.groups)
        if self.tick_group is not None:
            dist.destroy_process_group(self.tick_group)
            self.tick_group = None

    @classmethod
    def create(cls, cfg: HierConfig) -> HierRuntime:
        world = dist.get_world_size()
        topo = topology_for(cfg, world)
        # before any hop group is built: a rank with another plan would create other groups
        # and issue other collectives ([Note: agreed local checks] in comm/agree.py)
        agree_same("plan", plan_summary(cfg, topo))
        return cls(cfg, topo, dist.get_rank())

    def check_partition_world(self, world: int) -> None:
        if world != self.topo.world_size:
            raise HierTopologyError(
                "topology",
                self.topo.dims,
                f"parameters are partitioned over {world} ranks but the topology spans "
                f"{self.topo.world_size}; zeropp_hier needs ZeRO partitioning over the whole world "
                "(no model-parallel mpu)",
            )

    # -- gathers -------------------------------------------------------------------------------
    def all_gather_coalesced(
        self, params: Iterable[ZeroParam], safe_mode: bool = False, quantize: bool = False
    ) -> GatherHandle:
        """Replacement for DeepSpeed's per-parameter ``all_gather_coalesced`` closure: a job per
        layer ([Note: a job per layer] in deepspeed/inflight.py), one handle for all."""
        params = sorted(params, key=lambda p: p.ds_id)  # same order on every rank
        for p in params:
            if p.ds_status != ZeroParamStatus.NOT_AVAILABLE:
                raise RuntimeError(f"zeropp_hier: gather of a parameter that is not partitioned: {p.ds_summary()}")
            p.ds_status = ZeroParamStatus.INFLIGHT
        phase = self.phase  # the caller's phase (forward/backward), not the executor's later one
        by_layer: dict[str, list[ZeroParam]] = {}
        for p in params:  # each layer in order of its first parameter id
            # outside the step (persistent re-gathers, GatheredParameters) nothing is used layer by
            # layer: one coalesced job ([Note: every gather through the hierarchy])
            key = "" if phase == "other_gather" else self.layer_key.get(p.ds_id, "")
            by_layer.setdefault(key, []).append(p)
        layers = [Layer(ps, phase=phase, key=k) for k, ps in by_layer.items()]
        if phase == "backward_gather":  # backward uses the layers last to first
            layers.reverse()
        # the layers submitted now run as one tick stream in the tick mode ([Note: one tick
        # stream per call] in comm/tick/executor.py); on lanes this changes nothing
        with self.executor.fused():
            for layer in layers:  # submitted now, or when the backward window lets them go
                self.window.add(layer)
        return GatherHandle(layers, self.executor, self.window)

    def note_layers(self, named_params: Iterable[tuple[str, ZeroParam]]) -> None:
        """Each parameter's layer, for the job per layer (local and deterministic: names and
        ids are the same on every rank)."""
        for name, p in named_params:
            self.layer_key[p.ds_id] = levels.layer_of(name)

    def _submit_layer(self, layer: Layer) -> None:
        """Submit the gather of one layer's parameters; sets its futures, in submission order."""
        params, phase = list(layer.params), layer.phase
        # One coalesced buffer per (source, dtype): shard-backed and primary-backed parameters
        # take different hops, and a buffer holds one dtype. The source is decided now, on the
        # caller's thread, from the kept shards as they are at submission.
        buckets: dict[tuple[tuple[str, ...], torch.dtype], list] = {}
        # a kept copy holds what the (possibly compressed) forward gather delivered: used for the
        # backward and later forwards, never for an exact gather outside the step
        use_shards = phase != "other_gather"
        for p in params:
            # the source: the primary (()), or a kept copy spanning these axes
            src = (self.kept_axes_of(p.ds_id) or ()) if use_shards and p.ds_id in self.shards else ()
            buckets.setdefault((src, p.ds_tensor.dtype), []).append(p)
        work: list[tuple[list[ZeroParam], tuple[str, ...], list | gather.KeptRow | None]] = []
        for (src, _), ps in sorted(buckets.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            if not src:
                work.append((ps, src, None))
                continue
            # copies kept per tensor gather as one bucket; a whole packed row kept as one copy
            # gathers on its own ([Note: kept copies of packed buckets] in comm/gather.py)
            loose = [p for p in ps if not isinstance(self.shards[p.ds_id], gather.KeptRow)]
            if loose:
                work.append((loose, src, [self.shards[p.ds_id] for p in loose]))
            rows: dict[int, tuple[gather.KeptRow, list[ZeroParam]]] = {}
            for p in ps:
                row = self.shards[p.ds_id]
                if isinstance(row, gather.KeptRow):
                    rows.setdefault(id(row), (row, []))[1].append(p)
            work.extend((members, src, row) for row, members in rows.values())
        chunks = self.chunks
        if chunks > 1:  # [Note: chunked gathers] in comm/gather.py: a job per chunk of each bucket
            futures: list[Future] = []  # each chunk's, or each bucket's whole (``LayerWait.futures``)
            for ps, src, shards in work:
                b = self._bucket(ps, src, shards, phase)
                ranges = gather.column_ranges(b.width, b.align, chunks)
                bucket_lanes = [h.axes for h in b.hops]
                jobs = gather.chunk_jobs(self.comm, b.hops, b.make_start, ranges, phase, b.finish, b.carry, b.valid)
                if self.executor.yields_wires:  # the chunks advance together, in ticks
                    futures.append(self.executor.submit_all(jobs, bucket_lanes))
                    continue
                for job in jobs:
                    futures.append(self.executor.submit(job, bucket_lanes))
            layer.futures = futures
            return

        # the hop group of every collective, in order: the executor queues them now, in program
        # order ([Note: one order of hop collectives] in comm/executor.py)
        lanes = [hop.axes for _, src, _ in work for hop in gather.hops_for(self.plan, src, phase)]

        def gather_all() -> Job:
            full: dict[int, torch.Tensor] = {}
            for ps, src, shards in work:
                full.update((yield from self._gather_bucket(ps, src, shards, phase)))
            return full

        layer.futures = [self.executor.submit(gather_all(), lanes)]

    def _gather_bucket(
        self, ps: list[ZeroParam], src: tuple[str, ...], shards: list | gather.KeptRow | None, phase: str
    ) -> Job:
        """The job of one bucket, unchunked: its hops, then its ``finish``."""
        b = self._bucket(ps, src, shards, phase)
        return (yield from gather.gather_bucket(self.comm, b.hops, b.make_start(), phase, b.finish, b.carry, b.valid))

    def _bucket(
        self, ps: list[ZeroParam], src: tuple[str, ...], shards: list | gather.KeptRow | None, phase: str
    ) -> _Bucket:
        """One bucket: its parameters as plain tensors for the gather driver (``comm/gather.py``),
        run from the primary partitions (``src`` empty) or from kept copies spanning ``src``;
        ``finish`` hands the copies it keeps and the full tensors back to the parameters. The
        primary partitions are read by ``make_start``, called when the job starts (on its lane)."""
        if isinstance(shards, gather.KeptRow):
            return self._kept_row_bucket(ps, src, shards, phase)
        sizes = [p.ds_tensor.ds_numel for p in ps]
        numels = [p.ds_numel for p in ps]
        # Copies are kept from forward gathers only, for the backward (and, for frozen parameters,
        # the next steps): gathers outside the step (engine construction, GatheredParameters,
        # persistent re-gathers) keep nothing, so a weight changed between steps by any route
        # can never be served from a stale copy. Persistent parameters are never re-gathered,
        # and a layer at level none keeps nothing.
        keep = None
        if not src and self.plan.kept_axes is not None and phase == "forward_gather":
            keep = [None if getattr(p, "ds_persist", False) else self.kept_axes_of(p.ds_id) for p in ps]
        # each partition in a slot of whole blocks when a hop quantizes ([Note: blocks never
        # straddle]), packed where that padding grows past its bound ([Note: per-rank costs flat
        # in the world]); copies kept per tensor have the slots of the forward gather that made
        # them. Exact gathers ([Note: every gather through the hierarchy]) need no padding.
        # A packed bucket that keeps copies keeps its row whole ([Note: kept copies of packed
        # buckets] in comm/gather.py), which needs one kept level for the bucket: a bucket that
        # keeps at several levels (a memory budget's mix) stays in whole-block slots.
        kept_axes = {k for k in keep if k is not None} if keep is not None else set()
        packing_world = 1 if src or len(kept_axes) > 1 else self.topo.world_size
        lay = layout.bucket_layout(sizes, 1 if phase == "other_gather" else self._gather_align, packing_world)
        slots = list(lay.slots)
        row_axes = next(iter(kept_axes)) if lay.packed and kept_axes else None
        carry: tuple[torch.Tensor, ...] = ()
        start_block = 1
        if src:
            assert shards is not None
            kept_shards = shards

            def make_start() -> gather.Buffer:
                if isinstance(kept_shards[0], Encoded):
                    return Encoded.cat(kept_shards)
                return torch.cat(kept_shards, dim=3)

            # the kept copies were made on the forward's lanes
            carry = tuple(t for s in shards for t in ((s.data, s.scales) if isinstance(s, Encoded) else (s,)))
            start_block = shards[0].block_size if isinstance(shards[0], Encoded) else 1
        else:

            def make_start() -> gather.Buffer:
                parts = [p.ds_tensor.data.reshape(-1) for p in ps]
                return gather.primary_buffer(parts, sizes, numels, slots, self.rank)

        dtype = ps[0].ds_tensor.dtype
        hops = gather.with_block(gather.hops_for(self.plan, src, phase), lay.block)
        cut = gather.finish_bucket(self.comm, dtype, sizes, slots, numels, None if row_axes else keep)
        ids = tuple(p.ds_id for p in ps)

        def finish(full: gather.Buffer) -> dict[int, torch.Tensor]:
            got = cut(full)
            kept: Sequence[object] = got.kept
            if row_axes is not None:  # the whole row, once, for every parameter that keeps
                assert keep is not None
                row = gather.KeptRow(
                    gather.kept_copy(self.comm, full, row_axes),
                    ids,
                    tuple(sizes),
                    tuple(slots),
                    tuple(numels),
                    lay.block,
                )
                kept = [None if k is None else row for k in keep]
            kept_now = False
            for p, piece in zip(ps, kept):
                if piece is not None:
                    self.shards[p.ds_id] = piece  # type: ignore[assignment]
                    kept_now = True
                    if not p.requires_grad:
                        self._frozen[p.ds_id] = p
            if kept_now:
                self.stats.note_kept(self.shard_bytes())
            return {p.ds_id: t.view(p.ds_shape).to(p.ds_tensor.dtype) for p, t in zip(ps, got.values)}

        return _Bucket(
            hops,
            make_start,
            carry,
            sum(slots),
            layout.valid_of(sizes, slots),
            gather.chunk_align(hops, start_block),
            finish,
        )

    def _kept_row_bucket(self, ps: list[ZeroParam], src: tuple[str, ...], row: gather.KeptRow, phase: str) -> _Bucket:
        """The gather of a whole kept row ([Note: kept copies of packed buckets] in
        comm/gather.py): every tensor of the bucket the forward packed, from its copy; only the
        values of ``ps`` are handed out."""
        buf = row.buf
        hops = gather.with_block(gather.hops_for(self.plan, src, phase), row.block)
        carry = (buf.data, buf.scales) if isinstance(buf, Encoded) else (buf,)
        start_block = buf.block_size if isinstance(buf, Encoded) else 1
        cut = gather.finish_bucket(self.comm, ps[0].ds_tensor.dtype, row.sizes, row.slots, row.numels)
        at = {ds_id: i for i, ds_id in enumerate(row.ids)}

        def finish(full: gather.Buffer) -> dict[int, torch.Tensor]:
            values = cut(full).values
            return {p.ds_id: values[at[p.ds_id]].view(p.ds_shape).to(p.ds_tensor.dtype) for p in ps}

        return _Bucket(
            hops,
            lambda: buf,
            carry,
            sum(row.slots),
            layout.valid_of(row.sizes, row.slots),
            gather.chunk_align(hops, start_block),
            finish,
        )

    def kept_axes_of(self, ds_id: int) -> tuple[str, ...] | None:
        return self._kept_of.get(ds_id, self.plan.kept_axes)

    def set_levels(self, named_params: Sequence[tuple[str, ZeroParam]]) -> LevelPlan | None:
        """Choose each layer's kept level under ``memory.kept_shards_gb`` ([Note: kept levels]).
        Local and deterministic: every rank sees the same names and sizes, so all choose alike."""
        budget = self.cfg.memory.kept_shards_gb
        if budget is None or self.plan.kept_axes is None:
            return None
        per_elem = levels.kept_bytes_per_elem(self.plan, named_params[0][1].ds_tensor.element_size())
        layer_of = {p.ds_id: levels.layer_of(name) for name, p in named_params}
        slots: dict[str, float] = {}
        for _, p in named_params:
            if not getattr(p, "ds_persist", False):  # persistent parameters keep no copy
                key = layer_of[p.ds_id]
                slots[key] = slots.get(key, 0.0) + layout.aligned(p.ds_tensor.ds_numel, self._gather_align)
        plan = levels.assign(list(slots.items()), self.plan.preset, self.topo, per_elem, budget * 1e9)
        self._kept_of = {
            pid: levels.LEVEL_AXES[plan.levels[layer]] for pid, layer in layer_of.items() if layer in plan.levels
        }
        self.level_plan = plan
        self.shards.clear()
        return plan

    def invalidate_shards(self, keep_frozen: bool = False) -> None:
        """The primary shards changed: kept copies are stale. After an optimizer step
        (``keep_frozen``) the copies of frozen parameters stay: their primary shards did not
        change, so they serve the next forward and backward without leaving the package (a
        LoRA-style fine-tune gathers its frozen base model over the network once, not every
        step). A checkpoint load replaces every weight and drops them all."""
        self.executor.drain()  # no gather in flight may write a copy after this
        if keep_frozen:
            # still frozen now: a parameter unfrozen since its copy was made has just trained
            still = {i for i, p in self._frozen.items() if not p.requires_grad}
            for ds_id in [i for i in self.shards if i not in still]:
                del self.shards[ds_id]
                self._frozen.pop(ds_id, None)
        else:
            self.shards.clear()
            self._frozen.clear()

    def drop_shards(self, params: Iterable[ZeroParam]) -> None:
        """These parameters' full weights changed outside the optimizer: their copies are stale."""
        for p in params:
            self.shards.pop(p.ds_id, None)
            self._frozen.pop(p.ds_id, None)

    def shard_bytes(self) -> int:
        """Bytes of the kept copies on this rank (encoded ones at their encoded size)."""
        # a whole kept row is shared by its bucket's parameters: counted once
        held = {id(t): t.buf if isinstance(t, gather.KeptRow) else t for t in self.shards.values()}
        return sum(t.nbytes if isinstance(t, Encoded) else t.numel() * t.element_size() for t in held.values())
