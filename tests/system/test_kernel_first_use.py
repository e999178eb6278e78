"""The kernels are built on first use when the install has none (a build-isolated ``pip install``).

Each test copies the package and hip_kernels/ into a temporary checkout without ``zeropp_hier._C``
(what an isolated editable install leaves) and runs real Python processes on it with
``TORCH_EXTENSIONS_DIR`` in the test's directory; the first use compiles the CPU kernels there
with the host compiler (about half a minute on two cores). The cache's naming and locking rules:
zeropp_hier/quant/_jit.py; its pure parts: tests/unit/test_kernel_jit.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 900

# Quantizes a fixed tensor with the kernels and with the reference and reports what served it.
SCRIPT = """
import json, logging, sys
import torch
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
import zeropp_hier
from zeropp_hier import quant
from zeropp_hier.quant import _ext, reference
x = torch.randn(3000, generator=torch.Generator().manual_seed(0)) * 7
same = True
for bits, block in ((8, 64), (4, 128)):
    q, r = quant.quantize(x, bits, block), reference.quantize(x, bits, block)
    same = same and torch.equal(q.data, r.data) and torch.equal(q.scales, r.scales)
st = _ext.status()
print(json.dumps({"package": zeropp_hier.__file__, "loaded": st.loaded, "origin": st.origin,
                  "backend": quant.backend("cpu"), "same": bool(same)}))
"""


def _checkout(dest: Path, broken: bool = False) -> Path:
    """The package and its kernel sources, without any built library."""
    shutil.copytree(ROOT / "zeropp_hier", dest / "zeropp_hier", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copytree(ROOT / "hip_kernels", dest / "hip_kernels")
    assert not list((dest / "zeropp_hier").glob("_C*"))
    if broken:
        src = dest / "hip_kernels" / "bindings.cpp"
        # a missing header is fatal at once (an #error would let the compiler go on through torch's headers)
        src.write_text('#include "zeropp_deliberately_missing.h"\n' + src.read_text())
    return dest


def _start(checkout: Path, ext_dir: Path, **env_extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "ZEROPP_HIER_ALLOW_REFERENCE"}
    env.update(PYTHONPATH=str(checkout), TORCH_EXTENSIONS_DIR=str(ext_dir), **env_extra)
    # cwd outside the repository: `python -c` puts the cwd first on sys.path
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        cwd=checkout.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> tuple[int, dict, str]:
    out, err = proc.communicate(timeout=TIMEOUT_S)
    lines = out.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else {}), err


def test_first_use_builds_once_for_two_processes_and_matches_the_reference(tmp_path):
    checkout, ext_dir = _checkout(tmp_path / "checkout"), tmp_path / "ext"
    procs = [_start(checkout, ext_dir), _start(checkout, ext_dir)]  # two ranks starting at once
    results = [_finish(p) for p in procs]
    for rc, res, err in results:
        assert rc == 0, err
        assert res["package"].startswith(str(checkout))
        assert res["loaded"] and res["backend"] == "cpu-ext", err
        assert Path(res["origin"]).parent.parent == ext_dir, res["origin"]
        assert res["same"], "the first-use build's kernels differ from the reference"
    assert results[0][1]["origin"] == results[1][1]["origin"]
    logs = [err for _, _, err in results]
    assert sum("building the kernels into" in e for e in logs) == 1, logs
    # ninja logs every compile: each object was compiled once, by one process
    build_dir = Path(results[0][1]["origin"]).parent
    compiled = [line.split("\t")[3] for line in (build_dir / ".ninja_log").read_text().splitlines()[1:]]
    assert sorted(compiled) == sorted(set(compiled)) and any(c.endswith("quant_cpu.o") for c in compiled)

    # a later process loads the cached library without building or taking the lock
    rc, res, err = _finish(_start(checkout, ext_dir))
    assert rc == 0 and res["loaded"] and res["origin"] == results[0][1]["origin"] and res["same"], err
    assert "building the kernels" not in err


def test_a_failed_build_stops_with_the_compiler_error_and_the_ahead_command(tmp_path):
    checkout, ext_dir = _checkout(tmp_path / "checkout", broken=True), tmp_path / "ext"
    rc, res, err = _finish(_start(checkout, ext_dir, MAX_JOBS="1"))
    assert rc != 0 and not res
    assert "KernelBuildError" in err
    assert "zeropp_deliberately_missing.h" in err  # the compiler's own line
    assert "pip install --no-build-isolation -e ." in err and "ZEROPP_HIER_ALLOW_REFERENCE=1" in err
    assert "using the pure-PyTorch reference" not in err
    build_logs = list(ext_dir.glob("*/build.log"))
    assert len(build_logs) == 1 and "zeropp_deliberately_missing.h" in build_logs[0].read_text()

    # allowed explicitly: the reference serves, after one warning that says why
    rc, res, err = _finish(_start(checkout, ext_dir, MAX_JOBS="1", ZEROPP_HIER_ALLOW_REFERENCE="1"))
    assert rc == 0, err
    assert not res["loaded"] and res["backend"] == "reference" and res["same"]
    warnings = [line for line in err.splitlines() if "using the pure-PyTorch reference quantization" in line]
    assert len(warnings) == 1 and "building it on first use failed" in warnings[0], err
