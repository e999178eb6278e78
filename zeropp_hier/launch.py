"""Run a function on a local world of CPU processes (gloo), for the demo and the tests.

``LocalWorld`` starts W processes once, initialises torch.distributed in each, and then runs
any number of tasks on all ranks, collecting one result per rank. Spawning W processes that
import DeepSpeed costs tens of seconds on a small machine, so a world is reused across tasks.
A task that raises on any rank, or exceeds its timeout, fails the whole world loudly: the
remaining ranks are terminated, never left hanging.
"""
from __future__ import annotations

import ctypes
import os
import queue
import signal
import socket
import traceback
from typing import Any, Callable

import multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this process when its launcher exits."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux
        pass


def _worker(rank: int, world: int, port: int, tasks, results, env: dict) -> None:
    _die_with_parent()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_SIZE=str(world))
    import warnings
    # DeepSpeed calls torch.distributed functions that torch 2.13 marks deprecated, once per
    # collective: thousands of identical lines that would bury the training output.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    try:
        import torch
        torch.set_num_threads(1)
        import deepspeed
        from deepspeed.utils import logger
        logger.setLevel("ERROR")
        deepspeed.init_distributed(dist_backend="gloo")
        from .shm_hygiene import release_deepspeed_shm
        release_deepspeed_shm()  # [Note: DeepSpeed shm leak]
        results.put((rank, "ready", None))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        return
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
    try:
        import torch.distributed as dist
        dist.destroy_process_group()
    except Exception:
        pass


class WorldError(RuntimeError):
    pass


class LocalWorld:
    def __init__(self, world_size: int, timeout: float = 600.0, env: dict | None = None):
        self.world_size = world_size
        self.timeout = timeout
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        port = free_port()
        # Set before the children start: unpickling a task may import DeepSpeed before _worker
        # runs, and DeepSpeed picks its accelerator at import.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", **(env or {})}
        self.procs = [ctx.Process(target=_worker, args=(r, world_size, port, self.tasks[r],
                                                        self.results, env), daemon=True)
                      for r in range(world_size)]
        for p in self.procs:
            p.start()
        self._collect("start-up")

    def _collect(self, what: str) -> list:
        out: list[Any] = [None] * self.world_size
        errors = {}
        for _ in range(self.world_size):
            try:
                rank, status, payload = self.results.get(timeout=self.timeout)
            except queue.Empty:
                self.close(force=True)
                raise WorldError(f"{what}: no answer from every rank within {self.timeout:.0f} s; "
                                 f"ranks answered: {[r for r in range(self.world_size) if out[r] is not None]}")
            if status == "error":
                errors[rank] = payload
                # the others may be blocked in a collective with the failed rank: stop waiting
                self.close(force=True)
                raise WorldError(f"{what} failed on rank {rank}:\n{payload}")
            out[rank] = payload
        return out

    def run(self, fn: Callable, *args, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the per-rank results."""
        for q in self.tasks:
            q.put((fn, args, kwargs))
        return self._collect(getattr(fn, "__name__", "task"))

    def close(self, force: bool = False) -> None:
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
