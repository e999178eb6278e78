"""hip_kernels/build.py: the extension spec per torch flavour (sources, macros, floating-point
flags), without compiling anything (tests/system/test_kernel_compile.py compiles)."""

from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "hip_kernels" / "check_compile.sh"


def _build_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hip_kernels_build", SCRIPT.parent / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_build_spec_per_torch_flavour(monkeypatch):
    monkeypatch.delenv("PYTORCH_ROCM_ARCH", raising=False)
    build = _build_module()
    cpu, cuda, rocm = (build.extension_spec(f) for f in ("cpu", "cuda", "rocm"))
    names = {f: [Path(s).name for s in spec.sources] for f, spec in (("cpu", cpu), ("cuda", cuda), ("rocm", rocm))}
    host = ["bindings.cpp", "quant_ops.cpp", "quant_cpu.cpp"]
    assert not cpu.gpu and names["cpu"] == host
    assert cuda.gpu and names["cuda"] == host + ["quant_kernels_cuda.cu"]
    assert rocm.gpu and names["rocm"] == host + ["quant_kernels.hip"]
    assert ("ZEROPP_GPU_HIP", "1") in rocm.define_macros
    assert "--offload-arch=gfx90a" in rocm.device_flags and "--fmad=false" in cuda.device_flags
    for spec in (cpu, cuda, rocm):  # [Note: bit-exact arithmetic]
        assert "-ffp-contract=off" in spec.cxx_flags and "-fopenmp" in spec.cxx_flags
        assert not any("fast-math" in f and "no-" not in f for f in spec.cxx_flags + spec.device_flags)
    # the CUDA build compiles the very same kernel source
    assert '#include "quant_kernels.hip"' in (SCRIPT.parent / "quant_kernels_cuda.cu").read_text()
    with pytest.raises(ValueError, match="flavour"):
        build.extension_spec("metal")
