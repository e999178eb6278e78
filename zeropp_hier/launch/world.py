"""Run a function on a local world of CPU processes (gloo), for the demo and the tests.

``LocalWorld`` starts W processes once, initialises torch.distributed in each, and then runs
any number of tasks on all ranks, collecting one result per rank. Spawning W processes that
import DeepSpeed costs tens of seconds on a small machine, so a world is reused across tasks.

[Note: a failed world]
A task that raises on any rank, a rank that dies (killed, crashed), or a task that exceeds its
timeout fails the whole world loudly, never silently and never by hanging. A rank whose task
raised exits, as a training script would, so that peers blocked on it see its connections close.
The launcher then lets the other ranks fail and exit on their own (each reporting its own error,
e.g. a ``HierCommError`` naming the peer it waited on) for as long as some rank fails or exits
at least every ``failure_grace_s`` seconds; a rank that stays silent that long after the last
such event is stuck, and is terminated with whatever else is left. ``WorldError`` then carries
every rank's report, when each rank exited and which ranks had to be terminated. With the
default grace of 0 the launcher terminates everything at the first failure, after at most half a
second for exits already under way to show (a killed rank's peers may report the closed sockets
before its own exit status arrives; the rank that died is named either way).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import queue
import signal
import sys
import time
import traceback
import uuid
from datetime import timedelta
from typing import Any, Callable, Sequence, cast

from .deferred_compile import MUON_MODULE, import_deferring_compile
from .ports import free_port

# What a preloading world's fork server imports once ([Note: preloaded ranks]): torch, DeepSpeed,
# the Muon optimizer that DeepSpeed's ZeRO-3 optimizer imports when each rank builds its first
# engine (its functions compiled on first call: [Note: compile on first call]), and the main
# job's model class (transformers' GPT-NeoX). The fork server skips a module that this DeepSpeed
# lacks. A rank a launcher started imports the same itself (``import_frozen``), the model's only
# for a NeoX job.
RANK_MODULES = ("torch", "torch.distributed", "deepspeed", MUON_MODULE)
NEOX_MODULE = "transformers.models.gpt_neox.modeling_gpt_neox"
_PRELOAD = (*RANK_MODULES, NEOX_MODULE)


def _die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this process when its launcher exits."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux
        pass


def _worker(
    rank: int,
    world: int,
    port: int,
    tasks,
    results,
    env: dict,
    pg_timeout_s: float | None,
    gpus: int = 0,
    with_deepspeed: bool = True,
) -> None:
    _die_with_parent()
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        # ranks on GPUs use device rank % gpus: several ranks may share one (gloo accepts that)
        LOCAL_RANK=str(rank % gpus) if gpus else str(rank),
        LOCAL_SIZE=str(world),
    )
    import warnings

    # DeepSpeed calls torch.distributed functions that torch 2.13 marks deprecated, once per
    # collective: thousands of identical lines that would bury the training output.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    try:
        import torch

        torch.set_num_threads(1)
        if with_deepspeed:
            _start_deepspeed(rank, world, pg_timeout_s, gpus)
        else:  # a world for the layers under DeepSpeed: torch.distributed only
            import torch.distributed as dist

            timeout = None if pg_timeout_s is None else timedelta(seconds=pg_timeout_s)
            dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
        import gc

        gc.freeze()  # [Note: frozen start-up objects]
        results.put((rank, "ready", None))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        return
    _serve(rank, tasks, results)


# [Note: frozen start-up objects]
# A rank holds about half a million Python objects once torch, DeepSpeed and transformers are
# imported, and a full ``gc.collect()`` walks all of them: 1.8 s when the 8 ranks of a world on
# 2 cores collect together. DeepSpeed collects at every engine build (``defragment``) and
# ``training.release`` at every engine's end, so a 6-step run of a small model spent about as
# long collecting as training.
# The imports make no garbage worth collecting, so each rank freezes what exists once it is
# started (``gc.freeze``: later collections skip those objects; objects made afterwards are
# collected as before). Measured in a world of 8: engine build 2.6 -> 0.8 s, release 1.6 -> 0.0
# s, build + 6 steps + release 8.9 -> 5.1 s.
# A rank that a launcher started (srun, torchrun) has no fork server to import for it: once it has
# joined, it imports the same modules itself at once (``import_frozen``), with the collector off,
# since each collection the interpreter starts during them walks every object imported so far
# (torch, DeepSpeed, Muon and GPT-NeoX: 6.4-7.0 CPU-s with the collector on, 5.2-5.3 off), then
# collects once (they leave ~14,000 unreachable objects) and freezes what exists. Its exit then
# skips them too: the interpreter's last collection walked them all (1.4-1.6 CPU-s; 0.2 frozen).
# Measured, one rank of the main job (tiny model, 3 steps) as a process on a loaded 2-core
# machine: 12.1-12.3 -> 8.9-9.8 CPU-s. A preloading world's fork server imports the same way
# (``launch/preloaded.py``): the ranks it forks start frozen, and its own exit is quick.


def import_frozen(modules: Sequence[str]) -> None:
    """Import ``modules`` (one this install lacks is skipped, as the fork server skips it) with
    the collector off, collect once and freeze every object that exists ([Note: frozen start-up
    objects]): the start-up a preloaded world gives its ranks, for a rank a launcher started."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            try:
                import_deferring_compile(name)  # [Note: compile on first call]
            except ImportError:
                pass
    finally:
        if enabled:
            gc.enable()
    gc.collect()
    gc.freeze()


def _start_deepspeed(rank: int, world: int, pg_timeout_s: float | None, gpus: int) -> None:
    import deepspeed
    import torch
    from deepspeed.utils import logger

    logger.setLevel("ERROR")
    if gpus:
        # The group is created here, not by DeepSpeed: DeepSpeed binds the CUDA device to
        # the default group, and torch then builds every new_group by splitting it, which
        # gloo cannot do (AttributeError: perform_nocolor_split on the non-members).
        import torch.distributed as dist

        torch.cuda.set_device(rank % gpus)
        timeout = None if pg_timeout_s is None else timedelta(seconds=pg_timeout_s)
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    if pg_timeout_s is None:
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=pg_timeout_s))
    from .shm_hygiene import release_deepspeed_shm

    release_deepspeed_shm()  # [Note: DeepSpeed shm leak]


def _serve(rank: int, tasks, results) -> None:
    """Run tasks until told to stop; then leave the default group."""
    while True:
        item = tasks.get()
        if item is None:
            break
        fn, args, kwargs = item
        try:
            out = fn(*args, **kwargs)
            results.put((rank, "ok", out))
        except BaseException:
            results.put((rank, "error", traceback.format_exc()))
            # [Note: a failed world]: exit, as a script whose exception propagated would, so
            # that this rank's sockets close. At once, once the report is flushed: no
            # destroy_process_group (it can wait on the very peer that failed) and no
            # interpreter teardown (seconds of CPU on a loaded machine).
            results.close()
            results.join_thread()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
    try:
        import torch.distributed as dist

        dist.destroy_process_group()
    except Exception:
        pass


_SETTLE_S = 0.5  # after the first failure: how long exits already under way may take to show


class WorldError(RuntimeError):
    """A task failed on some rank. ``failures``: rank -> its traceback (or how it died);
    ``exit_after_s``: rank -> seconds from the first failure until its process ended on its
    own; ``killed``: ranks the launcher had to terminate."""

    def __init__(
        self, message: str, failures: dict | None = None, exit_after_s: dict | None = None, killed: list | None = None
    ):
        super().__init__(message)
        self.failures = failures or {}
        self.exit_after_s = exit_after_s or {}
        self.killed = killed or []


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"killed by signal {-code}"
        if -code == signal.SIGILL:  # [Note: the CPU floor] in detect/cpu_floor.py
            return (
                f"killed by {name}: an instruction this CPU lacks (is it below the floor the installed "
                "NumPy and torch need? run `python zeropp_hier/detect/cpu_floor.py` on it)"
            )
        return f"killed by {name}"
    return f"exit code {code}"


def _last_line(text: str) -> str:
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def preloading_context() -> Any:
    """multiprocessing's fork-server context whose server imports ``_PRELOAD`` once, frozen, for
    CPU processes ([Note: preloaded ranks]): the ranks of preloading worlds, and any other process
    to be started without importing them again. One server per process: its first start fixes its
    preload and its environment."""
    ctx = mp.get_context("forkserver")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read by the fork server's import
    ctx.set_forkserver_preload(["zeropp_hier.launch.preloaded"])  # _PRELOAD, frozen
    return ctx


class LocalWorld:
    """``pg_timeout_s``: timeout of the default process group (torch's default is 30 min);
    ``failure_grace_s``: after a failure, how long a quiet spell (no rank failing or exiting)
    ends the wait for the others to fail on their own ([Note: a failed world]); ``gpus``: 0 for
    CPU ranks, else the number of GPUs the ranks share (rank r uses device r % gpus);
    ``with_deepspeed``: False for ranks that never import DeepSpeed (the default group is
    torch's own gloo group), to run the layers under DeepSpeed by themselves; ``preload``: fork
    the ranks from a process that imported torch and DeepSpeed once ([Note: preloaded ranks])."""

    def __init__(
        self,
        world_size: int,
        timeout: float = 600.0,
        env: dict | None = None,
        pg_timeout_s: float | None = None,
        failure_grace_s: float = 0.0,
        gpus: int = 0,
        with_deepspeed: bool = True,
        preload: bool = False,
    ):
        self.world_size = world_size
        self.timeout = timeout
        self.failure_grace_s = failure_grace_s
        self._closed = False
        # [Note: preloaded ranks]
        # A spawned rank imports torch and DeepSpeed (and the job's model class) itself: several
        # seconds of CPU each, tens of seconds for a world of 8 on a small machine, paid again by
        # every world started after a failed one. ``preload`` forks the ranks instead from
        # multiprocessing's fork server, which imported them once (``_PRELOAD``), before any
        # thread, device or process group existed (so the fork copies no lock held by another
        # thread). What a fork server does not carry over is
        # the caller's environment at start: every rank applies the caller's whole ``os.environ``
        # first, as a spawned one inherits it. Only ``/proc/<pid>/environ`` still shows the fork
        # server's, so a preloaded rank's own entry there lacks the world's mark (``world_id``);
        # whatever the rank starts carries it. CPU ranks only: the fork server chose DeepSpeed's
        # accelerator when it imported it.
        preload = preload and not gpus and with_deepspeed
        # both have Process and Queue
        ctx: Any = preloading_context() if preload else mp.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        port = free_port()
        # Set before the children start: unpickling a task may import DeepSpeed before _worker
        # runs, and DeepSpeed picks its accelerator at import.
        # gpus > 0: DeepSpeed's CUDA accelerator, rank r on device r % gpus, still gloo (which
        # accepts CUDA tensors; NCCL refuses two ranks of one communicator on one device)
        accel = "cuda" if gpus else "cpu"
        os.environ.setdefault("DS_ACCELERATOR", accel)
        env = {"DS_ACCELERATOR": accel, "OMP_NUM_THREADS": "1", **(env or {})}
        if preload:
            env = {**os.environ, **env}
        # the world's mark (below): a forked rank's /proc/<pid>/environ is the fork server's, so
        # each rank sets the mark itself, and anything it starts inherits it
        self.world_id = uuid.uuid4().hex
        env["ZEROPP_HIER_WORLD_ID"] = self.world_id
        self.procs = [
            ctx.Process(
                target=_worker,
                args=(r, world_size, port, self.tasks[r], self.results, env, pg_timeout_s, gpus, with_deepspeed),
                daemon=True,
            )
            for r in range(world_size)
        ]
        # A mark in the children's initial environment (visible in /proc/<pid>/environ of spawned
        # ranks and of anything any rank starts) lets a caller prove that no process of this world
        # survives it (a preloaded rank itself: by ``pids``).
        # The resource tracker is started first so that it does not carry the mark.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        previous = os.environ.get("ZEROPP_HIER_WORLD_ID")
        os.environ["ZEROPP_HIER_WORLD_ID"] = self.world_id
        try:
            for p in self.procs:
                p.start()
        finally:
            if previous is None:
                del os.environ["ZEROPP_HIER_WORLD_ID"]
            else:
                os.environ["ZEROPP_HIER_WORLD_ID"] = previous
        self._collect("start-up")

    @property
    def pids(self) -> list[int]:
        return [cast(int, p.pid) for p in self.procs]  # started in __init__: each has its pid

    def _drain(self, answers: dict, failures: dict, wait: float) -> None:
        try:
            rank, status, payload = self.results.get(timeout=wait) if wait > 0 else self.results.get_nowait()
        except queue.Empty:
            return
        (failures if status == "error" else answers)[rank] = payload

    def _collect(self, what: str) -> list:
        world = self.world_size
        answers: dict[int, Any] = {}
        failures: dict[int, str] = {}
        exited: dict[int, float] = {}
        failed_at: dict[int, float] = {}
        start = time.monotonic()
        first_failure: float | None = None
        last_event = start  # of the last failure or exit (read only once there is a failure)
        while True:
            self._drain(answers, failures, 0.05)
            now = time.monotonic()
            for r, p in enumerate(self.procs):
                if r not in exited and p.exitcode is not None:
                    exited[r] = last_event = now
                    self._drain(answers, failures, 0.2)  # its last words may still be in the pipe
                    if r not in answers and r not in failures:
                        failures[r] = f"rank {r} died without reporting: {_describe_exit(p.exitcode)}"
            for r in failures:
                if r not in failed_at:
                    failed_at[r] = last_event = now
            if failures and first_failure is None:
                first_failure = now
            if not failures and len(answers) == world:
                return [answers[r] for r in range(world)]
            if failures:
                # wait while ranks keep failing or exiting; a rank silent for the whole grace
                # after the last such event is stuck and will be terminated
                if len(exited) == world or now - last_event >= self.failure_grace_s:
                    break
            elif now - start >= self.timeout:
                self.close(force=True)
                raise WorldError(
                    f"{what}: no answer from every rank within {self.timeout:.0f} s; ranks answered: {sorted(answers)}"
                )
        # A rank's death reaches us later than its peers' reports of the sockets it closed (a
        # forkserver child's exit status comes through the fork server): wait a moment for the
        # exits already under way, so that the rank that died is named, not only its peers.
        settle = time.monotonic() + _SETTLE_S
        while len(exited) < world and time.monotonic() < settle:
            self._drain(answers, failures, 0.02)
            for r, p in enumerate(self.procs):
                if r not in exited and p.exitcode is not None:
                    exited[r] = time.monotonic()
                    if r not in answers and r not in failures:
                        failures[r] = f"rank {r} died without reporting: {_describe_exit(p.exitcode)}"
        for _ in range(2 * world):  # reports that arrived while we decided
            self._drain(answers, failures, 0)
        for r in failures:
            failed_at.setdefault(r, time.monotonic())
        killed = [r for r in range(world) if r not in exited]
        # the others may be blocked in a collective with the failed rank: stop waiting
        self.close(force=True)
        assert first_failure is not None  # the loop above ends on a failure
        exit_after = {r: t - first_failure for r, t in exited.items()}
        first = min(failures, key=lambda r: (failed_at[r], r))
        summary = "\n".join(
            f"  rank {r}: {_last_line(failures.get(r, 'no report'))}"
            + (" [terminated by the launcher]" if r in killed else "")
            for r in range(world)
            if r in failures or r in killed
        )
        raise WorldError(
            f"{what} failed on rank {first}:\n{failures[first]}\nall ranks:\n{summary}", failures, exit_after, killed
        )

    @property
    def healthy(self) -> bool:
        """Every rank process is alive and the world was not closed: a failed task, a dead rank
        or a timeout closes the world ([Note: a failed world]), so it cannot run another task."""
        return not self._closed and all(p.is_alive() for p in self.procs)

    def run(self, fn: Callable, *args, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the per-rank results."""
        for q in self.tasks:
            q.put((fn, args, kwargs))
        return self._collect(getattr(fn, "__name__", "task"))

    def close(self, force: bool = False) -> None:
        self._closed = True
        if not force:
            for q in self.tasks:
                q.put(None)
            for p in self.procs:
                p.join(timeout=30)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(force=exc[0] is not None)


class SharedWorld:
    """A ``LocalWorld`` shared by many tasks (a test session's 8 ranks) that is rebuilt before a
    task whenever the previous world can no longer run one.

    Starting a world costs tens of seconds, so tests share one; but one test whose task failed,
    whose rank died or that timed out leaves a closed world behind ([Note: a failed world]), and
    every later user of it would fail for that reason alone. ``run`` therefore checks the world
    first and starts a fresh one (new processes, new port) if it is not healthy, so one failure
    stays one failure. ``rebuilds`` counts how often that happened."""

    def __init__(self, world_size: int, **kwargs):
        self.world_size = world_size
        self._kwargs = kwargs
        self._world: LocalWorld | None = None
        self.rebuilds = 0

    @property
    def world(self) -> LocalWorld:
        """The current world, started (again) if there is none or it is unhealthy."""
        if self._world is not None and not self._world.healthy:
            self._world.close(force=True)
            self._world = None
            self.rebuilds += 1
        if self._world is None:
            self._world = LocalWorld(self.world_size, **self._kwargs)
        return self._world

    @property
    def pids(self) -> list[int]:
        return self.world.pids

    def run(self, fn: Callable, *args, **kwargs) -> list:
        return self.world.run(fn, *args, **kwargs)

    def close(self) -> None:
        if self._world is not None:
            self._world.close(force=not self._world.healthy)
            self._world = None
