"""``zeropp_hier.Init``: DeepSpeed's ``zero.Init`` whose parameters gather through the hierarchy.

DeepSpeed gives every partitioned parameter an ``all_gather_coalesced`` closure
(``Init._convert_to_deepspeed_param``); no class-level hook exists for it, so this subclass
rebinds that one attribute to ``HierRuntime.all_gather_coalesced`` right after DeepSpeed made
it (DESIGN.md §4). Everything else (primary partitioning, release, ``GatheredParameters``) is
DeepSpeed's own.
"""
from __future__ import annotations

from typing import Any

import deepspeed
from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
from deepspeed.runtime.zero.partition_parameters import Init as _DSInit
from deepspeed.runtime.zero.utils import is_zero_param

from ..core.config import hier_config_from_ds
from .runtime import HierRuntime


def _load_ds_config(config_dict_or_path: Any, config: Any) -> dict:
    cfg = config_dict_or_path if config_dict_or_path is not None else config
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return cfg
    import json
    with open(cfg) as f:
        return json.load(f)


def runtime_of(param) -> HierRuntime | None:
    """The runtime a partitioned parameter gathers through (None for stock parameters)."""
    fn = getattr(param, "all_gather_coalesced", None)
    owner = getattr(fn, "__self__", None)
    return owner if isinstance(owner, HierRuntime) else None


def bind(param, runtime: HierRuntime) -> None:
    """Route a partitioned parameter's gathers through ``runtime``.

    Its ``partition`` closure is wrapped too: DeepSpeed calls it with ``has_been_updated=True``
    when the full weights were changed outside the optimizer (``GatheredParameters`` with a
    ``modifier_rank``), and the kept shards of those parameters must then go.
    """
    param.all_gather_coalesced = runtime.all_gather_coalesced
    if getattr(param.partition, "zeropp_hier_runtime", None) is runtime:
        return  # already wrapped for this runtime
    ds_partition = param.partition

    def partition(param_list=None, hierarchy=0, has_been_updated=False, free_data=True):
        if has_been_updated:
            runtime.drop_shards(param_list if param_list is not None else [param])
        return ds_partition(param_list=param_list, hierarchy=hierarchy,
                            has_been_updated=has_been_updated, free_data=free_data)

    partition.zeropp_hier_runtime = runtime
    param.partition = partition


class Init(_DSInit):
    """Build a model already partitioned, gathering hierarchically.

    Use exactly like ``deepspeed.zero.Init``::

        with zeropp_hier.Init(config_dict_or_path=ds_config):
            model = GPT(cfg)

    With no enabled ``zeropp_hier`` section it is plain ``deepspeed.zero.Init``.
    """

    def __init__(self, *args, hier_runtime: HierRuntime | None = None, **kwargs):
        if hier_runtime is None:
            ds_config = _load_ds_config(kwargs.get("config_dict_or_path"), kwargs.get("config"))
            cfg = hier_config_from_ds(ds_config)
            if cfg.enabled:
                if not deepspeed.comm.is_initialized():
                    deepspeed.init_distributed()
                hier_runtime = HierRuntime.create(cfg)
        self.hier_runtime = hier_runtime
        super().__init__(*args, **kwargs)

    def _convert_to_deepspeed_param(self, param):
        super()._convert_to_deepspeed_param(param)
        if self.hier_runtime is not None:
            self.hier_runtime.check_partition_world(param.ds_zero_partition_world_size)
            bind(param, self.hier_runtime)


class HierOffload(DeepSpeedZeRoOffload):
    """DeepSpeed's parameter manager, converting a not-yet-partitioned model with our Init."""

    def __init__(self, *args, hier_runtime: HierRuntime, **kwargs):
        self.hier_runtime = hier_runtime
        super().__init__(*args, **kwargs)

    def _convert_to_zero_parameters(self, ds_config, module, mpu):
        params = list(module.parameters())
        fresh = [p for p in params if not is_zero_param(p)]
        if fresh and len(fresh) == len(params):
            Init(module=module, dtype=self.dtype, config_dict_or_path=ds_config,
                 remote_device=self.offload_device, pin_memory=self.offload_param_pin_memory,
                 mpu=mpu, hier_runtime=self.hier_runtime)
        else:
            # Some parameters were partitioned before (zeropp_hier.Init or deepspeed.zero.Init):
            # convert the rest the way DeepSpeed does, then route every gather through us.
            super()._convert_to_zero_parameters(ds_config, module, mpu)
        for p in module.parameters():
            owner = runtime_of(p)
            if owner is not None and owner is not self.hier_runtime:
                raise RuntimeError("zeropp_hier: the model was built under a zeropp_hier.Init of "
                                   "another engine; build it under the same config you pass to "
                                   "zeropp_hier.initialize")
            self.hier_runtime.check_partition_world(p.ds_zero_partition_world_size)
            bind(p, self.hier_runtime)
