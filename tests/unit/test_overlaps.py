"""The pure checker of the collective-overlap test (tests/dist/overlaps.py) on hand-built call
intervals: what counts as two communicators in flight at once, and what it refuses."""

import pytest

from ..dist.overlaps import Call, OpenCallError, conflicts, describe


def test_calls_in_sequence_on_different_communicators_do_not_conflict():
    calls = [
        Call(0.0, 1.0, "tick", "lane", "batch_isend_irecv"),
        Call(1.0, 2.0, "world", "main", "all_reduce"),  # starts exactly when the tick ended
        Call(2.5, 3.0, "tick", "lane", "batch_isend_irecv"),
    ]
    assert conflicts(calls) == []


def test_a_collective_in_flight_beside_a_tick_conflicts():
    tick = Call(0.0, 2.0, "tick", "lane", "batch_isend_irecv")
    loss = Call(1.5, 2.5, "world", "main", "all_reduce")
    later = Call(3.0, 4.0, "world", "main", "all_reduce")
    got = conflicts([later, loss, tick])  # any input order
    assert got == [(tick, loss)]
    assert "all_reduce on 'world' from 'main'" in describe(got[0])


def test_one_communicator_from_two_threads_at_once_conflicts_but_from_one_thread_does_not():
    a = Call(0.0, 2.0, "hop:node", "lane", "all_gather_into_tensor")
    b = Call(1.0, 3.0, "hop:node", "lane", "all_gather_into_tensor")  # queued behind a, same thread
    c = Call(2.5, 3.5, "hop:node", "main", "all_gather_into_tensor")
    assert conflicts([a, b]) == []
    assert conflicts([a, b, c]) == [(b, c)]


def test_a_long_call_conflicts_with_every_call_inside_it():
    long = Call(0.0, 10.0, "world", "main", "barrier")
    inner = [Call(float(t), t + 0.5, "tick", "lane", "batch_isend_irecv") for t in range(1, 9, 2)]
    got = conflicts([long, *inner])
    assert got == [(long, c) for c in inner]


def test_a_call_never_seen_to_complete_is_refused_by_name():
    with pytest.raises(OpenCallError, match=r"call 1 \(isend on 'tick' from thread 'lane'.*never seen to complete"):
        conflicts([Call(0.0, 1.0, "world", "main", "all_reduce"), Call(0.5, None, "tick", "lane", "isend")])


def test_an_interval_ending_before_it_starts_is_refused():
    with pytest.raises(OpenCallError, match="ends at 1.000000, before it starts at 2.000000"):
        conflicts([Call(2.0, 1.0, "world", "main", "all_reduce")])
