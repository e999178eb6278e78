"""When each hop group's collectives were in flight: the executor's busy intervals.

[Note: busy intervals]
With recording on (``CommExecutor.record_busy()``), the executor notes for every collective the
hop group it ran on (its lane as the job declared it, before ``one_lane`` folds the lanes into
one) and when it started and ended: from the job's ``Move`` to its next ``Move`` or its end, i.e.
the collective and the job's own work on its result up to the next collective (dequantizing,
summing a stage). Time a lane spends waiting for its turn is not counted, nor ``drain``'s
barrier (a slot on every lane that issues no collective).

On the CPU both ends are host ``time.perf_counter()`` readings (the clock
``app.run.train_steps`` times steps with). On a GPU they are events on the lane's stream
(timing events, recorded without a host wait); ``intervals`` resolves them later, once, against
a reference event taken when recording started, so the hot path never waits on the device.
Recording is off by default and costs nothing then: the benchmark turns it on around its
measured steps (benchmarks/compare/linkuse.py turns the intervals into busy fractions).
"""

from __future__ import annotations

import threading
import time
from types import ModuleType
from typing import Any, Hashable, Union

import torch


class Several(tuple):
    """The hop groups of one slot that moves several hops' transfers together (a tick, [Note:
    ticks] in comm/tick/plan.py): each is recorded busy for the slot's interval."""


# a collective's start or end: a host time on the CPU, a timing event on a GPU
Mark = Union[float, torch.cuda.Event]


class BusyLog:
    """(lane, start, end) per collective, host seconds (``time.perf_counter``)."""

    def __init__(self, cuda: ModuleType | None = None, device: torch.device | None = None):
        self._cuda = cuda  # torch.cuda when the executor's lanes are streams, else None
        self._raw: list[tuple[Hashable, Any, Any]] = []
        self._lock = threading.Lock()  # lanes append from their own threads
        self._ref = None
        if cuda is not None:  # one host wait, here, so that events map onto the host clock
            self._ref = cuda.Event(enable_timing=True)
            self._ref.record(cuda.current_stream(device))
            self._ref.synchronize()
        self._ref_host = time.perf_counter()

    def start(self, stream: torch.cuda.Stream | None = None) -> Mark:
        """A mark before a collective on ``stream`` (None: the current one)."""
        if self._cuda is None:
            return time.perf_counter()
        ev = self._cuda.Event(enable_timing=True)
        ev.record(stream) if stream is not None else ev.record()
        return ev

    def stop(self, begun: Mark, lane: Hashable, stream: torch.cuda.Stream | None = None) -> None:
        end = self.start(stream)
        with self._lock:
            for one in lane if isinstance(lane, Several) else (lane,):
                self._raw.append((one, begun, end))

    def intervals(self) -> list[tuple[Hashable, float, float]]:
        """Every recorded collective so far as (lane, start, end) in host seconds; on a GPU this
        waits for the last one to finish (call it after the measured steps, not inside them)."""
        with self._lock:
            raw = list(self._raw)
        if self._cuda is None:
            return raw
        ref = self._ref
        assert ref is not None
        out = []
        for lane, a, b in raw:
            b.synchronize()
            out.append((lane, self._ref_host + ref.elapsed_time(a) / 1e3, self._ref_host + ref.elapsed_time(b) / 1e3))
        return out
