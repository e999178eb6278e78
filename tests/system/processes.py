"""Running several processes at once, each writing to files of its own, and waiting for them only
as long as the result is open.

A job's processes are a group: once one of them exits with an error the job has failed, so the
rest of its group is ended at once instead of being waited for (they would sit in a rendezvous or
a collective with the dead one until some timeout). Processes of other groups run on."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable, NamedTuple

ROOT = Path(__file__).resolve().parents[2]


def cpu_env(**extra) -> dict:
    """This process's environment for a CPU rank of this checkout: none of our own rank
    variables, one thread, DeepSpeed's CPU accelerator, no forced kernel variant."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT), **extra)
    env.pop("ZEROPP_HIER_CPU_ISA", None)
    return env


def rank_env(rank: int, world: int, port: int, **extra) -> dict:
    """``cpu_env`` for rank ``rank`` of ``world`` ranks on this host, torchrun-style."""
    return cpu_env(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **extra,
    )


class Run(NamedTuple):
    returncode: int | None  # None: ended by the waiter (its group failed, or the deadline passed)
    out: str  # stdout and stderr
    stdout: str
    seconds: float  # from start until it exited (or was ended)
    ended_because: str  # "" when it exited on its own


@dataclass
class _Proc:
    proc: subprocess.Popen
    group: Hashable
    out: object
    err: object
    start: float
    end: float | None = None
    ended_because: str = ""


def run_all(cmds: dict, logs: Path, deadline_s: float, cwd: Path, clean=lambda s: s) -> dict:
    """``cmds``: key -> (argv, env, group). Start all, then wait: a process that exits with an
    error ends the others of its group; everything still running at ``deadline_s`` is killed.
    Returns key -> ``Run``."""
    procs: dict = {}
    try:
        for key, (argv, env, group) in cmds.items():
            name = "-".join(map(str, key if isinstance(key, tuple) else (key,)))
            out, err = (open(logs / f"{name}.{ext}", "w+") for ext in ("out", "err"))
            p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
            procs[key] = _Proc(p, group, out, err, time.monotonic())
        deadline = time.monotonic() + deadline_s
        while any(s.end is None for s in procs.values()):
            now = time.monotonic()
            for key, s in procs.items():
                if s.end is None and s.proc.poll() is not None:
                    s.end = now
                    if s.proc.returncode != 0 and not s.ended_because:
                        for other in procs.values():
                            if other.group == s.group and other.end is None and other.proc.poll() is None:
                                other.ended_because = f"{key} failed first (exit {s.proc.returncode})"
                                other.proc.kill()
            if now >= deadline:
                for s in procs.values():
                    if s.end is None and s.proc.poll() is None:
                        s.ended_because = f"still running at the fixture's deadline ({deadline_s:.0f} s)"
                        s.proc.kill()
            time.sleep(0.2)
        runs = {}
        for key, s in procs.items():
            s.out.seek(0)
            s.err.seek(0)
            stdout = s.out.read()
            code = s.proc.returncode
            killed = s.ended_because and code == -signal.SIGKILL
            assert s.end is not None
            runs[key] = Run(
                None if killed else code, clean(stdout + s.err.read()), stdout, s.end - s.start, s.ended_because
            )
        return runs
    finally:
        for s in procs.values():
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()
            s.out.close()
            s.err.close()
