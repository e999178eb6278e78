"""Extension modules for the quantization kernels, for the torch that is installed.

setup.py calls ``extension_modules()``; hip_kernels/ is not a package, so import this file by
path, e.g.::

    spec = importlib.util.spec_from_file_location("hip_kernels_build", "hip_kernels/build.py")
    build = importlib.util.module_from_spec(spec); spec.loader.exec_module(build)
    setup(..., ext_modules=build.extension_modules(),
          cmdclass={"build_ext": torch.utils.cpp_extension.BuildExtension})

The extension is ``zeropp_hier._C``:
- CPU torch  -> CppExtension: bindings + ops + OpenMP CPU loops.
- CUDA torch -> CUDAExtension: the above + quant_kernels.hip compiled by nvcc (through the
  one-line quant_kernels_cuda.cu, since torch hands only .cu files to nvcc).
- ROCm torch -> CUDAExtension: torch hipifies the C++ and hipcc builds quant_kernels.hip,
  for gfx90a (MI250X) unless PYTORCH_ROCM_ARCH says otherwise.

Floating-point flags matter for bit-exactness ([Note: bit-exact arithmetic] in quant_math.h):
no -ffast-math anywhere, no FMA contraction, no flush-to-zero, IEEE division. The C++
standard is left to torch (its headers need what it passes, C++20 for torch 2.13).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
EXT_NAME = "zeropp_hier._C"

HOST_SOURCES = ("bindings.cpp", "quant_ops.cpp", "quant_cpu.cpp")
CXX_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-fast-math"]
LINK_FLAGS = ["-fopenmp"]
NVCC_FLAGS = ["-O3", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true"]
HIPCC_FLAGS = [
    "-O3",
    "-ffp-contract=off",
    "-fno-gpu-flush-denormals-to-zero",
    "-fhip-fp32-correctly-rounded-divide-sqrt",
]
DEFAULT_ROCM_ARCH = "gfx90a"


def _source(name: str) -> str:
    """Path of a source as setuptools wants it: relative to the project root when we are there."""
    path = HERE / name
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def torch_flavour() -> str:
    """ "rocm", "cuda" or "cpu": which kind of torch is installed (not which devices exist)."""
    import torch

    if getattr(torch.version, "hip", None):
        return "rocm"
    if torch.version.cuda:
        return "cuda"
    return "cpu"


class ExtSpec(NamedTuple):
    """What to build for one torch flavour (pure data, so it can be checked anywhere)."""

    gpu: bool  # CUDAExtension (with device code) rather than CppExtension
    sources: list
    define_macros: list
    cxx_flags: list
    device_flags: list  # nvcc flags (hipcc's in a ROCm torch); [] for CPU


def extension_spec(flavour: str) -> ExtSpec:
    """Sources and flags for "cpu", "cuda" or "rocm"."""
    sources = [_source(s) for s in HOST_SOURCES]
    if flavour == "cpu":
        return ExtSpec(False, sources, [], list(CXX_FLAGS), [])
    if flavour == "cuda":
        return ExtSpec(
            True,
            sources + [_source("quant_kernels_cuda.cu")],
            [("ZEROPP_WITH_GPU", "1")],
            list(CXX_FLAGS),
            list(NVCC_FLAGS),
        )
    if flavour == "rocm":
        device_flags = list(HIPCC_FLAGS)
        if not os.environ.get("PYTORCH_ROCM_ARCH"):
            device_flags.append(f"--offload-arch={DEFAULT_ROCM_ARCH}")
        return ExtSpec(
            True,
            sources + [_source("quant_kernels.hip")],
            [("ZEROPP_WITH_GPU", "1"), ("ZEROPP_GPU_HIP", "1")],
            list(CXX_FLAGS),
            device_flags,
        )
    raise ValueError(f"flavour must be 'cpu', 'cuda' or 'rocm', got {flavour!r}")


def extension_modules() -> list:
    """The zeropp_hier._C extension for the installed torch, for setup.py's ext_modules."""
    from torch.utils import cpp_extension

    spec = extension_spec(torch_flavour())
    include_dirs = [str(HERE)]
    if not spec.gpu:
        return [
            cpp_extension.CppExtension(
                EXT_NAME,
                spec.sources,
                include_dirs=include_dirs,
                define_macros=spec.define_macros,
                extra_compile_args={"cxx": spec.cxx_flags},
                extra_link_args=LINK_FLAGS,
            )
        ]
    return [
        cpp_extension.CUDAExtension(
            EXT_NAME,
            spec.sources,
            include_dirs=include_dirs,
            define_macros=spec.define_macros,
            extra_compile_args={"cxx": spec.cxx_flags, "nvcc": spec.device_flags},
            extra_link_args=LINK_FLAGS,
        )
    ]
