"""Building the kernels on first use, when no ``zeropp_hier._C`` was installed with the package.

A build-isolated ``pip install -e .`` (or ``pip install .``) has no torch to build against, so it
installs the package without ``zeropp_hier._C``. The first process that needs the kernels then
compiles them with ``torch.utils.cpp_extension.load`` into a cache, as DeepSpeed's op builder does,
with the sources, flags and ISA dispatch that setup.py uses (hip_kernels/build.py): no
``-march``, so the build machine's CPU never decides which instructions a user runs.

The cache: ``$TORCH_EXTENSIONS_DIR/<name>``, else torch's per-user default
(``~/.cache/torch_extensions``, under ``$XDG_CACHE_HOME`` when set). ``<name>`` hashes the sources,
the flags, torch's version and flavour, Python's version and the GPU architecture variables, so a
changed input builds anew beside the old build and never loads a library built for another torch.

[Note: one build per cache] Many ranks start at once on a node. An ``fcntl`` lock on a file in the
build directory lets exactly one build; the others wait on the lock, then load what it built. The
kernel drops the lock when its holder dies (a killed job), unlike torch's own file baton (a file
that exists while a build runs, left behind by a killed build so that every later load waits
forever); holding our lock, we know no build runs, so a baton left behind is removed. A finished
build is marked by ``<name>.ok``, written after the library: later processes load it without
taking the lock. A failed build writes ``<name>.failed`` (the compiler's output): processes that
were already waiting when it failed report that failure instead of each compiling again; a process
that starts after it tries again (the user may have fixed the compiler).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import logging
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Iterator, List, NamedTuple, Optional

import torch

log = logging.getLogger("zeropp_hier.quant")

PACKAGE_DIR = Path(__file__).resolve().parents[1]
# A checkout (an editable install): hip_kernels/ beside the package. A wheel: the copy setup.py
# puts in the package (setup.py's build_py).
SOURCE_DIRS = (PACKAGE_DIR.parent / "hip_kernels", PACKAGE_DIR / "_kernel_src")
SOURCE_SUFFIXES = (".cpp", ".h", ".hip", ".cu", ".py")
# What changes the device code without changing a source or a flag here.
ARCH_VARIABLES = ("PYTORCH_ROCM_ARCH", "TORCH_CUDA_ARCH_LIST")
AHEAD_COMMAND = "`bash scripts/install.sh` or `pip install --no-build-isolation -e .` in the repository root"
TAIL_LINES = 25


class KernelBuildError(RuntimeError):
    """The kernels could not be built on first use; the message says why and what builds them."""


def source_dir() -> Optional[Path]:
    """Where hip_kernels/ is for this install, or None (a wheel built before setup.py copied it)."""
    for d in SOURCE_DIRS:
        if (d / "build.py").is_file():
            return d
    return None


def _build_module(src: Path) -> ModuleType:
    """hip_kernels/build.py, imported by path (hip_kernels/ is not a package)."""
    spec = importlib.util.spec_from_file_location("zeropp_hier_kernel_build", src / "build.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def extension_name(src: Path, flags: List[str]) -> str:
    """``zeropp_hier_C_<hash>``: a C identifier (torch passes it as TORCH_EXTENSION_NAME)."""
    h = hashlib.sha256()
    for path in sorted(p for p in src.iterdir() if p.suffix in SOURCE_SUFFIXES):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    meta = [torch.__version__, str(torch.version.cuda), str(getattr(torch.version, "hip", None)), sys.version]
    meta += [f"{v}={os.environ.get(v, '')}" for v in ARCH_VARIABLES]
    h.update("\0".join(meta + flags).encode())
    return "zeropp_hier_C_" + h.hexdigest()[:16]


def cache_root() -> Path:
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env)
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[bool]:
    """An fcntl lock on ``lock_path``; yields whether it is held. Where the file system has no
    locks (some network file systems), torch's own baton is all that separates the builds."""
    with open(lock_path, "a+") as f:
        locked = False
        try:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("zeropp_hier.quant: waiting for another process's kernel build in %s", lock_path.parent)
                fcntl.flock(f, fcntl.LOCK_EX)
            locked = True
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            log.info("zeropp_hier.quant: %s cannot be locked (%s); relying on torch's build baton", lock_path, exc)
        try:
            yield locked
        finally:
            if locked:
                fcntl.flock(f, fcntl.LOCK_UN)


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _failure(build_dir: Path, what: str, output: str) -> KernelBuildError:
    return KernelBuildError(
        f"zeropp_hier.quant: the compiled kernels are not installed and building them on first use failed: "
        f"{what} (full output: {build_dir / 'build.log'}). Last lines:\n{_tail(output)}\n"
        f"Fix the compiler error and rerun, or build the kernels ahead with {AHEAD_COMMAND}; "
        f"ZEROPP_HIER_ALLOW_REFERENCE=1 runs the (much slower) pure-PyTorch reference instead."
    )


class BuildPlan(NamedTuple):
    """What to compile and where (pure data: sources, flags, cache directory)."""

    name: str
    build_dir: Path
    sources: List[str]
    include_dir: str
    cflags: List[str]
    device_flags: List[str]
    ldflags: List[str]
    gpu: bool

    @property
    def library(self) -> Path:
        return self.build_dir / f"{self.name}.so"

    @property
    def ok_marker(self) -> Path:
        return self.build_dir / f"{self.name}.ok"

    @property
    def failed_marker(self) -> Path:
        return self.build_dir / f"{self.name}.failed"


def plan() -> BuildPlan:
    """The build for the installed torch, with setup.py's sources and flags (hip_kernels/build.py)."""
    src = source_dir()
    if src is None:
        raise KernelBuildError(
            "zeropp_hier.quant: the compiled kernels are not installed, and this install has no kernel "
            f"sources to build them from (looked in {', '.join(str(d) for d in SOURCE_DIRS)}); "
            f"install from a checkout with {AHEAD_COMMAND}"
        )
    build = _build_module(src)
    spec = build.extension_spec(build.torch_flavour())
    macros = [f"-D{k}={v}" for k, v in spec.define_macros]
    cflags = list(spec.cxx_flags) + macros
    device_flags = list(spec.device_flags) + macros
    ldflags = list(build.LINK_FLAGS)
    name = extension_name(src, cflags + device_flags + ldflags)
    sources = [str((src / Path(s).name).resolve()) for s in spec.sources]
    return BuildPlan(name, cache_root() / name, sources, str(src), cflags, device_flags, ldflags, spec.gpu)


def build_and_load(why: str) -> str:
    """Loads the kernels from the cache, building them first when needed ([Note: one build per
    cache]); returns the library's path. ``why``: why the installed library is not used (for the
    log). Raises KernelBuildError naming the compiler's last lines and the ahead-of-time command."""
    p = plan()
    p.build_dir.mkdir(parents=True, exist_ok=True)
    if p.ok_marker.is_file():
        torch.ops.load_library(str(p.library))
        return str(p.library)

    waiting_since = time.time()
    with _exclusive(p.build_dir / "zeropp_hier.lock") as locked:
        if p.ok_marker.is_file():  # another process built it while this one waited
            torch.ops.load_library(str(p.library))
            return str(p.library)
        failed = p.failed_marker
        if failed.is_file() and failed.stat().st_mtime >= waiting_since:
            raise _failure(p.build_dir, "another process's build failed while this one waited", failed.read_text())
        if locked:  # no build runs: a baton left here by a killed build would block torch forever
            with contextlib.suppress(FileNotFoundError):
                (p.build_dir / "lock").unlink()
        log.info("zeropp_hier.quant: %s; building the kernels into %s (once per cache)", why, p.build_dir)
        from torch.utils import cpp_extension

        started = time.monotonic()
        try:
            cpp_extension.load(
                p.name,
                p.sources,
                extra_cflags=p.cflags,
                extra_cuda_cflags=p.device_flags,
                extra_ldflags=p.ldflags,
                extra_include_paths=[p.include_dir],
                build_directory=str(p.build_dir),
                with_cuda=p.gpu,
                is_python_module=False,
            )
        except (RuntimeError, OSError, ImportError) as exc:
            output = str(exc)
            (p.build_dir / "build.log").write_text(output)
            tmp = p.build_dir / f"{p.name}.failed.tmp"
            tmp.write_text(output)
            os.replace(tmp, failed)  # whole, for the processes waiting
            # from None: torch's exception holds the whole output again; build.log keeps it
            raise _failure(p.build_dir, f"{type(exc).__name__} from torch.utils.cpp_extension.load", output) from None
        p.ok_marker.write_text(f"{p.library}\n")
        with contextlib.suppress(FileNotFoundError):
            failed.unlink()
        log.info("zeropp_hier.quant: built %s in %.0f s", p.library, time.monotonic() - started)
    return str(p.library)
