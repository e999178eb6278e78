"""Block quantization for the compressed collectives.

The format is defined by ``reference.py`` ([Note: quantization format]). These functions have
the reference's signatures and results, and run the compiled kernels (hip_kernels/, loaded as
``zeropp_hier._C``) when they exist for the tensor's device; otherwise the reference, after one
logged warning saying why and how to build. Both paths give the same bytes.

Non-finite input is never hidden: a block holding NaN/Inf gets a NaN scale and dequantizes to
NaN; ``nonfinite_blocks`` reports which blocks they are.
"""

from __future__ import annotations

from typing import Sequence, Union

import torch

from . import _checks, _ext, reference
from ._checks import QuantArgumentError, QuantDtypeError
from .reference import QMAX, Quantized, num_blocks, unpack_int4

# A list of k payloads of the same shape, or one "stacked" payload whose data is [k, bytes]
# and scales [k, nblocks] (e.g. an all-to-all receive buffer, passed without copies).
Parts = Union[Sequence[Quantized], Quantized]

__all__ = [
    "Quantized",
    "quantize",
    "dequantize",
    "dequantize_columns",
    "dequantize_sum",
    "dequantize_sum_requantize",
    "nonfinite_blocks",
    "backend",
    "num_blocks",
    "unpack_int4",
    "QMAX",
    "QuantArgumentError",
    "QuantDtypeError",
]


def backend(device: Union[torch.device, str, None] = None) -> str:
    """Which implementation serves tensors on ``device``: "cpu-ext", "hip", "cuda" or
    "reference". Without a device: the accelerator if torch has one, else the CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if not _ext.has_kernels_for(device):
        return "reference"
    if device.type == "cpu":
        return "cpu-ext"
    return "hip" if _ext.status().build_info == "cpu+hip" else "cuda"


def kernel_info(device: Union[torch.device, str, None] = None) -> str:
    """``backend(device)``, with the CPU kernels' instruction-set variant when they serve it
    (e.g. "cpu-ext/avx2"): what a job log should say it ran."""
    name = backend(device)
    if name == "cpu-ext":
        name += "/" + torch.ops.zeropp_hier.cpu_isa()
    return name


def _use_ext(device: torch.device) -> bool:
    if _ext.has_kernels_for(device):
        return True
    _ext.warn_fallback(device.type)
    return False


def quantize(x: torch.Tensor, bits: int, block_size: int, rotate: int = 0) -> Quantized:
    """x: any shape, fp32/fp16/bf16, read as a flat vector. Returns data int8 [nblocks*B]
    (bits=8) or uint8 [nblocks*B/2] (bits=4) and fp32 scales [nblocks]. ``rotate``: the
    Hadamard rotation size R, 0 for none ([Note: block rotation]); the payload does not record
    it, so dequantize with the same R."""
    _checks.check_tensor("x", x)
    _checks.check_float_dtype("x", x.dtype)
    _checks.check_bits("bits", bits)
    _checks.check_block_size("block_size", block_size)
    _checks.check_rotate("rotate", rotate, block_size)
    x = x.detach()
    if not _use_ext(x.device):
        return reference.quantize(x, bits, block_size, rotate)
    data, scales = torch.ops.zeropp_hier.quantize(x.contiguous().view(-1), bits, block_size, rotate)
    return Quantized(data, scales, x.numel(), bits, block_size)


def dequantize(q: Quantized, dtype: torch.dtype = torch.float32, rotate: int = 0) -> torch.Tensor:
    """Returns [q.numel] of ``dtype``; NaN for the elements of non-finite blocks. ``rotate``:
    the R ``q`` was quantized with."""
    _check_quantized("q", q)
    _checks.check_payload("q", q.data, q.scales, q.numel, q.bits, q.block_size, stacked=False)
    _checks.check_float_dtype("dtype", dtype)
    _checks.check_rotate("rotate", rotate, q.block_size)
    if not _use_ext(q.data.device):
        return reference.dequantize(q, dtype, rotate)
    return torch.ops.zeropp_hier.dequantize(
        q.data.contiguous(), q.scales.contiguous(), q.numel, q.bits, q.block_size, dtype, rotate
    )


# [Note: decoding a few columns]
# A gathered bucket is rows of whole blocks, one row per rank, and a tensor is a column range
# of every row. When the world is large against the bucket, a row holds a few values and the
# rest is padding up to one block (a LayerNorm of 256 elements over 75,264 ranks: one value
# in a row of 32 or 256). Dequantizing the whole rows then costs the padding: 19.3 M values
# for 75 k at 9,408 nodes. ``dequantize_columns`` decodes only the columns a tensor uses, by
# the reference's arithmetic (the product, the saturation, the cast: what every backend
# computes), so it gives the bytes that dequantizing the whole rows and slicing gives. A
# rotated payload is decoded whole: its rotation mixes the values of a block.


def dequantize_columns(
    data: torch.Tensor, scales: torch.Tensor, bits: int, block_size: int, a: int, b: int, dtype: torch.dtype
) -> torch.Tensor:
    """Columns [a, b) of unrotated rows, dequantized: ``data`` [R, S bytes] (S elements per
    row, whole ``block_size`` blocks; two int4 per byte), ``scales`` [R, S / block_size] ->
    [R, b - a] of ``dtype``, contiguous; equal to dequantizing every row and slicing
    ([Note: decoding a few columns])."""
    _checks.check_bits("bits", bits)
    _checks.check_block_size("block_size", block_size)
    _checks.check_float_dtype("dtype", dtype)
    if bits == 8:
        codes = data[:, a:b]
    else:  # the bytes that hold columns [a, b), unpacked, then the columns
        lo, hi = a // 2, (b + 1) // 2
        codes = unpack_int4(data[:, lo:hi].reshape(-1)).view(data.shape[0], -1)[:, a - 2 * lo : b - 2 * lo]
    first, last = a // block_size, (b - 1) // block_size
    if first == last:  # one block: one scale per row
        s = scales[:, first : first + 1]
    else:
        s = scales.index_select(1, torch.arange(a, b, device=scales.device) // block_size)
    return reference.values(codes, s).to(dtype)


def dequantize_sum(parts: Parts, dtype: torch.dtype = torch.float32, rotate: int = 0) -> torch.Tensor:
    """Sum of k dequantized payloads, in fp32 in part order, cast to ``dtype``: [numel]. The k
    full-precision payloads are never materialised. ``rotate``: the parts' R; rotated parts are
    summed in the rotated domain and rotated back once ([Note: block rotation])."""
    _checks.check_float_dtype("dtype", dtype)
    data, scales, like = _stacked(parts)
    _checks.check_rotate("rotate", rotate, like.block_size)
    if not _use_ext(data.device):
        return reference.dequantize_sum(_unstacked(data, scales, like), dtype, rotate)
    return torch.ops.zeropp_hier.dequantize_sum(data, scales, like.numel, like.bits, like.block_size, dtype, rotate)


def dequantize_sum_requantize(
    parts: Parts, bits: int, block_size: int, rotate: int = 0, out_rotate: int = 0
) -> Quantized:
    """quantize(dequantize_sum(parts, fp32), bits, block_size) in one pass, for the step between
    reduce-scatter hops. A non-finite part, or an fp32 overflow of the sum, marks the block.
    ``rotate`` / ``out_rotate``: the parts' and the output's R; equal non-zero R with equal
    block sizes requantize the rotated-domain sum without rotating back and forth."""
    _checks.check_bits("bits", bits)
    _checks.check_block_size("block_size", block_size)
    _checks.check_rotate("out_rotate", out_rotate, block_size)
    data, scales, like = _stacked(parts)
    _checks.check_rotate("rotate", rotate, like.block_size)
    if not _use_ext(data.device):
        return reference.dequantize_sum_requantize(
            _unstacked(data, scales, like), bits, block_size, rotate, out_rotate
        )
    out_data, out_scales = torch.ops.zeropp_hier.dequantize_sum_requantize(
        data, scales, like.numel, like.bits, like.block_size, bits, block_size, rotate, out_rotate
    )
    return Quantized(out_data, out_scales, like.numel, bits, block_size)


def nonfinite_blocks(q: Quantized) -> torch.Tensor:
    """bool [nblocks] ([k, nblocks] for a stacked payload): True where the block held NaN/Inf
    (its scale is NaN). ``nonfinite_blocks(q).any()`` is the check before using a result."""
    _check_quantized("q", q)
    return torch.isnan(q.scales)


# ---- helpers ------------------------------------------------------------------------------


def _check_quantized(arg: str, q) -> None:
    if not isinstance(q, Quantized):
        raise QuantDtypeError(f"argument '{arg}' must be a Quantized, got {type(q).__name__}")


def _stacked(parts: Parts) -> tuple[torch.Tensor, torch.Tensor, Quantized]:
    """parts -> (data [k, bytes], scales [k, nblocks], first part as the shape template),
    checked. Rows already evenly spaced in one buffer are viewed, not copied."""
    if isinstance(parts, Quantized):
        _checks.check_payload(
            "parts", parts.data, parts.scales, parts.numel, parts.bits, parts.block_size, stacked=True
        )
        return parts.data, parts.scales, parts
    if not isinstance(parts, (list, tuple)) or not parts:
        raise QuantArgumentError(
            f"argument 'parts' must be a non-empty list of Quantized or one stacked Quantized, got {parts!r:.80}"
        )
    first = parts[0]
    for i, p in enumerate(parts):
        _check_quantized(f"parts[{i}]", p)
        _checks.check_payload(f"parts[{i}]", p.data, p.scales, p.numel, p.bits, p.block_size, stacked=False)
        if (p.numel, p.bits, p.block_size) != (first.numel, first.bits, first.block_size):
            raise QuantArgumentError(
                f"argument 'parts[{i}]' has (numel, bits, block_size) = "
                f"{(p.numel, p.bits, p.block_size)} but parts[0] has "
                f"{(first.numel, first.bits, first.block_size)}"
            )
        if p.data.device != first.data.device:
            raise QuantArgumentError(
                f"argument 'parts[{i}]' is on {p.data.device} but parts[0] on {first.data.device}"
            )
    data = _rows([p.data for p in parts])
    scales = _rows([p.scales for p in parts])
    return data, scales, first


def _rows(ts: list[torch.Tensor]) -> torch.Tensor:
    """k 1-D tensors of one size -> [k, size]: a strided view when they are contiguous rows at
    a constant non-negative spacing in one storage (a receive buffer's rows), else a copy."""
    first = ts[0]
    if len(ts) == 1:
        return first.contiguous().unsqueeze(0)
    if all(t.is_contiguous() for t in ts):
        base = first.untyped_storage().data_ptr()
        step = ts[1].storage_offset() - first.storage_offset()
        if step >= 0 and all(
            t.untyped_storage().data_ptr() == base and t.storage_offset() == first.storage_offset() + i * step
            for i, t in enumerate(ts)
        ):
            return first.as_strided((len(ts), first.numel()), (step, 1))
    return torch.stack([t.contiguous() for t in ts])


def _unstacked(data: torch.Tensor, scales: torch.Tensor, like: Quantized) -> list[Quantized]:
    return [Quantized(data[j], scales[j], like.numel, like.bits, like.block_size) for j in range(data.shape[0])]
