"""DeepSpeed's backpressure on gradient buckets, as the overlapped bucket flush keeps it
([Note: bucket flush against DeepSpeed] in deepspeed/stage3.py, part 5): completed events
are forgotten, and past the limit the host waits for the oldest outstanding one. The events here
stand for device events (``query``: has the device passed it; ``synchronize``: wait for it); the
CPU accelerator records none, as in DeepSpeed."""

import collections

from zeropp_hier.deepspeed.stage3 import _throttle


class Event:
    def __init__(self, log: list, name: str, done: bool):
        self.log, self.name, self.done = log, name, done

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append(self.name)
        self.done = True


def test_completed_events_are_dropped_without_waiting():
    log: list = []
    events = collections.deque([Event(log, "a", True), Event(log, "b", True), Event(log, "c", False)])
    _throttle(events, 2)
    assert [e.name for e in events] == ["c"]
    assert log == []


def test_past_the_limit_the_host_waits_for_the_oldest_only():
    log: list = []
    events = collections.deque(Event(log, n, False) for n in "abcd")
    _throttle(events, 2)
    assert log == ["a"]  # one wait, for the oldest
    assert [e.name for e in events] == ["b", "c", "d"]
    _throttle(events, 3)  # at the limit: no wait
    assert log == ["a"]


def test_the_cpu_accelerator_records_no_events():
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    # the flush records an event only where the accelerator does not handle backpressure
    assert CPU_Accelerator().handles_memory_backpressure()
