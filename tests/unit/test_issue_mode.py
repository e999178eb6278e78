"""The executor mode per backend ([Note: one issuing thread on GPUs] in comm/issue.py): the pure
choice, and the executor built for each default, with a recording hook on every collective that
notes the host thread that issues it and how many collectives are in flight."""

import threading
import time

import pytest
import torch

from zeropp_hier.comm.executors import executor_for
from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS, backend_for, default_chunks, one_tier_hops, resolve_issue_mode
from zeropp_hier.comm.job import Move
from zeropp_hier.core.config import parse_section
from zeropp_hier.core.errors import HierConfigError

CPU = torch.device("cpu")
# (backend as torch.distributed names it, ROCm build): gloo, NCCL on CUDA, RCCL on ROCm (which
# torch also names "nccl")
GLOO, NCCL, RCCL = ("gloo", False), ("nccl", False), ("nccl", True)


def test_a_plan_with_a_hop_across_tiers_runs_one_lane_on_gpu_libraries():
    """Ticks send a hop's rows point-to-point to every member: a flat hop (zero3, zeropp) would put
    each shard on the slow link once per far member, so true runs one lane there; "gpu" is the
    same choice on any backend, and a named mode stays as named."""
    from zeropp_hier.core.plan import make_plan
    from zeropp_hier.core.topology import Topology

    topo = Topology.for_world(16, 4, 2)

    def axes(preset):
        plan = make_plan(preset, parse_section({"enabled": True, "preset": preset}).compression, topo)
        return [h.axes for h in (*plan.forward, *plan.backward, *plan.reduce)]

    assert one_tier_hops(axes("frontier")) and not one_tier_hops(axes("zeropp")) and not one_tier_hops(axes("zero3"))
    for backend in (NCCL, RCCL):
        assert resolve_issue_mode(True, *backend, one_tier=True).name == "ticks"
        flat = resolve_issue_mode(True, *backend, one_tier=False)
        assert flat.name == ("one_lane/serial" if backend == RCCL else "one_lane")
        assert "spans several tiers" in flat.reason
        assert resolve_issue_mode("ticks", *backend, one_tier=False).name == "ticks"
    assert resolve_issue_mode("gpu", *GLOO, one_tier=True).name == "ticks"
    assert resolve_issue_mode("gpu", *GLOO, one_tier=False).name == "one_lane"  # gloo has no RCCL wait
    assert resolve_issue_mode(True, *GLOO, one_tier=False).name == "lanes"
    assert parse_section({"overlap": "gpu"}).overlap == "gpu"


@pytest.mark.parametrize(
    "backend, overlap, name",
    [
        (GLOO, True, "lanes"),
        (GLOO, "lanes", "lanes"),
        (GLOO, "one_lane", "one_lane"),
        (GLOO, False, "inline"),
        (NCCL, True, "ticks"),  # one thread, one communicator, the tiers at once
        (NCCL, "one_lane", "one_lane"),
        (NCCL, "lanes", "lanes"),
        (NCCL, False, "inline"),
        (RCCL, True, "ticks"),
        (RCCL, "one_lane", "one_lane/serial"),
        (RCCL, "lanes", "lanes"),
        (RCCL, False, "inline"),
        (("ucc", False), True, "ticks"),  # not known to be safe with lanes: the GPU default
        (GLOO, "serial", "one_lane/serial"),  # serial as asked, on any backend
        (NCCL, "serial", "one_lane/serial"),
        (RCCL, "serial", "one_lane/serial"),
    ],
)
def test_mode_per_backend(backend, overlap, name):
    mode = resolve_issue_mode(overlap, *backend)
    assert mode.name == name
    # the planner's vocabulary: inline and RCCL's serial lane both run hop after hop
    assert mode.schedule == {"inline": "one_lane", "one_lane/serial": "one_lane"}.get(name, name)
    # a warning exactly when lanes were asked for on a device library
    assert (mode.warning is not None) == (name == "lanes" and backend != GLOO)


def test_lanes_on_a_device_library_warn_with_the_reference_and_the_fix():
    nccl = resolve_issue_mode("lanes", *NCCL).warning
    rccl = resolve_issue_mode("lanes", *RCCL).warning
    assert nccl and "Using multiple NCCL communicators concurrently" in nccl and '"one_lane"' in nccl
    assert rccl and "RCCL" in rccl and "ROCm/rccl#2191" in rccl


def test_bad_overlap_value_is_refused_by_config_and_by_the_resolver():
    with pytest.raises(HierConfigError, match="zeropp_hier.overlap"):
        parse_section({"overlap": "threads"})
    with pytest.raises(ValueError, match="zeropp_hier.overlap"):
        resolve_issue_mode(1, "nccl", False)  # type: ignore[arg-type]
    assert parse_section({"overlap": "lanes"}).overlap == "lanes"


@pytest.mark.parametrize(
    "backend, device, want",
    [("nccl", "cuda", "nccl"), ("cpu:gloo,cuda:nccl", "cuda", "nccl"), ("cpu:gloo,cuda:nccl", "cpu", "gloo")],
)
def test_backend_for_device(backend, device, want):
    assert backend_for(backend, device) == want


def _record(mode, wait_s: float, jobs: int = 6):
    """Run ``jobs`` jobs of three collectives each (gcd, gpu, node hops) on the executor built for
    ``mode``; every collective notes its issuing thread and the most collectives in flight. A
    job's node hop and the next job's gcd hop each wait (up to ``wait_s``) for the other to
    start: with lanes both are in flight together; with one lane the node hop's wait runs out."""
    ex = executor_for(mode, "test", CPU)
    seen = {"threads": set(), "in_flight": 0, "max_in_flight": 0, "order": []}
    lock = threading.Lock()
    gcd_started = [threading.Event() for _ in range(jobs)]
    node_started = [threading.Event() for _ in range(jobs)]

    def collective(job: int, hop: str):
        with lock:
            seen["threads"].add(threading.get_ident())
            seen["in_flight"] += 1
            seen["max_in_flight"] = max(seen["max_in_flight"], seen["in_flight"])
            seen["order"].append((job, hop))
        if hop == "gcd":
            gcd_started[job].set()
            if job > 0:
                node_started[job - 1].wait(wait_s)
        if hop == "node":
            node_started[job].set()
            if job + 1 < jobs:
                gcd_started[job + 1].wait(wait_s)
        with lock:
            seen["in_flight"] -= 1

    def job(i: int):
        for hop in ("gcd", "gpu", "node"):
            yield Move(hop)
            collective(i, hop)
        return i

    futs = [ex.submit(job(i), ["gcd", "gpu", "node"]) for i in range(jobs)]
    assert [ex.result(f) for f in futs] == list(range(jobs))
    ex.close()
    return seen


@pytest.mark.parametrize("backend", [NCCL, RCCL], ids=["nccl", "rccl"])
def test_one_lane_on_a_gpu_library_issues_from_one_host_thread(backend):
    """The one-lane mode (the GPU default, ticks, is watched on real transfers in
    tests/dist/test_ticks.py): one issuing thread, program order, one collective in flight."""
    mode = resolve_issue_mode("one_lane", *backend)
    seen = _record(mode, wait_s=0.05)
    assert len(seen["threads"]) == 1 and threading.get_ident() not in seen["threads"]
    # one thread, in program order: every rank issues the same sequence
    assert seen["order"] == [(j, h) for j in range(6) for h in ("gcd", "gpu", "node")]
    assert seen["max_in_flight"] == 1


def test_the_recording_hook_sees_several_threads_with_lanes():
    """The same harness on gloo's default (lanes): several issuing threads and collectives of
    different hop groups in flight together, so the checks above can fail."""
    seen = _record(resolve_issue_mode(True, *GLOO), wait_s=20.0)
    assert len(seen["threads"]) == 3
    assert seen["max_in_flight"] >= 2


def test_one_lane_on_rccl_is_serial_and_the_executor_carries_it():
    ex = executor_for(resolve_issue_mode("one_lane", *RCCL), "test", CPU)
    assert ex.one_lane and ex.serial
    ex.close()
    ex = executor_for(resolve_issue_mode("one_lane", *NCCL), "test", CPU)
    assert ex.one_lane and not ex.serial
    ex.close()


@pytest.mark.parametrize("backend", [GLOO, NCCL, RCCL], ids=["gloo", "nccl", "rccl"])
def test_serial_is_rccls_one_lane_on_every_backend_and_the_executor_carries_it(backend):
    mode = resolve_issue_mode("serial", *backend)
    assert (mode.background, mode.one_lane, mode.serial, mode.ticks) == (True, True, True, False)
    assert mode.warning is None and "no two communicators in flight" in mode.reason
    assert mode == resolve_issue_mode("one_lane", *RCCL)._replace(reason=mode.reason)
    assert parse_section({"overlap": "serial"}).overlap == "serial"
    ex = executor_for(mode, "test", CPU)
    assert ex.one_lane and ex.serial
    ex.close()


class _SlowEvent:
    """Stands in for the CUDA event the serial lane waits on (the CPU has none): each
    ``synchronize`` counts and sleeps ``wait_s``, as a collective still on the device would."""

    def __init__(self, wait_s: float):
        self.wait_s = wait_s
        self.waits = 0

    def synchronize(self) -> None:
        self.waits += 1
        time.sleep(self.wait_s)


@pytest.mark.parametrize("overlap, serial", [("serial", True), ("one_lane", False)])
def test_serial_wait_s_adds_the_issuing_threads_waits_and_only_in_the_serial_mode(overlap, serial):
    """Each collective of the serial lane waits for its predecessor's event, and the host seconds
    of those waits add up in ``serial_wait_s`` (what comm_stats reports); one lane never waits.
    On the CPU no event is ever recorded, so there the figure stays 0 (tests/dist/test_gpu_modes.py)."""
    ex = executor_for(resolve_issue_mode(overlap, *NCCL), "test", CPU)
    assert ex.serial_wait_s == 0.0
    event = _SlowEvent(0.01)
    ex._previous = event  # what a recorded event of the last collective would be on a GPU

    def job(i: int):
        for hop in ("gcd", "gpu", "node"):
            yield Move(hop)
        return i

    futs = [ex.submit(job(i), ["gcd", "gpu", "node"]) for i in range(4)]
    assert [ex.result(f) for f in futs] == list(range(4))
    # no event is recorded on the CPU, so the stand-in stays the predecessor of every collective
    assert event.waits == (12 if serial else 0)
    if serial:
        assert ex.serial_wait_s >= 12 * event.wait_s  # sleep waits at least that long
        ex.reset_serial_wait()
    assert ex.serial_wait_s == 0.0
    ex.close()


@pytest.mark.parametrize("backend", [GLOO, NCCL, RCCL])
def test_ticks_are_one_lane_and_never_serial_on_every_backend(backend):
    """The tick mode is the same schedule everywhere (gloo measures what a GPU runs); it needs no
    host wait on ROCm, because one communicator carries every transfer ([Note: ticks])."""
    mode = resolve_issue_mode("ticks", *backend)
    assert (mode.name, mode.background, mode.one_lane, mode.serial, mode.ticks) == ("ticks", True, True, False, True)
    assert mode.warning is None
    assert parse_section({"overlap": "ticks"}).overlap == "ticks"


def test_the_tick_mode_needs_its_transport():
    with pytest.raises(ValueError, match="TickTransport"):
        executor_for(resolve_issue_mode("ticks", *GLOO), "test", CPU)


@pytest.mark.parametrize(
    "backend, overlap, warned",
    [
        (NCCL, "one_lane", True),  # hop by hop
        (RCCL, "one_lane", True),  # hop by hop, serial
        (NCCL, True, False),  # the default: ticks
        (GLOO, "one_lane", True),
        (GLOO, False, True),  # inline
        (GLOO, True, False),  # lanes pipeline the chunks
        (NCCL, "ticks", False),  # ticks overlap them in one call
        (RCCL, "ticks", False),
    ],
)
def test_chunks_that_overlap_nothing_start_with_a_warning(backend, overlap, warned):
    from zeropp_hier.comm.issue import chunks_warning

    mode = resolve_issue_mode(overlap, *backend)
    text = chunks_warning(mode, 4)
    assert (text is not None) == warned
    if text:
        assert "pipeline.chunks = 4" in text and '"ticks"' in text and mode.name in text
    assert chunks_warning(mode, 1) is None  # unchunked: nothing to warn about


def test_ticks_with_gpu_tensors_on_gloo_are_refused_by_name():
    from zeropp_hier.comm.issue import check_tick_device

    ticks = resolve_issue_mode("ticks", *GLOO)
    with pytest.raises(HierConfigError, match="zeropp_hier.overlap.*gloo does only for CPU tensors"):
        check_tick_device(ticks, "gloo", "cuda")
    check_tick_device(ticks, "gloo", "cpu")  # the emulated cluster: CPU tensors on gloo
    check_tick_device(resolve_issue_mode("ticks", *NCCL), "nccl", "cuda")
    check_tick_device(resolve_issue_mode(True, *GLOO), "gloo", "cuda")  # other modes: no check


@pytest.mark.parametrize(
    "backend, overlap, chunks",
    [
        (NCCL, True, DEFAULT_TICK_CHUNKS),  # the GPU default: ticks, cut into the tick mode's count
        (RCCL, True, DEFAULT_TICK_CHUNKS),
        (GLOO, "ticks", DEFAULT_TICK_CHUNKS),
        (GLOO, True, 1),  # lanes overlap different jobs' hops without chunks
        (NCCL, "one_lane", 1),  # hop by hop: chunks would only add latency
        (GLOO, False, 1),
    ],
)
def test_chunks_left_out_take_the_issue_modes_count(backend, overlap, chunks):
    mode = resolve_issue_mode(overlap, *backend)
    assert default_chunks(None, mode) == chunks
    assert default_chunks(3, mode) == 3  # a configured count is kept in every mode
    assert default_chunks(parse_section({"pipeline": {"chunks": 1}}).pipeline.chunks, mode) == 1
