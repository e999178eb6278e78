"""The GPU kernel source compiles for MI250X (hipcc, gfx90a) and for CUDA (nvcc, sm_80).

Runs hip_kernels/check_compile.sh, the same script CI runs. It installs Debian's hipcc when
missing (as root); nvcc must be on PATH. No GPU is needed. The build spec of each torch flavour:
tests/unit/test_kernel_build.py.
"""

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "hip_kernels" / "check_compile.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=900)


def test_kernels_compile_for_gfx90a_and_sm80():
    res = _run()
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "bundle target: hipv4-amdgcn-amd-amdhsa--gfx90a" in out
    assert "OK gfx90a:" in out and "OK sm_80:" in out
    n_hip = int(out.split("OK gfx90a: ")[1].split()[0])
    n_cuda = int(out.split("OK sm_80: ")[1].split()[0])
    # 4 quantize variants (3 input dtypes + fused requantize), 3 dequantize, 3 sums, and the
    # block rotation ([Note: GPU block rotation])
    assert n_cuda == 11 and n_hip == 11
    hip_names = out.split("gfx90a kernels: ")[1].splitlines()[0]
    cuda_names = out.split("sm_80 kernels: ")[1].splitlines()[0]
    assert "hadamard_tiles" in hip_names and "hadamard_tiles" in cuda_names


def test_a_compile_error_fails_the_check(tmp_path):
    broken = tmp_path / "broken.hip"
    broken.write_text('#include "gpu_runtime.h"\n__global__ void k(float* out) { out[0] = not_declared; }\n')
    res = _run(str(broken))
    assert res.returncode != 0
    assert "check_compile: FAIL" in res.stderr and "not_declared" in res.stderr
