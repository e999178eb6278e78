"""Model FLOPs, TFLOP/s per GCD and MFU (zeropp_hier.app.model.flops): the formula against torch's own
FLOP counter on a real GPT-NeoX, and the peaks by device name."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from zeropp_hier.app.model import flops, models
from zeropp_hier.app.spec import MODELS, ModelSpec, input_embedding_params, n_params


def test_formula_equals_torchs_count_of_a_training_step():
    from transformers import GPTNeoXForCausalLM

    spec = ModelSpec(vocab_size=256, seq_len=64, hidden=128, heads=4, layers=2, intermediate=512)
    torch.manual_seed(0)
    # eager attention: its score and value products are plain matmuls that the counter sees
    lm = GPTNeoXForCausalLM._from_config(models.neox_config(spec), attn_implementation="eager")
    m = models.CausalLM(lm, spec)
    x = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
    with FlopCounterMode(display=False) as counter:
        m(x, x).backward()
    counted = counter.get_total_flops()
    per_token = flops.flops_per_token(
        n_params(spec), input_embedding_params(spec), spec.layers, spec.hidden, spec.seq_len
    )
    # the formula counts biases and LayerNorm weights as 6 FLOPs each; the counter only matmuls
    assert counted <= per_token * x.numel() <= counted * 1.01
    # and the attention term is what separates the two: without it the formula falls short
    assert (per_token - 12 * spec.layers * spec.hidden * spec.seq_len) * x.numel() < counted


def test_20b_on_frontier_arithmetic():
    spec = MODELS["neox_20b"]
    f = flops.flops_per_token(n_params(spec), input_embedding_params(spec), 44, 6144, 2048)
    # 6 x 20.2e9 non-embedding-lookup weights + 12 x 44 x 6144 x 2048 (~5%)
    assert 1.25e11 < f < 1.30e11
    # 48 nodes x 8 GCDs, 4M tokens per step in 60 s
    t = flops.tflops_per_gcd(f, 4 * 2**20, 60.0, 384)
    assert t == pytest.approx(f * 4 * 2**20 / 60 / 384 / 1e12)
    assert flops.mfu(t, flops.peak_tflops("AMD Instinct MI250X")) == pytest.approx(t / 191.5)


@pytest.mark.parametrize(
    "name, peak",
    [
        ("AMD Instinct MI250X", 191.5),  # ROCm's name for one GCD
        ("AMD Instinct MI250X / MI250", 191.5),
        ("NVIDIA H100 80GB HBM3", 989.0),  # the SXM5 part
        ("NVIDIA H200", 989.0),  # the SXM part
        ("NVIDIA H200 NVL", 835.5),
        ("NVIDIA A100-SXM4-80GB", None),
        (None, None),
    ],
)
def test_peaks_by_device_name(name, peak):
    assert flops.peak_tflops(name) == peak


def test_mfu_text_says_why_there_is_none():
    assert flops.mfu_text(None, None) == "MFU n/a on CPU"
    assert "A100" in flops.mfu_text(None, "NVIDIA A100-SXM4-80GB")
    assert flops.mfu_text(0.4123, "AMD Instinct MI250X") == "MFU 41.2%"
