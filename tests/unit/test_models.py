"""The job's named model sizes (zeropp_hier.app.model.models): the YAML group equals the typed table,
the parameter arithmetic equals the built model, the published shapes are what the papers say."""

from pathlib import Path

import pytest
import yaml

from zeropp_hier.app.model import models
from zeropp_hier.app.spec import MODELS, ModelSpec, n_params

CONFIGS = Path(models.__file__).parents[1] / "configs" / "model"


def test_every_named_size_has_its_yaml_and_they_agree():
    names = {p.stem for p in CONFIGS.glob("*.yaml")}
    assert names == set(MODELS)
    for name, spec in MODELS.items():
        assert ModelSpec(**yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())) == spec, name


def test_neox_20b_is_transformers_default_gpt_neox_shape():
    from transformers import GPTNeoXConfig

    ref, ours = GPTNeoXConfig(), models.neox_config(MODELS["neox_20b"])
    for key in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "use_parallel_residual",
        "tie_word_embeddings",
    ):
        assert getattr(ours, key) == getattr(ref, key), key
    assert ours.rope_parameters["partial_rotary_factor"] == 0.25
    assert 20.0e9 < n_params(MODELS["neox_20b"]) < 20.8e9  # "20B"


@pytest.mark.parametrize(
    "spec",
    [
        MODELS["tiny"],
        ModelSpec(arch="gpt", vocab_size=101, seq_len=16, hidden=36, heads=3, layers=2, intermediate=144),
    ],
)
def test_parameter_count_equals_the_built_model(spec):
    m = models.build(spec, {})  # no ZeRO-3 section: built whole, in this process
    assert sum(p.numel() for p in m.parameters()) == n_params(spec)


def test_tiny_is_the_quickstart_size_and_the_loss_is_next_token():
    import torch

    spec = MODELS["tiny"]
    assert 1e5 < n_params(spec) < 5e6
    m = models.build(spec, {})
    x = torch.randint(0, spec.vocab, (2, spec.seq_len))
    loss = m(x, x)
    assert loss.ndim == 0 and float(loss.detach()) > 0


def test_bad_shapes_name_the_field():
    with pytest.raises(ValueError, match="'model.heads'"):
        ModelSpec(hidden=64, heads=5).check()
    with pytest.raises(ValueError, match="'model.arch'"):
        ModelSpec(arch="llama").check()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'activation_checkpointing'"):
        models.enable_checkpointing(models.build(MODELS["tiny"], {}), "sometimes")  # type: ignore[arg-type]
