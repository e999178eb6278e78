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

[Note: block rotation]
Optional, per call: ``rotate = R`` (0 = off, the format above byte for byte; else a power of two,
2 <= R <= B, R dividing B). Quantize first rotates the zero-padded fp32 block vector: each
consecutive group of R elements is multiplied by the orthonormal Walsh-Hadamard matrix
H_R / sqrt(R), computed as
- the in-place butterfly, for h = 1, 2, 4, ..., R/2 in that order: for every i in the group with
  bit h clear, ``(x[i], x[i+h]) <- (x[i] + x[i+h], x[i] - x[i+h])`` (one fp32 add / subtract
  each, no multiply, so nothing can be contracted into an FMA);
- then ONE fp32 multiply of every element by the fp32 constant ``float32(1 / sqrt(R))`` (for
  odd log2(R) that constant is rounded; it is the same rounded value everywhere).
The fixed order of these exact-rounding operations makes the result identical on every
backend. Scales and codes are then computed from the rotated block as above (the payload layout
is unchanged; the rotation size is not stored in it: both ends take it from the policy).
Dequantize computes ``float32(q) * scale`` (saturated as above) in fp32, applies the same
transform (normalised H is its own inverse, so this undoes the rotation up to rounding), and
only then casts to the requested dtype. The tail padding takes part in the rotation, so the
padded elements of a rotated block generally dequantize to small non-zero values; they are
dropped, as always.
Rotation mixes only within a block, so a non-finite block stays non-finite: its NaN scale makes
every dequantized value NaN, and the transform of NaNs is NaN (never finite); a finite block is
finite after rotation, except that the butterfly's sums of up to R values can overflow to Inf
when |x| is within a factor R of FLT_MAX: quantize then marks the block NaN like any Inf input,
and dequantize gives Inf/NaN there (not saturated; never a wrong finite value). Gradients and
weights are ~30 orders of magnitude below that.
Fused sums with rotation R: the transform is linear, so the k parts are dequantized to fp32
WITHOUT de-rotation, summed in the rotated domain in list order, and the sum is de-rotated once
(dequantize_sum) or, when the output uses the same R and the same block size, requantized
directly without de-rotating and re-rotating (dequantize_sum_requantize). Any other output
rotation (including 0) de-rotates the sum, then quantizes it with the output rotation. So the
fused results equal the unfused composition up to the rounding of one transform, not bit for
bit; the reference below defines the bits.
"""

from __future__ import annotations

import math
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


def inv_sqrt(rotate: int) -> float:
    """The fp32 normalising constant of H_R: float32(1 / sqrt(R)) (exact for even log2 R)."""
    return float(torch.tensor(1.0 / math.sqrt(rotate), dtype=torch.float32))


def hadamard_(x: torch.Tensor, rotate: int) -> torch.Tensor:
    """In place on fp32 ``x`` (numel a multiple of ``rotate``): each group of ``rotate``
    consecutive elements times H_R / sqrt(R), in the butterfly order of [Note: block rotation].
    Returns ``x``. ``rotate`` 0 (or 1) leaves it unchanged."""
    if rotate <= 1:
        return x
    g = x.view(-1, rotate)
    h = 1
    while h < rotate:
        v = g.view(-1, rotate // (2 * h), 2, h)
        a = v[:, :, 0, :].clone()
        b = v[:, :, 1, :]
        v[:, :, 0, :] = a + b
        v[:, :, 1, :] = a - b
        h *= 2
    x.mul_(inv_sqrt(rotate))
    return x


def rotate_ok(rotate: object, block_size: int) -> bool:
    """The rule for R: 0 (off) or a power of two from 2 to block_size (hence dividing it)."""
    return (
        isinstance(rotate, int)
        and not isinstance(rotate, bool)
        and (rotate == 0 or (2 <= rotate <= block_size and rotate & (rotate - 1) == 0))
    )


def check_rotate(rotate: int, block_size: int) -> None:
    """rotate must satisfy ``rotate_ok``."""
    if not rotate_ok(rotate, block_size):
        raise ValueError(
            f"argument 'rotate' must be 0 (off) or a power of two from 2 to block_size={block_size}, got {rotate!r}"
        )


def quantize(x: torch.Tensor, bits: int, block_size: int, rotate: int = 0) -> Quantized:
    """See [Note: quantization format]; ``rotate`` > 0: [Note: block rotation]."""
    check_rotate(rotate, block_size)
    n = x.numel()
    nb = num_blocks(n, block_size)
    flat = torch.zeros(nb * block_size, dtype=torch.float32, device=x.device)
    flat[:n] = x.reshape(-1).to(torch.float32)
    return _quantize_fp32(hadamard_(flat, rotate), n, bits, block_size)


def _quantize_fp32(flat: torch.Tensor, n: int, bits: int, block_size: int) -> Quantized:
    """The padded fp32 vector flat [nblocks * B] (already rotated) -> payload of n elements."""
    qmax = QMAX[bits]
    nb = flat.numel() // block_size
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


def values(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 float32(code) * scale, saturated (NaN stays NaN): the one dequantize arithmetic;
    ``scales`` broadcast against ``codes``."""
    return (codes.to(torch.float32) * scales).clamp_(-FLT_MAX, FLT_MAX)


def _dequantize_padded(q: Quantized) -> torch.Tensor:
    """fp32 [nblocks * B]: float32(q) * scale, saturated; still in the rotated domain."""
    vals = unpack_int4(q.data) if q.bits == 4 else q.data
    return values(vals.view(-1, q.block_size), q.scales.view(-1, 1)).view(-1)


def dequantize(q: Quantized, dtype: torch.dtype = torch.float32, rotate: int = 0) -> torch.Tensor:
    """``rotate``: the rotation the payload was quantized with ([Note: block rotation])."""
    check_rotate(rotate, q.block_size)
    return hadamard_(_dequantize_padded(q), rotate)[: q.numel].to(dtype)


def _sum_rotated(parts: list[Quantized]) -> torch.Tensor:
    """fp32 [nblocks * B]: the parts' padded dequantized values summed in list order from +0.0,
    not de-rotated (the transform is linear)."""
    p0 = parts[0]
    acc = torch.zeros(num_blocks(p0.numel, p0.block_size) * p0.block_size, dtype=torch.float32, device=p0.data.device)
    for p in parts:
        acc += _dequantize_padded(p)
    return acc


def dequantize_sum(parts: list[Quantized], dtype: torch.dtype = torch.float32, rotate: int = 0) -> torch.Tensor:
    """Sum of k dequantized payloads, accumulated in fp32 in list order, then cast. With
    ``rotate``: summed in the rotated domain, then de-rotated once."""
    check_rotate(rotate, parts[0].block_size)
    if rotate == 0:
        acc = torch.zeros(parts[0].numel, dtype=torch.float32, device=parts[0].data.device)
        for p in parts:
            acc += dequantize(p, torch.float32)
        return acc.to(dtype)
    return hadamard_(_sum_rotated(parts), rotate)[: parts[0].numel].to(dtype)


def dequantize_sum_requantize(
    parts: list[Quantized], bits: int, block_size: int, rotate: int = 0, out_rotate: int = 0
) -> Quantized:
    """Quantize the fp32 sum of k payloads (the step between reduce-scatter hops). ``rotate``:
    the parts' rotation; ``out_rotate``: the output's. The same non-zero rotation and block
    size on both sides requantizes the rotated-domain sum directly."""
    p0 = parts[0]
    check_rotate(rotate, p0.block_size)
    check_rotate(out_rotate, block_size)
    if rotate and rotate == out_rotate and block_size == p0.block_size:
        return _quantize_fp32(_sum_rotated(parts), p0.numel, bits, block_size)
    return quantize(dequantize_sum(parts, torch.float32, rotate), bits, block_size, out_rotate)
