"""Quiet boundaries on the executor alone ([Note: quiet boundaries] in comm/boundary.py): jobs
that stand in for collectives by waiting on events (the real gathers are in
tests/dist/test_boundary_drain.py)."""

import threading

import pytest
import torch

from zeropp_hier.comm.boundary import HierBoundaryError, check_alone, quiesce
from zeropp_hier.comm.executor import CommExecutor
from zeropp_hier.comm.job import Move

CPU = torch.device("cpu")
WAIT_S = 20.0


def _held(ex: CommExecutor, gate: threading.Event, lane: str = "node"):
    def job():
        yield Move(lane)
        if not gate.wait(WAIT_S):
            raise AssertionError("never released")
        return "done"

    return ex.submit(job(), [lane])


def test_quiesce_waits_for_queued_work_and_leaves_nothing_in_flight():
    ex = CommExecutor("a", CPU)
    gate = threading.Event()
    fut = _held(ex, gate)
    assert ex.in_flight == 1
    threading.Timer(0.2, gate.set).start()  # released while quiesce waits
    assert quiesce(ex, "a test boundary") == 1
    assert fut.done() and ex.in_flight == 0
    assert ex.result(fut) == "done"
    assert quiesce(ex, "a test boundary") == 0  # nothing in flight: returns at once
    ex.close()


def test_a_second_engine_with_work_in_flight_is_refused_at_the_first_ones_boundary():
    first, second = CommExecutor("engine-1", CPU), CommExecutor("engine-2", CPU)
    gate = threading.Event()
    fut = _held(first, gate)
    try:
        with pytest.raises(HierBoundaryError, match="one active engine per process") as e:
            quiesce(second, "the optimizer step")
        assert "engine-1" in str(e.value) and "the optimizer step" in str(e.value)
        with pytest.raises(HierBoundaryError, match="engine-1"):
            check_alone(second, "a forward pass")
    finally:
        gate.set()
    first.result(fut)
    assert first.wait_idle(WAIT_S) == 0
    check_alone(second, "a forward pass")  # idle now: both may exist, one at a time active
    first.close()
    check_alone(second, "a forward pass")  # a closed executor is not live
    second.close()


def test_inline_executor_has_nothing_in_flight():
    ex = CommExecutor("inline", CPU, overlap=False)

    def job():
        yield Move("node")
        return 1

    assert ex.result(ex.submit(job(), ["node"])) == 1
    assert ex.in_flight == 0 and quiesce(ex, "x") == 0
    ex.close()
