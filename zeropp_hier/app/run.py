"""One rank of the job: build the engine, train, measure each step, resume and save
(torch.distributed already initialised; ``app/launch.py`` starts the ranks).

``Run`` is the job built on this rank; ``rank_main`` drives it with the job's reporting
(``app/report.py``), resume and checkpoints (``app/longrun/resume.py``). The engine building and the step
loop below are shared with the benchmarks and the tests, so that all of them exercise the code
path the job runs. The model is a ``ModelSpec`` (the job's GPT-NeoX sizes) or the hand-written
GPT's ``GPTConfig``.
"""

from __future__ import annotations

import gc
import os
import resource
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

import deepspeed
import torch
import torch.distributed as dist

import zeropp_hier

from ..core.errors import HierConfigError
from ..core.vocab import TIERS
from ..quant import kernel_info
from . import report
from .data import orders
from .data.tokens import Loader, TokenData, open_tokens, synthetic_batch
from .job_vocab import with_data_vocab
from .longrun import deadline, io_cost, resume, resume_rules
from .model import flops, init_schemes, models, pretrained
from .model.gpt import GPT, GPTConfig
from .monitoring import evaluate, monitor, monitor_run
from .recipe import write_ds_config
from .spec import JobSpec, ModelSpec, input_embedding_params

if TYPE_CHECKING:
    from .data.blend import BlendedTokens
    from .data.indexed import IndexedTokens

# -- engine and step loop (the job, the benchmarks and the tests) ------------------------------


def build_engine(
    config: dict,
    model_cfg: Any = GPTConfig(),
    seed: int = 0,
    checkpointing: str = "none",
    init=("normal", "normal"),
    init_from: str | None = None,
):
    """An engine for ``model_cfg``: a ``ModelSpec`` is built sharded under ZeRO-3
    ([Note: building a model sharded] in app/model/models.py); a ``GPTConfig`` whole, as the tests of
    the hand-written GPT always did. ``checkpointing``: activation checkpointing per block
    ("none", "torch", "deepspeed"). ``init``: the GPT-NeoX schemes (init_method,
    output_layer_init_method) of ``app/model/init_schemes.py``. ``init_from``: a Hugging Face model
    directory whose weights replace the initial ones (``app/model/pretrained.py``)."""
    if isinstance(model_cfg, ModelSpec):
        model = models.build(model_cfg, config, seed=seed)
        if init_from is not None:  # each rank reads its own partitions ([Note: pretrained weights in])
            pretrained.load_into(model, init_from)
        else:
            init_schemes.apply(model, model_cfg.hidden, model_cfg.layers, init[0], init[1], seed)
    else:
        torch.manual_seed(seed)
        model = GPT(model_cfg)
    models.enable_checkpointing(model, checkpointing)  # type: ignore[arg-type]
    engine, *_ = zeropp_hier.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def gathered_state(engine) -> dict[str, torch.Tensor]:
    """Full fp32 copies of every parameter (collective: every rank must call it)."""
    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return {n: p.detach().float().clone() for n, p in params.items()}


def train_steps(
    engine,
    steps: int,
    start: int = 0,
    on_step: Callable[[int, float, float], None] | None = None,
    batch_fn: Callable[[int, int, int], tuple] | None = None,
) -> list[float]:
    """Run ``steps`` optimizer steps; returns this rank's loss per step (mean over micro-batches).
    ``batch_fn(index, batch, rank) -> (inputs, targets)`` gives the ``index``-th micro-batch
    (index = step * accumulation + micro); the default is the synthetic sequences of the model's
    vocabulary and length (``data.synthetic_batch``)."""
    c = engine.module.config
    rank, accum = dist.get_rank(), engine.gradient_accumulation_steps()
    micro = engine.train_micro_batch_size_per_gpu()
    if batch_fn is None:
        batch_fn = lambda index, batch, r: synthetic_batch(c, batch, index, r)  # noqa: E731
    losses = []
    for step in range(start, start + steps):
        t0 = time.perf_counter()
        total = 0.0
        for m in range(accum):
            x, y = batch_fn(step * accum + m, micro, rank)
            x, y = x.to(engine.device), y.to(engine.device)  # no-op on CPU
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += float(loss.detach().float())
        losses.append(total / accum)
        if on_step is not None:
            on_step(step, losses[-1], time.perf_counter() - t0)
    return losses


def release(engine) -> None:
    """Free an engine so the next one in this process starts clean."""
    engine.destroy()
    del engine
    gc.collect()


def run_config(
    config: dict, steps: int, model_cfg: GPTConfig = GPTConfig(), seed: int = 0, want_state: bool = True
) -> dict:
    """Build, train, report: losses, final weights and comm stats for this rank."""
    engine = build_engine(config, model_cfg, seed)
    losses = train_steps(engine, steps)
    out: dict[str, Any] = {"losses": losses}
    if want_state:
        out["state"] = gathered_state(engine)
    if getattr(engine, "hier_runtime", None) is not None:
        out["stats"] = zeropp_hier.comm_stats(engine)
    release(engine)
    return out


def peak_memory_bytes(device) -> int:
    """This rank's peak memory: the accelerator's peak allocation, or on a CPU the process's
    peak resident set (VmHWM; Linux)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


# -- the job on this rank --------------------------------------------------------------------


class Run:
    """One rank's job, built: the data (checked before the model is built: a wrong path costs
    nothing), the engine for ``spec.model`` under the preset (built sharded, ``app/model/models.py``)
    and the per-step metrics. ``rank_main`` drives it with the job's reporting, resume and
    checkpoints; the benchmarks (``benchmarks/compare/rank.py``, ``benchmarks/cpu/convergence.py``)
    with their own hooks, so that what they measure is what the job runs.
    ``ds_overrides``: see ``spec.ds_config``; ``data``: the loader ``open_data`` returned (else
    opened here). Collective: every rank builds it."""

    def __init__(self, spec: JobSpec, ds_overrides: Mapping[str, Any] | None = None, data: Loader | None = None):
        spec = with_data_vocab(spec)  # the model's vocabulary: the data's, or refused if smaller
        self.spec = spec
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        m = spec.model
        self.config = spec.ds_config(ds_overrides, world=self.world)
        accum = int(self.config.get("gradient_accumulation_steps", 1))
        self.loader: Loader | None = data if data is not None else open_data(spec, self.rank, self.world, accum)
        self.tokens: TokenData | IndexedTokens | BlendedTokens | None = self.loader.data if self.loader else None
        init = (spec.init_method, spec.output_layer_init_method)
        self.engine = build_engine(self.config, m, spec.seed, spec.activation_checkpointing, init, spec.init_from)
        self.runtime = getattr(self.engine, "hier_runtime", None)
        self.hier = self.runtime is not None
        self.tokens_per_step = self.world * spec.micro_batch * m.seq_len * self.engine.gradient_accumulation_steps()
        self.n_params = sum(p.ds_numel for p in self.engine.module.parameters())
        dev = self.engine.device
        self.device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
        self.flops_per_token = flops.flops_per_token(
            self.n_params, input_embedding_params(m), m.layers, m.hidden, m.seq_len
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
        if self.hier:
            zeropp_hier.reset_comm_stats(self.engine)
        self._sent = {t: 0 for t in TIERS}

    def measure(self, step: int, loss: float, seconds: float) -> dict:
        """The job's metrics row of one step (collective: the loss is averaged over ranks)."""
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
            snap = zeropp_hier.comm_stats(self.engine)["bytes"]
            now = {tier: sum(snap[p][tier] for p in snap) for tier in TIERS}
            row["bytes"] = {tier: now[tier] - self._sent[tier] for tier in TIERS}
            self._sent.update(now)
        row["skipped"] = self.engine.skipped_steps > self._skipped  # fp16 overflow or non-finite gradient
        self._skipped = self.engine.skipped_steps
        return row

    def recount(self) -> None:
        """Leave out of the next row the bytes sent since the last one (an evaluation's gathers)."""
        if self.hier:
            snap = zeropp_hier.comm_stats(self.engine)["bytes"]
            self._sent = {tier: sum(snap[p][tier] for p in snap) for tier in TIERS}

    def train(self, steps: int, start: int = 0, on_row: Callable[[dict], None] | None = None) -> list[dict]:
        """Steps ``start`` .. ``start + steps - 1``; ``on_row`` sees each step's row as it ends
        (``row["seconds"]`` is the step itself, timed by ``train_steps``)."""
        rows: list[dict] = []

        def on_step(step: int, loss: float, seconds: float) -> None:
            end = time.perf_counter()  # train_steps times the step with this clock
            self.windows.append((end - seconds, end))
            rows.append(self.measure(step, loss, seconds))
            if on_row is not None:
                on_row(rows[-1])

        train_steps(self.engine, steps, start=start, on_step=on_step, batch_fn=self.batch_fn())
        return rows

    def release(self) -> None:
        release(self.engine)
        self.engine = None


class _Checkpoints:
    """The job's saves: every ``save_every`` steps and after the last, each with the data
    position of the next step and the record a resume checks (``resume_rules.record``), and
    the save in time before the allocation ends (``deadline.for_job``: a job with a
    ``checkpoint_dir``). ``hooks.saved(engine, step)`` (tests) runs after each regular save;
    what it returns is kept."""

    def __init__(self, spec: JobSpec, run: Run, data_sha: str | None, hooks: Any, monitor: dict | None = None):
        self.spec, self.run, self.hooks, self.monitor = spec, run, hooks, monitor
        self.accum = run.engine.gradient_accumulation_steps()
        self.record = resume_rules.record(spec, run.world, self.accum, data_sha)
        self.saved: dict = {}
        executor = run.runtime.executor if run.runtime is not None else None
        self.watch = deadline.for_job(spec.checkpoint_dir, run.n_params, run.world, run.engine.device, executor)

    def data_state(self, next_step: int) -> dict:
        if self.run.loader is not None:
            return self.run.loader.state(next_step * self.accum)
        return {"sample": next_step * self.accum * self.run.world * self.spec.micro_batch, "seed": self.spec.seed}

    def after_step(self, done: int, rep: report.Reporter) -> None:
        """Save when ``done`` (steps completed) is due; then the ranks agree whether to save and
        stop before the wall clock ends (collective; raises ``deadline.SavedInTime``)."""
        spec, engine = self.spec, self.run.engine
        if spec.save_every and (done % spec.save_every == 0 or done == spec.steps):
            assert spec.ckpt_dir is not None  # JobSpec.check: save_every needs a directory
            self.save(spec.ckpt_dir, done, rep)
            if self.hooks is not None:
                self.saved[done] = self.hooks.saved(engine, done)
        if self.watch is not None and done < spec.steps:  # save in time ([Note: saving before the wall clock ends])
            saved = bool(spec.save_every) and done % spec.save_every == 0
            self.watch.after_step(done, saved, lambda d: self.save(d, done, rep))

    def save(self, where: str, done: int, rep: report.Reporter) -> str:
        """Save after ``done`` steps (collective); rank 0 says what it cost (io_cost.save_line)."""
        t0 = time.perf_counter()
        tag = resume.save(self.run.engine, where, done, self.data_state(done), self.record, self.monitor)
        seconds = time.perf_counter() - t0  # save_checkpoint returns after the commit, on every rank
        if self.run.rank == 0:
            rep.line(io_cost.totals_line(tag, where, *resume.saved_totals(where, tag), seconds))
        return tag


def open_data(spec: JobSpec, rank: int, world: int, accum: int) -> Loader | None:
    """This rank's loader of the training split, its sample orders from the cache for the
    positions of ``spec.steps`` steps (rank 0 builds or checks the cache, every rank maps it:
    [Note: data order caches] in app/data/order_cache.py), or None for synthetic batches.
    Collective (one object broadcast)."""
    if spec.data_path is None:
        return None
    tokens = open_tokens(spec.data_path, "train", spec.data_split, spec.seed)
    if hasattr(tokens, "limit_vocab"):  # ids the model cannot embed stop the job, named
        tokens.limit_vocab(spec.model.vocab)
    loader = Loader(tokens, spec.model.seq_len, spec.micro_batch, rank, world, spec.seed)
    loader.start_seconds = orders.start(
        loader, 0, spec.steps * accum * world * spec.micro_batch, spec.data_cache_dir, rank
    )
    return loader


_NOT_TOLD = "not told"


def _data_sha(spec: JobSpec) -> str | None:
    """The token files' hash (a resume checks it); read before the model is built, so that a
    wrong path costs nothing, on rank 0 only (a Megatron pair's fingerprint reads up to 4 MiB of
    it) and broadcast (collective)."""
    if spec.data_path is None:
        return None
    told: list = [_NOT_TOLD]
    if dist.get_rank() == 0:
        try:
            told[0] = open_tokens(spec.data_path, "train", spec.data_split).index.get("sha256")
        except (ValueError, RuntimeError, OSError) as e:  # HierConfigError among them
            told[0] = e
    dist.broadcast_object_list(told, src=0)
    if isinstance(told[0], BaseException):
        raise told[0]
    if told[0] == _NOT_TOLD:  # a dry run of another rank: the mirror leaves rank 0's object out
        return open_tokens(spec.data_path, "train", spec.data_split).index.get("sha256")
    return told[0]


def _resume(run: Run, plan: resume.Plan, saves: _Checkpoints, rep: report.Reporter) -> tuple[int, Any]:
    """Load ``plan``'s checkpoint into the run; the step to continue at, and what the load hook
    (tests) returned."""
    spec, engine, loader = run.spec, run.engine, run.loader
    job = resume.load(engine, plan)
    start = int(job["step"])
    if loader is not None:
        loader.resume_at(job["data"], start * saves.accum)  # the exact next global sample
        first = loader.base_sample  # the cached orders of the positions left (collective)
        last = first + (spec.steps - start) * saves.accum * run.world * spec.micro_batch
        orders.start(loader, first, last, spec.data_cache_dir, run.rank)
    loaded = saves.hooks.loaded(engine) if saves.hooks is not None else None
    if start >= spec.steps:
        raise HierConfigError("steps", spec.steps, f"the checkpoint is at step {start}: ask for more steps")
    rep.resumed_at(start, spec.steps)
    if (c := plan.conversion) is not None:
        rep.line(io_cost.conversion_line(plan.tag, c.source_world, c.world, c.bytes_read, c.bytes_written, c.seconds))
    rep.line(
        report.resumed_line(
            os.path.join(plan.load_dir, plan.tag),
            start,
            job["data"]["sample"],
            plan.saved_world,
            run.world,
            plan.universal,
        )
    )
    return start, loaded


def _monitor_run(spec: JobSpec, plan: resume.Plan | None) -> tuple[monitor_run.MonitorRun, str]:
    """This job's run in the monitor, the same on every rank (collective): rank 0 chooses it
    from the checkpoint's (``plan``) and cuts the run's metrics.jsonl back to the resumed step
    ([Note: one run in the monitor] in monitor_run.py)."""
    result: list = [None]
    if dist.get_rank() == 0:
        try:
            saved = plan.monitor if plan is not None else None
            start = plan.step if plan is not None else 0
            run, line = monitor_run.choose(spec.out_dir, saved, start, monitor_run.new_wandb_id())
            result[0] = (monitor_run.continue_metrics(run), line)
        except OSError as e:  # the run's directory unreadable or unwritable: every rank stops alike
            result[0] = HierConfigError("out_dir", spec.out_dir, f"cannot continue the run's monitor files: {e}")
    dist.broadcast_object_list(result, src=0)
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _gather_kernels(world: int) -> list:
    """Which quantization kernels each rank runs (collective): one digest all-reduce when every
    rank runs the same (the usual case); only otherwise are the names gathered, to rank 0, which
    reports them ([Note: a coordinator, not a world gather] in comm/_coordinator.py). A rank other
    than 0 returns its own name for every rank (it reports nothing)."""
    from ..comm import _coordinator as coordinator

    mine = kernel_info()
    if coordinator.same_everywhere(mine):
        return [mine] * world
    names = coordinator.gather_to_root(mine)
    return names if names is not None else [mine] * world


def _summary(run: Run, history: list[dict], elapsed: float, kernels: list) -> dict:
    """The run's summary (collective: every rank's peak memory is gathered to rank 0, which
    writes the report; another rank's summary holds its own figure only)."""
    from ..comm import _coordinator as coordinator

    own = int(peak_memory_bytes(run.engine.device))
    mem = coordinator.gather_to_root(own) or [own]
    return report.summary(
        run.spec,
        world=run.world,
        n_params=run.n_params,
        tokens_per_step=run.tokens_per_step,
        history=history,
        elapsed=elapsed,
        kernels=kernels,
        flops_per_token=run.flops_per_token,
        device_name=run.device_name,
        peak_tflops=run.peak_tflops,
        memory=mem,
        runtime=run.runtime,
        stats=zeropp_hier.comm_stats(run.engine) if run.hier else None,
    )


def rank_main(spec: JobSpec, hooks: Any = None) -> dict:
    """One rank of the job (torch.distributed already initialised). ``hooks`` (tests): an object
    whose ``loaded(engine)`` runs after a resume's load and ``saved(engine, step)`` after each
    save, on every rank; what they return is in the result's "hooks"."""
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = with_data_vocab(spec)  # the model's vocabulary: the data's, or refused if smaller
    if rank == 0:
        report.log_to_stdout()
    data_sha = _data_sha(spec)
    # before the model is built: a resume that cannot work costs nothing; another world converts
    plan = resume.plan(spec, world, data_sha) if spec.resume else None
    val = evaluate.val_loader(spec, rank, world)  # None without eval_every; a too small split costs nothing
    if val is not None:  # the same batches at every evaluation: their orders from the cache (collective)
        orders.start(val, 0, spec.eval_batches * world * spec.micro_batch, spec.data_cache_dir, rank)
    mrun, where = _monitor_run(spec, plan)  # one run in the monitor across the jobs of a chain
    monitor.begin_wandb(spec.monitor, mrun.dir, mrun.wandb_id)  # wandb.init (in the engine) reads its environment
    overrides: dict = {"checkpoint": {"load_universal": True}} if plan is not None and plan.universal else {}
    if mrun.dir != spec.out_dir:
        overrides |= monitor_run.ds_paths(monitor.ds_sections(spec.monitor, spec.out_dir), mrun)
    if plan is not None and spec.init_from is not None:  # the checkpoint's weights replace them: not read
        spec = replace(spec, init_from=None)
    run = Run(spec, overrides or None)
    rep = report.Reporter(spec, rank == 0, mrun.dir, append=mrun.continued)
    if where:
        rep.line(where)
    kernels = _gather_kernels(world)
    rep.lines(report.header_lines(spec, world, run.n_params, run.tokens_per_step, kernels, run.runtime))
    if rank == 0 and (ds_path := write_ds_config(spec.out_dir, run.config)):
        rep.line(f"DeepSpeed config: {ds_path}")  # what ran: the job's keys, the recipe's and the user's
    saves = _Checkpoints(spec, run, data_sha, hooks, mrun.state() if mrun.dir else None)
    start, loaded = _resume(run, plan, saves, rep) if plan is not None else (0, None)
    if rank == 0:  # DeepSpeed's TensorBoard and csv monitors continue the run's files
        monitor_run.continue_monitors(run.engine, mrun)
    history: list[dict] = []
    wandb_from = mrun.logged_to + 1 if mrun.continued else 0  # wandb refuses the steps it holds
    mon = monitor.StepMonitor(run.engine, spec.steps, spec.log_every, run.hier, wandb_from)

    def on_row(row: dict) -> None:
        mon.annotate(row)  # lr, grad norm, bytes per phase, ETA
        if val is not None and monitor.due(row["step"] + 1, spec.eval_every):
            row["val_loss"] = evaluate.val_loss(run.engine, val, spec.eval_batches)  # collective
            # the evaluation's gathers in its own count, not the next step's (which may find the
            # weights' kept copies already gathered by it)
            if run.hier:
                row["val_bytes"] = mon.recount()
                run.recount()
        history.append(row)
        mon.write(row)  # DeepSpeed's monitors, every log_every steps
        rep.step(row, report.step_line(row, run.hier, run.device_name))
        saves.after_step(row["step"] + 1, rep)

    t0 = time.perf_counter()
    try:
        run.train(spec.steps - start, start=start, on_row=on_row)
    except deadline.SavedInTime as stop:  # every rank saved at the same step: the run ends here
        rep.line(stop.line)
    elapsed = time.perf_counter() - t0
    rep.close()
    summary = _summary(run, history, elapsed, kernels)
    if rank == 0:
        plan_of_hops = run.runtime.plan if run.runtime is not None else None
        report.finish(rep, spec, summary, history, plan_of_hops, run.device_name)
    mon.close()  # the wandb run finished (its summary written) and its session ended
    run.release()
    losses = [row["loss"] for row in history]  # mean over ranks, one per step trained here
    out = {"first_loss": summary["first_loss"], "final_loss": summary["final_loss"], "losses": losses}
    out["val_losses"] = {row["step"]: row["val_loss"] for row in history if "val_loss" in row}
    if hooks is not None:
        out["hooks"] = {"loaded": loaded, "saved": saves.saved}
    return out
