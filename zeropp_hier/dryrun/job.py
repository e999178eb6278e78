"""The job's dry run: one rank of ``zeropp-hier train`` at any size, in this process
(``zeropp-hier train ... dryrun.nodes=N [dryrun.rank=R]``).

It runs the job's own pieces in the job's order (``app/run.py``: the data, ``Run`` with its
engine from ``zeropp_hier.initialize``, the kernels' gather, the checkpoints' saver, steps through
``Run.train``, a save through the job's saver, then ``resume.plan`` and ``resume.load`` of that
save into the same engine), on the fake process group with the mirror in place, and measures each
phase (``meters.Meters``). Reporting, monitors and the summary's gathers are left out (they do not
change what a step or a save costs a rank).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from typing import Any, Iterator

from ..app.spec import JobSpec
from .meters import Meters
from .mirror import Mirror
from .world import DryWorld, flush_subnormals, init_fake_world, keep_subnormals


class _Lines:
    """Stands in for the job's ``report.Reporter`` where the saver writes its line."""

    def __init__(self) -> None:
        self.out: list[str] = []

    def line(self, text: str) -> None:
        self.out.append(text)


def _instrument(engine: Any, meters: Meters) -> None:
    """Host seconds by part of each step: forward, backward, optimizer step (instance attributes:
    ``nn.Module.__call__`` reads ``self.forward``)."""
    for part in ("forward", "backward", "step"):
        setattr(engine, part, meters.timed(part, getattr(engine, part)))


def _profiled(fn: Any) -> tuple[Any, str]:
    """``fn()`` under cProfile (this thread); its result and the top 15 functions by own time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    out = prof.runcall(fn)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    return out, text.getvalue()


@contextlib.contextmanager
def _manifest_problems_kept(into: list) -> Iterator[None]:
    """The load's manifest check runs in full (its file operations are counted), but what it
    finds is kept instead of raised: a mirrored save's manifest records rank 0's files and the
    sums the mirror hands back for the other ranks' pieces ([Note: the SPMD mirror], [Note: a
    manifest in pieces]), which a check may find wanting."""
    from ..deepspeed.checkpoint import atomic, shares

    real = atomic.raise_problems, shares.raise_problems
    atomic.raise_problems = shares.raise_problems = lambda problems, *a, **k: into.extend(problems)
    try:
        yield
    finally:
        atomic.raise_problems, shares.raise_problems = real


def dry_run_job(
    spec: JobSpec,
    world: DryWorld,
    steps: int = 2,
    save: bool = True,
    load: bool = True,
    trace_memory: bool = True,
    profile: bool = False,
) -> dict[str, Any]:
    """Run rank ``world.rank`` of ``spec`` on ``world``: start-up, ``steps`` steps, a save and a
    load. Returns the report (``report.build``'s dict). ``profile``: the last step under
    cProfile, its top 15 functions by own time in the report."""
    from . import report

    t_start = time.perf_counter()
    world.check()
    out_dir = spec.out_dir or os.path.abspath("dryrun")
    ckpt = spec.checkpoint_dir or os.path.join(out_dir, "checkpoints")
    spec = replace(
        spec,
        steps=steps,
        topology=world.topology(),
        local_world=world.world_size,
        out_dir=out_dir,
        checkpoint_dir=ckpt,
        save_every=steps if save else 0,
        resume=None,
        progress="off",
        eval_every=0,
    )
    meters = Meters(trace_memory=trace_memory)
    mirror = Mirror(meters)
    with meters:
        meters.begin("process_group")
        init_fake_world(world)
        mirror.install()
        flushed = flush_subnormals()
        try:
            result = _phases(spec, world, steps, save, load, meters, profile)
        finally:
            if flushed:
                keep_subnormals()
            meters.end()
            mirror.uninstall()
        result["subnormals_flushed"] = flushed
        memory = meters.memory()
        import torch.distributed as dist

        dist.destroy_process_group()  # another dry run may follow in this process
    return report.build(spec, world, meters, memory, result, time.perf_counter() - t_start)


def _phases(spec: JobSpec, world: DryWorld, steps: int, save: bool, load: bool, meters: Meters, profile: bool) -> dict:
    import torch.distributed as dist

    from ..app import launch, memory_check, run
    from ..app.job_vocab import with_data_vocab
    from ..app.longrun import resume
    from . import holdings

    meters.begin("plan_and_memory_table")
    spec.check()
    spec = with_data_vocab(spec)
    # as the job checks: against the GPU's memory where the engine will be on one, else the CPU's
    gpus = launch.visible_gpus()
    name, total = launch.gpu_memory(gpus)
    launch.memory_lines(spec, world.env(), gpus)  # refuses a layout that cannot fit, as the job does
    planned = memory_check.parts(spec, world.world_size, world.per_node, name, total)  # the same table, as data
    meters.begin("data")  # the hash (rank 0), the loader and its orders' cache (rank 0 builds it)
    data_sha = run._data_sha(spec)
    loader = run.open_data(spec, world.rank, world.world_size, spec.grad_accum)
    meters.begin("engine")
    job = run.Run(spec, data=loader)
    meters.begin("job_start")
    kernels = run._gather_kernels(world.world_size)
    saves = run._Checkpoints(spec, job, data_sha, None)
    _instrument(job.engine, meters)
    gathered = holdings.GatheredPeak(job.engine.module)
    losses: list[float] = []
    top: str | None = None
    for k in range(steps):
        meters.begin(f"step{k}")
        if profile and k == steps - 1:
            rows, top = _profiled(lambda: job.train(1, start=k))
        else:
            rows = job.train(1, start=k)
        losses.append(rows[-1]["loss"])
    gathered.close()
    held = holdings.held(job.engine, gathered.peak)  # after the steps: Adam's moments exist
    lines = _Lines()
    if save:
        meters.begin("save")
        assert spec.ckpt_dir is not None
        saves.save(spec.ckpt_dir, steps, lines)  # type: ignore[arg-type]
    loaded_step = None
    problems: list = []
    if save and load:
        meters.begin("load")
        again = replace(spec, resume="latest", steps=steps + 1)
        plan = resume.plan(again, world.world_size, data_sha)
        with _manifest_problems_kept(problems):
            loaded_step = int(resume.load(job.engine, plan)["step"])
    meters.begin("release")
    runtime = job.runtime
    facts = {
        "params": job.n_params,
        "losses": losses,
        "loaded_step": loaded_step,
        "kernels": kernels[0] if kernels else None,
        "executor": type(runtime.executor).__name__ if runtime is not None else None,
        "save_lines": lines.out,
        "data_orders_seconds": None if loader is None else round(loader.start_seconds, 4),
        "profile_top15": top,
        # the manifest lists rank 0's files and the other ranks' pieces as the mirror sums them
        # (rank 0 has no piece: none); what the load's check finds is counted here
        "manifest_problems_from_the_mirror": len(problems),
        "engine_memory": held,
        "planner_memory": planned,
    }
    job.release()
    dist.barrier()
    return facts


__all__ = ["dry_run_job"]
