"""Per-engine state of the hierarchy: groups, kept shards, counters, and the two operations
DeepSpeed delegates to us (gather a list of parameters, reduce-scatter a list of gradients).

One ``HierRuntime`` per engine; nothing lives in module globals. DeepSpeed's partitioned
parameters call ``HierRuntime.all_gather_coalesced`` (bound in place of DeepSpeed's closure by
``zeropp_hier.deepspeed.partition.Init``), and the stage-3 subclass calls ``reduce_scatter``.
"""

from __future__ import annotations

import functools
import logging
from typing import Iterable, Sequence

import torch
import torch.distributed as dist
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from ..comm.agree import agree_same
from ..comm.collectives import Encoded, HierCollectives
from ..comm.executor import CommExecutor, Job, Move
from ..comm.groups import build_hop_groups
from ..comm.numerics import Numerics
from ..comm.stats import CommStats
from ..core import layout, levels
from ..core.config import HierConfig
from ..core.errors import HierTopologyError
from ..core.levels import LevelPlan
from ..core.plan import CommPlan, make_plan
from ..core.policy import QUANTIZED
from ..core.topology import Topology

logger = logging.getLogger("zeropp_hier")


def topology_for(cfg: HierConfig, world_size: int) -> Topology:
    t = cfg.topology
    if t.mode == "auto":  # collective: every rank gets here (HierRuntime.create)
        from ..detect.probe import detect

        return detect(t.gcds_per_gpu, t.gpus_per_node).topology
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
        "topology": [list(topo.dims), list(topo.rank_map) if topo.rank_map is not None else None],
        "hops": repr(plan),
        "levels": None if level_plan is None else dict(level_plan.levels),
    }


class _GatheredHandle:
    """DeepSpeed's gather-handle protocol. The hops run on the runtime's executor from the moment
    the handle is made ([Note: one order of hop collectives]); ``wait`` takes their outputs and
    hands the full tensors to the parameters."""

    def __init__(self, params: Sequence[torch.nn.Parameter], future, executor: CommExecutor):
        self.params = params
        self.future = future
        self.executor = executor
        self.complete = False

    def wait(self, handle_dependency: bool = True) -> None:
        if self.complete:
            return
        full = self.executor.result(self.future)
        for p in self.params:
            t = full[p.ds_id]
            if t.is_cuda:  # made on the executor's stream, used on the caller's from now on
                t.record_stream(torch.cuda.current_stream(t.device))
            p.data = t
            p.ds_status = ZeroParamStatus.AVAILABLE
        self.complete = True


class HierRuntime:
    def __init__(self, cfg: HierConfig, topo: Topology, rank: int):
        self.cfg = cfg
        self.topo = topo
        self.rank = rank
        self.me = topo.coord(rank)
        self.plan: CommPlan = make_plan(cfg.preset, cfg.compression, topo)
        # slot granularity of gathered partitions: the largest block of any quantizing gather hop
        # (block sizes are powers of two, so it is a multiple of every one); 1 when all are exact
        self._exact_forward = tuple(h._replace(scheme="none") for h in self.plan.forward)
        # the backward hops of every kept level a layer may take: the preset's own, and the others
        # only under a memory budget ([Note: kept levels]), so no unused group is built
        budgeted = cfg.memory.kept_shards_gb is not None
        backward_hops = [
            h for axes, hops in self.plan.by_level if budgeted or axes == self.plan.kept_axes for h in hops
        ]
        self._gather_align = max(
            (h.block_size for h in (*self.plan.forward, *backward_hops) if h.scheme in QUANTIZED), default=1
        )
        axes_sets = [h.axes for h in (*self.plan.forward, *backward_hops, *self.plan.reduce)]
        self.groups = build_hop_groups(topo, axes_sets, rank, cfg.collective_timeout_s)
        # kept level per parameter ([Note: kept levels] in core/levels.py): set by set_levels
        # when a memory budget asks for a mix; otherwise every parameter keeps plan.kept_axes
        self._kept_of: dict[int, tuple[str, ...] | None] = {}
        self.level_plan: LevelPlan | None = None
        self.auto_choice: dict | None = None  # what "preset": "auto" chose, and why
        self.stream_chunk_elems = layout.STREAM_CHUNK_ELEMS
        self.stats = CommStats(topo, rank)
        self.coll = HierCollectives(topo, self.groups, self.stats)
        from deepspeed.accelerator import get_accelerator

        # where tensors that our collectives (and the agreed non-finite check) send must live: the
        # accelerator's current device (the CPU on the CPU accelerator), whatever DeepSpeed's
        # optimizer device is (the CPU under offload_optimizer)
        self.comm_device = torch.device(get_accelerator().current_device_name())
        self.executor = CommExecutor(
            f"rank{rank}",
            self.comm_device,
            overlap=bool(cfg.overlap),
            one_lane=cfg.overlap == "one_lane",
            timeout_s=cfg.collective_timeout_s,
        )
        self.numerics = Numerics(cfg.numerics, self.plan, topo, rank)
        self.phase = "other_gather"
        # ds_id -> kept shard [n, p, g, partition_numel]; cleared whenever the primary changes
        self.shards: dict[int, torch.Tensor] = {}
        self._frozen: dict[int, torch.nn.Parameter] = {}  # kept shards of parameters that do not train
        self._index_order = layout.index_order(topo)  # host copies; per device in self._perms
        self._rank_order = layout.rank_order(topo)
        self._perms = layout.DevicePerms()  # [Note: no host traffic in the hot path]

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
            logger.warning(
                f"zeropp_hier: rank {self.rank}: lanes {stuck} are still inside a collective after the "
                "executor's bounded close; their process groups are left in place for the process's "
                "exit (destroying them under a running collective could crash it). Exit this process."
            )
            return
        for hg in self.groups.values():
            dist.destroy_process_group(hg.group)
        # clear the dict in place: HierCollectives holds the same one, and the groups' transport
        # threads end only when the last reference goes
        self.groups.clear()

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
        self, params: Iterable[torch.nn.Parameter], safe_mode: bool = False, quantize: bool = False
    ) -> _GatheredHandle:
        """Replacement for DeepSpeed's per-parameter ``all_gather_coalesced`` closure."""
        params = sorted(params, key=lambda p: p.ds_id)  # same order on every rank
        for p in params:
            if p.ds_status != ZeroParamStatus.NOT_AVAILABLE:
                raise RuntimeError(f"zeropp_hier: gather of a parameter that is not partitioned: {p.ds_summary()}")
            p.ds_status = ZeroParamStatus.INFLIGHT
        # One coalesced buffer per (source, dtype): shard-backed and primary-backed parameters
        # take different hops, and a buffer holds one dtype. The source is decided now, on the
        # caller's thread, from the kept shards as they are at submission.
        buckets: dict[tuple[tuple[str, ...], torch.dtype], list] = {}
        # a kept copy holds what the (possibly compressed) forward gather delivered: used for the
        # backward and later forwards, never for an exact gather outside the step
        use_shards = self.phase != "other_gather"
        for p in params:
            # the source: the primary (()), or a kept copy spanning these axes
            src = self.kept_axes_of(p.ds_id) if use_shards and p.ds_id in self.shards else ()
            buckets.setdefault((src, p.ds_tensor.dtype), []).append(p)
        work = [
            (ps, src, [self.shards[p.ds_id] for p in ps] if src else None)
            for (src, _), ps in sorted(buckets.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))
        ]
        phase = self.phase  # the caller's phase (forward/backward), not the executor's later one
        # the hop group of every collective, in order: the executor queues them now, in program
        # order ([Note: one order of hop collectives] in comm/executor.py)
        lanes = [hop.axes for _, src, _ in work for hop in self._gather_hops(src, phase)]

        def gather_all() -> Job:
            full: dict[int, torch.Tensor] = {}
            for ps, src, shards in work:
                full.update((yield from self._gather_bucket(ps, src, shards, phase)))
            return full

        return _GatheredHandle(params, self.executor.submit(gather_all(), lanes), self.executor)

    def _gather_hops(self, src: tuple[str, ...], phase: str) -> tuple:
        """The hops of a gather from the primary shards (``src`` empty) or from kept copies
        spanning ``src``. Gathers outside forward and backward (GatheredParameters, the 16-bit
        save, persistent re-gathers, item()) hand out weights that are saved, inspected or kept:
        they take the same hops, exact ([Note: every gather through the hierarchy] in
        partition.py)."""
        if src:
            return self.plan.backward_for(src)
        return self._exact_forward if phase == "other_gather" else self.plan.forward

    def _gather_bucket(self, ps: list, src: tuple[str, ...], shards: list | None, phase: str) -> Job:
        """Gather one bucket from the primary shards (``src`` empty) or from kept copies spanning
        ``src``; keep copies on the way when this is a forward gather. A job for the executor:
        it announces each hop's collective (``Move``) before issuing it."""
        from_shard = bool(src)
        sizes = [p.ds_tensor.ds_numel for p in ps]
        exact = phase == "other_gather"  # [Note: every gather through the hierarchy]
        # each partition in a slot of whole blocks when a hop quantizes ([Note: blocks never
        # straddle]); kept shards have the slots of the forward gather that made them
        align = 1 if exact else self._gather_align
        slots = [layout.aligned(n, align) for n in sizes]
        buf: torch.Tensor | None = None
        enc: Encoded | None = None  # set once a hop has quantized ([Note: quantize once per gather])
        if from_shard:
            if isinstance(shards[0], Encoded):
                enc = Encoded.cat(shards)
            else:
                buf = torch.cat(shards, dim=3)
        else:
            buf = self._primary_buffer(ps, sizes, slots).view(1, 1, 1, -1)
        hops = self._gather_hops(src, phase)
        dtype = ps[0].ds_tensor.dtype
        for i, hop in enumerate(hops):
            # the tensors this hop reads that another lane made (on a GPU: its stream)
            carry = (enc.data, enc.scales) if enc is not None else (buf,)
            if i == 0 and shards:  # the kept copies were made on the forward's lanes
                carry += tuple(t for s in shards for t in ((s.data, s.scales) if isinstance(s, Encoded) else (s,)))
            yield Move(hop.axes, carry)
            if enc is None and hop.scheme in QUANTIZED:
                enc = self.coll.encode(buf, hop, hop.block_size, hook=self.numerics.gather_hook(phase, hop))
            if enc is not None:
                enc = self.coll.gather_encoded(enc, hop, phase)
            else:
                buf = self.coll.gather_hop(buf, hop, hop.block_size, phase, hook=self.numerics.gather_hook(phase, hop))
        # Copies are kept from forward gathers only, for the backward (and, for frozen parameters,
        # the next steps): gathers outside the step (engine construction, GatheredParameters,
        # persistent re-gathers) keep nothing, so a weight changed between steps by any route
        # can never be served from a stale copy. An encoded gather leaves encoded copies.
        if not from_shard and self.plan.kept_axes is not None and phase == "forward_gather":
            cut: dict = {}  # kept axes -> this rank's part of the gathered buffer along them
            off, kept_now = 0, False
            for p, slot in zip(ps, slots):
                axes = self.kept_axes_of(p.ds_id)
                # persistent ones are never re-gathered; a layer at level none keeps nothing
                if axes is not None and not getattr(p, "ds_persist", False):
                    if axes not in cut:
                        mine = functools.partial(layout.kept_shard, me=self.me, kept_axes=axes)
                        cut[axes] = (
                            enc._replace(data=mine(enc.data), scales=mine(enc.scales))
                            if enc is not None
                            else mine(buf)
                        )
                    kept = cut[axes]
                    self.shards[p.ds_id] = (
                        kept.payload(off, slot) if enc is not None else kept[..., off : off + slot].contiguous()
                    )
                    kept_now = True
                    if not p.requires_grad:
                        self._frozen[p.ds_id] = p
                off += slot
            if kept_now:
                self.stats.note_kept(self.shard_bytes())
        if enc is not None:
            buf = self.coll.decode(enc, dtype)
        assert buf is not None
        rows = buf.reshape(self.topo.world_size, -1)  # coordinate order
        if self._rank_order is not None:
            rows = rows.index_select(0, self._perms.get("rank", self._rank_order, rows.device))  # global rank order
        out, off = {}, 0
        for p, n, slot in zip(ps, sizes, slots):
            flat = rows[:, off : off + n].reshape(-1)[: p.ds_numel]
            out[p.ds_id] = flat.view(p.ds_shape).to(p.ds_tensor.dtype)
            off += slot
        return out

    def _primary_buffer(self, ps: list, sizes: list[int], slots: list[int]) -> torch.Tensor:
        """This rank's partitions side by side, each in its slot; everything else zero.
        DeepSpeed leaves the tail of the last partitions uninitialised: uncompressed those
        elements are never read, but a quantization block holding them would take its scale from
        whatever is there (NaN included) and spoil the real values beside it."""
        dtype = ps[0].ds_tensor.dtype
        if slots == sizes:  # no padding: one concatenation, then zero the tails
            buf = torch.cat([p.ds_tensor.data.reshape(-1) for p in ps])
        else:
            buf = torch.zeros(sum(slots), dtype=dtype, device=ps[0].ds_tensor.device)
        off = 0
        for p, n, slot in zip(ps, sizes, slots):
            valid = max(0, min(n, p.ds_numel - self.rank * n))
            if slots != sizes:
                buf[off : off + valid].copy_(p.ds_tensor.data.reshape(-1)[:valid])
            elif valid < n:
                buf[off + valid : off + n].zero_()
            off += slot
        return buf

    def kept_axes_of(self, ds_id: int) -> tuple[str, ...] | None:
        return self._kept_of.get(ds_id, self.plan.kept_axes)

    def set_levels(self, named_params: Sequence[tuple[str, torch.nn.Parameter]]) -> LevelPlan | None:
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

    def drop_shards(self, params: Iterable[torch.nn.Parameter]) -> None:
        """These parameters' full weights changed outside the optimizer: their copies are stale."""
        for p in params:
            self.shards.pop(p.ds_id, None)
            self._frozen.pop(p.ds_id, None)

    def shard_bytes(self) -> int:
        """Bytes of the kept copies on this rank (encoded ones at their encoded size)."""
        return sum(t.nbytes if isinstance(t, Encoded) else t.numel() * t.element_size() for t in self.shards.values())

    def kept_weights(self, p: torch.nn.Parameter) -> torch.Tensor:
        """A parameter's kept copy as values [n, p, g, slot] in its dtype (decoded if encoded)."""
        t = self.shards[p.ds_id]
        return self.coll.decode(t, p.ds_tensor.dtype) if isinstance(t, Encoded) else t

    # -- gradient reduction --------------------------------------------------------------------
    def reduce_scatter(
        self,
        grads: Sequence[torch.Tensor],
        wire_dtype: torch.dtype,
        key: tuple[str, ...] | None = None,
        loss_scale: float = 1.0,
    ) -> list[torch.Tensor]:
        """Average ``grads`` over the world; return this rank's chunk of each (fp32), in the
        sizes DeepSpeed's ``reduce_scatter_coalesced`` returns. ``key`` names the bucket (its
        parameter names) for error feedback; ``loss_scale`` is the one the gradients carry (fp16)."""
        return self.executor.result(self.submit_reduce_scatter(grads, wire_dtype, key, loss_scale))

    def submit_reduce_scatter(
        self,
        grads: Sequence[torch.Tensor],
        wire_dtype: torch.dtype,
        key: tuple[str, ...] | None = None,
        loss_scale: float = 1.0,
    ):
        """``reduce_scatter`` without waiting: the gradients are copied into the stage layout
        now, on the caller (the caller may reuse their memory at once: DeepSpeed's bucket
        buffer), and the stages run on the executor behind any gather in flight (one order per
        hop group, [Note: one order of hop collectives]). ``executor.result`` of the returned
        future gives the chunks."""
        world = self.topo.world_size
        # rows padded to every quantized stage's block size (powers of two: the largest), so
        # that no quantization block straddles two destinations
        pad = max((h.block_size for h in self.plan.reduce if h.scheme in QUANTIZED), default=1)
        packed = layout.pack_grad_rows(grads, world, pad, scale=1.0 / world, align_chunks=pad > 1)
        numels = [g.numel() for g in grads]
        chunks = self._column_chunks(packed.rows.shape[1], pad)
        lanes = [hop.axes for _ in chunks for hop in self.plan.reduce]
        return self.executor.submit(self._reduce_rows(packed, chunks, numels, wire_dtype, key, loss_scale), lanes)

    def _column_chunks(self, width: int, pad: int) -> list[tuple[int, int]]:
        """[Note: streamed gradient stages]: column ranges of at most ``stream_chunk_elems``
        elements over all rows, edges on block boundaries."""
        step = max(pad, layout.aligned(-(-self.stream_chunk_elems // self.topo.world_size), pad))
        return [(a, min(a + step, width)) for a in range(0, width, step)] or [(0, 0)]

    def _reduce_rows(
        self,
        packed: layout.GradRows,
        chunks: list[tuple[int, int]],
        numels: list[int],
        wire_dtype: torch.dtype,
        key: tuple[str, ...] | None,
        loss_scale: float,
    ) -> Job:
        """The stages of one gradient bucket, chunk by chunk: a job for the executor, which
        announces each stage's collective (``Move``) before issuing it."""
        rows = packed.rows
        self.numerics.check_local(rows)
        width = rows.shape[1]
        # [Note: streamed gradient stages]
        # Reduce-scatter sums each column of the rows on its own, so the stages run on column
        # chunks one after another: the reordering, the stage layout, the wire and receive
        # buffers are the size of one chunk, not of the bucket (DeepSpeed's default bucket is
        # 5e8 elements: several GB per staging copy in fp32). Chunk edges fall on block
        # boundaries, where the rows' quantization blocks already end, so every block, sum and
        # residual is the same as unchunked: the result is bit for bit the same.
        out = rows.new_empty(width) if len(chunks) > 1 else None
        for a, b in chunks:
            buf = rows[:, a:b]
            if self._index_order is not None:  # rows by coordinate
                buf = buf.index_select(0, self._perms.get("index", self._index_order, buf.device))
            buf = buf.contiguous().view(*self.topo.dims, -1)
            ckey = key if len(chunks) == 1 or key is None else (*key, f"columns {a}:{b}")
            for i, hop in enumerate(self.plan.reduce):
                # the rows and the output are read and written on several lanes (GPU streams)
                yield Move(hop.axes, (buf, rows) if out is None else (buf, rows, out))
                buf = self.coll.reduce_stage(
                    buf, hop, hop.block_size, wire_dtype, hook=self.numerics.reduce_hook(ckey, i, hop, loss_scale)
                )
            if out is None:
                out = buf.reshape(-1)
            else:
                out[a:b].copy_(buf.reshape(-1))
        return layout.unpack_my_chunks(out, numels, packed.chunk, self.rank, packed.slots)
