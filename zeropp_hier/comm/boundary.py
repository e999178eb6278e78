"""Nothing of ours in flight where the training thread issues a collective of its own.

[Note: quiet boundaries]
Hop collectives run on the executor's lanes ([Note: one order of hop collectives] in
executor.py); DeepSpeed, and a few of our own checks, issue collectives straight from the
training thread: the agreed non-finite check and DeepSpeed's gradient-norm all-reduce in the
optimizer step, the barriers, tag check and gathers of a checkpoint save and load. If a hop
collective were still queued or running then, two communicators would be in flight at once
(on ROCm/RCCL a possible deadlock, [Note: one issuing thread on GPUs] in issue.py), and a rank
whose lanes lag behind could pair collectives in another order than its peers. So at each such
boundary the engine calls ``quiesce``: it drains the executor (everything submitted so far
runs to its end), checks that nothing is left, and checks that no *other* executor in this
process has anything in flight.

One active engine per process: an engine is active while its executor has collectives queued
or running. Several engines may exist in one process (an evaluation engine beside the training
one, a sweep building one after another), but only one may be active at a time: every boundary
of one engine, and the start of each of its forward passes, refuses to go on while another
engine's executor has work in flight (``HierBoundaryError``, naming both), since the two
engines' collectives would then be in flight side by side in an order no peer agrees to.
The boundaries are ``HierEngine.step`` (at a gradient-accumulation boundary, before the
optimizer step), ``save_checkpoint`` and ``load_checkpoint`` (before their first collective).
"""

from __future__ import annotations

from .executor import CommExecutor, live_executors

# after ``drain`` returns, the last lanes' bookkeeping may lag the barrier's result by a moment
IDLE_SLACK_S = 5.0


class HierBoundaryError(RuntimeError):
    """Work of ours was still in flight at a boundary where the training thread issues a
    collective ([Note: quiet boundaries])."""


def others_in_flight(executor: CommExecutor) -> list[tuple[str, int]]:
    """(name, collectives in flight) of every other live executor of this process that has any
    (a broken one issues nothing more: [Note: executor failure semantics] in executor.py)."""
    return [
        (e.name, e.in_flight) for e in live_executors() if e is not executor and e.broken is None and e.in_flight > 0
    ]


def check_alone(executor: CommExecutor, what: str) -> None:
    """Refuse ``what`` while another engine's executor in this process has work in flight."""
    others = others_in_flight(executor)
    if others:
        raise HierBoundaryError(
            f"zeropp_hier: one active engine per process: {what} of the engine with executor "
            f"{executor.name!r} while executor(s) {others} (name, collectives in flight) of another engine "
            "still run collectives; their collectives would be in flight beside this engine's. Finish "
            "(or destroy) the other engine's forward/backward/step before using this one."
        )


def quiesce(executor: CommExecutor, what: str) -> int:
    """Drain ``executor`` and check that nothing of ours is in flight before ``what`` issues its
    collectives ([Note: quiet boundaries]); returns how many collectives were in flight on entry."""
    check_alone(executor, what)
    if executor.broken is not None:
        # it issues nothing more ([Note: executor failure semantics] in executor.py); the failure
        # surfaces where it did before, and a drain would only raise ExecutorBrokenError here
        return 0
    pending = executor.in_flight
    if pending:  # a barrier job through every lane: what was queued before it has run
        executor.drain()
    left = executor.wait_idle(IDLE_SLACK_S)
    if left:
        raise HierBoundaryError(
            f"zeropp_hier internal: executor {executor.name!r} still has {left} collective(s) in flight "
            f"after draining it before {what}"
        )
    return pending
