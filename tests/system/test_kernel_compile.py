"""The GPU kernel source compiles for MI250X (hipcc, gfx90a) and for CUDA (nvcc, sm_80).

Runs hip_kernels/check_compile.sh, the same script CI runs. It installs Debian's hipcc when
missing (as root); nvcc must be on PATH. No GPU is needed.
"""
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "hip_kernels" / "check_compile.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=900)


def test_kernels_compile_for_gfx90a_and_sm80():
    res = _run()
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "bundle target: hipv4-amdgcn-amd-amdhsa--gfx90a" in out
    assert "OK gfx90a:" in out and "OK sm_80:" in out
    n_hip = int(out.split("OK gfx90a: ")[1].split()[0])
    n_cuda = int(out.split("OK sm_80: ")[1].split()[0])
    # 4 quantize variants (3 input dtypes + fused requantize), 3 dequantize, 3 sums
    assert n_cuda == 10 and n_hip == 10


def test_a_compile_error_fails_the_check(tmp_path):
    broken = tmp_path / "broken.hip"
    broken.write_text('#include "gpu_runtime.h"\n'
                      "__global__ void k(float* out) { out[0] = not_declared; }\n")
    res = _run(str(broken))
    assert res.returncode != 0
    assert "check_compile: FAIL" in res.stderr and "not_declared" in res.stderr


def _build_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("hip_kernels_build",
                                                  SCRIPT.parent / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_build_spec_per_torch_flavour(monkeypatch):
    monkeypatch.delenv("PYTORCH_ROCM_ARCH", raising=False)
    build = _build_module()
    cpu, cuda, rocm = (build.extension_spec(f) for f in ("cpu", "cuda", "rocm"))
    names = {f: [Path(s).name for s in spec.sources] for f, spec in
             (("cpu", cpu), ("cuda", cuda), ("rocm", rocm))}
    host = ["bindings.cpp", "quant_ops.cpp", "quant_cpu.cpp"]
    assert not cpu.gpu and names["cpu"] == host
    assert cuda.gpu and names["cuda"] == host + ["quant_kernels_cuda.cu"]
    assert rocm.gpu and names["rocm"] == host + ["quant_kernels.hip"]
    assert ("ZEROPP_GPU_HIP", "1") in rocm.define_macros
    assert "--offload-arch=gfx90a" in rocm.device_flags and "--fmad=false" in cuda.device_flags
    for spec in (cpu, cuda, rocm):  # [Note: bit-exact arithmetic]
        assert "-ffp-contract=off" in spec.cxx_flags and "-fopenmp" in spec.cxx_flags
        assert not any("fast-math" in f and "no-" not in f
                       for f in spec.cxx_flags + spec.device_flags)
    # the CUDA build compiles the very same kernel source
    assert '#include "quant_kernels.hip"' in (SCRIPT.parent / "quant_kernels_cuda.cu").read_text()
    with pytest.raises(ValueError, match="flavour"):
        build.extension_spec("metal")
