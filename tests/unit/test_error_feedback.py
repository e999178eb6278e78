"""Error feedback and compression telemetry as pure tensor logic (no processes)."""

import math

import pytest
import torch

from zeropp_hier import quant
from zeropp_hier.comm.error_feedback import ErrorFeedback
from zeropp_hier.comm.numerics import Telemetry, relative_error

KEY = (("blocks.0.fc.weight", "blocks.0.fc.bias"), 2)


def _int4_roundtrip(x, block=256):
    return quant.dequantize(quant.quantize(x.reshape(-1), 4, block), torch.float32).view_as(x)


def test_feedback_keeps_the_sum_of_what_was_sent_exact():
    """Telescoping: sum(sent) = sum(x) - last residual, so the accumulated error stays one
    quantization step, while without feedback it grows with the number of steps."""
    g = torch.Generator().manual_seed(0)
    bias = torch.randn(4, 1024, generator=g) * 0.05  # a persistent component, as in gradients
    ef = ErrorFeedback({"t": 1})
    sent_ef = torch.zeros(4, 1024)
    sent_plain = torch.zeros(4, 1024)
    total = torch.zeros(4, 1024)
    for _ in range(50):
        x = bias + torch.randn(4, 1024, generator=g)
        total += x
        c = ef.compensate(KEY, x, 1.0)
        d = _int4_roundtrip(c)
        ef.record(KEY, c, d, 1.0)
        sent_ef += d
        sent_plain += _int4_roundtrip(x)
    residual = ef.residuals[KEY]
    assert torch.allclose(sent_ef + residual, total, atol=1e-4)
    err_ef = float((sent_ef - total).norm() / total.norm())
    err_plain = float((sent_plain - total).norm() / total.norm())
    one_step = float(residual.norm() / total.norm())
    assert err_ef == pytest.approx(one_step, rel=1e-3)
    assert err_ef < err_plain / 4, (err_ef, err_plain)


def test_residual_units_follow_the_loss_scale():
    ef = ErrorFeedback({})
    sent = torch.full((2, 8), 3.0)
    ef.record(KEY, sent, torch.full((2, 8), 2.0), loss_scale=4.0)  # error 1.0 at scale 4
    assert torch.equal(ef.residuals[KEY], torch.full((2, 8), 0.25))  # stored unscaled
    out = ef.compensate(KEY, torch.zeros(2, 8), loss_scale=8.0)  # the scale doubled since
    assert torch.equal(out, torch.full((2, 8), 2.0))


def test_nonfinite_never_enters_the_residual():
    ef = ErrorFeedback({})
    sent = torch.tensor([[1.0, float("inf"), 3.0, float("nan")]])
    decoded = torch.tensor([[0.5, 1.0, float("nan"), 1.0]])
    ef.record(KEY, sent, decoded, 1.0)
    assert ef.residuals[KEY].tolist() == [[0.5, 0.0, 0.0, 0.0]]


def test_compensate_leaves_the_input_alone_and_checks_shapes():
    ef = ErrorFeedback({})
    x = torch.ones(2, 4)
    assert ef.compensate(KEY, x, 1.0) is x  # no residual yet
    ef.record(KEY, x, torch.zeros(2, 4), 1.0)
    y = ef.compensate(KEY, x, 1.0)
    assert torch.equal(x, torch.ones(2, 4)) and torch.equal(y, torch.full((2, 4), 2.0))
    with pytest.raises(RuntimeError, match=r"shape \(2, 4\)"):
        ef.compensate(KEY, torch.ones(3, 4), 1.0)


def test_state_round_trip_and_layout_check():
    sig = {"world": 8, "dims": (2, 2, 2), "stages": ((2, ("node",), "int4", 256),)}
    ef = ErrorFeedback(sig)
    ef.record(KEY, torch.randn(2, 8), torch.zeros(2, 8), 1.0)
    state = ef.state_dict()
    fresh = ErrorFeedback(dict(sig))
    assert fresh.load_state_dict(state) is None
    assert torch.equal(fresh.residuals[KEY], ef.residuals[KEY])
    other = ErrorFeedback({**sig, "world": 16})
    why = other.load_state_dict(state)
    assert "differs" in why and not other.residuals
    assert "no error-feedback state" in ErrorFeedback(sig).load_state_dict(None)
    ef.reset()
    assert ef.nbytes() == 0


def test_telemetry_samples_every_nth_call_and_measures_int4_error():
    t = Telemetry(every=3)
    assert [t.due("grad_reduce", "node") for _ in range(7)] == [True, False, False, True, False, False, True]
    assert t.due("forward_gather", "node")  # counted per (phase, tier)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    t.record("grad_reduce", "node", x, _int4_roundtrip(x))
    t.record("grad_reduce", "node", x, quant.dequantize(quant.quantize(x, 8, 256)))
    s = t.snapshot()["grad_reduce"]["node"]
    assert s["samples"] == 2
    # int4 of Gaussian data: ~0.11 relative error; int8 ~16x smaller
    assert 0.05 < s["max"] < 0.2 and s["last"] < s["max"] / 10
    assert Telemetry(every=0).due("grad_reduce", "node") is False
    assert relative_error(torch.zeros(8), torch.zeros(8)) is None
    assert relative_error(torch.tensor([1.0, math.inf]), torch.zeros(2)) is None


def test_nonfinite_flags_and_verdict():
    from zeropp_hier.comm.numerics import Location, NonFiniteMonitor, Verdict

    local, node = Location("grad_reduce", None, "its local gradient"), Location("grad_reduce", "node", "stage 2")
    m = NonFiniteMonitor((local, node))
    m.note(0, torch.ones(4))
    m.note(1, torch.tensor([1.0, float("nan")]))
    m.note(1, torch.ones(2))  # a later finite buffer does not clear the flag
    assert m.flags.tolist() == [False, True]
    v = Verdict(((node, (5, 6)),))
    assert v.any and v.first() == (node, 5)
    assert v.as_list() == [{"phase": "grad_reduce", "tier": "node", "ranks": [5, 6]}]
    assert not Verdict(()).any


def test_bf16_residuals_take_half_the_memory_and_are_added_back_in_fp32():
    import torch

    from zeropp_hier.comm.error_feedback import ErrorFeedback

    torch.manual_seed(0)
    KEY = (("blocks.0.fc.weight",), 0)  # (bucket parameter names, stage)
    sent = torch.randn(4, 256)
    decoded = sent + torch.randn(4, 256) * 1e-2
    full, half = ErrorFeedback({}), ErrorFeedback({}, dtype=torch.bfloat16)
    for ef in (full, half):
        ef.record(KEY, sent, decoded, 1.0)
    assert half.nbytes() * 2 == full.nbytes()
    r_full, r_half = full.residuals[KEY], half.residuals[KEY]
    assert r_half.dtype == torch.bfloat16 and torch.equal(r_half, r_full.to(torch.bfloat16))
    out = half.compensate(KEY, sent, 1.0)
    assert out.dtype == torch.float32  # the next send stays fp32
    assert torch.allclose(out, sent + r_full, atol=1e-4)
    # a checkpoint written with fp32 residuals loads into bf16 storage (and back)
    half.load_state_dict(full.state_dict())
    assert half.residuals[KEY].dtype == torch.bfloat16


def test_consecutive_skips_are_capped_with_their_history():
    """``max_consecutive_skips`` skipped steps in a row raise with every skip's step and cause;
    an applied step in between starts the count again."""
    from zeropp_hier.comm.numerics import Numerics, Verdict
    from zeropp_hier.core.errors import HierSkippedStepsError
    from zeropp_hier.core.plan import make_plan
    from zeropp_hier.core.policy import CompressionConfig, NumericsConfig
    from zeropp_hier.core.topology import Topology

    topo = Topology(2, 2, 2)
    num = Numerics(NumericsConfig(max_consecutive_skips=3), make_plan("frontier", CompressionConfig(), topo), topo, 0)
    clean = Verdict(())
    num.finish_step(clean, applied=False, fp16=True)  # step 0 skipped
    num.finish_step(clean, applied=False, fp16=True)  # step 1 skipped
    num.finish_step(clean, applied=True, fp16=True)  # step 2 applied: the count starts again
    num.finish_step(clean, applied=False, fp16=True)
    num.finish_step(clean, applied=False, fp16=True)
    with pytest.raises(HierSkippedStepsError, match=r"3 steps in a row were skipped \(steps \[3, 4, 5\]\)") as e:
        num.finish_step(clean, applied=False, fp16=True)
    assert [h["step"] for h in e.value.history] == [3, 4, 5]
    assert "max_consecutive_skips = 3" in str(e.value) and "3 x DeepSpeed's overflow check" in str(e.value)
