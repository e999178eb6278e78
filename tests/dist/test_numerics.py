"""Numerics on 8 real ranks (2x2x2, gloo), each beside stock DeepSpeed where one applies:
error feedback survives a checkpoint; a non-finite gradient on one rank never reaches the
weights (fp16: skipped and loss scale lowered as stock; bf16: skipped and reported, or raised);
the compression error is reported per tier."""

import pytest

from zeropp_hier.app.spec import ds_config

from ..helpers import (
    FP16_MARKS,
    FP16_REFUSED,
    assert_losses_close,
    assert_states_close,
    error_feedback_expected,
    max_state_diff,
    nonfinite_carried,
    requires_fp16,
)
from . import ranks_numerics as scenarios_numerics

STEPS, INJECT_STEP, INJECT_RANK = 3, 1, 3  # one element of one gradient on rank 3 becomes +Inf
FP16 = {"fp16": {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}}  # lower the scale at once
# int4 gradients on the node stage: frontier keeps error feedback there ("auto"), so the skip tests
# can check that no non-finite value lands in a residual (the default's int8 keeps none)
WITH_EF = {"gradients": {"node": "int4"}}


def _nonfinite_configs():
    cfgs = {
        "stock_fp16": ds_config(None, dtype="fp16", overrides=FP16),
        "frontier_fp16": ds_config("frontier", dtype="fp16", compression=WITH_EF, overrides=FP16),
        "stock_bf16": ds_config(None, dtype="bf16"),
        "frontier_bf16_skip": ds_config("frontier", dtype="bf16", compression=WITH_EF),
        "frontier_bf16_raise": ds_config("frontier", dtype="bf16"),
    }
    cfgs["frontier_bf16_raise"]["zeropp_hier"]["numerics"] = {"nonfinite": "raise"}
    if FP16_REFUSED:  # DeepSpeed would refuse these on every rank: run the rest
        del cfgs["stock_fp16"], cfgs["frontier_fp16"]
    return cfgs


@pytest.fixture(scope="module")
def suite(world8, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("ef_ckpt"))
    # frontier with int8 weights on the node hop, int8 gradients on the gcd stage (the preset's)
    # and the gpu stage and int4 on the node stage (error feedback on the int4 node stage, the
    # preset's), with gradient accumulation 2: residuals carry across micro-steps and steps, and
    # the node stage's scheme differs from the others', so the per-tier error report can be told
    # apart tier by tier
    config = ds_config("frontier", grad_accum=2, compression={"gradients": {"gpu": "int8", "node": "int4"}})
    return world8.run(
        scenarios_numerics.numerics_suite, config, ckpt, _nonfinite_configs(), STEPS, INJECT_STEP, INJECT_RANK
    )


def test_error_feedback_state_round_trips_through_a_checkpoint(suite):
    for rank, r in enumerate(suite):
        res = r["resume"]
        assert res["saved_buffers"] > 0 and res["saved_norm"] > 0, "no residual was saved: proves nothing"
        assert res["same_keys"] and res["residual_max_diff"] == 0.0
        assert_losses_close(res["resumed_losses"], res["ref_losses"], 1e-6, f"rank {rank} after resume")
        assert_states_close(res["state"], res["ref_state"], 1e-6, f"rank {rank} final weights")
        # the residuals matter: the same load without them gives another trajectory
        assert res["control_losses"][0] == res["ref_losses"][0]  # forward before any feedback
        assert max(abs(a - b) for a, b in zip(res["control_losses"][1:], res["ref_losses"][1:])) > 1e-5


def test_compression_error_is_reported_per_tier(suite):
    for r in suite:
        rel = r["resume"]["numerics"]["relative_error"]
        assert set(rel) == {"forward_gather", "grad_reduce"}  # the backward gather is exact
        assert set(rel["forward_gather"]) == {"node"} and set(rel["grad_reduce"]) == {"gcd", "gpu", "node"}
        fwd, gcd = rel["forward_gather"]["node"], rel["grad_reduce"]["gcd"]
        gpu, node = rel["grad_reduce"]["gpu"], rel["grad_reduce"]["node"]
        assert all(s["samples"] > 0 for s in (fwd, gcd, gpu, node))
        # int8 weights ~1/200 of the norm; int4 gradients an order of magnitude worse than int8
        assert 0 < fwd["max"] < 0.02
        assert 0 < gcd["mean"] < 0.05 and 0 < gpu["mean"] < 0.05 < node["mean"] < 0.5
        assert node["mean"] > 4 * gpu["mean"]
        ef = r["resume"]["numerics"]["error_feedback"]
        assert ef["stages"] == [{"axes": ["node"], "scheme": "int4"}] and ef["bytes"] > 0


def _weights_unchanged(run):
    return max_state_diff(run["after"], run["before"]) == 0.0


@pytest.mark.parametrize("dt", [pytest.param("fp16", marks=FP16_MARKS), "bf16"])
def test_stock_deepspeed_skips_the_poisoned_step(suite, dt):
    # the reference behaviour, in the same world: every rank skips, weights kept
    for r in suite:
        stock = r["nonfinite"][f"stock_{dt}"]
        assert _weights_unchanged(stock) and stock["skipped_steps"] == 1


@requires_fp16
def test_fp16_inf_on_one_rank_skips_the_step_everywhere_like_stock(suite):
    for rank, r in enumerate(suite):
        ours, stock = r["nonfinite"]["frontier_fp16"], r["nonfinite"]["stock_fp16"]
        # the Inf sits in one element of rank 3's gradient; after int8/int4 stages it is a NaN
        # block in another rank's partition, which DeepSpeed's overflow check must still see
        assert _weights_unchanged(ours), f"rank {rank}: weights changed in the skipped step"
        assert ours["skipped_steps"] == stock["skipped_steps"] == 1
        assert ours["scales"] == stock["scales"] == [256.0, 128.0, 128.0]
        # no NaN carried into later steps: losses and the int4 node stage's residuals stay finite
        assert error_feedback_expected(_nonfinite_configs()["frontier_fp16"])
        assert nonfinite_carried(ours, True) == [], f"rank {rank}"
        events = ours["numerics"]["nonfinite"]["events"]
        assert [e["step"] for e in events] == [INJECT_STEP]
        assert events[0]["seen"][0] == {"phase": "grad_reduce", "tier": "local", "ranks": [INJECT_RANK]}


def test_bf16_skip_keeps_weights_and_reports(suite):
    for rank, r in enumerate(suite):
        ours = r["nonfinite"]["frontier_bf16_skip"]
        assert _weights_unchanged(ours), f"rank {rank}"
        assert ours["skipped_steps"] == 1 and ours["error"] is None
        assert len(ours["losses"]) == STEPS
        # the same check as the fp16 test's, on residuals the config keeps (int4 node stage)
        assert error_feedback_expected(_nonfinite_configs()["frontier_bf16_skip"])
        assert nonfinite_carried(ours, True) == [], f"rank {rank}"
        nf = ours["numerics"]["nonfinite"]
        assert nf["policy"] == "skip" and nf["skipped_steps"] == [INJECT_STEP]
        assert f"first seen on rank {INJECT_RANK}" in nf["events"][0]["cause"]
        # the reduced partitions were poisoned too: every stage saw it somewhere
        assert [s["tier"] for s in nf["events"][0]["seen"]] == ["local", "gcd", "gpu", "node"]


def test_bf16_raise_names_step_rank_and_stage(suite):
    for rank, r in enumerate(suite):
        ours = r["nonfinite"]["frontier_bf16_raise"]
        err = ours["error"]
        assert err is not None, f"rank {rank} did not raise"
        assert (err["step"], err["rank"], err["phase"], err["tier"]) == (INJECT_STEP, INJECT_RANK, "grad_reduce", None)
        assert f"step {INJECT_STEP}" in err["message"] and f"rank {INJECT_RANK}" in err["message"]
        assert "phase 'grad_reduce'" in err["message"] and "nonfinite" in err["message"]
        assert _weights_unchanged(ours)
        assert len(ours["losses"]) == INJECT_STEP  # raised in the poisoned step, not later
