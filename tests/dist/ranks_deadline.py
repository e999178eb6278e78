"""Functions the deadline-agreement tests run on every rank of a real gloo world (no DeepSpeed):
each rank runs "steps" and asks ``Deadline.check`` at every boundary; the tests assert that all
ranks stop at the same step. The signal is a real SIGUSR1 delivered to one rank's process; the
clock case gives one rank an allocation end that is near (its own clock), the others none."""

from __future__ import annotations

import os
import signal
import threading
import time

import torch.distributed as dist

from zeropp_hier.app.longrun import deadline as dl

MAX_STEPS = 50


def stop_on_a_signal_to_one_rank(victim: int, signal_step: int, mid_step: bool) -> dict:
    """``victim`` gets SIGUSR1 during step ``signal_step`` (from another thread while the step
    runs when ``mid_step``, else from itself at the step's start); returns the step after which
    this rank stopped and what it saw itself."""
    rank = dist.get_rank()
    flag = dl.watch_signal(signal.SIGUSR1)
    d = dl.Deadline(dl.AllocationEnd(None, "no end: the signal alone"), dl.SaveEstimate(0.0), flag=flag)
    try:
        for step in range(MAX_STEPS):
            if rank == victim and step == signal_step:
                if mid_step:
                    threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1)).start()
                else:
                    os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.2)  # the step's work; a signal arriving now is read at the boundary
            mine = flag.received
            decision = d.check()
            if decision.stop:
                return {
                    "stopped_after": step,
                    "own_signal": mine,
                    "why": decision.why(),
                    "by_signal": decision.by_signal,
                    "by_clock": decision.by_clock,
                }
        return {"stopped_after": None, "own_signal": flag.received}
    finally:
        dl.unwatch_signal(flag)


class _StepClock:
    """A clock that advances ``step_s`` per call: the one rank whose allocation ends soon."""

    def __init__(self, step_s: float):
        self.t, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.t += self.step_s
        return self.t


def stop_on_one_ranks_clock(near: int, end_s: float) -> dict:
    """Rank ``near`` sees its allocation end at ``end_s`` (100 s per step on its clock, save 0 s,
    margin 60 s); the others see no end. Every rank must stop where ``near`` decides to."""
    rank = dist.get_rank()
    if rank == near:
        d = dl.Deadline(dl.AllocationEnd(end_s, "test"), dl.SaveEstimate(0.0), clock=_StepClock(100.0))
    else:
        d = dl.Deadline(dl.AllocationEnd(None, "none"), dl.SaveEstimate(0.0))
    for step in range(MAX_STEPS):
        decision = d.check()
        if decision.stop:
            return {"stopped_after": step, "by_signal": decision.by_signal, "by_clock": decision.by_clock}
    return {"stopped_after": None}
