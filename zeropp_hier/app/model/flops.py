"""Model FLOPs, TFLOP/s per GCD and MFU of a training step (pure arithmetic; no torch).

[Note: model FLOPs]
Per token trained, a decoder of L layers, hidden size h and context s costs

    F = 6 N + 12 L h s

floating-point operations (forward 2 per weight and token, backward 4): N counts the weights that
take part in matrix products (every parameter but the input embedding, a lookup; the output head
counts), and 12 L h s are the attention scores and the weighted sum of values (QK^T and AV,
2 s h each per layer and token in forward, times 3 with backward; causal masking not discounted).
This is the model-FLOPs convention of PaLM (Chowdhery et al. 2022, appendix B): recomputation
under activation checkpointing is not counted, so MFU does not rise when the run recomputes.
Biases and LayerNorms are in N (a few per mille). TFLOP/s per GCD = F x tokens per step /
seconds / ranks (one rank per GCD); MFU = that / the device's dense bf16 peak.
"""

from __future__ import annotations

from typing import Mapping

# Dense bf16 peak per device that one rank drives, TFLOP/s, by a substring of the device name
# (torch.cuda.get_device_name). AMD: MI250X is 383 TFLOP/s of bf16 per package of two GCDs
# (AMD Instinct MI250X data sheet), 191.5 per GCD, and each GCD is one device to ROCm. NVIDIA:
# H100 SXM5 989 TFLOP/s dense bf16 (NVIDIA H100 data sheet; the 1979 printed there is with
# sparsity); "H100 80GB HBM3" is the SXM5 name (the PCIe card's peak is lower and not listed).
# H200 SXM 989 and H200 NVL 835.5 (NVIDIA H200 data sheet: 1979 and 1671 with sparsity); torch
# names them "NVIDIA H200" and "NVIDIA H200 NVL", so the NVL key comes first (first match wins).
PEAK_BF16_TFLOPS: dict[str, float] = {"MI250X": 191.5, "H100 80GB HBM3": 989.0, "H200 NVL": 835.5, "H200": 989.0}


def flops_per_token(params: int, input_embedding: int, layers: int, hidden: int, seq_len: int) -> float:
    """F of [Note: model FLOPs]: ``params`` all parameters, ``input_embedding`` those of the
    input embedding (vocabulary x hidden; 0 when it is tied to the output head)."""
    n = params - input_embedding
    return 6.0 * n + 12.0 * layers * hidden * seq_len


def tflops_per_gcd(flops_token: float, tokens_per_step: int, seconds: float, ranks: int) -> float:
    return flops_token * tokens_per_step / seconds / ranks / 1e12


def by_device_name(table: Mapping[str, float], device_name: str | None) -> float | None:
    """The value of the first key of ``table`` found in ``device_name``; None for a CPU
    (``None``) or a device not in the table."""
    if not device_name:
        return None
    return next((value for key, value in table.items() if key in device_name), None)


def peak_tflops(device_name: str | None) -> float | None:
    """The dense bf16 peak of the device named ``device_name`` (``by_device_name``)."""
    return by_device_name(PEAK_BF16_TFLOPS, device_name)


def mfu(tflops: float, peak: float | None) -> float | None:
    return None if peak is None else tflops / peak


def mfu_text(value: float | None, device_name: str | None) -> str:
    if value is not None:
        return f"MFU {100 * value:.1f}%"
    return "MFU n/a on CPU" if not device_name else f"MFU n/a (no bf16 peak known for {device_name})"
