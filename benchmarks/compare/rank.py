"""What every rank runs for ``benchmarks/compare/run.py`` (inside the emulated cluster).

    python -m benchmarks.compare.rank '<json plan>'

Every configuration is the training job's own code (``zeropp_hier.app.run.Run``: the job's
config, the model shape built sharded, its step loop and metrics), stock DeepSpeed as the job's
``stock`` preset with the benchmark's extra DeepSpeed keys. The plan lists configurations (stock
DeepSpeed or a zeropp_hier preset), the model shape, rounds and steps. One
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


def job_spec(cfg: dict, plan: dict):
    """The job (``zeropp_hier.app.run``) of one configuration: the plan's model shape, dtype,
    micro-batch and topology; stock configurations are the job's ``stock`` preset (DeepSpeed
    ZeRO-3 with no zeropp_hier section: plain ``deepspeed.initialize``, the same model built
    under stock ``deepspeed.zero.Init`` from the same seed)."""
    from zeropp_hier.app.spec import JobSpec, ModelSpec

    return JobSpec(
        preset="stock" if cfg["kind"] == "stock" else cfg["preset"],
        compression=cfg.get("compression"),
        dtype=plan.get("dtype", "fp32"),
        micro_batch=plan["micro_batch"],
        model=ModelSpec(**plan["model_spec"]),
        topology=dict(plan["topology"]),
        regather=plan["regather"],
        local_world=plan["world"],
        seed=0,
        progress="off",
    )


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

    from zeropp_hier.app.model.models import blocks

    _wait_after = _device_time_hook(DeviceTime.apply)
    for blk in blocks(model.module if hasattr(model, "module") else model):
        blk.register_forward_hook(_wait_after)


def _device_time_hook(fn):
    """A forward hook applying ``fn`` to a block's hidden states (a tensor, or a tuple's first)."""

    def hook(_module, _inputs, out):
        if isinstance(out, tuple):
            return (fn(out[0]), *out[1:])
        return fn(out)

    return hook


def ds_overrides(cfg: dict, plan: dict) -> dict:
    """What the benchmark sets beyond the job's config (``JobSpec.ds_config``): stock ZeRO++'s
    ``zero`` keys, DeepSpeed's prefetch and gradient buckets, our overlap/memory/pipeline keys."""
    zero = dict(cfg.get("zero", {}))
    bucket = plan.get("prefetch_bucket", 0)
    if bucket and cfg.get("prefetch", True):
        # prefetch ahead of use; reuse distance 0 and at most about one bucket of live parameters,
        # as for a model much larger than this one: without the live limit DeepSpeed keeps this
        # small model gathered from forward into backward, and backward gathers nothing
        zero.update(stage3_prefetch_bucket_size=bucket, stage3_max_reuse_distance=0, stage3_max_live_parameters=bucket)
    if plan.get("reduce_bucket"):
        # gradient buckets of about one layer, as a model much larger than DeepSpeed's 5e8-element
        # default bucket has: backward fills several, and each is reduced while backward goes on
        # (with the default this small model is one bucket, reduced after backward ends)
        zero["reduce_bucket_size"] = plan["reduce_bucket"]
    out: dict = {"zero_optimization": zero} if zero else {}
    ours = {k: cfg[k] for k in ("overlap", "memory", "pipeline", "auto") if k in cfg}
    if ours:
        out["zeropp_hier"] = ours
    return out


# [Note: auto on the benchmark's probe]
# Built on shaped links, ``auto`` spends its build moving the whole model over them (DeepSpeed's
# broadcast and partitioning): at 8 nodes x 1 x 2 and 0.86 Mbit/s per GCD that is over 15 minutes
# per build. When the driver has probed the shaped links (``zeropp-hier probe``, the same probe
# ``auto`` runs), ``auto`` in the shaped phase reads that file (``auto.probe_file``) and is built
# on unshaped links like every other configuration. With the links unshaped it probes them itself.
def auto_on_probe(cfg: dict, plan: dict, shaped: bool) -> dict:
    """``cfg`` as it runs: ``auto`` in the shaped phase ranks on the plan's probe file if any."""
    if cfg.get("preset") != "auto" or not shaped or not plan.get("auto_probe_file"):
        return cfg
    return {**cfg, "auto": {"probe_file": plan["auto_probe_file"]}}


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


def run_one(name: str, cfg: dict, plan: dict, label: str, marks: bool = True) -> dict:
    """One configuration on this rank: build, warm up, measure. ``marks=False`` runs it outside
    the emulated cluster (no driver to answer [Note: marks]), as the tests do."""
    import torch.distributed as dist

    import zeropp_hier
    from benchmarks.cluster import rankside
    from benchmarks.cluster.rankside import peak_rss_bytes, peak_rss_reset
    from benchmarks.compare.linkuse import busy_summary
    from zeropp_hier.app.run import Run

    mark = rankside.mark if marks else (lambda _label: None)
    shaped = label.startswith("shaped/")
    cfg = auto_on_probe(cfg, plan, shaped)
    # "auto" probes the links while it is built: it must see them as the steps will (unless it
    # reads the driver's probe of the shaped links, [Note: auto on the benchmark's probe])
    auto = cfg.get("preset") == "auto" and "auto" not in cfg
    if shaped:  # otherwise the driver unshapes the links: building moves the whole model
        mark(f"{label} {'shape' if auto else 'build'}")
    peak_rss_reset()
    t0 = time.perf_counter()
    run = Run(job_spec(cfg, plan), ds_overrides(cfg, plan))
    build_s = time.perf_counter() - t0
    engine = run.engine
    if plan.get("device_ms"):  # [Note: device-time compute]
        add_device_time(engine, plan["device_ms"])
    if shaped and not auto:
        mark(f"{label} shape")
    run.train(plan["warmup"])
    run.reset_counters()
    executor = run.runtime.executor if run.hier else None
    mark(f"{label} begin")
    if executor is not None:  # [Note: busy intervals] in zeropp_hier/comm/busy.py
        executor.record_busy()
    first = len(run.windows)
    # the job's row of each step all-reduces one float (the mean loss) after the step's timer
    # stops: outside the step times, inside the wire counters (~100 bytes per rank per step)
    rows = run.train(plan["steps"], start=plan["warmup"])
    windows = run.windows[first:]
    busy = executor.busy_log.intervals() if executor is not None and executor.busy_log is not None else None
    if executor is not None:
        executor.record_busy(False)
    mark(f"{label} end")
    out = {
        "times": [r["seconds"] for r in rows],
        "losses": [r["loss"] for r in rows],  # mean over ranks (the job's row)
        "peak_rss": peak_rss_bytes(),
        "build_s": build_s,
    }
    if run.hier:
        out["stats"] = zeropp_hier.comm_stats(engine)
    if busy is not None:  # per tier busy time in the measured steps ([Note: link use])
        out["busy"] = busy_summary(busy, windows)
    run.release()
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
                res = run_one(name, plan["configs"][name], plan, f"{phase['name']}/{rnd}/{name}")
                if dist.get_rank() == 0:
                    res["phase"], res["round"] = phase["name"], rnd
                    send_result(res)
    mark("done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
