"""Run one process per rank inside the emulated cluster, and always tear it down.

``Cluster`` is a context manager: it builds the namespaces on entry and removes them on exit —
after normal completion, an exception, Ctrl-C, SIGTERM or SIGHUP (the handlers turn those
signals into an exception so the ``finally`` path runs). Ranks are started with
``ip netns exec <ns> python ...`` and asked to die with their launcher (PR_SET_PDEATHSIG), so a
driver killed with SIGKILL, which no handler can catch, leaves no rank running; the namespaces
such a driver leaves are removed by ``python -m benchmarks.cluster teardown`` or the next setup.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Sequence

from . import netns
from .spec import ClusterSpec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Interrupted(BaseException):
    """Raised from a signal handler so that ``finally`` blocks (teardown) run."""


def _raise_interrupted(signum, _frame):
    raise Interrupted(f"signal {signal.Signals(signum).name}")


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, kept across exec of ip/python
    os.setpgrp()  # own process group: a terminal's Ctrl-C goes to the driver, which tears down


def rank_env(spec: ClusterSpec, rank: int, port: int, extra: dict | None = None) -> dict:
    p = spec.place(rank)
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(spec.world_size),
        LOCAL_RANK=str(p.local_rank),
        LOCAL_SIZE=str(spec.gcds_per_gpu),
        MASTER_ADDR=spec.master_address,
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME=p.ifname,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra or {})
    return env


def launch(
    spec: ClusterSpec,
    argv: Sequence[str],
    port: int = 29511,
    extra_env: dict | None = None,
    stdin=None,
    stdout=None,
    stderr=None,
) -> list[subprocess.Popen]:
    """Start ``python argv...`` once per rank in its package namespace."""
    procs = []
    for rank in range(spec.world_size):
        cmd = ["ip", "netns", "exec", spec.place(rank).namespace, sys.executable, *argv]
        procs.append(
            subprocess.Popen(
                cmd,
                env=rank_env(spec, rank, port, extra_env),
                cwd=REPO,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                preexec_fn=_die_with_parent,
                text=True,
            )
        )
    return procs


class Cluster:
    """``with Cluster(spec) as c:`` — the cluster exists inside the block and nowhere after."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self._old = {}
        self.left: dict | None = None

    def __enter__(self) -> Cluster:
        netns.require_root()
        for s in self.SIGNALS:
            self._old[s] = signal.signal(s, _raise_interrupted)
        try:
            netns.setup(self.spec)
        except BaseException:
            self._restore()
            raise
        return self

    def _restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    def __exit__(self, *exc) -> None:
        # a second signal during teardown must not abort it half-way
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        try:
            self.left = netns.teardown(self.spec.prefix)
        finally:
            self._restore()
        if any(self.left.values()):
            print(f"WARNING: teardown left {self.left}", file=sys.stderr)
