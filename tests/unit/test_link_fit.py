"""A tier's bandwidth and latency from the link probe's all-gathers ([Note: latency from a tiny
message] in zeropp_hier/detect/links.py): the bandwidth is the slope between the larger sizes,
the latency the tiny message's time less its bytes, so the intercept of two large, noisy times
never becomes the latency; and noise that hides the slope leaves a finite bandwidth."""

import json
from pathlib import Path

import pytest

from zeropp_hier.detect.links import TINY_BYTES, fit_tier

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("k", [2, 4, 8])
def test_alpha_beta_data_gives_back_its_rates(k):
    alpha, bw = 2e-3, 5e7  # seconds per step, bytes/s per GCD
    times = {s: (k - 1) * (alpha + s / bw) for s in (4096, 1 << 20)}
    got_bw, got_alpha = fit_tier(times, (k - 1) * (alpha + TINY_BYTES / bw), k)
    assert got_bw == pytest.approx(bw, rel=1e-9) and got_alpha == pytest.approx(alpha, rel=1e-9)


def test_the_latency_follows_the_tiny_message_not_the_intercept():
    # the node tier's all-gathers as the 2 x 4 x 2 re-run's probe recorded them (two GCDs, links
    # shaped to 0.22 Mbit/s per GCD): a line through them meets the axis at 0.111 s per step
    rec = json.loads((ROOT / "benchmarks/results/compare_shapes_rerun_2x4x2.json").read_text())
    node = rec["probe"]["tiers"]["node"]
    times = {int(s): t for s, t in node["all_gather_s"].items()}
    assert node["latency"] == pytest.approx(0.111, abs=1e-3)  # what the intercept gave that run
    for tiny in (0.02, 0.05):  # a tiny message's time, as the probe now measures it (not recorded then)
        bw, alpha = fit_tier(times, tiny, 2)
        assert bw == pytest.approx(node["bandwidth"], rel=1e-9)  # the slope is unchanged
        assert alpha == pytest.approx(tiny - TINY_BYTES / bw, rel=1e-9) and alpha < 0.06


def test_noise_that_hides_the_slope_leaves_a_finite_bandwidth():
    # fast links: the larger size ran no slower than the smaller one
    bw, alpha = fit_tier({4096: 2.0e-3, 1 << 20: 1.9e-3}, 6e-4, 4)
    assert alpha == pytest.approx(2e-4)
    assert bw == pytest.approx(3 * (1 << 20) / (1.9e-3 - 6e-4)) and bw < float("inf")
