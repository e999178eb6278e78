"""Pure-PyTorch reference of the block-quantization format.

[Note: quantization format]
This module *defines* the wire format; every compiled backend (hip_kernels/) must produce the
same bytes.

- The input is read as a flat vector of n elements in its own dtype (fp32, fp16 or bf16) and
  converted exactly to fp32. It is cut into ceil(n / B) blocks of B elements (B a power of two,
  32..4096); the tail block is padded with zeros.
- One fp32 scale per block: ``scale = absmax(block) / qmax`` with qmax = 127 (int8) or 7 (int4),
  computed as an fp32 division. Only when that quotient is subnormal (or 0) and
  ``scale * qmax < absmax`` is the scale stepped up to the next float: a rounded-down subnormal
  scale (few significant bits) would make the largest values clamp with an error far beyond
  scale/2, and a quotient below 2^-150 would lose the block entirely.
- Values: ``q = clamp(round_half_even(x / scale), -qmax, qmax)`` (fp32 division). A block whose
  absmax is 0 is all zeros.
- int8 data: one int8 per element, ``nblocks * B`` elements (padding included).
  int4 data: two's-complement nibbles, element 2i in the low nibble and 2i+1 in the high
  nibble of byte i, stored as uint8, ``nblocks * B / 2`` bytes.
- A block holding any NaN or Inf gets scale = NaN and q = 0, so its dequantized values are all
  NaN: non-finite input is carried through as non-finite, never turned into finite numbers.
- Dequantize: ``x = float32(q) * scale``, saturated to +-FLT_MAX (near FLT_MAX the rounded
  scale times qmax can round past it; finite input must not come back as Inf), then cast to the
  requested dtype (round to nearest even; values beyond fp16's range become Inf, as any cast).
  Dequantized NaN is NaN; its payload bits are not part of the format.
- Fused sum of k payloads: each dequantized to fp32 as above and accumulated in fp32 in list
  order, starting from +0.0; the requantizing variant quantizes that fp32 sum (any block size /
  bits), so a NaN/Inf in any part, or an fp32 overflow of the sum, marks the output block.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

QMAX = {8: 127, 4: 7}
FLT_MAX = torch.finfo(torch.float32).max
FLT_MIN = torch.finfo(torch.float32).tiny  # smallest normal fp32
SUPPORTED_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Quantized(NamedTuple):
    data: torch.Tensor  # int8 [nblocks*B] (bits=8) or uint8 [nblocks*B/2] (bits=4)
    scales: torch.Tensor  # fp32 [nblocks]
    numel: int  # elements before padding
    bits: int
    block_size: int

    def nbytes(self) -> int:
        """Bytes a collective moves for this payload: data plus scales."""
        return self.data.numel() * self.data.element_size() + self.scales.numel() * 4


def num_blocks(numel: int, block_size: int) -> int:
    return -(-numel // block_size)


def quantize(x: torch.Tensor, bits: int, block_size: int) -> Quantized:
    qmax = QMAX[bits]
    n = x.numel()
    nb = num_blocks(n, block_size)
    flat = torch.zeros(nb * block_size, dtype=torch.float32, device=x.device)
    flat[:n] = x.reshape(-1).to(torch.float32)
    blocks = flat.view(nb, block_size)
    finite = torch.isfinite(blocks).all(dim=1, keepdim=True)
    safe = torch.where(finite, blocks, torch.zeros_like(blocks))
    absmax = safe.abs().amax(dim=1, keepdim=True)
    scale = absmax / qmax
    undershoot = (scale < FLT_MIN) & (scale * qmax < absmax)
    scale = torch.where(undershoot, torch.nextafter(scale, torch.full_like(scale, float("inf"))), scale)
    nonzero = scale > 0
    q = torch.where(
        nonzero, torch.round(safe / torch.where(nonzero, scale, torch.ones_like(scale))), torch.zeros_like(safe)
    )
    q = q.clamp_(-qmax, qmax).to(torch.int8)
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    if bits == 4:
        pairs = q.view(-1, 2).to(torch.int16) & 0xF
        data = (pairs[:, 0] | (pairs[:, 1] << 4)).to(torch.uint8)
    else:
        data = q.view(-1)
    return Quantized(data, scale.view(-1), n, bits, block_size)


def unpack_int4(data: torch.Tensor) -> torch.Tensor:
    """uint8 [m] -> int8 [2m], sign-extending each nibble."""
    d = data.to(torch.int16)
    lo = d & 0xF
    hi = (d >> 4) & 0xF
    both = torch.stack([lo, hi], dim=1).view(-1)
    return torch.where(both >= 8, both - 16, both).to(torch.int8)


def dequantize(q: Quantized, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    vals = unpack_int4(q.data) if q.bits == 4 else q.data
    out = vals.view(-1, q.block_size).to(torch.float32) * q.scales.view(-1, 1)
    out = out.clamp_(-FLT_MAX, FLT_MAX)  # NaN stays NaN
    return out.view(-1)[: q.numel].to(dtype)


def dequantize_sum(parts: list[Quantized], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sum of k dequantized payloads, accumulated in fp32 in list order, then cast."""
    acc = torch.zeros(parts[0].numel, dtype=torch.float32, device=parts[0].data.device)
    for p in parts:
        acc += dequantize(p, torch.float32)
    return acc.to(dtype)


def dequantize_sum_requantize(parts: list[Quantized], bits: int, block_size: int) -> Quantized:
    """Quantize the fp32 sum of k payloads (the step between reduce-scatter hops)."""
    return quantize(dequantize_sum(parts, torch.float32), bits, block_size)
