"""What one rank of a dry run costs, counted per phase: host seconds, collectives (count by kind,
largest payload), object collectives (count, bytes), files opened, listed and stat'ed, memory.

One ``Meters`` per dry run; ``begin(phase)`` starts a phase (start-up parts, ``step0``,
``step1``, ``save``, ``load``) and everything counted until the next ``begin`` is that phase's.
Files are seen through an audit hook (``open``, ``os.listdir``, ``os.scandir``: Python's own
events, every library's opens included) and a wrapper of ``os.stat`` / ``os.lstat`` (which raise
no audit event; ``os.path.exists``, ``isfile``, ``getsize`` and ``pathlib`` call them). An
audit hook cannot be removed: it is installed once per process and does nothing while no
``Meters`` is active.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

_active: list[Meters] = []  # the Meters counting now (at most one)
_hooked = False
_local = threading.local()


@dataclass
class Phase:
    """One phase's counts."""

    name: str
    seconds: float = 0.0
    collectives: dict[str, int] = field(default_factory=dict)
    collective_bytes: int = 0
    largest_payload: int = 0
    largest_kind: str = ""
    objects: dict[str, int] = field(default_factory=dict)
    object_bytes: int = 0  # pickled bytes this rank sent
    object_buffer_bytes: int = 0  # what torch would allocate on this rank (group x largest)
    opened: int = 0
    listed: int = 0
    stated: int = 0
    paths: set[str] = field(default_factory=set)
    unmatched_receives: int = 0
    foreign_objects: int = 0
    rss_bytes: int = 0
    split: dict[str, float] = field(default_factory=dict)  # host seconds by part (forward, ...)
    # host seconds inside the mirror's answers (any thread): the fake harness standing in for
    # the peers and the wire, part of ``seconds``, not what a rank of the job pays
    mirror_seconds: float = 0.0
    # this process's CPU seconds (every thread): beside other work on the machine a steadier
    # measure than the host (wall) seconds, which include waiting for a core
    cpu_seconds: float = 0.0
    # the most device memory the caching allocator handed out during the phase (None: no CUDA
    # device in use, as in a CPU dry run)
    device_peak_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 4),
            "split": {k: round(v, 4) for k, v in self.split.items()},
            "mirror_seconds": round(self.mirror_seconds, 4),
            "cpu_seconds": round(self.cpu_seconds, 4),
            "collectives": dict(sorted(self.collectives.items())),
            "collective_calls": sum(self.collectives.values()),
            "collective_bytes": self.collective_bytes,
            "largest_payload_bytes": self.largest_payload,
            "largest_payload_kind": self.largest_kind,
            "object_collectives": dict(sorted(self.objects.items())),
            "object_bytes": self.object_bytes,
            "object_buffer_bytes": self.object_buffer_bytes,
            "files_opened": self.opened,
            "files_listed": self.listed,
            "files_stated": self.stated,
            "distinct_paths": len(self.paths),
            "unmatched_receives": self.unmatched_receives,
            "foreign_object_broadcasts": self.foreign_objects,
            "rss_bytes": self.rss_bytes,
            "device_peak_bytes": self.device_peak_bytes,
        }


def cuda_in_use() -> bool:
    """Whether this process has initialised a CUDA (or ROCm) device: asking the allocator before
    would initialise one, which a CPU dry run must not do."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


def device_peaks() -> tuple[int, int] | None:
    """The caching allocator's peaks on the current device since the last reset: (allocated,
    reserved) bytes; None where no device is in use."""
    if not cuda_in_use():
        return None
    import torch

    return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())


def _reset_device_peaks() -> None:
    if cuda_in_use():
        import torch

        torch.cuda.reset_peak_memory_stats()


def rss_bytes(peak: bool = False) -> int:
    """This process's resident set (VmRSS), or its peak (VmHWM); Linux's /proc."""
    key = "VmHWM:" if peak else "VmRSS:"
    try:
        with open("/proc/self/status") as f:  # opened before a phase counts (the hook skips it)
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Meters:
    """The counters of one dry run (``with meters:`` activates them)."""

    def __init__(self, trace_memory: bool = True) -> None:
        self.phases: dict[str, Phase] = {}
        self.current: Phase | None = None
        self._t0 = 0.0
        self._cpu0 = 0.0
        self.trace_memory = trace_memory
        self._real_stat: tuple[Callable, Callable] | None = None
        # the device's peaks over the whole run (the allocator's are reset at every phase)
        self.device_peak_allocated: int | None = None
        self.device_peak_reserved: int | None = None

    # -- phases ----------------------------------------------------------------------------------
    def begin(self, name: str) -> Phase:
        self.end()
        phase = self.phases.setdefault(name, Phase(name))
        self.current = phase
        _reset_device_peaks()  # each phase's device peak is its own
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()
        return phase

    def end(self) -> None:
        if self.current is not None:
            self.current.seconds += time.perf_counter() - self._t0
            self.current.cpu_seconds += time.process_time() - self._cpu0
            self.current.rss_bytes = rss_bytes()
            peaks = device_peaks()
            if peaks is not None:
                allocated, reserved = peaks
                self.current.device_peak_bytes = max(self.current.device_peak_bytes or 0, allocated)
                self.device_peak_allocated = max(self.device_peak_allocated or 0, allocated)
                self.device_peak_reserved = max(self.device_peak_reserved or 0, reserved)
            self.current = None

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, its host seconds added to the current phase's ``split[part]``."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.current is not None:
                    self.current.split[part] = self.current.split.get(part, 0.0) + time.perf_counter() - t0

        return wrapper

    # -- counts (the mirror calls these) ---------------------------------------------------------
    def collective(self, kind: str, nbytes: int) -> None:
        p = self.current
        if p is None:
            return
        p.collectives[kind] = p.collectives.get(kind, 0) + 1
        p.collective_bytes += nbytes
        if nbytes > p.largest_payload:
            p.largest_payload, p.largest_kind = nbytes, kind

    def object_collective(self, kind: str, sent: int, buffer: int) -> None:
        p = self.current
        if p is None:
            return
        p.objects[kind] = p.objects.get(kind, 0) + 1
        p.object_bytes += sent
        p.object_buffer_bytes = max(p.object_buffer_bytes, buffer)

    def mirrored(self, seconds: float) -> None:
        """Host seconds one of the mirror's answers took (from whichever thread called it)."""
        p = self.current
        if p is not None:
            p.mirror_seconds += seconds

    def unmatched(self, n: int) -> None:
        if self.current is not None:
            self.current.unmatched_receives += n

    def foreign_object(self) -> None:
        if self.current is not None:
            self.current.foreign_objects += 1

    def _file(self, what: str, path: Any) -> None:
        p = self.current
        if p is None or getattr(_local, "busy", False):
            return
        if what == "open":
            p.opened += 1
        elif what == "list":
            p.listed += 1
        else:
            p.stated += 1
        if isinstance(path, (str, bytes, os.PathLike)):
            p.paths.add(os.fsdecode(path))

    # -- activation -------------------------------------------------------------------------------
    def __enter__(self) -> Meters:
        global _hooked
        if _active:
            raise RuntimeError("zeropp_hier dry run: one dry run per process at a time")
        _active.append(self)
        if not _hooked:
            sys.addaudithook(_audit)
            _hooked = True
        real_stat, real_lstat = os.stat, os.lstat
        self._real_stat = (real_stat, real_lstat)

        def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
            self._file("stat", path)
            return real_stat(path, *args, **kwargs)

        def lstat(path: Any, *args: Any, **kwargs: Any) -> Any:
            self._file("stat", path)
            return real_lstat(path, *args, **kwargs)

        os.stat, os.lstat = stat, lstat
        if self.trace_memory and not tracemalloc.is_tracing():
            tracemalloc.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end()
        if self._real_stat is not None:
            os.stat, os.lstat = self._real_stat
        _active.remove(self)

    def memory(self) -> dict[str, int | None]:
        """Peak memory so far: tracemalloc's peak of Python allocations, the host's peak RSS and,
        where a device is in use, the caching allocator's peaks (allocated: what tensors held;
        reserved: what it kept from the device, the figure a job's out-of-memory depends on)."""
        traced = tracemalloc.get_traced_memory()[1] if tracemalloc.is_tracing() else 0
        return {
            "tracemalloc_peak_bytes": traced,
            "peak_rss_bytes": rss_bytes(peak=True),
            "device_peak_allocated_bytes": self.device_peak_allocated,
            "device_peak_reserved_bytes": self.device_peak_reserved,
        }

    def steps(self) -> Iterator[Phase]:
        return (p for name, p in self.phases.items() if name.startswith("step"))


def _audit(event: str, args: tuple) -> None:
    if not _active:
        return
    if event == "open":
        _active[0]._file("open", args[0])
    elif event in ("os.listdir", "os.scandir"):
        _active[0]._file("list", args[0])


__all__ = ["Meters", "Phase", "cuda_in_use", "device_peaks", "rss_bytes"]
