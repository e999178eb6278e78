"""A tier's bandwidth and latency from the link probe's all-gathers ([Note: latency from a tiny
message] in zeropp_hier/detect/links.py): the bandwidth is the slope between the larger sizes,
the latency the tiny message's time less its bytes, so the intercept of two large, noisy times
never becomes the latency; and noise that hides the slope leaves a finite bandwidth."""

import pytest

from zeropp_hier.detect.links import TINY_BYTES, fit_tier


@pytest.mark.parametrize("k", [2, 4, 8])
def test_alpha_beta_data_gives_back_its_rates(k):
    alpha, bw = 2e-3, 5e7  # seconds per step, bytes/s per GCD
    times = {s: (k - 1) * (alpha + s / bw) for s in (4096, 1 << 20)}
    got_bw, got_alpha = fit_tier(times, (k - 1) * (alpha + TINY_BYTES / bw), k)
    assert got_bw == pytest.approx(bw, rel=1e-9) and got_alpha == pytest.approx(alpha, rel=1e-9)


# the node tier's all-gathers as the 2 x 4 x 2 re-run's probe recorded them before the tiny
# message (two GCDs, links shaped to 0.22 Mbit/s per GCD; seconds by bytes per rank, and what the
# probe derived): benchmarks/results/compare_shapes_rerun_2x4x2.json at commit f8db265, "probe"
RECORDED_NODE = {
    "all_gather_s": {16384: 0.7476407289505005, 65536: 2.65763521194458},
    "bandwidth": 25734.10574618521,
    "latency": 0.11097590128580725,
}


def test_the_latency_follows_the_tiny_message_not_the_intercept():
    # a line through the two recorded times meets the axis at 0.111 s per step: what that run's
    # probe took for the latency; the fit now keeps the slope and takes the tiny message's time
    times = RECORDED_NODE["all_gather_s"]
    intercept = times[16384] - 16384 / RECORDED_NODE["bandwidth"]
    assert intercept == pytest.approx(RECORDED_NODE["latency"], rel=1e-9)
    for tiny in (0.02, 0.05):  # a tiny message's time (the probe measures it; not recorded then)
        bw, alpha = fit_tier(times, tiny, 2)
        assert bw == pytest.approx(RECORDED_NODE["bandwidth"], rel=1e-9)  # the slope is unchanged
        assert alpha == pytest.approx(tiny - TINY_BYTES / bw, rel=1e-9) and alpha < 0.06


def test_noise_that_hides_the_slope_leaves_a_finite_bandwidth():
    # fast links: the larger size ran no slower than the smaller one
    bw, alpha = fit_tier({4096: 2.0e-3, 1 << 20: 1.9e-3}, 6e-4, 4)
    assert alpha == pytest.approx(2e-4)
    assert bw == pytest.approx(3 * (1 << 20) / (1.9e-3 - 6e-4)) and bw < float("inf")
