"""Records every collective and point-to-point call of this process, from every thread, with the
communicator it ran on, the thread that issued it and when it was in flight: the recorder of the
collective-overlap test (tests/dist/test_collective_overlap.py). It only watches: each wrapper
notes the call and then calls the real function with the same arguments, and hands back what it
returned; nothing is replaced or skipped.

Two layers, so that no route is missed:

* the ``torch.distributed`` functions (``all_reduce``, ``batch_isend_irecv``, ...), wherever a
  loaded module holds a reference to them (``from torch.distributed import all_reduce`` copies
  the reference into the importer; every such copy is wrapped too);
* the ``ProcessGroup`` methods that every one of those functions ends in (``allreduce``,
  ``_allgather_base``, ``send``, ...), for callers that hold a function from before the recorder
  was installed (DeepSpeed's ``TorchBackend`` keeps ``all_gather_into_tensor`` in an attribute)
  or call a group directly. A call already recorded by the function layer is not recorded again
  (a per-thread depth).

Where the runtime's guard wraps a function ([Note: foreign collectives] in
zeropp_hier/comm/foreign.py), the recorder wraps the real function under it: a call is recorded
as it reaches torch, after the guard's drain. A call's interval starts when it is issued. It
ends when the call returns if it ran synchronously, else when the last ``Work`` it returned is
seen complete: ``Work.wait`` returned, or ``Work.is_completed`` answered True (both patched on
the class, and both later than the true end, so intervals are if anything too long: an overlap
is never hidden by them). A call whose works were never seen complete stays open, and the
checker refuses it (tests/dist/overlaps.py).
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any, Callable

import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, Work

from zeropp_hier.comm.foreign import GUARDED

from .overlaps import Call

# every collective and point-to-point function of torch.distributed: the list the package's drain
# wraps (comm/foreign.py), so the recorder sees each call the drain can see
FUNCTIONS = GUARDED
GROUP_METHODS = (
    "allreduce",
    "allreduce_coalesced",
    "allgather",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "all_gather_single",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "reduce_scatter_single",
    "alltoall",
    "alltoall_base",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "recv_anysource",
)


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


class _Open:
    """One recorded call: its works still to be seen complete."""

    __slots__ = ("start", "end", "comm", "thread", "op", "left")

    def __init__(self, start: float, comm: str, thread: str, op: str):
        self.start, self.end, self.comm, self.thread, self.op = start, None, comm, thread, op
        self.left = 0  # works not yet seen complete


class CallRecorder:
    """Install with ``start()``; ``stop()`` restores every real function and method. ``labels``:
    a readable name per process group (its ``group_name``), e.g. the tick group's."""

    def __init__(self, labels: dict[str, str] | None = None):
        self.labels = dict(labels or {})
        self.on = False
        self._calls: list[_Open] = []
        self._works: dict[int, tuple[Any, _Open]] = {}  # id(work) -> (work, its call); keeps it alive
        self._lock = threading.Lock()
        self._depth = threading.local()
        self._undo: list[Callable[[], None]] = []

    # -- what a call ran on ------------------------------------------------------------------
    def comm_of(self, group: Any) -> str:
        if group is None or group is dist.GroupMember.WORLD:
            return "world"
        name = getattr(group, "group_name", None)
        return self.labels.get(name, f"group:{name}")

    def _group_arg(self, name: str, sig: inspect.Signature | None, args: tuple, kwargs: dict) -> Any:
        if name == "batch_isend_irecv":
            ops = args[0] if args else kwargs.get("p2p_op_list", [])
            return ops[0].group if ops else None
        if sig is None:
            return None
        try:
            bound = sig.bind_partial(*args, **kwargs)
        except TypeError:
            return kwargs.get("group")
        return bound.arguments.get("group")

    # -- recording ---------------------------------------------------------------------------
    def _begin(self, comm: str, op: str) -> _Open | None:
        if not self.on or getattr(self._depth, "n", 0):
            return None
        call = _Open(time.perf_counter(), comm, threading.current_thread().name, op)
        with self._lock:
            self._calls.append(call)
        return call

    def _returned(self, call: _Open | None, result: Any) -> None:
        if call is None:
            return
        works = [w for w in (result if isinstance(result, (list, tuple)) else [result]) if isinstance(w, Work)]
        now = time.perf_counter()
        with self._lock:
            if not works:  # ran synchronously: done when it returned
                call.end = now
                return
            call.left = len(works)
            for w in works:
                self._works[id(w)] = (w, call)

    def _completed(self, work: Any) -> None:
        now = time.perf_counter()
        with self._lock:
            entry = self._works.pop(id(work), None)
            if entry is None or entry[0] is not work:
                if entry is not None:  # another object at a reused id: keep its entry
                    self._works[id(work)] = entry
                return
            call = entry[1]
            call.left -= 1
            if call.left == 0:
                call.end = now

    def _wrap(self, name: str, real: Callable, group_of: Callable[[tuple, dict], Any]) -> Callable:
        recorder = self

        def recorded(*args: Any, **kwargs: Any) -> Any:
            call = recorder._begin(recorder.comm_of(group_of(args, kwargs)), name) if recorder.on else None
            d = recorder._depth
            d.n = getattr(d, "n", 0) + 1
            try:
                result = real(*args, **kwargs)
            finally:
                d.n -= 1
            recorder._returned(call, result)
            return result

        recorded.__wrapped__ = real  # type: ignore[attr-defined]
        return recorded

    # -- install / remove --------------------------------------------------------------------
    def start(self) -> CallRecorder:
        self._install_functions()
        self._install_methods()
        self._install_work()
        self.on = True
        return self

    def _install_functions(self) -> None:
        import torch.distributed.distributed_c10d as c10d

        from zeropp_hier.comm import foreign

        wrappers: dict[int, tuple[Callable, Callable]] = {}  # id(real) -> (real, wrapper)
        for name in FUNCTIONS:
            real = getattr(c10d, name, None)
            if real is None:
                continue
            if getattr(real, "zeropp_guarded", None):
                # the runtime's guard drains the lanes before the real call ([Note: foreign
                # collectives] in zeropp_hier/comm/foreign.py): record the call as it reaches
                # torch, under the guard, so that the drain is not counted as the call's flight
                real = foreign.REAL[name]
                sig = _signature(real)
                foreign.REAL[name] = self._wrap(name, real, lambda a, k, n=name, s=sig: self._group_arg(n, s, a, k))
                self._undo.append(lambda n=name, r=real: foreign.REAL.__setitem__(n, r))
                continue
            sig = _signature(real)
            wrappers[id(real)] = (
                real,
                self._wrap(name, real, lambda a, k, n=name, s=sig: self._group_arg(n, s, a, k)),
            )
        # every module attribute that is one of these functions: torch.distributed's own names and
        # any ``from torch.distributed import ...`` copy, in one pass over the loaded modules
        for mod, attr, value in foreign.rebind(wrappers):
            self._undo.append(lambda m=mod, a=attr, r=value: setattr(m, a, r))

    def _install_methods(self) -> None:
        for name in GROUP_METHODS:
            real = getattr(ProcessGroup, name, None)
            if real is None:
                continue
            wrapper = self._wrap(f"ProcessGroup.{name}", real, lambda a, k: a[0])
            # restored from the class's own dict: pybind keeps its methods there as instance-method
            # descriptors, and ``getattr`` hands back the bare function, which would not bind ``self``
            raw = ProcessGroup.__dict__[name]
            setattr(ProcessGroup, name, wrapper)
            self._undo.append(lambda n=name, r=raw: setattr(ProcessGroup, n, r))

    def _install_work(self) -> None:
        real_wait, real_done = Work.wait, Work.is_completed
        raw_wait, raw_done = Work.__dict__["wait"], Work.__dict__["is_completed"]  # as for ProcessGroup
        recorder = self

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            out = real_wait(work, *args, **kwargs)
            recorder._completed(work)
            return out

        def is_completed(work: Any) -> bool:
            done = real_done(work)
            if done:
                recorder._completed(work)
            return done

        Work.wait, Work.is_completed = wait, is_completed  # type: ignore[method-assign]
        self._undo.append(lambda: setattr(Work, "wait", raw_wait))
        self._undo.append(lambda: setattr(Work, "is_completed", raw_done))

    def stop(self) -> list[Call]:
        """Stop recording, restore everything, and return the calls (``end`` None where a work
        was never seen complete)."""
        self.on = False
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        with self._lock:
            calls = [Call(c.start, c.end, c.comm, c.thread, c.op) for c in self._calls]
            self._works.clear()
        return calls
