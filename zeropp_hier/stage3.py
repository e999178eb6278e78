"""The ZeRO stage-3 optimizer subclass: DeepSpeed's, with the hierarchy plugged in at three
points — the parameter manager (gathers), the gradient averaging (reduce-scatter), and the
invalidation of kept shards whenever the primary shards change."""
from __future__ import annotations

from typing import List

import torch
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

from .partition import HierOffload
from .runtime import HierRuntime


class HierZeroOptimizer_Stage3(DeepSpeedZeroOptimizer_Stage3):

    def __init__(self, *args, hier_runtime: HierRuntime, **kwargs):
        # set before DeepSpeed's constructor: it builds the parameter manager, which needs it
        self.hier_runtime = hier_runtime
        super().__init__(*args, **kwargs)

    def initialize_ds_offload(self, *args, **kwargs):
        return HierOffload(*args, hier_runtime=self.hier_runtime, **kwargs)

    def invalidate_secondary_tensor(self):
        # Called by DeepSpeed after every optimizer step and around checkpoint load/save.
        super().invalidate_secondary_tensor()
        self.hier_runtime.invalidate_shards()

    # DeepSpeed's private ``__avg_scatter_grads`` (name-mangled, so overridden by its mangled
    # name): it receives the bucket's parameters and returns this rank's averaged chunk of each.
    def _DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads(self, params_to_reduce: List[torch.nn.Parameter],
                                                          communication_data_type: torch.dtype
                                                          ) -> List[torch.Tensor]:
        self._assert_same_partition_group(params_to_reduce)
        grads = [p.grad for p in params_to_reduce]
        parts = self.hier_runtime.reduce_scatter(grads, communication_data_type)
        world = self.hier_runtime.topo.world_size
        averaging = self._gradient_averaging_world_size(params_to_reduce, world)
        if averaging != world:  # expert-parallel parameters average over another group size
            parts = [g.mul(world / float(averaging)) for g in parts]
        return [g.to(self.gradient_accumulation_dtype) for g in parts]
