"""The executor that runs a job's hop collectives in its issue mode ([Note: one issuing thread
on GPUs] in comm/issue.py): the lanes' or one lane's ``CommExecutor``, or the tick mode's
``TickExecutor``. Apart from comm/issue.py, which only decides the mode, so that the tick
executor, which asks issue.py which backend a tensor is on, does not import its chooser back."""

from __future__ import annotations

import torch

from .executor import CommExecutor
from .issue import IssueMode
from .tick import TickExecutor, TickTransport


def executor_for(
    mode: IssueMode,
    name: str,
    device: torch.device,
    timeout_s: float | None = None,
    transport: TickTransport | None = None,
) -> CommExecutor:
    """The executor that runs hop collectives in ``mode``; ``timeout_s`` bounds its waits
    ([Note: executor failure semantics] in comm/executor.py); ``transport``: the tick mode's
    (comm/tick/executor.py), required there."""
    if mode.ticks:
        if transport is None:
            raise ValueError("zeropp_hier internal: the tick mode needs a TickTransport")
        return TickExecutor(name, device, transport, timeout_s=timeout_s)

    return CommExecutor(
        name, device, overlap=mode.background, one_lane=mode.one_lane, serial=mode.serial, timeout_s=timeout_s
    )
