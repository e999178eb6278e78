"""Functions the distributed tests run on every rank of a ``LocalWorld``.

They return plain data (losses, tensors, counters) to the test process, which does the
asserting, so a failed assertion shows in pytest's output rather than in a worker's traceback.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from zeropp_hier.app import run as app_run
from zeropp_hier.app.model.gpt import GPTConfig
from zeropp_hier.app.spec import ds_config
from zeropp_hier.core import layout


def run_configs(configs: dict, steps: int, model_cfg: GPTConfig = GPTConfig()) -> dict:
    """Train each named config from the same seed, one after the other, in this world."""
    return {name: app_run.run_config(cfg, steps, model_cfg) for name, cfg in configs.items()}


def partition_sizes(config: dict, model_cfg: GPTConfig = GPTConfig()) -> dict:
    """Per-parameter partition sizes under ``config`` (for byte bounds), and a 1-step run's stats."""
    engine = app_run.build_engine(config, model_cfg)
    sizes = [p.ds_tensor.ds_numel for p in engine.module.parameters()]
    app_run.release(engine)
    return {"partition_sizes": sizes}


def checkpoint_resume(config: dict, ckpt_dir: str, steps_before: int, steps_after: int) -> dict:
    """Uninterrupted run vs save at ``steps_before`` + load in a fresh engine + continue."""
    import zeropp_hier

    ref = app_run.build_engine(config)
    ref_losses = app_run.train_steps(ref, steps_before + steps_after)
    ref_state = app_run.gathered_state(ref)
    app_run.release(ref)

    first = app_run.build_engine(config)
    app_run.train_steps(first, steps_before)
    rank_lists = _counting_rank_lists(first.optimizer)
    first.save_checkpoint(ckpt_dir, tag="step5")
    partition_metadata = {"rank_lists_in_save": rank_lists[0], **_partition_metadata(first.optimizer, rank_lists)}
    app_run.release(first)

    second = app_run.build_engine(config, seed=123)  # different init: the load must overwrite it
    second.load_checkpoint(ckpt_dir, tag="step5")
    rt = second.hier_runtime
    shards_after_load = len(rt.shards)
    # one forward rebuilds the kept shards from the loaded weights
    c = second.module.config
    from zeropp_hier.app.data.tokens import synthetic_batch

    x, y = synthetic_batch(c, second.train_micro_batch_size_per_gpu(), 0, dist.get_rank())
    with torch.no_grad():
        second(x, y)
    shard_errors = compare_shards_with_gather(second)
    resumed = app_run.train_steps(second, steps_after, start=steps_before)
    state = app_run.gathered_state(second)
    stats = zeropp_hier.comm_stats(second)
    app_run.release(second)
    return {
        "ref_losses": ref_losses[steps_before:],
        "resumed_losses": resumed,
        "ref_state": ref_state,
        "state": state,
        "shards_after_load": shards_after_load,
        "shard_errors": shard_errors,
        "stats": stats,
        "partition_metadata": partition_metadata,
    }


def _counting_rank_lists(optimizer) -> list[int]:
    """Counts the calls of DeepSpeed's ``_get_sub_group_partition_ranks`` (each lists every rank
    of a sub-group's partition group) on this optimizer, which still runs DeepSpeed's."""
    count = [0]
    real = optimizer._get_sub_group_partition_ranks

    def counted(sub_group_id):
        count[0] += 1
        return real(sub_group_id)

    optimizer._get_sub_group_partition_ranks = counted
    return count


def _partition_metadata(optimizer, count: list[int]) -> dict:
    """[Note: partition groups only for AutoEP]: ours and DeepSpeed's method on this engine,
    as it is and with one parameter marked as an AutoEP expert (then unmarked)."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stock

    out = {
        "ours": optimizer._zero3_partition_group_metadata(),
        "deepspeed": Stock._zero3_partition_group_metadata(optimizer),
    }
    param = optimizer.fp16_groups[0][0]
    param.ds_zero_placement_family = "autoep_expert"
    try:
        before = count[0]
        out["ours_autoep"] = optimizer._zero3_partition_group_metadata()
        out["rank_lists_autoep"] = count[0] - before
        out["deepspeed_autoep"] = Stock._zero3_partition_group_metadata(optimizer)
    finally:
        del param.ds_zero_placement_family
    return out


def compare_shards_with_gather(engine) -> dict:
    """For every kept shard, the max abs difference from the same slice of the gathered weights."""
    import deepspeed

    from zeropp_hier.comm.collectives import Encoded

    rt = engine.hier_runtime
    topo = rt.topo
    errors = {}
    params = [p for p in engine.module.parameters() if p.ds_id in rt.shards]
    # each kept copy as values [n, p, g, slot] in its parameter's dtype (decoded where encoded)
    kept = {}
    for p in params:
        t = rt.shards[p.ds_id]
        kept[p.ds_id] = (rt.coll.decode(t, p.ds_tensor.dtype) if isinstance(t, Encoded) else t).clone()
    with deepspeed.zero.GatheredParameters(params):
        for p in params:
            ps = p.ds_tensor.ds_numel
            flat = torch.zeros(topo.world_size * ps, dtype=p.dtype)
            flat[: p.numel()] = p.data.reshape(-1)
            rows = flat.view(topo.world_size, ps)
            order = layout.index_order(topo)
            if order is not None:
                rows = rows.index_select(0, order)
            full = rows.view(*topo.dims, ps)
            expect = layout.kept_shard(full, rt.me, rt.plan.kept_axes)
            errors[p.ds_id] = float((expect.float() - kept[p.ds_id].float()).abs().max())
    return {"count": len(errors), "max": max(errors.values()) if errors else None}


def world_info() -> dict:
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "pid": os.getpid()}


def init_parity(steps: int) -> dict:
    """Models built already partitioned: stock deepspeed.zero.Init vs zeropp_hier.Init; and a
    disabled section giving a stock engine."""
    import deepspeed

    import zeropp_hier
    from zeropp_hier.app.model.gpt import GPT

    out = {}
    for name, cfg, init, initialize in (
        ("stock", ds_config(None), deepspeed.zero.Init, deepspeed.initialize),
        ("hier", ds_config("frontier", compression="none"), zeropp_hier.Init, zeropp_hier.initialize),
    ):
        torch.manual_seed(0)
        with init(config_dict_or_path=cfg):
            model = GPT(GPTConfig())
        engine, *_ = initialize(model=model, model_parameters=model.parameters(), config=cfg)
        out[name] = {
            "losses": app_run.train_steps(engine, steps),
            "engine": type(engine).__name__,
            "optimizer": type(engine.optimizer).__name__,
        }
        if name == "hier":
            out[name]["stats"] = zeropp_hier.comm_stats(engine)
        app_run.release(engine)
    off = ds_config("frontier")
    off["zeropp_hier"]["enabled"] = False
    engine = app_run.build_engine(off)
    out["disabled"] = {"engine": type(engine).__name__, "optimizer": type(engine.optimizer).__name__}
    app_run.release(engine)
    return out


def modified_weights(steps: int) -> dict:
    """Weights changed through GatheredParameters(modifier_rank=0) while kept shards exist: the
    next steps must see the new weights (stock vs frontier)."""
    import deepspeed

    from zeropp_hier.app.data.tokens import synthetic_batch

    out = {}
    for name, cfg in (("stock", ds_config(None)), ("hier", ds_config("frontier", compression="none"))):
        engine = app_run.build_engine(cfg)
        app_run.train_steps(engine, 2)
        x, y = synthetic_batch(engine.module.config, 2, 99, dist.get_rank())
        with torch.no_grad():
            engine(x, y)  # leaves kept shards behind (frontier)
        kept_before = len(engine.hier_runtime.shards) if name == "hier" else None
        params = [engine.module.wte.weight, engine.module.blocks[0].fc.weight]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            if dist.get_rank() == 0:
                for p in params:
                    p.data.mul_(0.5)
        out[name] = {"losses": app_run.train_steps(engine, steps, start=2), "kept_before": kept_before}
        app_run.release(engine)
    return out
