"""The ZeRO stage-3 optimizer subclass: DeepSpeed's, with the hierarchy plugged in at three
points — the parameter manager (gathers), the gradient averaging (reduce-scatter), and the
invalidation of kept shards whenever the primary shards change — and the numerics around the
optimizer step: the agreed non-finite check and the error-feedback state in checkpoints."""

from __future__ import annotations

from typing import List

import torch
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

from .partition import HierOffload
from .runtime import HierRuntime

ERROR_FEEDBACK_KEY = "zeropp_hier_error_feedback"


class HierZeroOptimizer_Stage3(DeepSpeedZeroOptimizer_Stage3):
    def __init__(self, *args, hier_runtime: HierRuntime, **kwargs):
        # set before DeepSpeed's constructor: it builds the parameter manager, which needs it
        self.hier_runtime = hier_runtime
        self._pending_reduce = None  # (params, future, backward) of the bucket in flight
        self._reduce_now = False
        self.buckets_overlapped = 0  # buckets whose stages ran while backward went on
        self._backwards_done = 0  # epilogues run: tells a bucket of an aborted backward
        super().__init__(*args, **kwargs)

    def initialize_ds_offload(self, *args, **kwargs):
        return HierOffload(*args, hier_runtime=self.hier_runtime, **kwargs)

    def invalidate_secondary_tensor(self):
        # Called by DeepSpeed after every optimizer step and around checkpoint load/save; frozen
        # parameters' copies stay valid (HierEngine.load_checkpoint drops them all after a load).
        super().invalidate_secondary_tensor()
        self.hier_runtime.invalidate_shards(keep_frozen=True)

    def _post_step(self, timer_names):
        # The primary shards just changed. DeepSpeed re-gathers persistent parameters here before
        # it calls invalidate_secondary_tensor; that gather now runs through us
        # ([Note: every gather through the hierarchy]) and must not be served stale kept shards.
        self.hier_runtime.invalidate_shards(keep_frozen=True)
        return super()._post_step(timer_names)

    # DeepSpeed's private ``__avg_scatter_grads`` (name-mangled, so overridden by its mangled
    # name): it receives the bucket's parameters and returns this rank's averaged chunk of each.
    def _DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads(
        self, params_to_reduce: List[torch.nn.Parameter], communication_data_type: torch.dtype
    ) -> List[torch.Tensor]:
        return self._averaged(
            params_to_reduce,
            self.hier_runtime.executor.result(self._submit(params_to_reduce, communication_data_type)),
        )

    def _submit(self, params: List[torch.nn.Parameter], communication_data_type: torch.dtype):
        self._assert_same_partition_group(params)
        grads = [p.grad for p in params]
        # The bucket's parameter names (DeepSpeed sorted it by ds_id) name it for error
        # feedback: unlike ds_ids, which count up across every engine a process builds, names
        # are the same in the engine that saves a checkpoint and in the one that loads it.
        key = tuple(self.param_names.get(p, f"ds_id:{p.ds_id}") for p in params)
        return self.hier_runtime.submit_reduce_scatter(
            grads, communication_data_type, key=key, loss_scale=float(self.loss_scale)
        )

    def _averaged(self, params: List[torch.nn.Parameter], parts: List[torch.Tensor]) -> List[torch.Tensor]:
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
    def _DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads(
        self, communication_data_type: torch.dtype
    ) -> None:
        stock = DeepSpeedZeroOptimizer_Stage3._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads
        bucket = self.ipg_buckets[communication_data_type]
        if not self.hier_runtime.cfg.overlap or getattr(self, "zenflow", False):
            return stock(self, communication_data_type)
        params = bucket.params
        if not params:
            return
        if self._pending_reduce is not None:
            self.buckets_overlapped += 1  # the previous bucket ran beside this bucket's backward
        self._finish_pending_reduce()
        for p in params:
            if p.grad.numel() != p.ds_numel:
                raise RuntimeError(
                    f"zeropp_hier: the gradient of {self.param_names.get(p, p.ds_id)} has {p.grad.numel()} "
                    f"elements but the parameter has {p.ds_numel}; a gradient must match its parameter"
                )
        params.sort(key=lambda p: p.ds_id)
        from deepspeed.accelerator import get_accelerator

        # DeepSpeed copied the bucket's gradients on its reduce stream: pack them there too (the
        # executor's stream then starts after it, and the next bucket's copies after the pack)
        with get_accelerator().stream(self.reduce_and_partition_stream):
            future = self._submit(params, communication_data_type)
        self._pending_reduce = (list(params), future, self._backwards_done)
        params.clear()
        bucket.elements = 0
        bucket.process_group = None
        if self._reduce_now:
            self._finish_pending_reduce()

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
            self.partition_grads(params, parts)

    def independent_gradient_partition_epilogue(self):
        self._reduce_now = True  # the step needs every chunk: nothing left pending past here
        try:
            self._finish_pending_reduce()
            super().independent_gradient_partition_epilogue()
        finally:
            self._reduce_now = False
        self._backwards_done += 1

    # -- numerics around the step ([Note: non-finite gradients] in comm/numerics.py) -----------
    def step(self, closure=None):
        numerics = self.hier_runtime.numerics
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
    def state_dict(self):
        sd = super().state_dict()
        sd[ERROR_FEEDBACK_KEY] = self.hier_runtime.numerics.error_feedback.state_dict()
        return sd

    def _rigid_load_state_dict(self, state_dict, load_optimizer_states=True):
        super()._rigid_load_state_dict(state_dict, load_optimizer_states=load_optimizer_states)
        numerics = self.hier_runtime.numerics
        if load_optimizer_states:
            # residuals meet the gradients' send buffers, which live on the accelerator even when
            # the optimizer state is offloaded to the CPU
            numerics.restore_error_feedback(state_dict.get(ERROR_FEEDBACK_KEY), self.hier_runtime.comm_device)
        else:  # residuals belong to the optimizer trajectory that was just replaced
            numerics.error_feedback.reset()
