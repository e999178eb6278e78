"""The ZeRO stage-3 optimizer subclass: DeepSpeed's, with the hierarchy plugged in at four
points — the parameter manager (gathers), the gradient averaging (reduce-scatter), the
gradient-bucket flush and the end of backward (the stages beside backward), and the
invalidation of kept shards whenever the primary shards change — and the numerics around the
optimizer step: the agreed non-finite check and the error-feedback state in checkpoints. The
table of every overridden method: docs/design.md#deepspeed-hook-points."""

from __future__ import annotations

import collections
from concurrent.futures import Future
from typing import Any, Callable, List

import deepspeed.runtime.zero.stage3 as _ds_stage3
import torch
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

from ..comm import reduce as comm_reduce
from ..comm.boundary import quiesce
from .partition import HierOffload
from .runtime import HierRuntime
from .zero_param import ZeroParam

ERROR_FEEDBACK_KEY = "zeropp_hier_error_feedback"
AUTOEP_EXPERT = "autoep_expert"  # DeepSpeed's placement family of AutoEP expert parameters


class HierZeroOptimizer_Stage3(DeepSpeedZeroOptimizer_Stage3):
    def __init__(self, *args, hier_runtime: HierRuntime, **kwargs):
        # set before DeepSpeed's constructor: it builds the parameter manager, which needs it
        self.hier_runtime = hier_runtime
        # (params, future, backward) of the bucket in flight
        self._pending_reduce: tuple[list[ZeroParam], Future, int] | None = None
        self._reduce_now = False
        self.buckets_overlapped = 0  # buckets whose stages ran while backward went on
        self._backwards_done = 0  # epilogues run: tells a bucket of an aborted backward
        super().__init__(*args, **kwargs)

    def initialize_ds_offload(self, *args: Any, **kwargs: Any) -> HierOffload:
        return HierOffload(*args, hier_runtime=self.hier_runtime, **kwargs)

    def invalidate_secondary_tensor(self) -> None:
        # Called by DeepSpeed after every optimizer step and around checkpoint load/save; frozen
        # parameters' copies stay valid (HierEngine.load_checkpoint drops them all after a load).
        super().invalidate_secondary_tensor()
        self.hier_runtime.invalidate_shards(keep_frozen=True)

    def _post_step(self, timer_names: set[str]) -> None:
        # The primary shards just changed. DeepSpeed re-gathers persistent parameters here before
        # it calls invalidate_secondary_tensor; that gather now runs through us
        # ([Note: every gather through the hierarchy]) and must not be served stale kept shards.
        self.hier_runtime.invalidate_shards(keep_frozen=True)
        return super()._post_step(timer_names)

    # DeepSpeed's private ``__avg_scatter_grads`` (name-mangled, so overridden by its mangled
    # name): it receives the bucket's parameters and returns this rank's averaged chunk of each.
    def _DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads(
        self, params_to_reduce: List[ZeroParam], communication_data_type: torch.dtype
    ) -> List[torch.Tensor]:
        return self._averaged(
            params_to_reduce,
            self.hier_runtime.executor.result(self._submit(params_to_reduce, communication_data_type)),
        )

    def _submit(self, params: List[ZeroParam], communication_data_type: torch.dtype) -> Future:
        self._assert_same_partition_group(params)
        grads = [_grad(p) for p in params]
        # The bucket's parameter names (DeepSpeed sorted it by ds_id) name it for error
        # feedback: unlike ds_ids, which count up across every engine a process builds, names
        # are the same in the engine that saves a checkpoint and in the one that loads it.
        key = tuple(self.param_names.get(p, f"ds_id:{p.ds_id}") for p in params)
        return comm_reduce.submit_reduce_scatter(
            self.hier_runtime.comm, grads, communication_data_type, key=key, loss_scale=float(self.loss_scale)
        )

    def _averaged(self, params: List[ZeroParam], parts: List[torch.Tensor]) -> List[torch.Tensor]:
        world = self.hier_runtime.topo.world_size
        averaging = self._gradient_averaging_world_size(params, world)
        if averaging != world:  # expert-parallel parameters average over another group size
            parts = [g.mul(world / float(averaging)) for g in parts]
        return [g.to(self.gradient_accumulation_dtype) for g in parts]

    # [Note: gradient stages beside backward]
    # DeepSpeed reduces a gradient bucket when it fills, in the middle of backward, and waits for
    # the result before backward goes on. Here a full bucket's gradients are copied into the stage
    # layout (DeepSpeed reuses the bucket's buffer for the next one at once), its stages are
    # queued on the executor behind the gathers already issued, and backward continues; the
    # reduced chunks are handed to DeepSpeed (``partition_grads``) when the next bucket is
    # submitted or at the end of backward. So one bucket's stages overlap the compute of the
    # next bucket's layers, and at most one bucket's staging is alive beyond DeepSpeed's own.
    # The last buckets, which DeepSpeed reduces in the epilogue, are waited for at once: the
    # optimizer step needs them. With overlap off, or DeepSpeed features that read the
    # reduced chunks straight away (ZenFlow), DeepSpeed's own synchronous path runs.
    #
    # [Note: bucket flush against DeepSpeed]
    # DeepSpeed 0.19's ``__reduce_and_partition_ipg_grads``, part by part, and what runs here:
    # 1. an empty bucket returns at once: kept.
    # 2. ``_assert_same_partition_group``: kept (``_submit``).
    # 3. every gradient has its parameter's ``ds_numel`` elements: kept, the error names the
    #    parameter (tests/dist/test_bucket_flush.py).
    # 4. the bucket's ds_ids are distinct: kept, as an error naming the parameter (a repeated
    #    parameter would have its gradient reduced and added twice) (test_bucket_flush.py).
    # 5. the ``param_reduce_events`` throttle (at most ``max_param_reduce_events`` buckets whose
    #    partition copies the device has not finished; the host waits for the oldest beyond
    #    that): kept, ``_throttle`` below. The event is recorded where DeepSpeed records it,
    #    after ``partition_grads`` on the reduce stream, which here is when the bucket is
    #    finished (``_finish_pending_reduce``); like DeepSpeed, only on accelerators that do
    #    not handle memory backpressure themselves (not the CPU) (unit test of ``_throttle``).
    # 6. the work runs on ``reduce_and_partition_stream``: kept, for the copy into the stage
    #    layout and for ``partition_grads``; the stages run on the executor's lanes.
    # 7. ``enable_sanity_checks``: DeepSpeed's check that every rank flushes the same ds_ids is
    #    kept, but run after draining the executor: it is a collective on DeepSpeed's own group,
    #    issued from this thread, and must not be in flight beside hop collectives on the lanes
    #    ([Note: one order of hop collectives] in comm/executor.py) (test_bucket_flush.py).
    # 8. the contiguous-buffer all-reduce (``contiguous_gradients`` with ``reduce_scatter``
    #    false): replaced; the hierarchy always reduce-scatters, and ``reduce_scatter: false``
    #    is refused with the config (``core.config.check_deepspeed_config``), so the stock path
    #    (overlap off) cannot take it either (tests/unit/test_config.py).
    # 9. the bucket sorted by ds_id, then ``__avg_scatter_grads``: kept; the averaging runs on
    #    the executor (``_submit``) and its result is taken later (``_finish_pending_reduce``).
    # 10. ZenFlow's channel selection and its fp32 update read the reduced chunks at once: not
    #    replaced; with ZenFlow, DeepSpeed's own body runs.
    # 11. ``partition_grads``: kept, deferred to ``_finish_pending_reduce``. After a backward
    #    that raised, its pending bucket is handed over by the next flush, as stock DeepSpeed
    #    has already partitioned every bucket it flushed before the error (the
    #    ``_backwards_done`` check there drops a bucket only if an epilogue ran after it was
    #    queued, and the epilogue finishes it first).
    # 12. the bucket emptied (params, elements, process group): kept.
    # Parts 1, 2, 6, 9, 11 and 12 together are what tests/dist/test_parity.py compares with
    # stock DeepSpeed (same training) and tests/dist/test_overlap.py with the inline path.
    def _DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads(
        self, communication_data_type: torch.dtype
    ) -> None:
        stock: Callable[[HierZeroOptimizer_Stage3, torch.dtype], None] = (
            DeepSpeedZeroOptimizer_Stage3._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads
        )
        bucket = self.ipg_buckets[communication_data_type]
        if not self.hier_runtime.cfg.overlap or getattr(self, "zenflow", False):
            return stock(self, communication_data_type)
        params: List[ZeroParam] = bucket.params
        if not params:  # 1
            return
        self._check_bucket(params)  # 3, 4
        _throttle(self.param_reduce_events, self.max_param_reduce_events)  # 5
        if self._pending_reduce is not None:
            self.buckets_overlapped += 1  # the previous bucket ran beside this bucket's backward
        self._finish_pending_reduce()
        params.sort(key=lambda p: p.ds_id)  # 9
        from deepspeed.accelerator import get_accelerator

        if self.enable_sanity_checks:  # 7
            self.hier_runtime.executor.drain()
            with get_accelerator().stream(self.reduce_and_partition_stream):
                _ds_stage3.assert_ints_same_as_other_ranks([p.ds_id for p in params])
        # DeepSpeed copied the bucket's gradients on its reduce stream: pack them there too (the
        # executor's stream then starts after it, and the next bucket's copies after the pack)
        with get_accelerator().stream(self.reduce_and_partition_stream):  # 6
            future = self._submit(params, communication_data_type)  # 2, 9
        self._pending_reduce = (list(params), future, self._backwards_done)
        params.clear()  # 12
        bucket.elements = 0
        bucket.process_group = None
        if self._reduce_now:
            self._finish_pending_reduce()

    def _check_bucket(self, params: List[ZeroParam]) -> None:
        seen: set[int] = set()
        for p in params:
            name = self.param_names.get(p, p.ds_id)
            if _grad(p).numel() != p.ds_numel:
                raise RuntimeError(
                    f"zeropp_hier: the gradient of {name} has {_grad(p).numel()} "
                    f"elements but the parameter has {p.ds_numel}; a gradient must match its parameter"
                )
            if p.ds_id in seen:
                raise RuntimeError(
                    f"zeropp_hier: {name} (ds_id {p.ds_id}) is twice in one gradient bucket; its "
                    "gradient would be reduced and added twice (a parameter registered twice?)"
                )
            seen.add(p.ds_id)

    def _finish_pending_reduce(self) -> None:
        pending, self._pending_reduce = getattr(self, "_pending_reduce", None), None
        if pending is None:
            return
        params, future, backward = pending
        from deepspeed.accelerator import get_accelerator

        # on a GPU, ``result`` makes the current stream wait for the stages' event: the stream
        # that then copies the chunks into DeepSpeed's partitions must be the current one
        with get_accelerator().stream(self.reduce_and_partition_stream):
            parts = self._averaged(params, self.hier_runtime.executor.result(future))
            if backward != self._backwards_done:
                # submitted in a backward that never reached its epilogue (an exception in
                # between): its gradients belong to no step, and handing them to DeepSpeed now
                # would add them to this backward's
                return
            self.partition_grads(params, parts)  # 11
            if not get_accelerator().handles_memory_backpressure():  # 5
                event = get_accelerator().Event()
                event.record()
                self.param_reduce_events.append(event)

    def independent_gradient_partition_epilogue(self) -> None:
        self._reduce_now = True  # the step needs every chunk: nothing left pending past here
        try:
            self._finish_pending_reduce()
            super().independent_gradient_partition_epilogue()
        finally:
            self._reduce_now = False
        self._backwards_done += 1

    # -- numerics around the step ([Note: non-finite gradients] in comm/numerics.py) -----------
    def step(self, closure: Callable[[], Any] | None = None) -> None:
        numerics = self.hier_runtime.numerics
        # nothing of ours in flight beside the agreement and DeepSpeed's step collectives
        # ([Note: quiet boundaries] in comm/boundary.py); a no-op when the engine's step drained
        quiesce(self.hier_runtime.executor, "the agreed non-finite check")
        # collective: every rank, every step, same result; on the communication device, not
        # self.device (the CPU under optimizer offload, which NCCL/RCCL cannot all-reduce)
        verdict = numerics.agree(self.hier_runtime.comm_device)
        fp16 = self.dtype == torch.float16
        if verdict.any and not fp16 and numerics.cfg.nonfinite == "raise":
            raise numerics.fail(verdict)
        out = super().step(closure)
        numerics.finish_step(verdict, applied=not self.overflow, fp16=fp16)
        return out

    # -- error feedback in checkpoints ([Note: error feedback] in comm/error_feedback.py) ----
    # The residuals are per rank, like this rank's optimizer state, so they travel in the same
    # per-rank file (zero_pp_rank_*_optim_states.pt), written and read by DeepSpeed.
    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd[ERROR_FEEDBACK_KEY] = self.hier_runtime.numerics.error_feedback.state_dict()
        return sd

    def _rigid_load_state_dict(self, state_dict: dict, load_optimizer_states: bool = True) -> None:
        super()._rigid_load_state_dict(state_dict, load_optimizer_states=load_optimizer_states)
        numerics = self.hier_runtime.numerics
        if load_optimizer_states:
            # residuals meet the gradients' send buffers, which live on the accelerator even when
            # the optimizer state is offloaded to the CPU
            numerics.restore_error_feedback(state_dict.get(ERROR_FEEDBACK_KEY), self.hier_runtime.comm_device)
        else:  # residuals belong to the optimizer trajectory that was just replaced
            numerics.error_feedback.reset()

    # [Note: partition groups only for AutoEP]
    # DeepSpeed 0.19's ``_zero3_partition_group_metadata`` (called at every save, and at a load
    # whose checkpoint carries the metadata) lists every rank of each sub-group's partition
    # group (``_get_sub_group_partition_ranks``: the whole world, 75,264 ranks at Frontier's
    # size) and then returns None unless a parameter has the AutoEP placement family
    # "autoep_expert". The families are read first here: without AutoEP experts, None at once;
    # with them, DeepSpeed's own method (tests/dist/test_checkpoint.py).
    def _zero3_partition_group_metadata(self) -> list[dict] | None:
        if any(
            getattr(p, "ds_zero_placement_family", "replicated") == AUTOEP_EXPERT for g in self.fp16_groups for p in g
        ):
            return super()._zero3_partition_group_metadata()
        return None

    def load_hp_checkpoint_state(self, folder: str, key: str, param: Any = None) -> torch.Tensor:
        """DeepSpeed's per-parameter read of a universal checkpoint, reading only the rows this
        rank keeps ([Note: universal rows] in checkpoint/universal.py); AutoTP and AutoEP states
        (which the job never writes) go through DeepSpeed's full read."""
        import os

        from deepspeed.checkpoint.constants import PARAM
        from deepspeed.checkpoint.universal_checkpoint import _get_param_uc_restore_meta

        from .checkpoint.universal import kept_slice

        if param is not None and _get_param_uc_restore_meta(param):
            return super().load_hp_checkpoint_state(folder, key, param)
        # mapped, not read: only the pages of the rows copied below are read from the file
        state = torch.load(os.path.join(folder, f"{key}.pt"), map_location="cpu", weights_only=False, mmap=True)
        if isinstance(state, dict):
            if set(state) - {PARAM}:  # expert or tensor-parallel metadata: DeepSpeed's own path
                return super().load_hp_checkpoint_state(folder, key, param)
            state = state[PARAM]
        group = self._get_param_partition_group(param) if param is not None else self.dp_process_group
        start, count, width = kept_slice(
            state.numel(), _ds_stage3.dist.get_world_size(group=group), _ds_stage3.dist.get_rank(group=group)
        )
        out = torch.zeros(width, dtype=state.dtype)
        out[:count].copy_(state.reshape(-1)[start : start + count])
        return out


def _grad(p: ZeroParam) -> torch.Tensor:
    """A bucketed parameter's gradient: DeepSpeed puts a parameter in a bucket only once it has
    copied the gradient in."""
    if p.grad is None:
        raise RuntimeError(f"zeropp_hier: parameter ds_id {p.ds_id} is in a gradient bucket without a gradient")
    return p.grad


def _throttle(events: collections.deque, limit: int) -> None:
    """DeepSpeed's backpressure on gradient buckets ([Note: bucket flush against DeepSpeed],
    part 5): forget the events the device has passed; past ``limit`` outstanding, the host
    waits for the oldest."""
    while events and events[0].query():
        events.popleft()
    if len(events) > limit:
        events.popleft().synchronize()
