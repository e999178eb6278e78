"""Per-rank functions of the tests of the job's models (tests/dist/test_models.py,
tests/dist/test_activation_checkpointing.py): they return plain data for the test to assert on."""

from __future__ import annotations

import gc

from zeropp_hier.app import run as app_run
from zeropp_hier.app.model import models
from zeropp_hier.app.spec import ModelSpec


def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak_rss() -> None:
    # Linux: writing 5 to clear_refs resets the peak resident set size (VmHWM) to the current one
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def build_peak(spec: ModelSpec, config: dict) -> dict:
    """Peak resident memory while this rank builds ``spec`` sharded, against the model's size."""
    import ctypes

    import torch.distributed as dist

    # glibc raises its mmap threshold each time a large block is freed, after which blocks of
    # that size come from the heap and freed ones stay resident: the peak would then count
    # memory already released (one module's gathered weights after another). A fixed 64 KiB
    # threshold maps every block of a bias or more on its own and unmaps it when freed, so the
    # resident peak follows the bytes actually held.
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_MMAP_THRESHOLD, 64 << 10)
    # the hierarchy's process groups first, and one small build under them, so that one-time
    # costs (the groups' buffers, modules transformers imports lazily) are not counted as the
    # model's; the measured build then runs under the same groups, as an engine's would
    from zeropp_hier.core.config import hier_config_from_ds
    from zeropp_hier.deepspeed.runtime import HierRuntime

    runtime = HierRuntime.create(hier_config_from_ds(config))
    warm = models.build(ModelSpec(), config, hier_runtime=runtime)
    del warm
    gc.collect()
    libc.malloc_trim(0)
    dist.barrier()
    _reset_peak_rss()
    base_kib = _proc_status_kib("VmRSS")
    model = models.build(spec, config, hier_runtime=runtime)
    peak_kib = _proc_status_kib("VmHWM")
    libc.mallopt(M_MMAP_THRESHOLD, 128 << 10)  # glibc's initial value (kept fixed from now on)
    dist.barrier()
    params = list(model.parameters())
    return {
        "peak_delta_bytes": (peak_kib - base_kib) * 1024,
        "full_fp32_bytes": 4 * sum(p.ds_numel for p in params),
        "shard_bytes": sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in params),
        "local_numel": sum(p.numel() for p in params),  # 0: nothing but shards is held
    }


def checkpointed_runs(configs: dict, spec: ModelSpec, api: str, steps: int) -> dict:
    """Each named config trained from the same seed with activation checkpointing ``api``; also
    how often one block ran forward (twice per micro-step when backward recomputes it)."""
    out = {}
    for name, cfg in configs.items():
        engine = app_run.build_engine(cfg, spec, checkpointing=api)
        lm = engine.module.lm if isinstance(engine.module, models.CausalLM) else engine.module
        # the block's first submodule, counted as it starts: torch's non-reentrant recompute
        # stops as soon as it has what backward needs, before the block's last module ends
        first = lm.gpt_neox.layers[0].input_layernorm if hasattr(lm, "gpt_neox") else lm.blocks[0].ln1
        calls = [0]
        handle = first.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        losses = app_run.train_steps(engine, steps)
        handle.remove()
        out[name] = {"losses": losses, "state": app_run.gathered_state(engine), "block_forwards": calls[0]}
        app_run.release(engine)
    return out
