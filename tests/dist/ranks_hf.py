"""Per-rank functions of the Hugging Face Trainer integration test (run in a shared world of 8).

A ``run_clm.py``-style job: ``TrainingArguments`` with a DeepSpeed ZeRO-3 config (which keeps a
``HfDeepSpeedConfig`` alive), then ``GPTNeoXForCausalLM.from_pretrained`` of a small saved model
(built under DeepSpeed's ``zero.Init`` by transformers itself), a ``Trainer`` on token data, a
checkpoint every ``save_steps`` and a second Trainer that resumes from one. The only
zeropp_hier-specific lines are ``zeropp_hier.patch_deepspeed()`` and the config's section.

[Note: the Trainer's world on CPU ranks]
Accelerate 1.15 finds its process group from the device it sees. On CPU ranks without ``cpu=True``,
``PartialState._prepare_backend`` names no backend (accelerate/state.py:769 takes a backend only
for an accelerator: CUDA/ROCm, XPU, NPU, ...), and ``PartialState.__init__`` then sets
``num_processes = 1``, ``process_index = 0`` (state.py:287, "No backend == no distributed
training") although DeepSpeed's default group spans the world; only afterwards does the
DeepSpeed flag turn the type into ``DEEPSPEED``. Every rank is then a world of one:
``args.world_size == 1``, a plain ``BatchSampler``, the same batches on every rank, and DeepSpeed
averaging identical gradients, so losses and weights look plausible. (With ``train_batch_size:
"auto"`` DeepSpeed at least refuses: ``2 != 2 * 1 * 8``.)
``TrainingArguments(use_cpu=True)`` makes the Trainer see the world: transformers builds
``PartialState(cpu=True, backend=ddp_backend)`` (transformers/training_args.py:1876), which takes
the ``MULTI_CPU`` path (gloo; ``num_processes`` from the default group already initialised), and
the ``Accelerator`` the Trainer builds with its DeepSpeed plugin sets ``ACCELERATE_USE_DEEPSPEED``
itself (accelerate/accelerator.py:368) and keeps DeepSpeed, its own ``cpu`` being False
(state.py:974). The environment variable ``ACCELERATE_USE_CPU`` is not the same: it also sets the
Accelerator's ``cpu`` (state.py:915), and Accelerate then drops DeepSpeed without a word
(``MULTI_CPU``, plain DDP). On GPU ranks none of this applies: ``torch.cuda.is_available()`` gives
the ``nccl`` backend and the real world.
"""

from __future__ import annotations

import os

SEQ = 16
SAMPLES = 64
VOCAB = 128


def dataset_rows() -> list[list[int]]:
    """The token data every rank (and the test process) builds: row i starts with token i so
    that a row names its sample."""
    import torch

    g = torch.Generator().manual_seed(1234)
    rows = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=g)
    rows[:, 0] = torch.arange(SAMPLES)
    return rows.tolist()


def save_tiny_neox(model_dir: str) -> dict:
    """The pretrained model the job starts from: a small GPT-NeoX from a config, saved whole
    (safetensors) by the test process; returns its parameters by name."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_attention_heads=2,
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        rotary_pct=0.25,
        attn_implementation="eager",
    )
    model = GPTNeoXForCausalLM(cfg)
    model.save_pretrained(model_dir)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def load_whole(model_dir: str) -> dict:
    """A saved model's parameters by name, loaded whole by ``from_pretrained`` (no DeepSpeed)."""
    from transformers import GPTNeoXForCausalLM

    return {n: p.detach().clone() for n, p in GPTNeoXForCausalLM.from_pretrained(model_dir).named_parameters()}


def ds_config(preset: str | None, gpus_per_node: int = 2, gcds_per_gpu: int = 2) -> dict:
    """The job's DeepSpeed JSON, with the Trainer's ``auto`` values; ``preset=None``: stock."""
    cfg = {
        # "auto" batch sizes: the Trainer fills them from its world, and DeepSpeed then checks
        # train_batch_size == micro * accumulation * its own world (a world of one fails here)
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_allow_untested_optimizer": True,
        # prefetch / reuse 0: the small model is released after forward and re-gathered in
        # backward, as a large model would be (otherwise there is no backward gather to see)
        "zero_optimization": {
            "stage": 3,
            "stage3_prefetch_bucket_size": 0,
            "stage3_max_reuse_distance": 0,
            "stage3_param_persistence_threshold": 0,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    }
    if preset is not None:
        # exact (no compression): the run is compared with stock at the parity tests' tolerance
        cfg["zeropp_hier"] = {
            "preset": preset,
            "compression": "none",
            "topology": {"gpus_per_node": gpus_per_node, "gcds_per_gpu": gcds_per_gpu},
        }
    return cfg


def hf_trainer_run(
    model_dir: str, out_dir: str, preset: str | None, steps: int, save_steps: int, resume_from: str | None = None
) -> dict:
    """One Trainer job on this rank; returns what the test asserts on (plain data)."""
    import deepspeed
    import torch
    import torch.distributed as dist

    import zeropp_hier

    zeropp_hier.patch_deepspeed()
    from transformers import GPTNeoXForCausalLM, Trainer, TrainingArguments

    env = dict(os.environ)  # Accelerate and transformers set variables; the shared world outlives this job
    try:
        args = TrainingArguments(
            output_dir=out_dir,
            per_device_train_batch_size=2,
            max_steps=steps,
            learning_rate=1e-3,
            deepspeed=ds_config(preset),
            report_to=[],
            logging_steps=1,
            save_strategy="steps",
            save_steps=save_steps,
            save_only_model=False,
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
            use_cpu=True,  # [Note: the Trainer's world on CPU ranks]
        )
        # after TrainingArguments (its HfDeepSpeedConfig is alive): transformers builds the model
        # under deepspeed.zero.Init, each parameter cut into 1/world shards as it is made
        model = GPTNeoXForCausalLM.from_pretrained(model_dir)
        loaded = {
            "partitioned": all(hasattr(p, "ds_id") for p in model.parameters()),
            "shard_numel": sum(p.ds_tensor.numel() for p in model.parameters()),
            "numel": sum(p.ds_numel for p in model.parameters()),
        }
        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            loaded["state"] = {n: p.detach().clone() for n, p in model.named_parameters()}

        seen: list[list[list[int]]] = []  # per forward: this rank's input rows
        # per forward: this rank's loss as the model returns it (its tokens' summed loss over the
        # world's token count, which the Trainer gathers); the log rounds and averages over ranks
        losses: list[float] = []

        def record(module, fargs, kwargs, output):
            seen.append(kwargs["input_ids"].tolist())
            losses.append(float(output.loss.detach()))

        model.register_forward_hook(record, with_kwargs=True)
        data = [{"input_ids": torch.tensor(r), "labels": torch.tensor(r)} for r in dataset_rows()]
        trainer = Trainer(model=model, args=args, train_dataset=data)
        result = trainer.train(resume_from_checkpoint=resume_from)
        engine = trainer.model_wrapped
        loader = trainer.get_train_dataloader()
        sampler = loader.batch_sampler
        params = dict(engine.module.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values())):
            state = {n: p.detach().clone() for n, p in params.items()}
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, seen)  # every rank's rows at every step, seen from this rank
        out = {
            "rank": dist.get_rank(),
            "engine": type(engine).__name__,
            "patched": zeropp_hier.is_patched(),
            "world_size": trainer.args.world_size,
            "process_index": trainer.args.process_index,
            "distributed_type": str(trainer.accelerator.distributed_type),
            "deepspeed": trainer.is_deepspeed_enabled,
            "train_batch_size": engine.train_batch_size(),
            "sampler": type(sampler).__name__,
            "sampler_processes": getattr(sampler, "num_processes", None),
            "sampler_index": getattr(sampler, "process_index", None),
            "global_step": result.global_step,
            "losses": losses,
            "rows": seen,
            "everyone_rows": everyone,
            "logged": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "loaded": loaded,
            "state": state,
            "stats": zeropp_hier.comm_stats(engine) if preset is not None else None,
            "topology": list(engine.hier_runtime.topo.dims) if preset is not None else None,
            "checkpoints": sorted(d for d in os.listdir(out_dir) if d.startswith("checkpoint-")),
        }
        engine.destroy()
        del trainer, engine, model, args
        import gc

        gc.collect()
        return out
    finally:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
        os.environ.clear()
        os.environ.update(env)
        zeropp_hier.unpatch_deepspeed()


def trainer_world(use_cpu: bool) -> dict:
    """What the Trainer's arguments see of the world with and without ``use_cpu`` ([Note: the
    Trainer's world on CPU ranks]), without training."""
    from transformers import TrainingArguments

    env = dict(os.environ)
    try:
        args = TrainingArguments(
            output_dir="unused",
            per_device_train_batch_size=2,
            deepspeed=ds_config(None),
            report_to=[],
            use_cpu=use_cpu,
        )
        return {
            "world_size": args.world_size,
            "process_index": args.process_index,
            "distributed_type": str(args.distributed_state.distributed_type),
        }
    finally:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
        os.environ.clear()
        os.environ.update(env)


def shm_buffers_left() -> list[str]:
    """Names of this world's DeepSpeed shm buffers still present in /dev/shm ([Note: DeepSpeed
    shm leak]): every rank unlinked its own at start-up, so none should be left."""
    import torch.distributed as dist

    from zeropp_hier.launch.shm_hygiene import buffer_name

    names = [
        buffer_name(os.getuid(), os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], r)
        for r in range(dist.get_world_size())
    ]
    return [n for n in names if os.path.exists(os.path.join("/dev/shm", n))]
