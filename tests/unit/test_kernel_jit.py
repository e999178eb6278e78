"""zeropp_hier/quant/_jit.py without a compiler: the cache's name, place and flags, and its rules
for a build that failed or was killed ([Note: one build per cache]). torch's ``cpp_extension.load``
is replaced by a stand-in that fails (or records what it is handed) so that no compile runs; the
real first-use builds, two processes at once included: tests/system/test_kernel_first_use.py.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import torch.utils.cpp_extension

from zeropp_hier.quant import _jit

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sources(tmp_path):
    return Path(shutil.copytree(ROOT / "hip_kernels", tmp_path / "hip_kernels"))


def test_sources_are_the_checkouts():
    assert _jit.source_dir() == ROOT / "hip_kernels"


def test_the_name_is_an_identifier_that_follows_every_input(sources, monkeypatch):
    monkeypatch.delenv("PYTORCH_ROCM_ARCH", raising=False)
    flags = ["-O3"]
    name = _jit.extension_name(sources, flags)
    assert name.isidentifier() and name == _jit.extension_name(sources, flags)
    assert _jit.extension_name(sources, flags + ["-DX=1"]) != name
    monkeypatch.setenv("PYTORCH_ROCM_ARCH", "gfx942")
    assert _jit.extension_name(sources, flags) != name
    monkeypatch.delenv("PYTORCH_ROCM_ARCH")
    header = sources / "quant_math.h"
    header.write_text(header.read_text() + "\n// changed\n")
    assert _jit.extension_name(sources, flags) != name


def test_the_cache_is_torch_extensions_dir_or_torchs_per_user_default(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert _jit.cache_root() == tmp_path and _jit.plan().build_dir.parent == tmp_path
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    assert _jit.cache_root() == Path(torch.utils.cpp_extension.get_default_build_root())


def test_the_plan_has_setup_pys_flags_and_no_march(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    p = _jit.plan()
    build = _jit._build_module(ROOT / "hip_kernels")
    spec = build.extension_spec(build.torch_flavour())
    assert p.cflags[: len(spec.cxx_flags)] == spec.cxx_flags and p.ldflags == build.LINK_FLAGS
    assert [Path(s).name for s in p.sources] == [Path(s).name for s in spec.sources]
    assert not any("march" in f or "native" in f for f in p.cflags + p.device_flags + p.ldflags)


def _failing_load(calls):
    def load(name, sources, **kwargs):
        calls.append(kwargs["build_directory"])
        assert not (Path(kwargs["build_directory"]) / "lock").exists(), "torch's stale baton was left"
        raise RuntimeError(f"Error building extension '{name}': quant_ops.cpp:1: error: boom\nninja: build stopped")

    return load


@pytest.fixture
def failing_build(tmp_path, monkeypatch):
    """A cache in ``tmp_path`` whose every build fails: (the build calls made, the cache's plan)."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    calls: list = []
    monkeypatch.setattr(torch.utils.cpp_extension, "load", _failing_load(calls))
    p = _jit.plan()
    p.build_dir.mkdir(parents=True)
    return calls, p


def test_a_failure_names_the_compiler_tail_and_the_ahead_command(failing_build):
    calls, p = failing_build
    (p.build_dir / "lock").write_text("")  # torch's baton, left by a build that was killed
    with pytest.raises(_jit.KernelBuildError) as err:
        _jit.build_and_load("zeropp_hier._C is not built")
    msg = str(err.value)
    assert "error: boom" in msg and "ninja: build stopped" in msg
    assert "pip install --no-build-isolation -e ." in msg and "ZEROPP_HIER_ALLOW_REFERENCE=1" in msg
    assert len(calls) == 1 and "error: boom" in (p.build_dir / "build.log").read_text()
    assert p.failed_marker.is_file() and not p.ok_marker.exists()


def test_a_failure_while_waiting_is_reported_and_an_older_one_is_retried(failing_build):
    calls, p = failing_build
    p.failed_marker.write_text("other rank: error: first failure")
    # failed after this process began to wait: reported, not compiled again
    future = time.time() + 60
    os.utime(p.failed_marker, (future, future))
    with pytest.raises(_jit.KernelBuildError, match="another process's build failed") as err:
        _jit.build_and_load("not built")
    assert "first failure" in str(err.value) and calls == []
    # failed before this process started (the user may have fixed the compiler since): built again
    past = time.time() - 60
    os.utime(p.failed_marker, (past, past))
    with pytest.raises(_jit.KernelBuildError, match="error: boom"):
        _jit.build_and_load("not built")
    assert len(calls) == 1


def test_no_sources_stops_with_the_ahead_command(monkeypatch, tmp_path):
    monkeypatch.setattr(_jit, "SOURCE_DIRS", (tmp_path / "none",))
    with pytest.raises(_jit.KernelBuildError, match="no kernel sources") as err:
        _jit.plan()
    assert "pip install --no-build-isolation -e ." in str(err.value)
