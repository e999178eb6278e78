"""Per-rank function of the Hugging Face Trainer integration test (run in a ``LocalWorld``).

Each rank builds a tiny GPT-2 from a config (no download), random token data and a Trainer
whose DeepSpeed config carries the ``zeropp_hier`` section; the only zeropp_hier-specific line
is ``zeropp_hier.patch_deepspeed()``. Returns plain data for the test process to assert on.
"""
from __future__ import annotations


def hf_trainer_run(out_dir: str, steps: int, gpus_per_node: int = 2, gcds_per_gpu: int = 2) -> dict:
    import torch
    import torch.distributed as dist

    import zeropp_hier
    zeropp_hier.patch_deepspeed()
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    ds_config = {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "zero_allow_untested_optimizer": True,
        # prefetch / reuse 0: the small model is released after forward and re-gathered in
        # backward, as a large model would be (otherwise there is no backward gather to see)
        "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0,
                              "stage3_param_persistence_threshold": 0},
        "zeropp_hier": {"preset": "frontier",
                        "topology": {"gpus_per_node": gpus_per_node, "gcds_per_gpu": gcds_per_gpu}},
    }
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=2, max_steps=steps,
                             learning_rate=1e-3, deepspeed=ds_config, report_to=[], logging_steps=1,
                             save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32))
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, 128, (64, 16), generator=g)
    data = [{"input_ids": t, "labels": t} for t in tokens]
    trainer = Trainer(model=model, args=args, train_dataset=data)
    result = trainer.train()
    engine = trainer.model_wrapped
    out = {"rank": dist.get_rank(), "engine": type(engine).__name__,
           "patched": zeropp_hier.is_patched(), "global_step": result.global_step,
           "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
           "stats": zeropp_hier.comm_stats(engine),
           "topology": list(engine.hier_runtime.topo.dims)}
    engine.destroy()
    zeropp_hier.unpatch_deepspeed()
    out["unpatched"] = not zeropp_hier.is_patched()
    return out


def shm_buffers_left() -> list[str]:
    """Names of this world's DeepSpeed shm buffers still present in /dev/shm ([Note: DeepSpeed
    shm leak]): every rank unlinked its own at start-up, so none should be left."""
    import os

    import torch.distributed as dist

    from zeropp_hier.launch.shm_hygiene import buffer_name
    names = [buffer_name(os.getuid(), os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], r)
             for r in range(dist.get_world_size())]
    return [n for n in names if os.path.exists(os.path.join("/dev/shm", n))]
