"""GPT-NeoX's small_init / wang_init (app/model/init_schemes.py, [Note: GPT-NeoX's init schemes]): the
weights of a model built whole have the standard deviations of GPT-NeoX's formulas
(megatron/model/init_functions.py), the recipes that publish them set them, and a scheme the
model cannot take is refused naming the field. No ranks start (the sharded build: tests/dist/
test_init_schemes.py)."""

import math

import pytest

from zeropp_hier.app.model import init_schemes, models
from zeropp_hier.app.spec import JobSpec, ModelSpec
from zeropp_hier.app.train import spec_from_overrides
from zeropp_hier.core.errors import HierConfigError

# wide enough that each matrix has >= 65k entries: the sample std is within ~0.5% of the true one
SPEC = ModelSpec(vocab_size=512, seq_len=16, hidden=256, heads=4, layers=4, intermediate=1024)
WHOLE = {"zero_optimization": {"stage": 0}}  # models.build builds it whole


def _weights(init_method, output_method, seed=0):
    model = models.build(SPEC, WHOLE, seed=seed)
    n = init_schemes.apply(model, SPEC.hidden, SPEC.layers, init_method, output_method, seed)
    return n, {k: p.detach().clone() for k, p in model.named_parameters()}


def test_initial_weights_have_gpt_neox_standard_deviations():
    small, wang = math.sqrt(2 / (5 * 256)), 2 / (4 * math.sqrt(256))  # 0.0395, 0.03125
    assert init_schemes.small_init_std(256) == pytest.approx(small)
    assert init_schemes.wang_init_std(256, 4) == pytest.approx(wang)
    n, w = _weights("small_init", "wang_init")
    assert n == 2 + 4 * 4  # embedding, head, and per block QKV, dense, h_to_4h, 4h_to_h
    seen = {"small": 0, "wang": 0}
    for name, t in w.items():
        if t.dim() != 2:
            continue  # biases and LayerNorms: as built
        want = wang if name.endswith(("attention.dense.weight", "dense_4h_to_h.weight")) else small
        seen["wang" if want == wang else "small"] += 1
        assert float(t.std()) == pytest.approx(want, rel=0.02), name
        assert abs(float(t.mean())) < 3 * want / math.sqrt(t.numel()) + 1e-4, name
    assert seen == {"small": 2 + 2 * 4, "wang": 2 * 4}
    for name, t in w.items():
        if name.endswith("bias"):
            assert float(t.abs().max()) == 0.0, name
    # transformers' own N(0, 0.02) otherwise, which both formulas differ from by > 50%
    n, w = _weights("normal", "normal")
    assert n == 0 and float(w["lm.gpt_neox.layers.0.mlp.dense_4h_to_h.weight"].std()) == pytest.approx(0.02, rel=0.02)


def test_same_seed_same_weights_and_schemes_apart():
    _, a = _weights("small_init", "normal", seed=3)
    _, b = _weights("small_init", "normal", seed=3)
    assert all(bool((a[k] == b[k]).all()) for k in a)
    # only the input-side weights were redrawn: the output projections keep 0.02
    assert float(a["lm.gpt_neox.layers.1.attention.dense.weight"].std()) == pytest.approx(0.02, rel=0.03)


def test_the_recipes_that_publish_them_set_them():
    for recipe in ("neox20b", "neox1_4b"):  # 20B.yml, 1-3B.yml and pythia-1.4b.yml name both
        spec = spec_from_overrides([f"recipe={recipe}"])
        assert (spec.init_method, spec.output_layer_init_method) == ("small_init", "wang_init")
    assert (JobSpec().init_method, JobSpec().output_layer_init_method) == ("normal", "normal")


def test_a_scheme_the_model_cannot_take_is_refused():
    with pytest.raises(HierConfigError, match="'init_method'.*got 'xavier'.*normal.*small_init"):
        JobSpec(init_method="xavier").check()
    with pytest.raises(HierConfigError, match="'output_layer_init_method'.*arch=neox"):
        JobSpec(output_layer_init_method="wang_init", model=ModelSpec(arch="gpt")).check()
