"""Per-rank functions of the tests of the job's models (tests/dist/test_models.py,
tests/dist/test_activation_checkpointing.py): they return plain data for the test to assert on."""

from __future__ import annotations

import gc

from zeropp_hier.app import models, training


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


def build_peak_then_train(spec: models.ModelSpec, config: dict, steps: int) -> dict:
    """Peak resident memory while this rank builds ``spec`` sharded, against the model's size;
    then train ``steps`` steps on it."""
    import ctypes

    import torch.distributed as dist

    import zeropp_hier

    # glibc raises its mmap threshold each time a large block is freed, after which blocks of
    # that size come from the heap and freed ones stay resident: the peak would then count
    # memory already released (one module's gathered weights after another). A fixed 1 MiB
    # threshold maps every large block on its own and unmaps it when freed, so the resident
    # peak follows the bytes actually held.
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
    # one small build first, so that one-time costs (modules transformers imports lazily, the
    # first process groups) are not counted as the model's
    warm = models.build(models.ModelSpec(), config)
    del warm
    gc.collect()
    libc.malloc_trim(0)
    dist.barrier()
    _reset_peak_rss()
    base_kib = _proc_status_kib("VmRSS")
    model = models.build(spec, config)
    peak_kib = _proc_status_kib("VmHWM")
    libc.mallopt(M_MMAP_THRESHOLD, 128 << 10)  # glibc's initial value (kept fixed from now on)
    dist.barrier()
    params = list(model.parameters())
    out = {
        "peak_delta_bytes": (peak_kib - base_kib) * 1024,
        "full_fp32_bytes": 4 * sum(p.ds_numel for p in params),
        "shard_bytes": sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in params),
        "params": sum(p.ds_numel for p in params),
        "local_numel": sum(p.numel() for p in params),  # 0: nothing but shards is held
    }
    engine, *_ = zeropp_hier.initialize(model=model, model_parameters=params, config=config)
    out["losses"] = training.train_steps(engine, steps)
    training.release(engine)
    return out


def checkpointed_runs(configs: dict, spec: models.ModelSpec, api: str, steps: int) -> dict:
    """Each named config trained from the same seed with activation checkpointing ``api``; also
    how often one block's MLP ran forward (twice per micro-step when backward recomputes it)."""
    out = {}
    for name, cfg in configs.items():
        engine = training.build_engine(cfg, spec, checkpointing=api)
        lm = engine.module.lm if isinstance(engine.module, models.CausalLM) else engine.module
        mlp = lm.gpt_neox.layers[0].mlp if hasattr(lm, "gpt_neox") else lm.blocks[0].fc
        calls = [0]
        handle = mlp.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        losses = training.train_steps(engine, steps)
        handle.remove()
        out[name] = {"losses": losses, "state": training.gathered_state(engine), "mlp_forwards": calls[0]}
        training.release(engine)
    return out
