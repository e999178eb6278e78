"""The tick mode ([Note: ticks] in comm/tick/plan.py): pieces of work advance hop by hop in
ticks, each tick one grouped point-to-point call on one communicator.

- ``plan``: the schedule, pure (which hop of which chunk runs in which tick, what each rank
  sends and receives there);
- ``agree``: the start-up agreement on the schedule's inputs ([Note: tick agreement]);
- ``connect``: the start-up warm-up of every tick peer's connection ([Note: connections before
  the first step]);
- ``executor``: the side effects, the executor and the transport that run the schedule.

The names the runtime and the benchmarks use are exported here; a test that replaces a function
replaces it in its module (``connect.connect_peers``, ``executor.record_carry``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Lazy: ``plan`` is pure and the planner reads it before any rank exists (without torch); the
# other modules import torch, so their names load on first use.
_WHERE = {
    "TickScheduleError": "agree",
    "agree_schedule": "agree",
    "TickConnectError": "connect",
    "LocalTickTransport": "executor",
    "TickExecutor": "executor",
    "TickTransport": "executor",
    "plan_pieces": "executor",
    "tick_job": "executor",
}

if TYPE_CHECKING:
    from .agree import TickScheduleError, agree_schedule
    from .connect import TickConnectError
    from .executor import LocalTickTransport, TickExecutor, TickTransport, plan_pieces, tick_job


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "LocalTickTransport",
    "TickConnectError",
    "TickExecutor",
    "TickScheduleError",
    "TickTransport",
    "agree_schedule",
    "plan_pieces",
    "tick_job",
]
