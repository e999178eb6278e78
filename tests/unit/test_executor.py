"""The executor's lanes ([Note: one order of hop collectives] in comm/executor.py), with jobs that
stand in for collectives by waiting on events: every wait has a timeout, so a lane that
serializes what should overlap, or a lost slot, fails the test instead of hanging it."""

import threading

import pytest
import torch

from zeropp_hier.comm.executor import CommExecutor, JobOrderError, Move

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


def test_a_job_that_breaks_its_declaration_fails_alone_and_the_lanes_go_on():
    ex = _ex()

    def wrong():
        yield Move("gpu")  # declared node
        return 1

    def short():
        yield Move("node")  # declared node then gcd: one collective missing
        return 2

    def fine():
        yield Move("node")
        yield Move("gcd")
        return 3

    f1, f2, f3 = ex.submit(wrong(), ["node"]), ex.submit(short(), ["node", "gcd"]), ex.submit(fine(), ["node", "gcd"])
    with pytest.raises(JobOrderError, match="declared lane 'node'.*moved to 'gpu'"):
        ex.result(f1)
    with pytest.raises(JobOrderError, match="declared 2 collectives"):
        ex.result(f2)
    assert ex.result(f3) == 3
    ex.close()


def test_an_error_in_a_hop_reaches_the_caller_and_skips_the_jobs_later_hops():
    ex = _ex()
    later: list[str] = []

    def boom():
        yield Move("node")
        raise ValueError("peer died")
        yield Move("gcd")  # declared, never reached
        later.append("boom gcd")

    def after():
        yield Move("gcd")
        later.append("after")
        return "after"

    f1, f2 = ex.submit(boom(), ["node", "gcd"]), ex.submit(after(), ["gcd"])
    with pytest.raises(ValueError, match="peer died"):
        ex.result(f1)
    assert ex.result(f2) == "after" and later == ["after"]
    ex.close()


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
