"""The compiled kernels: loading ``zeropp_hier._C`` and the ops' fake implementations.

``zeropp_hier._C`` is built from hip_kernels/ by setup.py (hip_kernels/build.py). It is a plain
shared library whose static initialisers register the ``torch.ops.zeropp_hier`` ops (see
hip_kernels/bindings.cpp); it has no Python module init, so it is loaded with
``torch.ops.load_library`` from the package's own directory (see ``load``).

When none is installed (or it does not load, e.g. built for another torch), the first use builds
the same library into a cache (_jit.py) and loads that. A failed build stops the process with the
compiler's last lines and the command that builds the kernels ahead; only with
``ZEROPP_HIER_ALLOW_REFERENCE=1`` does it fall back to the slow reference, after one warning.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import logging
import os
import threading
from typing import NamedTuple, Optional

import torch

from . import _checks, _jit
from .reference import num_blocks

log = logging.getLogger("zeropp_hier.quant")

EXT_MODULE = "zeropp_hier._C"
BUILD_HINT = (
    "build them with `pip install --no-build-isolation -e .` in the repository root "
    "(a CPU torch builds the CPU kernels; a ROCm or CUDA torch adds the GPU ones)"
)
ALLOW_REFERENCE_ENV = "ZEROPP_HIER_ALLOW_REFERENCE"


class ExtStatus(NamedTuple):
    loaded: bool
    build_info: str  # "cpu", "cpu+hip" or "cpu+cuda" when loaded
    reason: str  # why it is not loaded, else ""
    origin: str = ""  # the shared library loaded: the installed one or the first-use build's


_LOAD_LOCK = threading.Lock()  # fake impls may be registered only once per process
_BUILD_ERROR: Optional[_jit.KernelBuildError] = None  # raised again on every later call


def status() -> ExtStatus:
    """Loads the extension once per process (building it on first use when none is installed)."""
    with _LOAD_LOCK:
        if _BUILD_ERROR is not None:
            raise _BUILD_ERROR
        return _load_and_register()


@functools.cache
def _load_and_register() -> ExtStatus:
    st = load(EXT_MODULE)
    if not st.loaded:
        st = _build_on_first_use(st.reason)
    if st.loaded:
        _register_fakes()
    return st


def _build_on_first_use(why: str) -> ExtStatus:
    global _BUILD_ERROR
    try:
        path = _jit.build_and_load(why)
    except _jit.KernelBuildError as exc:
        if os.environ.get(ALLOW_REFERENCE_ENV) != "1":
            _BUILD_ERROR = exc
            raise
        return ExtStatus(False, "", f"{why}, and building it on first use failed ({str(exc).splitlines()[0]})")
    return ExtStatus(True, torch.ops.zeropp_hier.build_info(), "", path)


def load(module: str) -> ExtStatus:
    """Loads the shared library built for ``module`` (a dotted name) in its own package's directory.

    Only the package's own directory counts: an editable install's finder also answers for
    ``zeropp_hier._C`` from the tree it was installed from, so ``find_spec`` could hand this
    checkout another checkout's kernels, built from other sources.
    """
    package, _, name = module.rpartition(".")
    try:
        dirs = list(importlib.import_module(package).__path__)
    except (ImportError, AttributeError) as exc:  # a parent package is missing or is a module
        return ExtStatus(False, "", f"{module} cannot be found ({exc})")
    found = [
        os.path.join(d, name + suffix)
        for d in dirs
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if os.path.isfile(os.path.join(d, name + suffix))
    ]
    if not found:
        return ExtStatus(False, "", f"{module} is not built")
    try:
        torch.ops.load_library(found[0])
    except OSError as exc:  # e.g. built against another torch: undefined symbols
        return ExtStatus(False, "", f"{found[0]} could not be loaded ({exc})")
    return ExtStatus(True, torch.ops.zeropp_hier.build_info(), "", found[0])


def has_kernels_for(device: torch.device) -> bool:
    st = status()
    if not st.loaded:
        return False
    if device.type == "cpu":
        return True
    return device.type == "cuda" and st.build_info in ("cpu+hip", "cpu+cuda")


@functools.cache
def warn_fallback(device_type: str) -> None:
    """One warning per process and device type: the fallback is slow and must not be silent."""
    st = status()
    if st.loaded:
        why = f"{EXT_MODULE} was built without kernels for {device_type} tensors ({st.build_info})"
    else:
        why = st.reason
    log.warning(
        "zeropp_hier.quant: using the pure-PyTorch reference quantization for %s tensors (much slower): %s; %s.",
        device_type,
        why,
        BUILD_HINT,
    )


def _register_fakes() -> None:
    """Output shapes without running kernels (meta tensors, FakeTensorMode, torch.compile)."""

    def empty_payload(like: torch.Tensor, numel: int, bits: int, block_size: int):
        data = like.new_empty(
            _checks.payload_bytes(numel, bits, block_size), dtype=torch.int8 if bits == 8 else torch.uint8
        )
        return data, like.new_empty(num_blocks(numel, block_size), dtype=torch.float32)

    @torch.library.register_fake("zeropp_hier::quantize")
    def _quantize_fake(x, bits, block_size, rotate=0):
        _checks.check_float_dtype("x", x.dtype)
        _checks.check_bits("bits", bits)
        _checks.check_block_size("block_size", block_size)
        _checks.check_rotate("rotate", rotate, block_size)
        return empty_payload(x, x.numel(), bits, block_size)

    @torch.library.register_fake("zeropp_hier::dequantize")
    def _dequantize_fake(data, scales, numel, bits, block_size, dtype, rotate=0):
        _checks.check_payload("q", data, scales, numel, bits, block_size, stacked=False)
        _checks.check_float_dtype("dtype", dtype)
        _checks.check_rotate("rotate", rotate, block_size)
        return data.new_empty(numel, dtype=dtype)

    @torch.library.register_fake("zeropp_hier::dequantize_sum")
    def _dequantize_sum_fake(data, scales, numel, bits, block_size, dtype, rotate=0):
        _checks.check_payload("parts", data, scales, numel, bits, block_size, stacked=True)
        _checks.check_float_dtype("dtype", dtype)
        _checks.check_rotate("rotate", rotate, block_size)
        return data.new_empty(numel, dtype=dtype)

    @torch.library.register_fake("zeropp_hier::dequantize_sum_requantize")
    def _dequantize_sum_requantize_fake(
        data, scales, numel, bits, block_size, out_bits, out_block_size, rotate=0, out_rotate=0
    ):
        _checks.check_payload("parts", data, scales, numel, bits, block_size, stacked=True)
        _checks.check_bits("out_bits", out_bits)
        _checks.check_block_size("out_block_size", out_block_size)
        _checks.check_rotate("rotate", rotate, block_size)
        _checks.check_rotate("out_rotate", out_rotate, out_block_size)
        return empty_payload(data, numel, out_bits, out_block_size)
