"""Configurations real clusters use, on 4 real ranks (2 nodes x 1 GPU x 2 GCDs, gloo), each
beside stock DeepSpeed where one applies:
- DeepSpeed's default persistence threshold (LayerNorms and biases persistent, re-gathered after
  every step), GatheredParameters: every gather goes through the hierarchy, none over the world;
- optimizer offload: what the engine communicates lives on the accelerator's device;
- model parallelism (an mpu whose data-parallel group is not the world, MoE layers, a pipeline
  module) and models prepared by stock zero.Init with hpZ are refused with a named error;
- DeepSpeed's own groups keep their timeout unless deepspeed_group_timeout_s asks otherwise.
"""

import pytest

from zeropp_hier.app.spec import ds_config

from ..helpers import assert_losses_close

STEPS = 3


def _cfg(preset, **kw):
    cfg = ds_config(preset, gpus_per_node=1, gcds_per_gpu=2, **kw)
    return cfg


class _Counter:
    """Counts the all-gathers issued on groups that span the whole world. It instruments the real
    ProcessGroup class in this rank (DeepSpeed and we hold references to the torch.distributed
    functions, so they cannot be wrapped there): every gather still runs as before."""

    METHODS = (
        "_allgather_base",
        "all_gather_single",
        "all_gather_single_coalesced",
        "allgather",
        "allgather_coalesced",
        "allgather_into_tensor_coalesced",
    )

    def __init__(self):
        import torch
        import torch.distributed as dist

        self.cls = torch._C._distributed_c10d.ProcessGroup
        self.saved, self.world_gathers, self.on = {}, 0, False
        world = dist.get_world_size()
        for name in self.METHODS:
            if name not in self.cls.__dict__:
                continue
            # the raw descriptor, so that close() puts back a method that still binds self
            self.saved[name] = self.cls.__dict__[name]
            fn = getattr(self.cls, name)

            def wrapped(pg, *a, _fn=fn, **k):
                if self.on and pg.size() == world:
                    self.world_gathers += 1
                return _fn(pg, *a, **k)

            setattr(self.cls, name, wrapped)

    def close(self):
        for name, fn in self.saved.items():
            setattr(self.cls, name, fn)


def persistent_params_run(stock_cfg, ours_cfg, steps):
    import torch.distributed as dist  # noqa: F401

    import zeropp_hier
    from zeropp_hier.app import run as app_run

    out = {}
    for name, cfg in (("stock", stock_cfg), ("ours", ours_cfg)):
        counter = _Counter()
        try:
            engine = app_run.build_engine(cfg)
            persistent = len(getattr(engine.optimizer, "persistent_parameters", []))
            losses = app_run.train_steps(engine, 1)  # the trace step
            calls_before = zeropp_hier.comm_stats(engine)["calls"] if name == "ours" else None
            counter.on = True  # steady state: every later gather
            losses += app_run.train_steps(engine, steps - 1, start=1)
            state = app_run.gathered_state(engine)  # GatheredParameters
            counter.on = False
            out[name] = {
                "losses": losses,
                "world_gathers": counter.world_gathers,
                "persistent": persistent,
                "state": state,
            }
            if name == "ours":
                out[name]["stats"] = zeropp_hier.comm_stats(engine)
                out[name]["calls_before"] = calls_before
            app_run.release(engine)
        finally:
            counter.close()
    return out


def test_persistent_parameters_and_gathered_parameters_go_through_the_hierarchy(world4):
    zero = {"stage": 3}  # DeepSpeed's default stage3_param_persistence_threshold (1e5)
    stock, ours = _cfg(None), _cfg("frontier", compression="none")
    stock["zero_optimization"], ours["zero_optimization"] = dict(zero), dict(zero)  # replaced, not merged
    runs = world4.run(persistent_params_run, stock, ours, STEPS)
    for rank, r in enumerate(runs):
        assert r["stock"]["persistent"] > 0 and r["ours"]["persistent"] == r["stock"]["persistent"]
        # the stock engine re-gathers them over the world (so the counter sees such gathers) ...
        assert r["stock"]["world_gathers"] > 0
        # ... ours never gathers over the world: the hop groups of frontier are smaller
        assert r["ours"]["world_gathers"] == 0, f"rank {rank}"
        assert_losses_close(r["ours"]["losses"], r["stock"]["losses"], 1e-5, f"rank {rank}")
        for n, t in r["stock"]["state"].items():
            assert float((r["ours"]["state"][n] - t).abs().max()) <= 1e-5, n
        st = r["ours"]["stats"]
        # counted where they happen (other_gather: outside forward and backward), and coalesced:
        # in steady state one node-hop collective per step for all persistent parameters, plus
        # one for the GatheredParameters call, not one per parameter
        assert st["bytes"]["other_gather"]["node"] > 0
        steady = st["calls"]["other_gather"]["node"] - r["ours"]["calls_before"]["other_gather"]["node"]
        assert 0 < steady <= (STEPS - 1) + 1, steady


def offload_run(cfg, ckpt_dir, steps):
    import torch
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    from zeropp_hier.app import run as app_run

    want = torch.device(get_accelerator().current_device_name())
    seen = set()
    saved = {}
    for name in ("all_reduce", "all_gather_into_tensor", "all_to_all_single", "broadcast"):
        fn = getattr(dist, name)
        saved[name] = fn

        def wrapped(*a, _fn=fn, **k):
            for t in list(a) + list(k.values()):
                if isinstance(t, torch.Tensor):
                    seen.add(str(t.device))
            return _fn(*a, **k)

        setattr(dist, name, wrapped)
    try:
        engine = app_run.build_engine(cfg)
        optimizer_device = str(engine.optimizer.device)
        app_run.train_steps(engine, steps)
        engine.save_checkpoint(ckpt_dir)
        engine.load_checkpoint(ckpt_dir)
        app_run.train_steps(engine, 1, start=steps)
        ef = engine.hier_runtime.numerics.error_feedback
        residual_devices = {str(r.device) for r in ef.residuals.values()}  # as restored by the load
        app_run.release(engine)
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
    return {
        "want": str(want),
        "seen": sorted(seen),
        "optimizer_device": optimizer_device,
        "residual_devices": sorted(residual_devices),
        "comm_device": str(want),
    }


def test_optimizer_offload_communicates_on_the_accelerator_device(world4, tmp_path):
    """With offload_optimizer DeepSpeed's optimizer device is the CPU. NCCL/RCCL cannot
    communicate CPU tensors, so everything the engine communicates (the agreed non-finite check
    included) and the error-feedback residuals restored by a load must be on the accelerator's
    device. On this CPU-only machine both are the CPU, so this proves the devices agree with the
    accelerator's, as a GPU run must; only a GPU run can show a CPU tensor being refused."""
    # int4 node gradients, so that error feedback has residuals to restore
    cfg = _cfg(
        "frontier",
        overrides={"zero_force_ds_cpu_optimizer": False},
        compression={"gradients": {"gpu": "int4", "node": "int4"}},
    )
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    runs = world4.run(offload_run, cfg, str(tmp_path), 2)
    for r in runs:
        assert r["optimizer_device"] in ("cpu", "OffloadDeviceEnum.cpu")  # DeepSpeed keeps its enum
        assert r["seen"] == [r["want"]], r
        assert r["residual_devices"] == [r["want"]], r  # non-empty: error feedback was restored


def refusals(victim_rank_groups):
    import deepspeed
    import torch
    import torch.distributed as dist

    import zeropp_hier
    from zeropp_hier.app.model.gpt import GPT, GPTConfig

    out = {}
    cfg = _cfg("frontier")
    groups = [dist.new_group(g) for g in victim_rank_groups]  # every rank creates every group
    mine = next(g for g, ranks in zip(groups, victim_rank_groups) if dist.get_rank() in ranks)

    class TensorParallelMpu:  # a user's model-parallel unit, as Megatron passes one
        def get_data_parallel_group(self):
            return mine

        def get_model_parallel_group(self):
            return mine

    def attempt(name, **kwargs):
        model = kwargs.pop("model", None) or GPT(GPTConfig())
        try:
            zeropp_hier.initialize(
                model=model, model_parameters=model.parameters(), config=kwargs.pop("config", cfg), **kwargs
            )
            out[name] = None
        except zeropp_hier.HierConfigError as e:
            out[name] = str(e)

    attempt("mpu", mpu=TensorParallelMpu())

    from deepspeed.moe.layer import MoE

    class MoEModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = MoE(hidden_size=8, expert=torch.nn.Linear(8, 8), num_experts=2, ep_size=1)

    attempt("moe", model=MoEModel())
    hpz = _cfg(None)
    hpz["zero_optimization"]["zero_hpz_partition_size"] = 2
    with deepspeed.zero.Init(config_dict_or_path=hpz):
        stock_hpz_model = GPT(GPTConfig())
    attempt("hpz_init", model=stock_hpz_model)
    return out


def test_model_parallelism_and_stock_hpz_models_are_refused_by_name(world4):
    for r in world4.run(refusals, [[0, 1], [2, 3]]):
        assert r["mpu"] is not None and "initialize(mpu=...)" in r["mpu"]
        assert "data-parallel group of 2 of 4" in r["mpu"]
        assert r["moe"] is not None and "MoE layers" in r["moe"]
        assert r["hpz_init"] is not None and "hpZ secondary copy" in r["hpz_init"]
        assert "zeropp_hier.Init" in r["hpz_init"]


def timeouts_run():
    from zeropp_hier.app import run as app_run
    from zeropp_hier.comm.failures import group_timeout

    out = {}
    for name, preset, t in (("stock", None, None), ("default", "frontier", None), ("asked", "frontier", 42.0)):
        cfg = _cfg(preset)
        if t is not None:
            cfg["zeropp_hier"]["deepspeed_group_timeout_s"] = t
        engine = app_run.build_engine(cfg)
        group = engine.optimizer.dp_process_group
        out[name] = group_timeout(group).total_seconds()
        out[name + "_reported"] = getattr(engine, "ds_group_timeout_s", None)
        app_run.release(engine)
        out[name + "_after_destroy"] = group_timeout(group).total_seconds()
    return out


def test_deepspeed_groups_keep_their_timeout_unless_asked(world4):
    for r in world4.run(timeouts_run):
        # untouched by default: what stock DeepSpeed runs with (torch's default, or init_distributed's)
        assert r["default"] == r["stock"] == r["default_reported"]
        assert r["asked"] == r["asked_reported"] == 42.0
        assert r["asked_after_destroy"] == r["stock"]  # given back when the engine goes


@pytest.mark.parametrize(
    "section, field",
    [
        ({"tensor_parallel": {"autotp_size": 2}}, "tensor_parallel.autotp_size"),
        ({"sequence_parallel_size": 2}, "sequence_parallel_size"),
    ],
)
def test_model_parallel_config_keys_are_refused(section, field):
    from zeropp_hier import HierConfigError
    from zeropp_hier.core.config import hier_config_from_ds

    cfg = {**_cfg("frontier"), **section}
    with pytest.raises(HierConfigError, match=f"'{field}'.*data parallelism over the whole world"):
        hier_config_from_ds(cfg)


def no_optimizer_and_args_keyword(cfg_path: str) -> dict:
    """An engine without an optimizer (evaluation / inference), beside stock; and the config
    passed as ``args=namespace`` by keyword, as DeepSpeed's own examples do."""
    import argparse

    import deepspeed
    import torch

    import zeropp_hier
    from zeropp_hier.app.data.tokens import synthetic_batch
    from zeropp_hier.app.model.gpt import GPT, GPTConfig
    from zeropp_hier.deepspeed.partition import HierOffload

    out = {}
    cfg = _cfg("frontier", compression="none")
    stock_cfg = _cfg(None)
    for c in (cfg, stock_cfg):  # no optimizer anywhere: DeepSpeed builds its parameter manager alone
        del c["optimizer"]
    x, _ = synthetic_batch(GPTConfig(), 2, step=0, rank=0)
    for name, init, c in (("stock", deepspeed.initialize, stock_cfg), ("ours", zeropp_hier.initialize, cfg)):
        torch.manual_seed(0)
        engine, *_ = init(model=GPT(GPTConfig()), config=c)
        with torch.no_grad():
            logits = engine(x)
        out[name] = {"logits": logits.detach().float().clone(), "optimizer": type(engine.optimizer).__name__}
        if name == "ours":
            out[name]["hier_offload"] = isinstance(engine.optimizer, HierOffload)
            out[name]["fwd_bytes"] = zeropp_hier.comm_stats(engine)["bytes"]["forward_gather"]["node"]
        engine.destroy()
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    ns = argparse.Namespace(deepspeed_config=cfg_path, local_rank=int(__import__("os").environ["LOCAL_RANK"]))
    engine, *_ = zeropp_hier.initialize(args=ns, model=model, model_parameters=model.parameters())
    out["args_keyword_engine"] = type(engine).__name__
    engine.destroy()
    return out


def test_engine_without_optimizer_and_config_from_args_keyword(world4, tmp_path):
    import json

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(_cfg("frontier")))
    for r in world4.run(no_optimizer_and_args_keyword, str(path)):
        assert r["ours"]["hier_offload"], r["ours"]["optimizer"]  # not refused, and hierarchical
        assert r["ours"]["fwd_bytes"] > 0
        assert float((r["ours"]["logits"] - r["stock"]["logits"]).abs().max()) <= 1e-5
        assert r["args_keyword_engine"] == "HierEngine"
