"""The checks the non-finite tests make after a skipped step (tests/helpers.py), on their own:
the fp16 one runs only on CPUs with AVX512-FP16 (tests/dist/test_numerics.py), so what it
asserts is checked here on every host, and by the bf16 skip test, which runs everywhere."""

import math

from zeropp_hier.app.spec import ds_config

from ..helpers import FP16_MARKS, error_feedback_expected, nonfinite_carried, requires_fp16


def test_error_feedback_follows_the_config():
    # frontier keeps residuals on a stage only where its gradients are int4 ("auto")
    assert not error_feedback_expected(ds_config("frontier", dtype="bf16"))  # int8 node stage
    assert error_feedback_expected(ds_config("frontier", dtype="bf16", compression={"gradients": {"node": "int4"}}))
    assert not error_feedback_expected(ds_config("zeropp", dtype="bf16"))  # like ZeRO++: none
    assert error_feedback_expected(ds_config("zeropp", dtype="bf16", compression={"error_feedback": "auto"}))
    assert not error_feedback_expected(ds_config(None, dtype="bf16"))  # stock DeepSpeed


def _run(**kw):
    return {"losses": [2.5, 2.4, 2.3], "ef_finite": True, "ef_buffers": 4, **kw}


def test_a_clean_run_carries_nothing():
    assert nonfinite_carried(_run(), True) == []
    assert nonfinite_carried(_run(ef_buffers=0), False) == []


def test_each_carried_value_is_named():
    assert nonfinite_carried(_run(losses=[2.5, math.nan, 2.3]), True) == ["non-finite losses (step, loss): [(1, nan)]"]
    assert nonfinite_carried(_run(losses=[2.5, 2.4, math.inf]), True) == ["non-finite losses (step, loss): [(2, inf)]"]
    assert nonfinite_carried(_run(ef_finite=False), True) == ["a non-finite error-feedback residual"]


def test_residuals_must_match_the_config():
    # none where the config keeps them: the residual check would prove nothing (the old test's
    # failure on today's frontier default, issue 48)
    assert nonfinite_carried(_run(ef_buffers=0), True) == [
        "no error-feedback residual, though the config keeps them: nothing about them was checked"
    ]
    assert nonfinite_carried(_run(ef_buffers=2), False) == ["2 error-feedback residuals, though the config keeps none"]


def test_fp16_tests_carry_the_marker_that_selects_them():
    assert [m.name for m in FP16_MARKS] == ["cpu_fp16", "skipif"]

    @requires_fp16
    def probe():
        pass

    assert {m.name for m in probe.pytestmark} == {"cpu_fp16", "skipif"}
