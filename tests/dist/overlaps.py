"""Which recorded communication calls were in flight at the same time on different communicators
(or on one communicator from different threads): the pure checker of the collective-overlap test
(tests/dist/test_collective_overlap.py; the recorder is tests/dist/call_recorder.py).

[Note: the overlap rule checked]
A GPU library allows one host thread to keep several collectives in flight on *one*
communicator (they run in issue order), but collectives of two communicators in flight at once
may deadlock on RCCL ([Note: one issuing thread on GPUs] in zeropp_hier/comm/issue.py), and one
communicator driven from two threads at once can reach the device in a different order on
different ranks. So two calls conflict when their ``[start, end]`` intervals overlap and they
are on different communicators, or on the same communicator from different threads. A call's
interval runs from when it was issued to when it was known complete (a blocking call's return,
or the return of the ``wait`` of its last work). A call whose end was never seen is refused
(``OpenCallError``): it may overlap anything after it, and reading it as short would hide that.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence


class Call(NamedTuple):
    start: float
    end: float | None  # None: never seen to complete (refused by ``conflicts``)
    comm: str  # the communicator (process group) it ran on
    thread: str  # the host thread that issued it
    op: str  # what it was (all_reduce, batch_isend_irecv, ...), for the report


class OpenCallError(ValueError):
    """A recorded call has no end, or ends before it starts: its overlaps cannot be judged."""


def check_calls(calls: Sequence[Call]) -> None:
    """Refuse calls whose interval is unknown or inverted, naming the first such call."""
    for i, c in enumerate(calls):
        if c.end is None:
            raise OpenCallError(
                f"call {i} ({c.op} on {c.comm!r} from thread {c.thread!r}, issued at {c.start:.6f}) was never "
                "seen to complete: wait for its work (or record the wait) before checking overlaps"
            )
        if c.end < c.start:
            raise OpenCallError(
                f"call {i} ({c.op} on {c.comm!r}) ends at {c.end:.6f}, before it starts at {c.start:.6f}"
            )


def conflicts(calls: Sequence[Call]) -> list[tuple[Call, Call]]:
    """Every pair of calls in flight at once on different communicators, or on one communicator
    from different threads ([Note: the overlap rule checked]); each pair (earlier start first).
    Touching ends (one ends exactly when the other starts) do not overlap. Pure; a sweep over the
    calls sorted by start: O(n log n + pairs)."""
    check_calls(calls)
    order = sorted(calls, key=lambda c: (c.start, c.end))
    out: list[tuple[Call, Call]] = []
    active: list[Call] = []  # calls started so far that may still be in flight
    for c in order:
        active = [a for a in active if a.end is not None and a.end > c.start]
        for a in active:
            if a.comm != c.comm or a.thread != c.thread:
                out.append((a, c))
        active.append(c)
    return out


def describe(pair: tuple[Call, Call]) -> str:
    a, b = pair
    return (
        f"{a.op} on {a.comm!r} from {a.thread!r} [{a.start:.6f}, {a.end:.6f}] overlaps "
        f"{b.op} on {b.comm!r} from {b.thread!r} [{b.start:.6f}, {b.end:.6f}]"
    )


__all__ = ["Call", "OpenCallError", "check_calls", "conflicts", "describe"]
