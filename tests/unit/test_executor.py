"""The executor's lanes ([Note: one order of hop collectives] in comm/executor.py), with jobs that
stand in for collectives by waiting on events: every wait has a timeout, so a lane that
serializes what should overlap, or a lost slot, fails the test instead of hanging it."""

import sys
import threading

import pytest
import torch

from zeropp_hier.comm.executor import (
    CommExecutor,
    ExecutorBrokenError,
    ExecutorTimeoutError,
)
from zeropp_hier.comm.job import JobOrderError, Move

CPU = torch.device("cpu")
WAIT_S = 20.0


def _ex(overlap: bool = True) -> CommExecutor:
    return CommExecutor("test", CPU, overlap=overlap)


def test_hops_of_different_jobs_run_side_by_side():
    """Job A's node hop cannot finish until job B's gcd hop has run: that only happens if B's gcd
    hop runs while A still holds the node lane (one queue for everything would deadlock here)."""
    ex = _ex()
    a_on_node, b_ran = threading.Event(), threading.Event()

    def a():
        yield Move("gcd")
        yield Move("node")
        a_on_node.set()
        if not b_ran.wait(WAIT_S):
            raise AssertionError("B's gcd hop did not run beside A's node hop")
        return "a"

    def b():
        yield Move("gcd")
        if not a_on_node.wait(WAIT_S):
            raise AssertionError("A never reached its node hop")
        b_ran.set()
        return "b"

    fa, fb = ex.submit(a(), ["gcd", "node"]), ex.submit(b(), ["gcd"])
    assert (ex.result(fa), ex.result(fb)) == ("a", "b")
    assert ex.max_lanes_busy >= 2
    ex.close()


def test_each_lane_keeps_submission_order_even_when_a_later_job_is_ready_first():
    """B is ready for the gcd lane at once, A only after its slow node hop; the gcd lane must
    still run A's collective first (every rank issues a group's collectives in one order)."""
    ex = _ex()
    order: list[str] = []
    release = threading.Event()

    def a():
        yield Move("node")
        release.wait(WAIT_S)
        yield Move("gcd")
        order.append("a")

    def b():
        yield Move("gcd")
        order.append("b")

    fa, fb = ex.submit(a(), ["node", "gcd"]), ex.submit(b(), ["gcd"])
    assert not fb.done()  # B waits behind A's gcd slot, though A is still on the node lane
    release.set()
    ex.result(fa), ex.result(fb)
    assert order == ["a", "b"]
    ex.close()


def test_a_job_that_breaks_its_declaration_fails_with_a_named_error_and_breaks_the_executor():
    ex = _ex()

    def wrong():
        yield Move("gpu")  # declared node
        return 1

    def short():
        yield Move("node")  # declared node then gcd: one collective missing
        return 2

    with pytest.raises(JobOrderError, match="declared lane 'node'.*moved to 'gpu'"):
        ex.result(ex.submit(wrong(), ["node"]))
    with pytest.raises(ExecutorBrokenError):  # the lanes' order is no longer known: nothing more runs
        ex.submit(short(), ["node", "gcd"])
    ex2 = _ex()
    with pytest.raises(JobOrderError, match="declared 2 collectives"):
        ex2.result(ex2.submit(short(), ["node", "gcd"]))
    assert not ex.close() and not ex2.close()


def test_after_a_failed_collective_no_further_collective_is_issued():
    """An injected failure in job 1's node hop: job 1's later hop, job 2 (queued before the
    failure) and job 3 (submitted after) issue nothing; jobs 2 and 3 fail at once with
    ExecutorBrokenError chained to the original error."""
    ex = _ex()
    issued: list[str] = []
    node_started, release = threading.Event(), threading.Event()

    def boom():
        yield Move("node")
        node_started.set()
        release.wait(WAIT_S)
        raise ValueError("peer died (injected)")
        yield Move("gcd")  # declared, never reached
        issued.append("boom gcd")

    def later(name, lane):
        yield Move(lane)
        issued.append(name)
        return name

    f1 = ex.submit(boom(), ["node", "gcd"])
    f2 = ex.submit(later("two", "gcd"), ["gcd"])  # queued behind job 1's gcd slot
    assert node_started.wait(WAIT_S)
    release.set()
    with pytest.raises(ValueError, match="peer died"):
        ex.result(f1)
    with pytest.raises(ExecutorBrokenError, match="earlier collective job failed.*peer died") as e2:
        ex.result(f2)
    assert isinstance(e2.value.__cause__, ValueError)
    with pytest.raises(ExecutorBrokenError, match="peer died") as e3:
        ex.submit(later("three", "node"), ["node"])
    assert e3.value.__cause__ is e2.value.__cause__  # the original error, chained
    assert issued == [] and isinstance(ex.broken, ValueError)
    assert not ex.close()


def test_a_failure_inline_breaks_the_executor_too():
    ex = _ex(overlap=False)

    def boom():
        yield Move("node")
        raise ValueError("inline failure")

    def fine():
        yield Move("node")
        return 1

    with pytest.raises(ValueError, match="inline failure"):
        ex.result(ex.submit(boom(), ["node"]))
    with pytest.raises(ExecutorBrokenError, match="inline failure"):
        ex.submit(fine(), ["node"])


def test_result_waits_at_most_its_bound_then_breaks_the_executor():
    """A lane stuck outside any collective timeout: result() gives up after its bound (here
    an explicit one; the default is derived from timeout_s) instead of waiting forever."""
    ex = CommExecutor("test", CPU, timeout_s=1.0)
    release = threading.Event()

    def stuck():
        yield Move("node")
        release.wait(WAIT_S)

    fut = ex.submit(stuck(), ["node"])
    assert fut.zeropp_deadline > 0  # a default bound exists: timeout_s x slots + slack
    with pytest.raises(ExecutorTimeoutError, match="did not finish within its bound"):
        ex.result(fut, timeout=0.2)
    assert isinstance(ex.broken, ExecutorTimeoutError)
    release.set()
    assert not ex.close(timeout=WAIT_S)


def test_close_is_bounded_once_for_all_lanes_and_reports_stuck_lanes():
    """Three lanes stuck inside a 'collective': close gives up after one overall bound (not one
    per lane) and names them; jobs queued behind them are never run."""
    ex = CommExecutor("test", CPU)
    release, started = threading.Event(), [threading.Event() for _ in range(3)]
    ran: list[str] = []

    def stuck(i):
        yield Move(f"lane{i}")
        started[i].set()
        release.wait(WAIT_S)

    def queued(i):
        yield Move(f"lane{i}")
        ran.append(f"queued{i}")

    futs = [ex.submit(stuck(i), [f"lane{i}"]) for i in range(3)]
    futs += [ex.submit(queued(i), [f"lane{i}"]) for i in range(3)]
    assert all(e.wait(WAIT_S) for e in started)
    left = ex.close(timeout=0.3)
    # one bound for all three lanes: close returned while every lane was still stuck
    assert not release.is_set()
    assert sorted(left) == [f"zeropp_hier-test-lane{i}" for i in range(3)]
    release.set()
    for f in futs[3:]:
        with pytest.raises(ExecutorBrokenError, match="closed"):
            ex.result(f, timeout=WAIT_S)
    assert ran == []
    with pytest.raises(ExecutorBrokenError, match="closed"):
        ex.submit(queued(0), ["lane0"])


def test_submit_is_all_or_nothing_under_an_interrupt():
    """A KeyboardInterrupt raised inside submit, at each line of it in turn (a trace function
    raises it there, as Python's signal handler would between bytecodes), leaves the job queued
    on all of its lanes or on none: either it runs to its end, or it issues no collective."""
    lanes = ["node", "gpu", "gcd"]
    code = CommExecutor.submit.__code__
    lines = sorted({ln for _, _, ln in code.co_lines() if ln is not None and ln > code.co_firstlineno})
    outcomes = set()
    for target in lines:
        ex = _ex()
        issued: list[str] = []

        def job():
            for lane in lanes:
                yield Move(lane)
                issued.append(lane)
            return "done"

        def tracer(frame, event, arg, target=target):
            if frame.f_code is code and event == "line" and frame.f_lineno == target:
                sys.settrace(None)
                raise KeyboardInterrupt
            return tracer

        fut = None
        sys.settrace(tracer)
        try:
            fut = ex.submit(job(), lanes)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        if fut is not None:
            assert ex.result(fut, timeout=WAIT_S) == "done"
        ex.drain()  # a job queued before the interrupt runs its course
        ex.close(timeout=WAIT_S)
        outcomes.add(tuple(issued))
        assert issued in ([], lanes), (target, issued)
    assert () in outcomes and tuple(lanes) in outcomes


def test_drain_waits_for_every_lane_and_a_job_without_collectives_runs():
    ex = _ex()
    done: list[str] = []

    def slow(name, lane):
        yield Move(lane)
        threading.Event().wait(0.05)
        done.append(name)

    def local():
        done.append("local")
        return 7
        yield  # a generator that never moves

    futs = [ex.submit(slow("n", "node"), ["node"]), ex.submit(slow("g", "gcd"), ["gcd"])]
    assert ex.result(ex.submit(local(), [])) == 7
    ex.drain()
    assert all(f.done() for f in futs) and sorted(done) == ["g", "local", "n"]
    for f in futs:
        ex.result(f)
    assert ex.outstanding == 0 and ex.max_outstanding >= 2
    ex.close()


def test_overlap_off_runs_inline_with_the_same_checks():
    ex = _ex(overlap=False)
    seen: list[str] = []

    def job():
        yield Move("node")
        seen.append(threading.current_thread().name)
        yield Move("gcd")
        return "done"

    assert ex.result(ex.submit(job(), ["node", "gcd"])) == "done"
    assert seen == [threading.current_thread().name]  # on the caller
    with pytest.raises(JobOrderError):
        ex.result(ex.submit(job(), ["node"]))
    ex.close()


def test_one_lane_keeps_one_order_across_hop_groups():
    """With ``one_lane`` a later job's collective on another group waits for the earlier job's
    collectives: nothing overlaps, every collective in submission order."""
    ex = CommExecutor("test", CPU, one_lane=True)
    order: list[str] = []
    release = threading.Event()

    def a():
        yield Move("node")
        release.wait(WAIT_S)
        order.append("a node")

    def b():
        yield Move("gcd")
        order.append("b gcd")

    fa, fb = ex.submit(a(), ["node"]), ex.submit(b(), ["gcd"])
    assert not fb.done()
    release.set()
    ex.result(fa), ex.result(fb)
    assert order == ["a node", "b gcd"] and ex.max_lanes_busy == 1
    ex.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_submit_all_is_one_piece_of_work_with_the_last_value_or_the_first_error(overlap):
    """The chunks of a pipelined bucket ([Note: chunked gathers]): one future, the last job's
    value; an earlier job's error, not the last one's, when both fail; nothing left outstanding."""
    ex = _ex(overlap)
    seen: list[int] = []

    def chunk(i, fail=False):
        yield Move("node")
        yield Move("gcd")
        seen.append(i)
        if fail:
            raise ValueError(f"chunk {i} failed")
        return i

    fut = ex.submit_all([chunk(0), chunk(1), chunk(2)], ["node", "gcd"])
    assert ex.result(fut) == 2 and seen == [0, 1, 2]
    assert ex.outstanding == 0 and ex.max_outstanding == 1
    # the first failure is what the caller sees (inline, or where a failure stops the executor
    # from running more, it may come from ``submit_all`` itself, naming it)
    with pytest.raises(Exception, match="chunk 1 failed"):
        ex.result(ex.submit_all([chunk(0), chunk(1, fail=True), chunk(2, fail=True)], ["node", "gcd"]))
    assert ex.outstanding == 0
    ex.close()
