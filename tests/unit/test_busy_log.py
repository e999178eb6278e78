"""The executor's busy intervals ([Note: busy intervals] in comm/busy.py): one per collective,
on the hop group the job declared, with jobs that stand in for collectives by waiting on events
(every wait has a timeout, so a lost record fails instead of hanging)."""

import threading

import pytest
import torch

from benchmarks.compare.linkuse import busy_summary
from zeropp_hier.comm.executor import CommExecutor
from zeropp_hier.comm.job import Move

CPU = torch.device("cpu")
WAIT_S = 20.0


def _two_jobs(ex: CommExecutor, side_by_side: bool):
    """A: gcd hop then a node hop that, with ``side_by_side``, stays in flight until B's gpu hop
    has started (so the two must overlap). B: one gpu hop."""
    a_on_node, b_on_gpu = threading.Event(), threading.Event()

    def a():
        yield Move(("gcd",))
        yield Move(("node",))
        a_on_node.set()
        if side_by_side and not b_on_gpu.wait(WAIT_S):
            raise AssertionError("B's gpu hop did not run beside A's node hop")
        return "a"

    def b():
        yield Move(("gpu", "gcd"))
        b_on_gpu.set()
        if side_by_side and not a_on_node.wait(WAIT_S):
            raise AssertionError("A never reached its node hop")
        return "b"

    fa, fb = ex.submit(a(), [("gcd",), ("node",)]), ex.submit(b(), [("gpu", "gcd")])
    assert (ex.result(fa), ex.result(fb)) == ("a", "b")


def test_one_interval_per_collective_on_its_lane_and_overlap_is_seen():
    ex = CommExecutor("test", CPU)
    assert ex.busy_log is None  # off by default
    ex.record_busy()
    _two_jobs(ex, side_by_side=True)
    rec = ex.busy_log.intervals()
    assert sorted(lane for lane, _, _ in rec) == [("gcd",), ("gpu", "gcd"), ("node",)]
    assert all(a <= b for _, a, b in rec)
    got = {lane: (a, b) for lane, a, b in rec}
    # A's gcd hop ended before its node hop began (one job's hops stay in sequence)
    assert got[("gcd",)][1] <= got[("node",)][0]
    # A's node hop and B's gpu hop were in flight together: the summary sees two tiers at once
    s = busy_summary(rec, [(min(a for _, a, _ in rec), max(b for _, _, b in rec))])
    assert s["together_s"] > 0
    ex.record_busy(False)
    _two_jobs(ex, side_by_side=False)
    assert ex.busy_log is None
    ex.close()


def test_one_lane_records_the_declared_hop_groups():
    ex = CommExecutor("test", CPU, one_lane=True)
    ex.record_busy()
    _two_jobs(ex, side_by_side=False)  # one lane: they cannot overlap
    rec = ex.busy_log.intervals()
    assert sorted(lane for lane, _, _ in rec) == [("gcd",), ("gpu", "gcd"), ("node",)]
    s = busy_summary(rec, [(min(a for _, a, _ in rec), max(b for _, _, b in rec))])
    assert s["together_s"] == 0  # one thread ran them one after another
    ex.close()


@pytest.mark.parametrize("one_lane", [False, True])
def test_drain_records_no_collective_and_the_summary_reads_every_record(one_lane):
    """``drain`` (run by the engine at every step's end) queues a barrier slot on every lane; it
    issues no collective, so nothing of it is recorded: with one lane it used to record the
    folded lane ``("one_lane",)``, which the benchmark's summary refused."""
    ex = CommExecutor("test", CPU, one_lane=one_lane)
    ex.record_busy()
    _two_jobs(ex, side_by_side=not one_lane)
    ex.drain()
    rec = ex.busy_log.intervals()
    assert sorted(lane for lane, _, _ in rec) == [("gcd",), ("gpu", "gcd"), ("node",)]
    s = busy_summary(rec, [(min(a for _, a, _ in rec), max(b for _, _, b in rec))])
    assert set(s["busy_s"]) == {"gcd", "gpu", "node"} and all(v > 0 for v in s["busy_s"].values())
    ex.close()


def test_inline_records_each_collective_too():
    ex = CommExecutor("test", CPU, overlap=False)
    ex.record_busy()
    _two_jobs(ex, side_by_side=False)
    rec = ex.busy_log.intervals()
    assert [lane for lane, _, _ in rec] == [("gcd",), ("node",), ("gpu", "gcd")]  # program order
    ends = [b for _, _, b in rec]
    starts = [a for _, a, _ in rec]
    assert all(e <= s for e, s in zip(ends, starts[1:]))  # one after another on the caller
    ex.record_busy()  # anew: what came before is gone
    assert ex.busy_log.intervals() == []
    ex.close()


def test_a_slot_of_several_hops_records_each_hop_group_for_its_interval():
    """A tick ([Note: ticks] in comm/tick/plan.py) moves several hops' transfers in one slot:
    each hop group is busy for the slot's interval, and the summary sees the tiers together."""
    from zeropp_hier.comm.busy import Several

    ex = CommExecutor("test", CPU, one_lane=True)
    ex.record_busy()

    def tick():
        yield Move(("ticks",))
        return "t"

    assert ex.result(ex.submit(tick(), [("ticks",)], hops=[Several([("node",), ("gpu",), ("gcd",)])])) == "t"
    rec = ex.busy_log.intervals()
    assert sorted(lane for lane, _, _ in rec) == [("gcd",), ("gpu",), ("node",)]
    assert len({(a, b) for _, a, b in rec}) == 1  # one interval, three hop groups
    s = busy_summary(rec, [(rec[0][1], rec[0][2] + 1.0)])
    assert s["together_s"] == s["busy_s"]["node"]
    ex.close()
