"""The install's CPU check (zeropp_hier/detect/cpu_floor.py): the floor read from what each
dependency declares, and the one line it prints when an import is refused or dies of SIGILL.
The check itself on an emulated CPU without AVX2 is in tests/system/test_portability.py."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from zeropp_hier.detect import cpu_floor as cf

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "zeropp_hier" / "detect" / "cpu_floor.py"

# NumPy 2.4.6's x86-64 wheel, numpy._core._multiarray_umath.__cpu_baseline__ as captured on this
# project's AMD EPYC host and reported by issue 48 on an Intel Xeon host (both ['X86_V2'])
NUMPY_2_4_BASELINE = ["X86_V2"]
# NumPy 1.24's, from its docs' numpy.show_runtime() example
# (https://numpy.org/doc/1.24/reference/generated/numpy.show_runtime.html)
NUMPY_1_24_BASELINE = ["SSE", "SSE2", "SSE3"]
# torch 2.13.0+cpu (PyTorch's CPU wheel index), torch.__config__._cxx_flags() as captured on this
# project's host
TORCH_2_13_CXX_FLAGS = (
    "-fvisibility-inlines-hidden -DUSE_PTHREADPOOL -DNDEBUG -DUSE_KINETO -DUSE_FBGEMM -DUSE_PYTORCH_QNNPACK "
    "-DSYMBOLICATE_MOBILE_DEBUG_HANDLE -O2 -fPIC -DC10_NODEPRECATED -Wall -Wextra -Werror=return-type "
    "-Werror=non-virtual-dtor -Werror=range-loop-construct -Werror=bool-operation -Wnarrowing "
    "-Wno-missing-field-initializers -Wno-unknown-pragmas -Wno-unused-parameter -Wno-strict-overflow "
    "-Wno-strict-aliasing -Wno-stringop-overflow -Wsuggest-override -Wno-psabi -Wno-error=old-style-cast "
    "-faligned-new -Wno-maybe-uninitialized -fno-math-errno -fno-trapping-math -Werror=format "
    "-Wno-dangling-reference -Wno-error=dangling-reference -Wno-stringop-overflow"
)


def test_numpy_baselines_name_their_level():
    assert cf.level_of(cf.numpy_needs(NUMPY_2_4_BASELINE)) == "x86-64-v2"
    assert cf.level_of(cf.numpy_needs(NUMPY_1_24_BASELINE)) == "x86-64 + sse3"  # SSE3 alone completes no level
    listed = ["SSE", "SSE2", "SSE3", "SSSE3", "SSE41", "POPCNT", "SSE42", "AVX", "AVX2"]
    assert cf.level_of(cf.numpy_needs(listed)) == "x86-64 + avx, avx2, popcnt, sse3, sse4_1, sse4_2, ssse3"
    assert cf.level_of(cf.numpy_needs([*listed, "CX16"])) == "x86-64-v2 + avx, avx2"  # CX16 completes v2
    assert cf.level_of(cf.numpy_needs(["X86_V2", "AVX", "AVX2"])) == "x86-64-v2 + avx, avx2"
    assert cf.level_of(cf.numpy_needs(["X86_V2", "AVX512_SKX"])) == "x86-64-v4"


def test_build_flags_name_their_level():
    assert cf.flags_needs(TORCH_2_13_CXX_FLAGS.split()) == (set(), [])
    assert cf.level_of(set()) == "x86-64"
    needs, isa = cf.flags_needs(["-O3", "-mavx2", "-mfma"])
    assert isa == ["-mavx2", "-mfma"] and cf.level_of(needs) == "x86-64 + avx2, fma"
    assert cf.level_of(cf.flags_needs(["-march=x86-64-v2", "-msse4.2"])[0]) == "x86-64-v2"
    assert cf.level_of(cf.flags_needs(["-march=x86-64-v3"])[0]) == "x86-64-v3"
    # a CPU's name is no level: reported as written
    assert cf.flags_needs(["-O2", "-march=native"]) == (None, ["-march=native"])


def test_this_packages_kernels_are_built_for_plain_x86_64():
    # setup.py builds with hip_kernels/build.py's CXX_FLAGS: no -march, the wider variants are
    # picked at run time; a -march=native there would make a wheel die on older CPUs
    got = cf.kernels_declared()
    assert got is not None and got["level"] == "x86-64" and got["needs"] == [], got
    assert "no ISA flag" in got["how"]


def test_floor_is_what_all_declarations_need_together():
    declared = {"a": {"needs": ["sse3"]}, "b": {"needs": sorted(cf._up_to("x86-64-v2"))}, "c": {"needs": None}}
    assert cf.floor(declared) == "x86-64-v2"
    assert cf.floor({"a": {"needs": ["sse3"]}, "b": {"needs": ["avx2"]}}) == "x86-64 + avx2, sse3"
    assert cf.floor({}) == "x86-64"


def test_extra_modules_come_from_the_flag_and_the_environment_once_each():
    env = {cf.EXTRA_ENV: "site_ops, numpy,,other"}
    assert cf.modules_to_check(["site_ops"], env) == ["numpy", "torch", "site_ops", "other"]
    assert cf.modules_to_check(None, {}) == ["numpy", "torch"]


def test_the_check_reads_the_installed_wheels_declarations():
    import numpy
    import torch

    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:
        from numpy.core import _multiarray_umath as umath
    problem, declared = cf.check(["numpy", "torch"])
    assert problem is None
    got = declared[f"numpy {numpy.__version__}"]
    assert got["level"] == cf.level_of(cf.numpy_needs(list(umath.__cpu_baseline__)))
    assert str(list(umath.__cpu_baseline__)) in got["how"]
    tgot = next(v for k, v in declared.items() if k.startswith("torch "))
    assert tgot["needs"] == sorted(cf.flags_needs(torch.__config__._cxx_flags().split())[0] or ())
    assert torch.backends.cpu.get_cpu_capability() in tgot["how"]


def _run_check(tmp_path, *args, env_extra=None):
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", **(env_extra or {})}
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=300, env=env)


def test_a_module_that_dies_of_sigill_gets_one_line(tmp_path):
    # hand-written refusal case: the module raises SIGILL itself, as a CPU lacking one of its
    # instructions would (the real instruction under an emulated CPU: test_portability.py)
    (tmp_path / "dies_of_sigill.py").write_text(f"import os\nos.kill(os.getpid(), {int(signal.SIGILL)})\n")
    p = _run_check(tmp_path, "--module", "dies_of_sigill")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, p
    assert len(lines) == 1 and lines[0].startswith("[cpu] this CPU cannot run dies_of_sigill: "), p.stderr
    assert "died with SIGILL" in lines[0] and f"This CPU offers {cf.level_text(cf.cpu_features())}" in lines[0]


def test_a_refused_import_gets_one_line_naming_it(tmp_path):
    # hand-written refusal case, as NumPy refuses a CPU below its baseline (a RuntimeError)
    (tmp_path / "refuses.py").write_text("raise RuntimeError('built with baseline X86_V9 but this CPU lacks it')\n")
    p = _run_check(tmp_path, env_extra={cf.EXTRA_ENV: "refuses"})
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, p
    offers = cf.level_text(cf.cpu_features())
    assert lines == [
        "[cpu] refuses does not import here: RuntimeError: built with baseline X86_V9 but this CPU lacks it. "
        f"This CPU offers {offers} (see docs/usage.md, 'Which CPUs and precisions it runs on')"
    ], p.stderr


def test_this_host_passes_and_the_report_states_the_floor(tmp_path):
    p = _run_check(tmp_path)
    assert p.returncode == 0, p
    assert p.stdout.startswith("[cpu] numpy, torch import on this CPU (")
    problem, declared = cf.check()
    assert problem is None
    declared["zeropp_hier kernels"] = cf.kernels_declared()
    assert f"[cpu] floor: {cf.floor(declared)} (what they need together)" in p.stdout, p.stdout


def test_a_declaration_that_cannot_be_read_is_reported_not_refused(monkeypatch):
    # a NumPy release that moved __cpu_baseline__: the import works, so the check passes and says
    # it could not read the declaration (the forked child inherits the patched reader)
    def moved():
        raise AttributeError("module has no attribute '__cpu_baseline__'")

    monkeypatch.setitem(cf._DECLARED, "numpy", moved)
    problem, declared = cf.check(["numpy"])
    assert problem is None
    (got,) = declared.values()
    assert got["level"] is None and got["how"].startswith("not readable (AttributeError: "), got
    assert cf.floor(declared) == "x86-64"
