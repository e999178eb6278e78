"""Save in time, agreed ([Note: saving before the wall clock ends] in zeropp_hier/app/longrun/deadline.py):
a signal to one rank only, or one rank's clock, makes every rank of a real gloo world stop at
the same step (one all-reduce of the flags at each step boundary)."""

import pytest

from . import ranks_deadline as rd


@pytest.mark.parametrize("mid_step", [False, True], ids=["at-step-start", "mid-step"])
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(bare8, mid_step):
    out = bare8.run(rd.stop_on_a_signal_to_one_rank, 5, 3, mid_step)
    steps = {r["stopped_after"] for r in out}
    assert steps == {3}, out  # the signal came during step 3: all stop after it, none later
    assert [r["own_signal"] for r in out] == [rank == 5 for rank in range(8)], out
    assert all(r["by_signal"] and not r["by_clock"] for r in out), out
    assert all("warning signal" in r["why"] for r in out)


def test_one_ranks_clock_stops_every_rank_at_the_same_step(bare8):
    out = bare8.run(rd.stop_on_one_ranks_clock, 2, 1000.0)
    # rank 2's clock: 100 s per step from t=100; left < 100 (step) + 60 (margin) first at t=900
    assert {r["stopped_after"] for r in out} == {8}, out
    assert all(r["by_clock"] and not r["by_signal"] for r in out), out
