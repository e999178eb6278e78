"""A job of hop collectives: what it yields before each collective (``Move``), what its future
holds (``Done``), and how it is stepped and checked against the lanes it declared, on the caller
(``_run_inline``) or one collective at a time by a lane (``_advance``). The lanes, threads and
streams that run jobs are comm/executor.py's ([Note: one order of hop collectives] there; the tick
mode's in comm/tick/executor.py).
"""

from __future__ import annotations

from typing import Any, Generator, Generic, Hashable, NamedTuple, Sequence, TypeVar

import torch

from .busy import BusyLog
from .collectives import Wire


class Move(NamedTuple):
    """Yielded by a job before each collective: the hop group it is on, and the tensors the
    collective reads that were made elsewhere (recorded on the lane's stream on a GPU)."""

    lane: Hashable
    carry: Sequence[torch.Tensor] = ()


R = TypeVar("R")
# A job: before each collective it yields a ``Move``; under the tick executor it then yields the
# collective's transfer (``Wire``) and is sent the received rows back ([Note: collectives as
# steps] in comm/collectives.py). It returns its outputs (R).
Job = Generator[Move | Wire, torch.Tensor | None, R]


class JobOrderError(RuntimeError):
    """A job moved to a lane it did not declare: a bug in the job, reported instead of a hang."""


class Done(Generic[R]):
    """What a job's future holds: its outputs, and on a GPU the event after which they are ready
    (None on the CPU); ``result`` hands the outputs over."""

    __slots__ = ("value", "event")

    def __init__(self, value: R, event: torch.cuda.Event | None):
        self.value, self.event = value, event


class _End(NamedTuple):
    value: Any


def _advance(job: Job, lanes: Sequence[Hashable], issued: int, key=lambda lane: lane) -> Move | _End:
    """Run ``job`` to its next ``Move`` (after ``issued`` collectives), which must announce the
    lane it declared for that collective; or to its end, which must come after all of them."""
    try:
        move = next(job)
    except StopIteration as stop:
        if issued != len(lanes):
            raise JobOrderError(
                f"zeropp_hier internal: a job declared {len(lanes)} collectives on lanes {tuple(lanes)} "
                f"but issued {issued}"
            ) from None
        return _End(stop.value)
    if not isinstance(move, Move) or issued >= len(lanes) or lanes[issued] != key(move.lane):
        want = lanes[issued] if issued < len(lanes) else "nothing more"
        raise JobOrderError(
            f"zeropp_hier internal: a job declared lane {want!r} for its collective {issued} "
            f"(lanes {tuple(lanes)}) but moved to {getattr(move, 'lane', move)!r}"
        )
    return move


def _record_carry(move: Move, stream: Any) -> None:
    if stream is None:
        return
    for t in move.carry:
        if t.is_cuda:
            t.record_stream(stream)


def _run_inline(job: Job, lanes: Sequence[Hashable], busy: BusyLog | None = None) -> Any:
    """The whole job on the caller, with the same declaration checks."""
    issued, step = 0, _advance(job, lanes, 0)
    while isinstance(step, Move):
        begun = busy.start() if busy is not None else None
        issued += 1
        nxt = _advance(job, lanes, issued)
        if busy is not None and begun is not None:  # begun whenever busy
            busy.stop(begun, step.lane)
        step = nxt
    return step.value
