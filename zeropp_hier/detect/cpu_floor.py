"""Does this CPU run the installed dependencies? Asked before anything imports NumPy or torch.

[Note: the CPU floor]
The oldest x86-64 CPU this package runs on is the highest of the baselines its dependencies and
its own kernels declare, read here at install time rather than inferred from one emulator run:
- NumPy declares the features its build requires in ``numpy._core._multiarray_umath.
  __cpu_baseline__`` (``numpy.show_runtime()`` prints the same list): ``['X86_V2']`` for the
  NumPy 2.4 x86-64 wheels, ``['SSE', 'SSE2', 'SSE3']`` for NumPy 1.x;
- torch's x86-64 wheels are compiled without ``-march`` (no ISA flag in
  ``torch.__config__._cxx_flags()``); its ATen kernels are built once per capability (DEFAULT,
  AVX2, AVX512) and ``torch.backends.cpu.get_cpu_capability()`` names the set picked on this
  CPU. So torch declares plain x86-64; its import still dies with SIGILL on QEMU's ``qemu64``
  model (x86-64 with SSE3 only, below NumPy's floor anyway);
- this package's kernels (hip_kernels/build.py's ``CXX_FLAGS``) have no ``-march`` either: their
  AVX2 and AVX-512 variants are picked at run time.
A declaration can be wrong or incomplete, and a process that imports a wheel its CPU cannot run
is killed by SIGILL with no message naming the cause. So each import runs in a forked child first
(which then reads the module's declaration and sends it back), and a SIGILL or a refused import
becomes one line naming the module, its version and what this CPU has. Modules beyond NumPy and
torch (a site's own compiled extension imported beside this package) are checked the same way:
``--module NAME`` or ``ZEROPP_HIER_CPU_CHECK_MODULES=name1,name2``.

Run as a plain script (``python zeropp_hier/detect/cpu_floor.py``): it imports nothing but the
standard library, so it can run where importing this package (which imports torch) would not.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import mmap
import os
import platform
import re
import signal
import sys
from importlib import metadata
from pathlib import Path

# The dependencies whose wheels set the floor, in the order a failure is reported.
DEPENDENCIES = ("numpy", "torch")
EXTRA_ENV = "ZEROPP_HIER_CPU_CHECK_MODULES"

# CPUID leaf 1 (ECX) and leaf 7 (EBX) bits of the features the x86-64 levels are made of
# (x86-64 psABI, "micro-architecture levels"), plus AVX and XSAVE/OSXSAVE, which the OS must
# enable for AVX to run.
_LEAF1_ECX = {
    "sse3": 0,
    "ssse3": 9,
    "fma": 12,
    "cx16": 13,
    "sse4_1": 19,
    "sse4_2": 20,
    "movbe": 22,
    "popcnt": 23,
    "xsave": 26,
    "osxsave": 27,
    "avx": 28,
    "f16c": 29,
}
_LEAF7_EBX = {"bmi1": 3, "avx2": 5, "bmi2": 8, "avx512f": 16, "avx512dq": 17, "avx512cd": 28, "avx512bw": 30}
_LEAF7_EBX_VL = 31
_LEVELS = (
    ("x86-64-v2", ("cx16", "popcnt", "sse3", "sse4_1", "sse4_2", "ssse3")),
    ("x86-64-v3", ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave")),
    ("x86-64-v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
)

# x86-64 machine code for  void cpuid(uint32 leaf, uint32 subleaf, uint32 out[4])  (System V ABI:
# leaf in edi, subleaf in esi, out in rdx): push rbx; mov eax,edi; mov ecx,esi; mov r8,rdx; cpuid;
# mov [r8],eax; mov [r8+4],ebx; mov [r8+8],ecx; mov [r8+12],edx; pop rbx; ret.
# CPUID, not /proc/cpuinfo: under an emulator (QEMU user mode, how the suite tests narrower CPUs)
# /proc/cpuinfo describes the host, CPUID the emulated CPU.
_CPUID_CODE = bytes.fromhex("53 89f8 89f1 4989d0 0fa2 418900 41895804 41894808 4189500c 5b c3")


def _cpuid_reader():
    """A callable (leaf, subleaf) -> (eax, ebx, ecx, edx), or None where it cannot be made (not
    x86-64, or a system that forbids executable memory)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, AttributeError, ValueError):
        return None
    page.write(_CPUID_CODE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
    fn = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32))(addr)

    def read(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
        out = (ctypes.c_uint32 * 4)()
        fn(leaf, subleaf, out)
        return out[0], out[1], out[2], out[3]

    read.page = page  # type: ignore[attr-defined]  # keep the code's memory alive with the reader
    return read


def cpu_features() -> set[str]:
    """The level-defining features this CPU reports (CPUID; /proc/cpuinfo's flags where CPUID
    cannot be read)."""
    read = _cpuid_reader()
    if read is None:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("flags"):
                        flags = set(line.split(":", 1)[1].split())
                        known = {*_LEAF1_ECX, *_LEAF7_EBX, "avx512vl"}
                        # /proc/cpuinfo says pni for SSE3
                        return {n for n in known if n in flags or (n == "sse3" and "pni" in flags)}
        except OSError:
            pass
        return set()
    max_leaf = read(0)[0]
    ecx1 = read(1)[2]
    have = {n for n, bit in _LEAF1_ECX.items() if ecx1 >> bit & 1}
    if max_leaf >= 7:
        ebx7 = read(7, 0)[1]
        have |= {n for n, bit in _LEAF7_EBX.items() if ebx7 >> bit & 1}
        if ebx7 >> _LEAF7_EBX_VL & 1:
            have.add("avx512vl")
    return have


def level_text(have: set[str]) -> str:
    """The highest complete x86-64 level and which of the next level's features the CPU has,
    e.g. ``x86-64-v2, and of x86-64-v3's features: avx, xsave``."""
    level = "x86-64"
    for name, needs in _LEVELS:
        if not set(needs) <= have:
            partial = sorted(set(needs) & have)
            return f"{level}, and of {name}'s features: {', '.join(partial) or 'none'}"
        level = name
    return level


def _version(module: str) -> str:
    """The installed distribution's version of ``module``'s top package, "" where it has none (a
    module on the path that was not installed by pip, e.g. a site's own extension)."""
    try:
        return metadata.version(module.split(".")[0])
    except metadata.PackageNotFoundError:
        return ""


def _named(module: str) -> str:
    version = _version(module)
    return f"{module} {version}" if version else module


# ---- declared baselines (pure: they read what the module says, not the CPU) ------------------

# NumPy's names for x86 features (``__cpu_baseline__``, ``show_runtime()``) in this module's.
_NUMPY_NAMES = {
    "SSE3": "sse3",
    "CX16": "cx16",
    "SSSE3": "ssse3",
    "SSE41": "sse4_1",
    "SSE42": "sse4_2",
    "POPCNT": "popcnt",
    "AVX": "avx",
    "F16C": "f16c",
    "FMA3": "fma",
    "AVX2": "avx2",
    "AVX512F": "avx512f",
    "AVX512CD": "avx512cd",
}
# Compiler flags that widen what a build may execute anywhere, in this module's feature names.
_FLAG_NAMES = {
    "-msse3": "sse3",
    "-mssse3": "ssse3",
    "-msse4.1": "sse4_1",
    "-msse4.2": "sse4_2",
    "-msse4": "sse4_2",
    "-mpopcnt": "popcnt",
    "-mavx": "avx",
    "-mf16c": "f16c",
    "-mfma": "fma",
    "-mavx2": "avx2",
    "-mbmi": "bmi1",
    "-mbmi2": "bmi2",
    "-mavx512f": "avx512f",
}
_LEVEL_NAMES = ("x86-64", *(name for name, _ in _LEVELS))


def _up_to(level: str) -> set[str]:
    """Every feature of ``level`` and the levels below it."""
    names = [name for name, _ in _LEVELS]
    return {f for name, needs in _LEVELS[: names.index(level) + 1] for f in needs} if level in names else set()


def level_of(needs: set[str]) -> str:
    """A build's required features as the highest x86-64 level they complete, plus the rest:
    ``x86-64-v2``, or ``x86-64 + sse3`` (NumPy 1.x: SSE3 alone completes no level)."""
    level = "x86-64"
    for name, _ in _LEVELS:
        if _up_to(name) <= needs:
            level = name
    rest = sorted(needs - _up_to(level))
    return f"{level} + {', '.join(rest)}" if rest else level


def numpy_needs(baseline: list[str]) -> set[str]:
    """The features NumPy's ``__cpu_baseline__`` requires: its groups (``X86_V2``, ``X86_V3``,
    ``X86_V4``, NumPy 2.4 on) name a level, older lists name features."""
    needs = {_NUMPY_NAMES[n] for n in baseline if n in _NUMPY_NAMES}
    for n in baseline:
        group = re.fullmatch(r"X86_V(\d)", n)
        if group:
            needs |= _up_to(f"x86-64-v{group.group(1)}")
    if "AVX512_SKX" in baseline:
        needs |= _up_to("x86-64-v4")
    return needs


def flags_needs(flags: list[str]) -> tuple[set[str] | None, list[str]]:
    """The features a build's compiler flags let it assume anywhere, and the flags that say so.
    None for a ``-march`` that names a CPU rather than a level (its level is reported unknown,
    the flag as written)."""
    isa = [f for f in flags if f.startswith("-march=") or f in _FLAG_NAMES]
    needs = {_FLAG_NAMES[f] for f in isa if f in _FLAG_NAMES}
    for flag in isa:
        march = flag.partition("=")[2]
        if march in _LEVEL_NAMES:
            needs |= _up_to(march)
        elif flag.startswith("-march="):
            return None, isa
    return needs, isa


def _declaration(needs: set[str] | None, how: str) -> dict:
    return {
        "needs": None if needs is None else sorted(needs),
        "level": None if needs is None else level_of(needs),
        "how": how,
    }


def _declared_numpy() -> dict:
    # numpy._core (NumPy 2) or numpy.core (NumPy 1): private modules, found by name
    try:
        umath = importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:
        umath = importlib.import_module("numpy.core._multiarray_umath")
    baseline = list(umath.__cpu_baseline__)
    return _declaration(numpy_needs(baseline), f"its __cpu_baseline__ {baseline}")


def _declared_torch() -> dict:
    import torch

    needs, isa = flags_needs(torch.__config__._cxx_flags().split())
    said = f"its build's C++ flags {isa}" if isa else "no ISA flag in torch.__config__._cxx_flags()"
    return _declaration(needs, f"{said}; ATen kernels picked here: {torch.backends.cpu.get_cpu_capability()}")


_DECLARED = {"numpy": _declared_numpy, "torch": _declared_torch}


def kernels_declared(build_py: Path | None = None) -> dict | None:
    """What this package's kernels are compiled to need, from ``CXX_FLAGS`` in
    hip_kernels/build.py (a wheel's copy: zeropp_hier/_kernel_src), read as text: building them
    needs torch. None where neither file is there."""
    here = Path(__file__).resolve().parents[1]
    candidates = (
        [build_py] if build_py else [here.parent / "hip_kernels" / "build.py", here / "_kernel_src" / "build.py"]
    )
    for path in candidates:
        if path.is_file():
            found = re.search(r"^CXX_FLAGS\s*=\s*\[([^\]]*)\]", path.read_text(), re.M)
            if found:
                needs, isa = flags_needs(re.findall(r"[\"']([^\"']+)[\"']", found.group(1)))
                said = f"its C++ flags {isa}" if isa else f"no ISA flag in {path.parent.name}/build.py's CXX_FLAGS"
                return _declaration(needs, f"{said}; AVX2 and AVX-512 variants picked at run time")
    return None


def floor(declared: dict) -> str:
    """What a CPU needs to run all of them: the union of the declarations' features, as a level."""
    return level_of({f for d in declared.values() for f in d.get("needs") or ()})


# ---- the imports, each in a forked child ----------------------------------------------------


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"[:400]


def _import_in_child(module: str) -> dict:
    """Import ``module`` in a forked child and read its declared baseline there. A fork, not a
    new interpreter: the child runs on the same (possibly emulated) CPU as this process.
    Returns ``{"sigill": True}``, ``{"error": "Type: message"}`` or ``{"declared": {...}}``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, exit by status
        code = 0
        try:
            os.close(read_end)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            try:
                importlib.import_module(module)
            except BaseException as e:  # the import's own refusal (NumPy checks its baseline)
                out: dict = {"error": _first_line(e)}
                code = 1
            else:
                reader = _DECLARED.get(module)
                try:
                    out = {"declared": reader() if reader else {}}
                except Exception as e:  # a release that moved what is read: report, do not refuse
                    out = {"declared": _declaration(None, f"not readable ({_first_line(e)})")}
            os.write(write_end, json.dumps(out).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGILL:
        return {"sigill": True}
    try:
        return json.loads(data)
    except ValueError:
        return {"error": f"the import ended with status {status} and no report"}


def modules_to_check(extra: list[str] | None = None, environ: dict | None = None) -> list[str]:
    """NumPy and torch, then the extra modules (``--module``, then ``ZEROPP_HIER_CPU_CHECK_MODULES``,
    comma-separated), each once."""
    env = os.environ if environ is None else environ
    named = [*DEPENDENCIES, *(extra or []), *env.get(EXTRA_ENV, "").split(",")]
    return list(dict.fromkeys(m.strip() for m in named if m.strip()))


def check(modules: list[str] | None = None) -> tuple[str | None, dict]:
    """(None, each module's declared baseline) when every module imports on this CPU; else (one
    line saying which does not and why, the declarations read so far)."""
    declared: dict = {}
    for module in modules or list(DEPENDENCIES):
        got = _import_in_child(module)
        if got.get("sigill"):
            return (
                f"this CPU cannot run {_named(module)}: its import died with SIGILL (an instruction the "
                f"CPU lacks). This CPU offers {level_text(cpu_features())}; {module} needs more. Run on a "
                "newer CPU (see docs/usage.md, 'Which CPUs and precisions it runs on')"
            ), declared
        if "error" in got:
            return (
                f"{_named(module)} does not import here: {got['error']}. This CPU offers "
                f"{level_text(cpu_features())} (see docs/usage.md, 'Which CPUs and precisions it runs on')"
            ), declared
        if got["declared"]:
            declared[_named(module)] = got["declared"]
    return None, declared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Do NumPy, torch (and the named modules) run on this CPU?")
    parser.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="NAME",
        help=f"also check this module's import (repeatable; or {EXTRA_ENV}=a,b)",
    )
    modules = modules_to_check(parser.parse_args(argv).module)
    problem, declared = check(modules)
    if problem is not None:
        print(f"[cpu] {problem}", file=sys.stderr)
        return 2
    kernels = kernels_declared()
    if kernels:
        declared["zeropp_hier kernels"] = kernels
    print(f"[cpu] {', '.join(modules)} import on this CPU ({level_text(cpu_features())})")
    for name, d in declared.items():
        print(f"[cpu]   {name}: {d['level'] or 'unknown'} ({d['how']})")
    print(f"[cpu] floor: {floor(declared)} (what they need together)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
