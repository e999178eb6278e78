"""``zeropp_hier.Init``: DeepSpeed's ``zero.Init`` whose parameters gather through the hierarchy.

DeepSpeed gives every partitioned parameter an ``all_gather_coalesced`` closure
(``Init._convert_to_deepspeed_param``); no class-level hook exists for it, so this subclass
rebinds that one attribute to ``HierRuntime.all_gather_coalesced`` right after DeepSpeed made
it (docs/design.md#deepspeed-hook-points). Everything else (primary partitioning, release, ``GatheredParameters``) is
DeepSpeed's own.
"""

from __future__ import annotations

from typing import Any, Iterable, cast

import deepspeed
import torch
from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
from deepspeed.runtime.zero.partition_parameters import Init as _DSInit
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.utils import is_zero_param

from ..core.config import hier_config_from_ds
from ..core.errors import HierConfigError
from .inflight import LayerRegistry
from .runtime import HierRuntime
from .zero_param import ZeroParam


def _load_ds_config(config_dict_or_path: Any, config: Any) -> dict:
    cfg = config_dict_or_path if config_dict_or_path is not None else config
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return cfg
    import json

    with open(cfg) as f:
        return json.load(f)


def runtime_of(param: torch.nn.Parameter) -> HierRuntime | None:
    """The runtime a partitioned parameter gathers through (None for stock parameters)."""
    fn = getattr(param, "all_gather_coalesced", None)
    owner = getattr(fn, "__self__", None)
    return owner if isinstance(owner, HierRuntime) else None


def refuse_foreign_storage(param: torch.nn.Parameter, name: str) -> None:
    """Parameters partitioned by a stock ``deepspeed.zero.Init`` with ZeRO++ settings carry their
    own hpZ copy (``ds_secondary_tensor``) or int8 storage (``ds_quant_scale``); our gather reads
    the plain primary shard, so binding them would ignore those and serve wrong weights."""
    what = None
    if getattr(param, "ds_secondary_tensor", None) is not None:
        what = "an hpZ secondary copy (zero_hpz_partition_size > 1)"
    elif hasattr(getattr(param, "ds_tensor", None), "ds_quant_scale"):
        what = "quantized storage (zero_quantized_weights / zero_quantized_nontrainable_weights)"
    if what is not None:
        raise HierConfigError(
            f"parameter '{name}'",
            f"partitioned by deepspeed.zero.Init with {what}",
            "build the model under zeropp_hier.Init(config_dict_or_path=ds_config) with the same "
            "config you pass to zeropp_hier.initialize, or under a deepspeed.zero.Init without "
            "zero_hpz_partition_size / zero_quantized_* (zeropp_hier replaces them)",
        )


def bind(param: ZeroParam, runtime: HierRuntime) -> None:
    """Route a partitioned parameter's gathers through ``runtime``.

    Its ``partition`` closure is wrapped too: DeepSpeed calls it with ``has_been_updated=True``
    when the full weights were changed outside the optimizer (``GatheredParameters`` with a
    ``modifier_rank``), and the kept shards of those parameters must then go.
    """
    param.all_gather_coalesced = runtime.all_gather_coalesced
    if getattr(param.partition, "zeropp_hier_runtime", None) is runtime:
        return  # already wrapped for this runtime
    ds_partition = param.partition
    ds_all_gather = param.all_gather

    # [Note: every gather through the hierarchy]
    # DeepSpeed gathers outside the prefetch coordinator through ``param.all_gather``: the
    # re-gather of persistent parameters after every step (everything below
    # stage3_param_persistence_threshold: LayerNorms, biases), tied or external parameters on the
    # trace step, GatheredParameters (so the 16-bit save and zero_to_fp32-style reads),
    # ``param.item()``. Stock, that is one flat world all-gather per parameter, uncompressed and
    # latency-bound at scale. Routed here, the parameters of one call take the hops of the plan
    # as one coalesced bucket per dtype, and comm_stats counts them (phase "other_gather" outside
    # forward and backward).
    # the signatures of DeepSpeed 0.19's closures (Init._convert_to_deepspeed_param)
    def all_gather(param_list: Iterable[ZeroParam] | None = None, async_op: bool = False, hierarchy: int = 0) -> Any:
        params = [param] if param_list is None else list(param_list)
        ours = [p for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE and runtime_of(p) is runtime]
        taken = {id(p) for p in ours}
        rest = [p for p in params if id(p) not in taken]  # in flight / available, or not ours
        handles = []
        if ours:
            handle = runtime.all_gather_coalesced(ours)
            if async_op:
                handles.append(handle)
            else:
                handle.wait()
        if rest:
            out = ds_all_gather(param_list=rest, async_op=async_op, hierarchy=hierarchy)
            handles.extend(out or [])
        return handles if async_op else None

    def partition(
        param_list: list[ZeroParam] | None = None,
        hierarchy: int = 0,
        has_been_updated: bool = False,
        free_data: bool = True,
    ) -> None:
        if has_been_updated:
            runtime.drop_shards(param_list if param_list is not None else [param])
        return ds_partition(
            param_list=param_list, hierarchy=hierarchy, has_been_updated=has_been_updated, free_data=free_data
        )

    partition.zeropp_hier_runtime = runtime  # type: ignore[attr-defined]  # a marker on the closure, read back by getattr above
    param.partition = partition
    param.all_gather = all_gather


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
            if cfg.enabled and cfg.preset == "auto":
                from ..core.errors import HierConfigError

                raise HierConfigError(
                    "zeropp_hier.preset",
                    "auto",
                    '"auto" chooses at initialize from the built model; build it without zeropp_hier.Init '
                    "(plain construction, or deepspeed.zero.Init without our section), or name a preset",
                )
            if cfg.enabled:
                if not deepspeed.comm.is_initialized():
                    deepspeed.init_distributed()
                hier_runtime = HierRuntime.create(cfg)
        self.hier_runtime = hier_runtime
        super().__init__(*args, **kwargs)

    def _convert_to_deepspeed_param(self, param: ZeroParam) -> None:
        super()._convert_to_deepspeed_param(param)
        if self.hier_runtime is not None:
            self.hier_runtime.check_partition_world(param.ds_zero_partition_world_size)
            bind(param, self.hier_runtime)


class HierOffload(DeepSpeedZeRoOffload):
    """DeepSpeed's parameter manager, converting a not-yet-partitioned model with our Init."""

    def __init__(self, *args, hier_runtime: HierRuntime, **kwargs):
        self.hier_runtime = hier_runtime
        super().__init__(*args, **kwargs)

    def _convert_to_zero_parameters(self, ds_config: Any, module: torch.nn.Module, mpu: Any) -> None:
        # DeepSpeed makes the module's in-flight registry right after this unless one is there:
        # ours waits per layer ([Note: a job per layer] in deepspeed/inflight.py)
        # (one still holding another engine's gathers stays: it then waits per handle, as stock)
        registry = getattr(module, "ds_inflight_param_registry", None)
        if not isinstance(registry, LayerRegistry) and not registry:
            module.ds_inflight_param_registry = LayerRegistry()
        params = list(module.parameters())
        fresh = [p for p in params if not is_zero_param(p)]
        if fresh and len(fresh) == len(params):
            Init(
                module=module,
                dtype=self.dtype,
                config_dict_or_path=ds_config,
                remote_device=self.offload_device,
                pin_memory=self.offload_param_pin_memory,
                mpu=mpu,
                hier_runtime=self.hier_runtime,
            )
        else:
            # Some parameters were partitioned before (zeropp_hier.Init or deepspeed.zero.Init):
            # convert the rest the way DeepSpeed does, then route every gather through us.
            super()._convert_to_zero_parameters(ds_config, module, mpu)
        for name, param in module.named_parameters():
            p = cast(ZeroParam, param)  # converted above: DeepSpeed has set its attributes
            refuse_foreign_storage(p, name)
            owner = runtime_of(p)
            if owner is not None and owner is not self.hier_runtime:
                raise RuntimeError(
                    "zeropp_hier: the model was built under a zeropp_hier.Init of "
                    "another engine; build it under the same config you pass to "
                    "zeropp_hier.initialize"
                )
            self.hier_runtime.check_partition_world(p.ds_zero_partition_world_size)
            bind(p, self.hier_runtime)
        self.hier_runtime.note_layers(cast(Iterable[tuple[str, ZeroParam]], module.named_parameters()))
