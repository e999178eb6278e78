"""The main job, shared by its two front ends (``python -m zeropp_hier.app.train``, the Hydra app,
and ``python -m zeropp_hier.app.demo``, the argparse one): train a GPT-NeoX of a named size
(``app/models.py``), built sharded, on prepared token files (``app/data.py``) or synthetic
batches, report each step, write the metrics.

A ``JobSpec`` is plain, picklable data, so the same spec runs on ranks this process spawns
(``LocalWorld``) or, under ``srun``/``torchrun``, in this process as one rank of many.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal, Mapping, get_args

from ..detect.slurm_env import expand_hostlist, slurm_task
from ..files import write_json_atomic
from ..planner.tables import fmt_bytes
from .models import CHECKPOINTING, Checkpointing, ModelSpec

Preset = Literal["frontier", "zeropp", "zero3", "auto", "stock"]  # stock: DeepSpeed ZeRO-3 without our section
Dtype = Literal["fp32", "bf16", "fp16"]
Progress = Literal["auto", "on", "off"]
PRESETS: tuple[str, ...] = get_args(Preset)
DTYPES: tuple[str, ...] = get_args(Dtype)
PROGRESS: tuple[str, ...] = get_args(Progress)


@dataclass(frozen=True)
class JobSpec:
    """The job, typed, with its defaults in this one place. The Hydra app's YAML defaults
    (``configs/train.yaml`` and its default groups) are tested equal to these
    (``tests/unit/test_train_config.py``); the argparse front end takes its defaults from here."""

    preset: Preset = "frontier"
    compression: Any = None  # None: the preset's own; "none"/"int8"/...: every tier; or a dict
    steps: int = 30
    dtype: Dtype = "fp32"
    micro_batch: int = 4
    model: ModelSpec = field(default_factory=ModelSpec)  # zeropp_hier.app.models; default: tiny
    activation_checkpointing: Checkpointing = "none"  # per block: none | torch | deepspeed
    data_path: str | None = None  # a `zeropp-hier data prepare` directory; None: synthetic batches
    save_every: int = 0  # checkpoint every N steps and after the last (0: never); app/resume.py
    checkpoint_dir: str | None = None  # None: <out_dir>/checkpoints
    resume: str | None = None  # "latest" or a tag in checkpoint_dir: continue that run up to `steps`
    # the "topology" value of the zeropp_hier section ("auto", or a dict)
    topology: Any = field(default_factory=lambda: {"gpus_per_node": 2, "gcds_per_gpu": 2})
    local_world: int = 8  # ranks to start when not under a launcher
    regather: bool = True  # DeepSpeed prefetch/reuse 0: backward re-gathers as for a large model
    lr: float = 3e-3
    warmup_steps: int = 0  # DeepSpeed WarmupLR: lr rises linearly from 0 over this many steps (0: constant lr)
    seed: int = 0
    out_dir: str | None = None  # rank 0 writes metrics.jsonl and summary.json here
    memory_gb: float | None = None  # memory per rank the layout must fit in; None: the device's (memory_check.py)
    progress: Progress = "auto"  # progress bar: auto (only on a terminal), on, off
    label: dict = field(default_factory=dict)  # copied into summary.json (e.g. sweep overrides)

    def check(self) -> None:
        from ..core.errors import HierConfigError

        if self.preset not in PRESETS:
            raise HierConfigError("preset", self.preset, f"use one of {list(PRESETS)}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise HierConfigError("steps", self.steps, "use a positive integer")
        if self.dtype not in DTYPES:
            raise HierConfigError("dtype", self.dtype, "use fp32, bf16 or fp16")
        if self.progress not in PROGRESS:
            raise HierConfigError("progress", self.progress, "use auto, on or off")
        if self.activation_checkpointing not in CHECKPOINTING:
            raise HierConfigError(
                "activation_checkpointing", self.activation_checkpointing, f"use one of {list(CHECKPOINTING)}"
            )
        self.model.check()
        if not isinstance(self.save_every, int) or self.save_every < 0:
            raise HierConfigError("save_every", self.save_every, "use 0 (no checkpoints) or a positive step count")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise HierConfigError("warmup_steps", self.warmup_steps, "use 0 (constant lr) or a positive step count")
        if self.memory_gb is not None and not (isinstance(self.memory_gb, (int, float)) and self.memory_gb > 0):
            raise HierConfigError("memory_gb", self.memory_gb, "use a positive number of GB, or null for the device's")
        if (self.save_every or self.resume) and not (self.checkpoint_dir or self.out_dir):
            raise HierConfigError(
                "checkpoint_dir", self.checkpoint_dir, "name a directory for save_every / resume (or set out_dir)"
            )

    @property
    def ckpt_dir(self) -> str | None:
        if self.checkpoint_dir:
            return self.checkpoint_dir
        return os.path.join(self.out_dir, "checkpoints") if self.out_dir else None


def with_data_vocab(spec: JobSpec) -> JobSpec:
    """``spec`` with the model's vocabulary written out when the model leaves it null: the
    data's tokenizer's size (the prepared directory's index.json), or 256 for synthetic batches
    (which draw from the model's own vocabulary, so any size serves them); a model whose
    vocabulary is smaller than the data's is refused."""
    from dataclasses import replace

    from ..core.errors import HierConfigError
    from .models import BYTE_VOCAB

    m = spec.model
    if spec.data_path is None:  # synthetic batches draw from the model's own vocabulary
        return spec if m.vocab_size is not None else replace(spec, model=replace(m, vocab_size=BYTE_VOCAB))
    from .data import TokenData

    vocab, where = TokenData(spec.data_path).vocab_size, f"the tokenizer of {spec.data_path}"
    if m.vocab_size is None:
        return replace(spec, model=replace(m, vocab_size=vocab))
    if m.vocab_size < vocab:
        raise HierConfigError(
            "model.vocab_size",
            m.vocab_size,
            f"{where} has {vocab} tokens: use a model with at least as many (model.vocab_size={vocab}, "
            "or null to take the data's)",
        )
    return spec


def ds_config_for(spec: JobSpec, overrides: Mapping[str, Any] | None = None) -> dict:
    """The job's DeepSpeed config. ``overrides``: sections merged in last, one level deep (a
    dict value updates the section of the same name, anything else replaces it), e.g. the
    benchmarks' ``{"zero_optimization": {"zero_hpz_partition_size": 4}}`` for stock ZeRO++."""
    from . import training

    preset = None if spec.preset == "stock" else spec.preset
    cfg = training.ds_config(
        preset,
        dtype=spec.dtype,
        micro_batch=spec.micro_batch,
        compression=spec.compression,
        lr=spec.lr,
        regather=spec.regather,
    )
    if preset is not None:
        cfg["zeropp_hier"]["topology"] = spec.topology
    if spec.warmup_steps:
        cfg["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": spec.lr,
                "warmup_num_steps": spec.warmup_steps,
                "warmup_type": "linear",
            },
        }
    for key, value in (overrides or {}).items():
        if isinstance(value, Mapping) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg


class _JobLogHandler(logging.StreamHandler):
    """The job's own handler of the package's log, added once per process."""


class _Reporter:
    """Rank 0's output: a progress bar, one line per step, metrics.jsonl."""

    def __init__(self, spec: JobSpec, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self.jsonl = None
        if not enabled:
            return
        from tqdm import tqdm

        disable = {"auto": None, "on": False, "off": True}[spec.progress]  # None: only on a TTY
        self.bar = tqdm(
            total=spec.steps,
            desc="train",
            unit="step",
            disable=disable,
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
        )
        if spec.out_dir:
            os.makedirs(spec.out_dir, exist_ok=True)
            self.jsonl = open(os.path.join(spec.out_dir, "metrics.jsonl"), "w")

    def resumed_at(self, start: int, steps: int) -> None:
        """A resumed run trains steps start..steps-1: the bar counts those, not ``steps``."""
        if self.bar is not None:
            self.bar.reset(total=steps - start)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None and not self.bar.disable:
            self.bar.write(text, file=sys.stdout)  # keeps the bar below the lines
        else:
            print(text, flush=True)

    def step(self, row: dict, text: str) -> None:
        if not self.enabled:
            return
        self.line(text)
        if self.jsonl is not None:
            self.jsonl.write(json.dumps(row) + "\n")
            self.jsonl.flush()
        if self.bar is not None:  # made whenever the reporter is enabled
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['loss']:.3f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.jsonl is not None:
            self.jsonl.close()


def numerics_lines(engine) -> list[str]:
    """End-of-run table of the compression error per phase and tier, error-feedback memory and
    skipped steps, from ``comm_stats(engine)["numerics"]`` (this rank)."""
    import zeropp_hier

    num = zeropp_hier.comm_stats(engine)["numerics"]
    plan = engine.hier_runtime.plan
    hops = {"forward_gather": plan.forward, "backward_gather": plan.backward, "grad_reduce": plan.reduce}
    from ..planner.tables import table

    rows = []
    for phase, tiers in num["relative_error"].items():
        for tier, e in tiers.items():
            hop = next((h for h in hops.get(phase, ()) if h.tier == tier), None)
            scheme = hop.scheme if hop else "?"
            fb = "on" if hop is not None and hop.error_feedback else ""
            rows.append([phase, tier, scheme, f"{e['mean']:.4f}", f"{e['max']:.4f}", e["samples"], fb])
    lines = [f"compression error ||x - deq(q(x))|| / ||x|| on rank 0, sampled every {num['sample_every']}th call:"]
    if rows:
        lines += table(["phase", "tier", "scheme", "mean", "max", "samples", "feedback"], rows)
    else:
        lines.append("  (nothing compressed, or sampling off)")
    ef, nf = num["error_feedback"], num["nonfinite"]
    lines.append(
        f"error feedback: {ef['buffers']} residual buffer(s), {fmt_bytes(ef['bytes'])} on rank 0; "
        f"skipped steps ({nf['policy']} on non-finite): {nf['skipped_steps'] or 'none'}"
    )
    return lines


def peak_memory_bytes(device) -> int:
    """This rank's peak memory: the accelerator's peak allocation, or on a CPU the process's
    peak resident set (VmHWM; Linux)."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


class Run:
    """One rank's job, built: the data (checked before the model is built: a wrong path costs
    nothing), the engine for ``spec.model`` under the preset (built sharded, ``app/models.py``)
    and the per-step metrics. ``rank_main`` drives it with the job's reporting, resume and
    checkpoints; the benchmarks (``benchmarks/compare_rank.py``, ``benchmarks/convergence.py``)
    with their own hooks, so that what they measure is what the job runs.
    ``ds_overrides``: see ``ds_config_for``. Collective: every rank builds it."""

    def __init__(self, spec: JobSpec, ds_overrides: Mapping[str, Any] | None = None):
        import torch
        import torch.distributed as dist

        from ..core.topology import TIERS
        from . import flops, models, training
        from .data import Loader, TokenData

        spec = with_data_vocab(spec)  # the model's vocabulary: the data's, or refused if smaller
        self.spec = spec
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        m = spec.model
        self.loader: Loader | None = None
        self.tokens: TokenData | None = None
        if spec.data_path is not None:
            self.tokens = TokenData(spec.data_path)
            self.loader = Loader(self.tokens, m.seq_len, spec.micro_batch, self.rank, self.world, spec.seed)
        self.config = ds_config_for(spec, ds_overrides)
        self.engine = training.build_engine(
            self.config, m, seed=spec.seed, checkpointing=spec.activation_checkpointing
        )
        self.runtime = getattr(self.engine, "hier_runtime", None)
        self.hier = self.runtime is not None
        self.tokens_per_step = self.world * spec.micro_batch * m.seq_len
        self.n_params = sum(p.ds_numel for p in self.engine.module.parameters())
        dev = self.engine.device
        self.device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
        self.flops_per_token = flops.flops_per_token(
            self.n_params, models.input_embedding_params(m), m.layers, m.hidden, m.seq_len
        )
        self.peak_tflops = flops.peak_tflops(self.device_name)
        self.windows: list[tuple[float, float]] = []  # each trained step's (start, end), host clock
        self._sent = {t: 0 for t in TIERS}  # comm_stats' totals at the last row
        self._skipped = self.engine.skipped_steps

    def batch_fn(self):
        """``train_steps``' batches: the loader's, or None for the model's synthetic sequences."""
        loader = self.loader
        return None if loader is None else (lambda index, batch, r: loader.batch(index))

    def reset_counters(self) -> None:
        """Start the byte counters (and comm_stats) from zero, e.g. after warm-up steps."""
        from ..core.topology import TIERS

        if self.hier:
            import zeropp_hier

            zeropp_hier.reset_comm_stats(self.engine)
        self._sent = {t: 0 for t in TIERS}

    def measure(self, step: int, loss: float, seconds: float) -> dict:
        """The job's metrics row of one step (collective: the loss is averaged over ranks)."""
        import torch
        import torch.distributed as dist

        from ..core.topology import TIERS
        from . import flops

        t = torch.tensor([loss], dtype=torch.float64, device=self.engine.device)  # NCCL takes device tensors only
        dist.all_reduce(t)
        tps = self.tokens_per_step
        row: dict[str, Any] = {
            "step": step,
            "loss": float(t) / self.world,
            "tokens_per_s": tps / seconds,
            "seconds": seconds,
        }
        row["tflops_per_gcd"] = flops.tflops_per_gcd(self.flops_per_token, tps, seconds, self.world)
        row["mfu"] = flops.mfu(row["tflops_per_gcd"], self.peak_tflops)
        row["peak_memory_bytes"] = peak_memory_bytes(self.engine.device)  # this rank's
        if self.hier:
            import zeropp_hier

            snap = zeropp_hier.comm_stats(self.engine)["bytes"]
            now = {tier: sum(snap[p][tier] for p in snap) for tier in TIERS}
            row["bytes"] = {tier: now[tier] - self._sent[tier] for tier in TIERS}
            self._sent.update(now)
        row["skipped"] = self.engine.skipped_steps > self._skipped  # fp16 overflow or non-finite gradient
        self._skipped = self.engine.skipped_steps
        return row

    def train(self, steps: int, start: int = 0, on_row: Callable[[dict], None] | None = None) -> list[dict]:
        """Steps ``start`` .. ``start + steps - 1``; ``on_row`` sees each step's row as it ends
        (``row["seconds"]`` is the step itself, timed by ``training.train_steps``)."""
        from . import training

        rows: list[dict] = []

        def on_step(step: int, loss: float, seconds: float) -> None:
            end = time.perf_counter()  # train_steps times the step with this clock
            self.windows.append((end - seconds, end))
            rows.append(self.measure(step, loss, seconds))
            if on_row is not None:
                on_row(rows[-1])

        training.train_steps(self.engine, steps, start=start, on_step=on_step, batch_fn=self.batch_fn())
        return rows

    def release(self) -> None:
        from . import training

        training.release(self.engine)
        self.engine = None


def rank_main(spec: JobSpec, hooks: Any = None) -> dict:
    """One rank of the job (torch.distributed already initialised). ``hooks`` (tests): an object
    whose ``loaded(engine)`` runs after a resume's load and ``saved(engine, step)`` after each
    save, on every rank; what they return is in the result's "hooks"."""
    import torch.distributed as dist

    import zeropp_hier

    rank, world = dist.get_rank(), dist.get_world_size()
    spec = with_data_vocab(spec)  # the model's vocabulary: the data's, or refused if smaller
    if rank == 0:  # the auto topology's detection report (zeropp_hier.detect.probe logs it on rank 0)
        log = logging.getLogger("zeropp_hier")
        if not any(isinstance(h, _JobLogHandler) for h in log.handlers):
            log.addHandler(_JobLogHandler(sys.stdout))
        log.setLevel(logging.INFO)
        log.propagate = False
    model_cfg = spec.model
    from . import deadline, resume, resume_rules

    data_sha = None
    if spec.data_path is not None:  # checked before the model is built: a wrong path costs nothing
        from .data import TokenData

        data_sha = TokenData(spec.data_path).index.get("sha256")
    # before the model is built: a resume that cannot work costs nothing; another world converts
    plan = resume.plan(spec, world, data_sha) if spec.resume else None
    run = Run(spec, {"checkpoint": {"load_universal": True}} if plan is not None and plan.universal else None)
    engine, rt, hier, loader = run.engine, run.runtime, run.hier, run.loader
    tokens_per_step, n_params, device_name = run.tokens_per_step, run.n_params, run.device_name
    report = _Reporter(spec, rank == 0)
    mode = spec.topology if isinstance(spec.topology, str) else (spec.topology or {}).get("mode", "manual")
    arch = {"neox": "GPT-NeoX", "gpt": "GPT"}[model_cfg.arch]
    report.line(
        f"zeropp-hier: preset={spec.preset} compression={spec.compression or 'preset default'} "
        f"dtype={spec.dtype} world={world}, {arch} {n_params / 1e6:.2f}M params "
        f"({model_cfg.layers} layers x {model_cfg.hidden}, vocabulary {model_cfg.vocab_size}), "
        f"{tokens_per_step} tokens/step, "
        f"data {spec.data_path or 'synthetic'}, activation checkpointing {spec.activation_checkpointing}"
    )
    # which kernels each rank runs (a rank on another CPU may pick another variant)
    from zeropp_hier.quant import kernel_info

    kernels: list = [None] * world
    dist.all_gather_object(kernels, kernel_info())
    report.line(
        "quantization kernels: "
        + "; ".join(
            f"{k} on ranks {','.join(str(r) for r in range(world) if kernels[r] == k)}" for k in dict.fromkeys(kernels)
        )
    )
    if rt is not None:
        from ..planner import tables

        for line in (*tables.topology_lines(rt.topo, mode), *tables.plan_lines(rt.plan, rt.topo)):
            report.line(line)
    from ..core.topology import TIERS
    from . import flops

    history: list[dict] = []

    def on_row(row: dict) -> None:
        sent = ""
        if hier:
            sent = " | sent/rank " + "  ".join(
                f"{tier} {fmt_bytes(row['bytes'][tier]):>9s}" for tier in reversed(TIERS)
            )
        mark = " | SKIPPED (weights unchanged)" if row["skipped"] else ""
        history.append(row)
        perf = f"{row['tflops_per_gcd']:.3g} TFLOP/s/GCD {flops.mfu_text(row['mfu'], device_name)}"
        report.step(
            row,
            f"step {row['step']:4d} | loss {row['loss']:.4f} | {row['tokens_per_s']:8.0f} tok/s | {perf}{sent}{mark}",
        )
        done = row["step"] + 1
        if spec.save_every and (done % spec.save_every == 0 or done == spec.steps):
            assert spec.ckpt_dir is not None  # JobSpec.check: save_every needs a directory
            tag = resume.save(engine, spec.ckpt_dir, done, data_state(done), record)
            if hooks is not None:
                hooked["saved"][done] = hooks.saved(engine, done)
            report.line(f"checkpoint {tag} saved in {spec.ckpt_dir}")
        if watch is not None and done < spec.steps:  # save in time ([Note: saving before the wall clock ends])
            saved = bool(spec.save_every) and done % spec.save_every == 0
            watch.after_step(done, saved, lambda d: resume.save(engine, d, done, data_state(done), record))

    accum = engine.gradient_accumulation_steps()
    record = resume_rules.record(spec, world, accum, data_sha)
    hooked: dict = {"loaded": None, "saved": {}}
    watch = deadline.for_job(spec.checkpoint_dir, n_params, world, spec.dtype, engine.device, rt and rt.executor)

    def data_state(next_step: int) -> dict:
        if loader is not None:
            return loader.state(next_step * accum)
        return {"sample": next_step * accum * world * spec.micro_batch, "seed": spec.seed}

    start = 0
    if plan is not None:
        job = resume.load(engine, plan)
        start = int(job["step"])
        if loader is not None:
            loader.resume_at(job["data"], start * accum)  # the exact next global sample
        if hooks is not None:
            hooked["loaded"] = hooks.loaded(engine)
        if start >= spec.steps:
            from ..core.errors import HierConfigError

            raise HierConfigError("steps", spec.steps, f"the checkpoint is at step {start}: ask for more steps")
        report.resumed_at(start, spec.steps)
        report.line(
            f"resumed from {os.path.join(plan.load_dir, plan.tag)} at step {start}, data sample "
            f"{job['data']['sample']}"
            + (f" ({plan.saved_world} ranks -> {world}, universal format)" if plan.universal else "")
        )

    t0 = time.perf_counter()
    try:
        run.train(spec.steps - start, start=start, on_row=on_row)
    except deadline.SavedInTime as stop:
        report.line(stop.line)
    elapsed = time.perf_counter() - t0
    report.close()
    flops_token, peak = run.flops_per_token, run.peak_tflops
    summary = {
        "spec": asdict(spec),
        "world": world,
        "params": n_params,
        "tokens_per_step": tokens_per_step,
        "first_loss": history[0]["loss"],
        "final_loss": history[-1]["loss"],
        "tokens_per_s": tokens_per_step * len(history) / elapsed,
        "seconds": elapsed,
        "kernels": kernels,
        # [Note: model FLOPs] in app/flops.py: 6 N + 12 L h s per token, recomputation not counted
        "flops_per_token": flops_token,
        "device": device_name or "cpu",
        "tflops_per_gcd": flops.tflops_per_gcd(flops_token, tokens_per_step * len(history), elapsed, world),
        "peak_bf16_tflops": peak,
    }
    summary["mfu"] = flops.mfu(summary["tflops_per_gcd"], peak)
    mem: list = [None] * world
    dist.all_gather_object(mem, peak_memory_bytes(engine.device))
    summary["peak_memory_bytes_per_rank"] = mem
    if rt is not None:
        st = zeropp_hier.comm_stats(engine)
        summary["topology"] = {
            "dims": list(rt.topo.dims),
            "mode": mode,
            "rank_map": None if rt.topo.is_identity_map else list(rt.topo.rank_map),
        }
        summary["bytes_per_step"] = {
            p: {t: v / len(history) for t, v in per.items()} for p, per in st["bytes"].items()
        }
        summary["comm_stats"] = st
        if st.get("auto"):  # "preset": "auto": what it chose ([Note: auto preset])
            summary["auto"] = {k: st["auto"][k] for k in ("chosen", "runner_up", "rates_gbps", "source")}
    if rank == 0:
        report.line(
            f"done: {len(history)} steps, mean {summary['tokens_per_s']:.0f} tok/s, "
            f"{summary['tflops_per_gcd']:.3g} TFLOP/s per GCD ({flops.mfu_text(summary['mfu'], device_name)}), "
            f"final loss {summary['final_loss']:.4f} (first {summary['first_loss']:.4f}), "
            f"peak memory per rank {fmt_bytes(max(mem))} (max over ranks)"
        )
        if hier:
            from ..planner import tables

            for line in tables.bytes_lines(
                summary["bytes_per_step"], "bytes sent by rank 0 per step, by phase and tier:"
            ):
                report.line(line)
            for line in numerics_lines(engine):
                report.line(line)
        if spec.out_dir:
            write_json_atomic(os.path.join(spec.out_dir, "summary.json"), summary, indent=1)
            from . import chart

            title = f"{arch} {n_params / 1e6:.1f}M, preset {spec.preset}, {spec.dtype}, {world} ranks"
            png = chart.write(history, spec.out_dir, title)
            report.line(
                f"metrics: {os.path.join(spec.out_dir, 'metrics.jsonl')}, summary.json, {os.path.basename(png)}"
            )
    run.release()
    losses = [row["loss"] for row in history]  # mean over ranks, one per step trained here
    out = {"first_loss": summary["first_loss"], "final_loss": summary["final_loss"], "losses": losses}
    if hooks is not None:
        out["hooks"] = hooked
    return out


# -- launching ------------------------------------------------------------------------------


def launcher_env(env: Mapping[str, str], gpus_visible: int) -> dict | None:
    """Variables torch.distributed and DeepSpeed need, for a process started by a launcher;
    None when no launcher started it (then the job spawns its own ranks).

    torchrun sets them all. Under ``srun`` they come from Slurm: the rank from SLURM_PROCID,
    MASTER_ADDR from the first host of the step's node list, a port derived from the job id (two
    jobs sharing a node do not collide), and LOCAL_RANK 0 when the task sees a single GPU
    (``--gpus-per-task=1``: the device it must use is its device 0, whatever its local id).
    """
    if "RANK" in env and "WORLD_SIZE" in env:
        return {}
    task = slurm_task(env)
    if task is None or task.ntasks < 2:
        return None
    nodes = task.nodelist or expand_hostlist(env.get("SLURM_JOB_NODELIST", "localhost"))
    job = int(env.get("SLURM_JOB_ID", "0") or 0)
    out = {
        "RANK": str(task.procid),
        "WORLD_SIZE": str(task.ntasks),
        "LOCAL_RANK": str(0 if gpus_visible == 1 else task.localid),
        "LOCAL_SIZE": str(task.tasks_per_node[task.nodeid]),
    }
    if "MASTER_ADDR" not in env:
        out["MASTER_ADDR"] = nodes[0]
    if "MASTER_PORT" not in env:
        out["MASTER_PORT"] = str(20000 + job % 20000)
    return out


def memory_lines(spec: JobSpec, env: Mapping[str, str] | None, gpus: int) -> list[str]:
    """The planner's memory table for this job (printed by rank 0, or by the process that spawns
    the ranks); raises ``HierConfigError`` when the layout cannot fit. ``env``: ``launcher_env``'s."""
    from . import memory_check

    if env is None:  # this process spawns spec.local_world ranks on this machine
        world, per_node, rank = spec.local_world, spec.local_world, 0
    else:
        merged = {**os.environ, **env}
        world, rank = int(merged["WORLD_SIZE"]), int(merged["RANK"])
        per_node = int(merged.get("LOCAL_SIZE") or merged.get("LOCAL_WORLD_SIZE") or world)
    name, total = None, None
    if gpus:
        import torch

        name = torch.cuda.get_device_name(0)
        total = float(torch.cuda.get_device_properties(0).total_memory)
    lines = memory_check.check(spec, world, per_node, name, total)
    if rank == 0:
        print("\n".join(lines), flush=True)
    return lines


def launch(spec: JobSpec) -> dict:
    """Run the job: as one rank under a launcher, or on ``spec.local_world`` spawned ranks.
    Returns this process's rank result (rank 0's when it spawned the ranks)."""
    spec.check()
    spec = with_data_vocab(spec)  # before any rank starts: the memory table uses the vocabulary
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec.dtype == "fp16":
        # before any rank starts: otherwise every rank dies in deepspeed.initialize with a
        # ValueError that names neither the CPU feature nor the way out ([Note: fp16 on CPUs])
        from ..core.errors import HierConfigError
        from ..detect.hardware import fp16_unsupported_reason

        reason = fp16_unsupported_reason(uses_gpu=gpus > 0)
        if reason:
            raise HierConfigError(
                "dtype",
                "fp16",
                f"{reason}; use dtype=bf16 (same memory and wire size; no loss scaling needed) or dtype=fp32",
            )
    env = launcher_env(os.environ, gpus)
    memory_lines(spec, env, gpus)  # refuses here, before any rank builds a model
    if env is not None:
        os.environ.update(env)
        import deepspeed
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)  # one rank's INFO lines times thousands of ranks
        deepspeed.init_distributed(dist_backend=None if gpus else "gloo")
        if not gpus:
            from ..launch.shm_hygiene import release_deepspeed_shm

            release_deepspeed_shm()  # [Note: DeepSpeed shm leak]
        out = rank_main(spec)
        import torch.distributed as dist

        dist.destroy_process_group()
        return out
    from ..launch.world import LocalWorld

    if gpus:
        # NCCL refuses two ranks of one communicator on one GPU; gloo takes CUDA tensors (through
        # host memory: right for checking a workstation, not for timing)
        print(f"starting {spec.local_world} local ranks on {gpus} GPU(s), gloo...", flush=True)
    else:
        print(f"starting {spec.local_world} local CPU ranks (gloo)...", flush=True)
    with LocalWorld(spec.local_world, timeout=1800, gpus=gpus, preload=True) as w:
        out = w.run(rank_main, spec)
    return out[0]
