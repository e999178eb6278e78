"""Collectives the training thread issues beside our lanes: drained first, whoever calls them.

[Note: foreign collectives]
The hop collectives run on the executor's lanes; anything else is *foreign*: DeepSpeed's own
collectives, and the user's, issued from the training thread (a loss all-reduced for logging, an
evaluation's, a statistic all-reduced inside the model's forward as SyncBatchNorm does, a
DeepSpeed trace check at the end of a pass). The engine drains the executor at the boundaries it
knows ([Note: quiet boundaries] in boundary.py), but a collective inside the model's forward
runs while DeepSpeed's prefetch has later layers' gathers on the lane: two communicators in
flight at once, which RCCL may deadlock on ([Note: one issuing thread on GPUs] in issue.py).
Measured on 8 gloo ranks: every rank's all-reduce after the first block overlapped prefetched
hop gathers (tests/dist/test_collective_overlap.py, the control run).

So while an engine lives, ``torch.distributed``'s collective and point-to-point functions are
wrapped (``install``, once per process): a call from a thread that is not one of our lanes first
drains every live executor with work in flight (everything submitted so far runs to its end; on a
GPU the caller's stream then waits for the lanes' last event, so the foreign collective is
enqueued after them on the device too), and then calls the real function with the same
arguments. A call from a lane, or with nothing in flight, costs a thread check. The wrap replaces
the functions in ``torch.distributed`` (and ``distributed_c10d``) and every copy a loaded module
made with ``from torch.distributed import ...``; what it does not see: a reference kept in an
object's attribute before the first engine was built (DeepSpeed's ``TorchBackend`` keeps its
all-gather and reduce-scatter functions so; the hierarchy runs every parameter gather itself,
so DeepSpeed's own use of them never meets a lane), direct ``ProcessGroup`` method calls, and
``torch.distributed._functional_collectives`` (dispatched in C++). A drain waits for work
already submitted in program order, the same on every rank, so it pairs no collective
differently across ranks; it costs the prefetch its head start at that point only.
"""

from __future__ import annotations

import functools
import sys
import threading
from types import ModuleType
from typing import Any, Callable

from .executor import live_executors

# what is wrapped: every collective and point-to-point call of torch.distributed
GUARDED = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather_coalesced",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "send_object_list",
    "recv_object_list",
    "batch_isend_irecv",
)
# the real function behind each wrapper, by name: what a wrapper calls (a test's recorder may
# put its own wrapper here, to see each call as it reaches torch, after the drain)
REAL: dict[str, Callable] = {}
_lock = threading.Lock()
# drains made for a foreign call that found work in flight, and the collectives it waited for
# (two counters: bounded however long the job runs)
counts = {"drains": 0, "collectives": 0}


def drain_for(name: str) -> None:
    """Drain every live executor with work in flight unless this thread is one of their lanes."""
    here = threading.current_thread()
    executors = live_executors()
    if any(e.owns_thread(here) for e in executors):
        return
    for e in executors:
        pending = e.in_flight
        if pending and e.broken is None:  # a broken one issues nothing more
            from .boundary import quiesce

            quiesce(e, f"torch.distributed.{name} from thread {here.name!r}")
            with _lock:
                counts["drains"] += 1
                counts["collectives"] += pending


def _guard(name: str) -> Callable:
    @functools.wraps(REAL[name])
    def guarded(*args: Any, **kwargs: Any) -> Any:
        drain_for(name)
        return REAL[name](*args, **kwargs)

    guarded.zeropp_guarded = name  # type: ignore[attr-defined]
    return guarded


def install() -> None:
    """Wrap torch.distributed's collectives once per process ([Note: foreign collectives])."""
    import torch.distributed.distributed_c10d as c10d

    with _lock:
        if REAL:
            return
        wrappers: dict[int, tuple[Callable, Callable]] = {}
        for name in GUARDED:
            real = getattr(c10d, name, None)
            if real is None or getattr(real, "zeropp_guarded", None):
                continue
            REAL[name] = real
            wrappers[id(real)] = (real, _guard(name))
        rebind(wrappers)


def rebind(
    wrappers: dict[int, tuple[Callable[..., object], Callable[..., object]]],
) -> list[tuple[ModuleType, str, Callable[..., object]]]:
    """Replace, in every loaded module, each attribute that is one of the real functions of
    ``wrappers`` (``id(real) -> (real, wrapper)``) by its wrapper: torch.distributed's own names
    and every ``from torch.distributed import ...`` copy, in one pass. Returns (module, name,
    real) of each replacement, so that a caller can undo it."""
    done: list[tuple[ModuleType, str, Callable[..., object]]] = []
    for mod in list(sys.modules.values()):
        if not isinstance(mod, ModuleType):
            continue
        for attr, value in list(getattr(mod, "__dict__", {}).items()):
            hit = wrappers.get(id(value))
            if hit is not None and hit[0] is value:
                setattr(mod, attr, hit[1])
                done.append((mod, attr, value))
    return done


__all__ = ["GUARDED", "REAL", "counts", "drain_for", "install", "rebind"]
