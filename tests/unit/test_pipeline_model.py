"""The planner's model of pipelined hops ([Note: pipelined hops] in planner/pipeline.py): pure."""

import pytest

from zeropp_hier import planner as P

# a gather's hops in order (node, gpu, gcd): seconds for the whole job, on their own links
HOPS = [4.0, 2.0, 1.0]


def test_one_chunk_is_the_unpipelined_sum():
    assert P.pipelined_time(HOPS, 1) == P.sequential_time(HOPS) == 7.0
    lat = [0.1, 0.01, 0.001]
    assert P.pipelined_time(HOPS, 1, lat) == pytest.approx(P.sequential_time(HOPS, lat))


def test_slowest_tier_plus_fill_and_drain():
    # 4 chunks: the node hop 4 x 1.0, plus one chunk of the gpu (0.5) and gcd (0.25) hops
    assert P.pipelined_time(HOPS, 4) == pytest.approx(4.0 + 0.5 + 0.25)
    # many chunks without latency: tends to the slowest tier alone
    assert P.pipelined_time(HOPS, 1000) == pytest.approx(4.0, rel=1e-3)
    # always between the slowest tier and the sum
    for c in range(1, 20):
        assert max(HOPS) <= P.pipelined_time(HOPS, c) <= P.sequential_time(HOPS)
    # the order of the hops does not matter for identical chunks
    assert P.pipelined_time([1.0, 2.0, 4.0], 4) == pytest.approx(P.pipelined_time(HOPS, 4))


def test_flow_shop_matches_a_step_by_step_schedule():
    """The closed form against the schedule itself: hop t of chunk i starts when hop t of chunk
    i-1 and hop t-1 of chunk i have ended (one lane per hop, lanes in chunk order)."""
    hops, lat = [3.0, 5.0, 0.7, 2.2], [0.05, 0.02, 0.0, 0.3]
    for c in (1, 2, 3, 7):
        end = [[0.0] * len(hops) for _ in range(c)]
        for i in range(c):
            for t, (h, a) in enumerate(zip(hops, lat)):
                begin = max(end[i - 1][t] if i else 0.0, end[i][t - 1] if t else 0.0)
                end[i][t] = begin + h / c + a
        assert P.pipelined_time(hops, c, lat) == pytest.approx(end[-1][-1])


def test_latency_bounds_the_useful_chunk_count():
    # no latency: more chunks never hurt
    assert P.best_chunks(HOPS, max_chunks=16) == 16
    # each chunk pays every hop's latency: an optimum inside the range
    lat = [0.05, 0.05, 0.05]
    best = P.best_chunks(HOPS, lat, max_chunks=64)
    assert 1 < best < 64
    assert P.pipelined_time(HOPS, best, lat) < P.pipelined_time(HOPS, 1, lat)
    assert P.pipelined_time(HOPS, best, lat) <= P.pipelined_time(HOPS, best + 1, lat)
    # latency dominating: do not pipeline
    assert P.best_chunks([0.01, 0.01], [1.0, 1.0]) == 1


def test_bad_input():
    with pytest.raises(ValueError, match="at least one chunk"):
        P.pipelined_time(HOPS, 0)
    with pytest.raises(ValueError, match="3 hop times but 2 latencies"):
        P.pipelined_time(HOPS, 2, [0.1, 0.1])
    assert P.pipelined_time([], 4) == 0.0


@pytest.mark.parametrize(
    "width, align, chunks", [(1536, 256, 3), (1536, 256, 4), (1536, 256, 64), (708, 1, 3), (64, 64, 8)]
)
def test_column_ranges_cover_the_row_on_whole_blocks(width, align, chunks):
    from zeropp_hier.comm.gather import column_ranges

    ranges = column_ranges(width, align, chunks)
    assert ranges[0][0] == 0 and ranges[-1][1] == width
    assert all(b == c for (_, b), (c, _) in zip(ranges, ranges[1:]))  # contiguous, in order
    assert all(a % align == 0 and b > a for a, b in ranges)  # whole blocks, none empty
    assert len(ranges) == min(chunks, width // align)
    widths = [b - a for a, b in ranges]
    assert max(widths) - min(widths) <= align  # near-equal


def test_column_ranges_refuse_a_row_of_partial_blocks():
    from zeropp_hier.comm.gather import column_ranges

    with pytest.raises(AssertionError, match="not whole 256-element blocks"):
        column_ranges(1000, 256, 2)
