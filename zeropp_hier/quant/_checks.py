"""Argument checks shared by the public quantization API and the ops' fake implementations.

Every error names the argument, the value and what is allowed, and is a ValueError or TypeError
subclass so callers can catch either the specific or the built-in type.
"""

from __future__ import annotations

import torch

from .reference import QMAX, SUPPORTED_INPUT_DTYPES, num_blocks, rotate_ok

MIN_BLOCK, MAX_BLOCK = 32, 4096


class QuantArgumentError(ValueError):
    """A quantization argument has a value the format does not allow."""


class QuantDtypeError(TypeError):
    """A quantization argument has the wrong type or dtype."""


def _dtype_names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(arg: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise QuantDtypeError(f"argument '{arg}' must be a torch.Tensor, got {type(t).__name__}")


def check_float_dtype(arg: str, dtype) -> None:
    if dtype not in SUPPORTED_INPUT_DTYPES:
        raise QuantDtypeError(f"argument '{arg}' must be one of {_dtype_names(SUPPORTED_INPUT_DTYPES)}, got {dtype}")


def check_bits(arg: str, bits) -> None:
    if isinstance(bits, bool) or bits not in QMAX:
        raise QuantArgumentError(f"argument '{arg}' must be 8 or 4, got {bits!r}")


def check_block_size(arg: str, block_size) -> None:
    ok = (
        isinstance(block_size, int)
        and not isinstance(block_size, bool)
        and MIN_BLOCK <= block_size <= MAX_BLOCK
        and block_size & (block_size - 1) == 0
    )
    if not ok:
        raise QuantArgumentError(
            f"argument '{arg}' must be a power of two from {MIN_BLOCK} to {MAX_BLOCK}, got {block_size!r}"
        )


def check_rotate(arg: str, rotate, block_size: int) -> None:
    """[Note: block rotation]: 0 (off) or a power of two from 2 to the block size (the
    reference's rule, ``reference.rotate_ok``)."""
    if not rotate_ok(rotate, block_size):
        raise QuantArgumentError(
            f"argument '{arg}' must be 0 (off) or a power of two from 2 to the block size {block_size}, got {rotate!r}"
        )


def payload_bytes(numel: int, bits: int, block_size: int) -> int:
    """Bytes of quantized data for numel elements, padding included."""
    padded = num_blocks(numel, block_size) * block_size
    return padded if bits == 8 else padded // 2


def check_payload(
    arg: str, data: torch.Tensor, scales: torch.Tensor, numel: int, bits: int, block_size: int, stacked: bool
) -> None:
    """data [bytes] / scales [nblocks] (or [k, bytes] / [k, nblocks] when stacked) must hold a
    payload of numel elements in the (bits, block_size) format."""
    check_bits(f"{arg}.bits", bits)
    check_block_size(f"{arg}.block_size", block_size)
    check_tensor(f"{arg}.data", data)
    check_tensor(f"{arg}.scales", scales)
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise QuantArgumentError(f"argument '{arg}.numel' must be an int >= 0, got {numel!r}")
    want = torch.int8 if bits == 8 else torch.uint8
    if data.dtype != want:
        raise QuantDtypeError(f"argument '{arg}.data' must have dtype {want} for bits={bits}, got {data.dtype}")
    if scales.dtype != torch.float32:
        raise QuantDtypeError(f"argument '{arg}.scales' must have dtype torch.float32, got {scales.dtype}")
    if data.device != scales.device:
        raise QuantArgumentError(f"argument '{arg}': data is on {data.device} but scales on {scales.device}")
    rank = 2 if stacked else 1
    nbytes, nblocks = payload_bytes(numel, bits, block_size), num_blocks(numel, block_size)
    if data.dim() != rank or data.shape[-1] != nbytes:
        raise QuantArgumentError(
            f"argument '{arg}.data' must have shape {'[k, ' if stacked else '['}{nbytes}] for "
            f"numel={numel}, bits={bits}, block_size={block_size}, got {list(data.shape)}"
        )
    if scales.dim() != rank or scales.shape[-1] != nblocks:
        raise QuantArgumentError(
            f"argument '{arg}.scales' must have shape {'[k, ' if stacked else '['}{nblocks}] for "
            f"numel={numel}, block_size={block_size}, got {list(scales.shape)}"
        )
    if stacked and scales.shape[0] != data.shape[0]:
        raise QuantArgumentError(
            f"argument '{arg}': data stacks {data.shape[0]} payloads but scales {scales.shape[0]}"
        )
