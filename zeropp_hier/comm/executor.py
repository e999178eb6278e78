"""Where the hop collectives run: one ordered queue per engine.

[Note: one order of hop collectives]
Gathers are issued ahead of use (DeepSpeed's prefetch) and gradient stages run during backward,
on the same hop groups. Two rules keep that safe and overlapped:

1. Every collective on a hop group runs on one executor, in the order it was submitted. The
   submissions come from the training thread in program order, which is the same on every rank,
   so every group sees its collectives in the same order everywhere; no communicator is ever
   driven from two threads or two streams (with NCCL/RCCL that can deadlock: the device may run
   two streams' operations on one communicator in different orders on different ranks).
2. The caller is not blocked while a gather runs: ``submit`` returns at once and the hops of a
   bucket chain on the executor's thread (on a GPU, also on the executor's own stream, ordered
   after the caller's stream by an event); ``result`` hands the outputs over (on a GPU the
   caller's stream waits for the executor's event; the host does not). A gradient stage is
   submitted behind any gathers in flight and awaited when the next bucket is submitted or at
   the end of backward ([Note: gradient stages beside backward] in deepspeed/stage3.py).

With ``overlap`` off (``zeropp_hier.overlap: false``) the same calls run inline on the caller,
one after another: the behaviour before overlap existed, kept for comparison and debugging.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

import torch


def _device_stream_api(device: torch.device):
    """(Stream, Event, current_stream, stream context) for a CUDA/ROCm device, else None."""
    if device.type != "cuda":
        return None
    return torch.cuda


class _Done:
    __slots__ = ("value", "event")

    def __init__(self, value: Any, event: Any):
        self.value, self.event = value, event


class CommExecutor:
    """Runs submitted functions one at a time, in submission order, on a background thread."""

    def __init__(self, name: str, device: torch.device, overlap: bool = True):
        self.device = device
        self.overlap = overlap
        self._cuda = _device_stream_api(device) if overlap else None
        self._stream = self._cuda.Stream(device=device) if self._cuda is not None else None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # submitted but not yet taken by ``result``: more than one means work was issued ahead of
        # use (what DeepSpeed's prefetch is for); ``max_outstanding`` is the high-water mark
        self.outstanding = 0
        self.max_outstanding = 0
        self._thread: threading.Thread | None = None
        if overlap:
            self._thread = threading.Thread(target=self._loop, name=f"zeropp_hier-comm-{name}", daemon=True)
            self._thread.start()

    # -- caller side ---------------------------------------------------------------------------
    def submit(self, fn: Callable[[], Any]) -> Future:
        fut: Future = Future()
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        if not self.overlap:
            try:
                fut.set_result(_Done(fn(), None))
            except BaseException as e:  # noqa: B036 - handed to the waiter, as a thread would
                fut.set_exception(e)
            return fut
        ready = None
        if self._cuda is not None:  # the executor's stream starts after what the caller queued
            ready = self._cuda.Event()
            ready.record(self._cuda.current_stream(self.device))
        self._queue.put((fn, fut, ready))
        return fut

    def result(self, fut: Future) -> Any:
        self.outstanding -= 1
        done: _Done = fut.result()
        if done.event is not None:
            cuda = self._cuda
            assert cuda is not None  # events exist only on a device executor
            cuda.current_stream(self.device).wait_event(done.event)
        return done.value

    def run(self, fn: Callable[[], Any]) -> Any:
        """Submit and wait: ordered behind everything submitted before."""
        return self.result(self.submit(fn))

    def drain(self) -> None:
        """Wait until everything submitted so far has run (errors stay with their futures)."""
        if self.overlap:
            self.result(self.submit(lambda: None))

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=60)
            self._thread = None

    # -- executor side -------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut, ready = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                stream, cuda = self._stream, self._cuda
                if stream is None or cuda is None:
                    fut.set_result(_Done(fn(), None))
                    continue
                with cuda.stream(stream):
                    stream.wait_event(ready)
                    value = fn()
                    event = cuda.Event()
                    event.record(stream)
                fut.set_result(_Done(value, event))
            except BaseException as e:  # noqa: B036 - the waiter re-raises it
                fut.set_exception(e)
