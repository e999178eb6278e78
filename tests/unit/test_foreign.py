"""The drain before a foreign collective ([Note: foreign collectives] in comm/foreign.py), with
a real executor whose job stands in for a gather by waiting on an event (no process group): a
call from the training thread waits for work in flight; a call from a lane does not wait for
itself. The 8-rank test with real collectives is tests/dist/test_collective_overlap.py."""

import threading

import torch
import torch.distributed as dist

from zeropp_hier.comm import foreign
from zeropp_hier.comm.executor import CommExecutor, Move

CPU = torch.device("cpu")
WAIT_S = 20.0


def test_install_wraps_torch_distributed_once():
    foreign.install()
    wrapped = dist.all_reduce
    assert getattr(wrapped, "zeropp_guarded", None) == "all_reduce"
    assert (
        foreign.REAL["all_reduce"] is not wrapped
        and getattr(foreign.REAL["all_reduce"], "zeropp_guarded", None) is None
    )
    foreign.install()  # a second engine: nothing wrapped twice
    assert dist.all_reduce is wrapped and dist.distributed_c10d.all_reduce is wrapped


def test_a_call_from_the_training_thread_waits_for_work_in_flight():
    ex = CommExecutor("foreign-test", CPU, one_lane=True)
    gate, order = threading.Event(), []

    def gather():
        yield Move("node")
        if not gate.wait(WAIT_S):
            raise AssertionError("the gate was never opened")
        order.append("gather done")
        return "full"

    fut = ex.submit(gather(), ["node"])
    queued = ex.in_flight

    def open_when_drained():  # the drain's barrier job raises in_flight past the gather's one slot
        for _ in range(int(WAIT_S / 0.001)):
            if ex.in_flight > queued:
                order.append("drain began")
                gate.set()
                return
            threading.Event().wait(0.001)
        gate.set()

    watcher = threading.Thread(target=open_when_drained, daemon=True)
    watcher.start()
    before = dict(foreign.counts)
    try:
        foreign.drain_for("all_reduce")
        order.append("collective")
        assert order == ["drain began", "gather done", "collective"]
        assert ex.in_flight == 0 and ex.result(fut, WAIT_S) == "full"
        assert foreign.counts["drains"] == before["drains"] + 1
        assert foreign.counts["collectives"] == before["collectives"] + queued
    finally:
        gate.set()
        watcher.join(WAIT_S)
        ex.close()


def test_a_call_from_a_lane_does_not_wait_for_its_own_work():
    ex = CommExecutor("foreign-lane", CPU, one_lane=True)

    def job():
        yield Move("node")
        foreign.drain_for("batch_isend_irecv")  # the lane's own transfer: a drain here would never end
        return "sent"

    try:
        assert ex.result(ex.submit(job(), ["node"]), WAIT_S) == "sent"
    finally:
        ex.close()
