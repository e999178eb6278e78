"""What every rank runs for ``benchmarks/compare.py`` (inside the emulated cluster).

    python -m benchmarks.compare_rank '<json plan>'

The plan lists configurations (stock DeepSpeed or a zeropp_hier preset), rounds and steps. One
world runs all of them, round after round, in a rotating order so that drift in the shared
machine's load hits every configuration alike. Around the measured steps of each configuration
rank 0 raises marks ([Note: marks] in benchmarks/cluster/rankside.py) so the driver can read the
interface counters; per-step times, comm_stats and peak RSS come back as RESULT lines.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning)


def build(cfg: dict, model_cfg, ds_cfg: dict):
    """Stock configurations go through plain ``deepspeed.initialize``; ours through ours."""
    import deepspeed
    import torch

    from zeropp_hier.app import training
    from zeropp_hier.app.gpt import GPT

    if cfg["kind"] == "stock":
        torch.manual_seed(0)
        model = GPT(model_cfg)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
        return engine
    return training.build_engine(ds_cfg, model_cfg)


# [Note: device-time compute]
# On a GPU the host only launches the arithmetic: while a layer computes, the CPU is free to run
# the communication (gloo's threads, our lanes, the quantization kernels' launches). Here 16 ranks
# share 2 cores, and the arithmetic of every rank competes with every rank's communication for
# them, so overlap can hide only time spent waiting on links. ``device_ms`` emulates a device:
# each transformer block waits ``device_ms`` in forward and twice that in backward (the usual
# 1:2 FLOP ratio) with the CPU released (a sleep), beside the model's real, small arithmetic.
# This is a stand-in for GPU compute, not a GPU measurement: it moves the regime from CPU-bound
# to what a GPU run sees, and the step then shows what the communication costs there.
def add_device_time(model, device_ms: float) -> None:
    """Insert the device-time waits into every block of ``model``."""
    import torch

    wait_s = device_ms / 1000.0

    class DeviceTime(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            time.sleep(wait_s)
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            time.sleep(2 * wait_s)
            return grad

    blocks = model.module.blocks if hasattr(model, "module") else model.blocks
    for blk in blocks:
        blk.register_forward_hook(lambda _m, _i, out: DeviceTime.apply(out))


def ds_config_for(cfg: dict, plan: dict) -> dict:
    from zeropp_hier.app import training

    topo = plan["topology"]
    dtype, bucket = plan.get("dtype", "fp32"), plan.get("prefetch_bucket", 0)
    if cfg["kind"] == "stock":
        c = training.ds_config(None, micro_batch=plan["micro_batch"], regather=plan["regather"], dtype=dtype)
        c["zero_optimization"].update(cfg.get("zero", {}))
    else:
        c = training.ds_config(
            cfg["preset"],
            micro_batch=plan["micro_batch"],
            regather=plan["regather"],
            compression=cfg.get("compression"),
            gpus_per_node=topo["gpus_per_node"],
            gcds_per_gpu=topo["gcds_per_gpu"],
            dtype=dtype,
        )
    if bucket and cfg.get("prefetch", True):
        # prefetch ahead of use; reuse distance 0 and at most about one bucket of live parameters,
        # as for a model much larger than this one: without the live limit DeepSpeed keeps this
        # small model gathered from forward into backward, and backward gathers nothing
        c["zero_optimization"].update(
            stage3_prefetch_bucket_size=bucket, stage3_max_reuse_distance=0, stage3_max_live_parameters=bucket
        )
    if plan.get("reduce_bucket"):
        # gradient buckets of about one layer, as a model much larger than DeepSpeed's 5e8-element
        # default bucket has: backward fills several, and each is reduced while backward goes on
        # (with the default this small model is one bucket, reduced after backward ends)
        c["zero_optimization"]["reduce_bucket_size"] = plan["reduce_bucket"]
    if "overlap" in cfg:
        c["zeropp_hier"]["overlap"] = cfg["overlap"]
    if "memory" in cfg:
        c["zeropp_hier"]["memory"] = cfg["memory"]
    if "pipeline" in cfg:
        c["zeropp_hier"]["pipeline"] = cfg["pipeline"]
    return c


def forget_hpz_group() -> None:
    """DeepSpeed keeps ZeRO++'s hpZ group in a module global and refuses to create a second one
    (docs/design.md#deepspeed-hook-points); the next stock ZeRO++ engine in this process needs it cleared."""
    from deepspeed.utils import groups

    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None


def quant_rate(elems: int = 1 << 20, reps: int = 3) -> float:
    """Elements/s of int8 quantize + dequantize on this rank (all ranks run it at once, so the
    number includes the contention of the shared cores)."""
    import torch

    from zeropp_hier import quant

    x = torch.randn(elems)
    quant.dequantize(quant.quantize(x, 8, 256), torch.float32)
    t0 = time.perf_counter()
    for _ in range(reps):
        quant.dequantize(quant.quantize(x, 8, 256), torch.float32)
    return elems * reps / (time.perf_counter() - t0)


def run_one(name: str, cfg: dict, plan: dict, model_cfg, label: str) -> dict:
    import torch.distributed as dist

    import zeropp_hier
    from benchmarks.cluster.rankside import mark, peak_rss_bytes, peak_rss_reset
    from benchmarks.linkuse import busy_summary
    from zeropp_hier.app import training

    shaped = label.startswith("shaped/")
    # "auto" probes the links while it is built: it must see them as the steps will
    auto = cfg.get("preset") == "auto"
    if shaped:  # otherwise the driver unshapes the links: building moves the whole model
        mark(f"{label} {'shape' if auto else 'build'}")
    peak_rss_reset()
    t0 = time.perf_counter()
    engine = build(cfg, model_cfg, ds_config_for(cfg, plan))
    build_s = time.perf_counter() - t0
    if plan.get("device_ms"):  # [Note: device-time compute]
        add_device_time(engine, plan["device_ms"])
    if shaped and not auto:
        mark(f"{label} shape")
    ours = getattr(engine, "hier_runtime", None) is not None
    training.train_steps(engine, plan["warmup"])
    executor = engine.hier_runtime.executor if ours else None
    if ours:
        zeropp_hier.reset_comm_stats(engine)
    times, windows = [], []

    def on_step(_step, loss, dt):
        now = time.perf_counter()  # train_steps times a step with the same clock
        times.append((dt, loss))
        windows.append((now - dt, now))

    mark(f"{label} begin")
    if executor is not None:  # [Note: busy intervals] in zeropp_hier/comm/busy.py
        executor.record_busy()
    training.train_steps(engine, plan["steps"], start=plan["warmup"], on_step=on_step)
    busy = executor.busy_log.intervals() if executor is not None and executor.busy_log is not None else None
    if executor is not None:
        executor.record_busy(False)
    mark(f"{label} end")
    out = {
        "times": [t for t, _ in times],
        "losses": [loss for _, loss in times],
        "peak_rss": peak_rss_bytes(),
        "build_s": build_s,
    }
    if ours:
        out["stats"] = zeropp_hier.comm_stats(engine)
    if busy is not None:  # per tier busy time in the measured steps ([Note: link use])
        out["busy"] = busy_summary(busy, windows)
    training.release(engine)
    if cfg["kind"] == "stock" and cfg.get("zero", {}).get("zero_hpz_partition_size", 1) > 1:
        forget_hpz_group()
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, out)
    return {"name": name, "label": label, "per_rank": per_rank}


def main() -> int:
    plan = json.loads(sys.argv[1])
    import torch

    torch.set_num_threads(1)
    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel("ERROR")
    deepspeed.init_distributed(dist_backend="gloo")
    import torch.distributed as dist

    from benchmarks.cluster.rankside import mark, send_result
    from zeropp_hier.app.gpt import GPTConfig

    model_cfg = GPTConfig(**plan["model"])
    rate = quant_rate()
    rates = [None] * dist.get_world_size()
    dist.all_gather_object(rates, rate)
    if dist.get_rank() == 0:
        send_result({"quant_rate_per_rank": rates})
    names = list(plan["configs"])
    for phase in plan["phases"]:  # e.g. shaped rounds, then one unshaped pass
        mark(f"phase {phase['name']}")  # the driver (un)shapes the links here
        plan["steps"] = phase.get("steps", plan["steps"])
        for rnd in range(phase["rounds"]):
            k = rnd % len(names)
            for name in names[k:] + names[:k]:
                res = run_one(name, plan["configs"][name], plan, model_cfg, f"{phase['name']}/{rnd}/{name}")
                if dist.get_rank() == 0:
                    res["phase"], res["round"] = phase["name"], rnd
                    send_result(res)
    mark("done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
