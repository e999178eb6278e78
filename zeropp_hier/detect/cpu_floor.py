"""Does this CPU run the installed dependencies? Asked before anything imports NumPy or torch.

[Note: the CPU floor]
The oldest x86-64 CPU this package runs on is set by its dependencies' wheels, not by its own
kernels (those are compiled for baseline x86-64, AVX2 and AVX-512 and picked at run time). The
wheels raise their floor from release to release: NumPy 2.4's x86-64 wheels execute AVX
instructions when imported (measured under QEMU user-mode emulation: the import dies with SIGILL
on the ``Nehalem`` and ``Westmere`` models, SSE4.2 without AVX, and works on ``SandyBridge``, the
first with AVX; enabling AVX and XSAVE on ``Nehalem`` is enough), while torch 2.13's CPU wheel
imports on ``Nehalem``. A process that imports a wheel its CPU cannot run is killed by SIGILL,
with no message naming the cause. So this check runs each import in a forked child first and
turns a SIGILL into one line naming the dependency, its version and what this CPU has.

Run as a plain script (``python zeropp_hier/detect/cpu_floor.py``): it imports nothing but the
standard library, so it can run where importing this package (which imports torch) would not.
"""

from __future__ import annotations

import ctypes
import importlib
import mmap
import os
import platform
import signal
import sys
from importlib import metadata

# The dependencies whose wheels set the floor, in the order a failure is reported.
DEPENDENCIES = ("numpy", "torch")

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


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _import_dies_of_sigill(module: str) -> bool:
    """Import ``module`` in a forked child: True if the child was killed by SIGILL. A fork, not a
    new interpreter: the child runs on the same (possibly emulated) CPU as this process."""
    pid = os.fork()
    if pid == 0:  # the child: import, and report by exit status only
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            importlib.import_module(module)
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGILL


def check() -> str | None:
    """None when every dependency imports on this CPU; else one line saying which does not."""
    for dep in DEPENDENCIES:
        if _import_dies_of_sigill(dep):
            return (
                f"this CPU cannot run {dep} {_version(dep)}: its import died with SIGILL (an instruction the "
                f"CPU lacks). This CPU offers {level_text(cpu_features())}; {dep}'s wheel needs more"
                + (
                    " (NumPy 2.4's x86-64 wheels need AVX: Intel Sandy Bridge / AMD Bulldozer or newer)"
                    if dep == "numpy"
                    else ""
                )
                + ". Run on a newer CPU (see docs/usage.md, 'Which CPUs and precisions it runs on')"
            )
    return None


def main() -> int:
    problem = check()
    if problem is None:
        print(f"[cpu] dependencies import on this CPU ({level_text(cpu_features())})")
        return 0
    print(f"[cpu] {problem}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
