"""The link probe's timing on a GPU ([Note: timing a collective] in zeropp_hier/detect/links.py):
a kernel returns to the host at once, so ``timed`` with the device's synchronisation must report
at least the kernel's device time (measured by CUDA events), and a collective's figure likewise
covers its completion.

On a one-rank NCCL group an all-gather is a device-to-device copy of its input, so a device copy
and an all-gather timed by ``timed`` with ``device_sync`` must both agree with the device's copy
bandwidth (``dst.copy_(src)`` timed by CUDA events) within 20%; a buffer of 1 GiB takes about a
millisecond to copy, against tens of microseconds of launch and synchronisation. Without the
synchronisation the same figures disagree (the host times the launches): the last test asserts
that, and ``ZEROPP_HIER_TEST_DROP_SYNC=1`` runs the agreement tests themselves without it, to
show them failing (the GPU check runs this module both ways and keeps the log)."""

import functools
import os

import pytest
import torch
import torch.distributed as dist

from zeropp_hier.detect import links

from ..helpers import rel_diff

NBYTES = 1 << 30  # per buffer: launch and synchronisation costs are a few percent of its copy
REPS = 10
AGREE = 0.2  # relative agreement of a timed figure with the copy bandwidth
# test-only switch: time the agreement tests without the synchronisation (they must then fail)
DROP_SYNC = os.environ.get("ZEROPP_HIER_TEST_DROP_SYNC") == "1"


def test_timed_covers_the_device_work_not_its_launch():
    dev = torch.device("cuda", torch.cuda.current_device())
    cycles = 200_000_000  # ~0.1 s at GPU clocks
    torch.cuda._sleep(cycles)  # warm-up: the kernel's first launch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    device_s = start.elapsed_time(end) / 1e3
    host_s = links.timed(lambda: torch.cuda._sleep(cycles), links.device_sync(dev), reps=3)
    assert host_s >= 0.9 * device_s, f"timed {host_s:.4f} s per call, the kernel runs {device_s:.4f} s on the device"
    # the synchronisation is what makes it so: without it only the launch is timed
    launch_s = links.timed(lambda: torch.cuda._sleep(cycles), lambda: None, reps=3)
    torch.cuda.synchronize(dev)
    assert launch_s < 0.5 * device_s


@pytest.fixture(scope="module")
def dev():
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(scope="module")
def buffers(dev):
    src = torch.ones(NBYTES // 4, device=dev)
    return src, torch.empty_like(src)


@pytest.fixture(scope="module")
def copy_bandwidth(buffers):
    """The device's copy bandwidth, bytes copied per second, by CUDA events around ``REPS`` copies."""
    src, dst = buffers
    dst.copy_(src)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPS):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return NBYTES * REPS / (start.elapsed_time(end) / 1e3)


@pytest.fixture(scope="module")
def one_rank_nccl(dev, tmp_path_factory):
    """A one-rank NCCL process group in this process, destroyed after the module."""
    store = dist.FileStore(str(tmp_path_factory.mktemp("nccl") / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=dev)
    yield
    dist.destroy_process_group()


def _sync(dev):
    return (lambda: None) if DROP_SYNC else links.device_sync(dev)


def _copy(buffers):
    src, dst = buffers
    return lambda: dst.copy_(src)


def _all_gather(buffers):
    src, dst = buffers  # one rank: the output is as large as the input
    return functools.partial(dist.all_gather_into_tensor, dst, src)


def _probe_bandwidth(fn, sync, dev) -> float:
    seconds = links.timed(fn, sync, REPS, warmup=2)  # the all-gather's first calls set NCCL up
    torch.cuda.synchronize(dev)  # nothing left in flight for the next measurement
    return NBYTES / seconds


def _agreement(what: str, figure: float, reference: float) -> str:
    return f"{what}: timed {figure / 1e9:.1f} GB/s, CUDA events' copy {reference / 1e9:.1f} GB/s"


def test_a_timed_device_copy_agrees_with_the_copy_bandwidth(dev, buffers, copy_bandwidth):
    bw = _probe_bandwidth(_copy(buffers), _sync(dev), dev)
    print(_agreement("device copy", bw, copy_bandwidth))
    assert rel_diff(bw, copy_bandwidth) <= AGREE, _agreement("device copy", bw, copy_bandwidth)


def test_a_timed_one_rank_nccl_all_gather_agrees_with_the_copy_bandwidth(dev, buffers, copy_bandwidth, one_rank_nccl):
    assert dist.get_backend() == "nccl" and dist.get_world_size() == 1
    bw = _probe_bandwidth(_all_gather(buffers), _sync(dev), dev)
    print(_agreement("one-rank NCCL all-gather", bw, copy_bandwidth))
    assert rel_diff(bw, copy_bandwidth) <= AGREE, _agreement("one-rank NCCL all-gather", bw, copy_bandwidth)


@pytest.mark.parametrize("what", ["copy", "all_gather"])
def test_without_the_synchronisation_the_figures_disagree(what, dev, buffers, copy_bandwidth, one_rank_nccl):
    fn = _copy(buffers) if what == "copy" else _all_gather(buffers)
    bw = _probe_bandwidth(fn, lambda: None, dev)
    print(_agreement(f"{what} without synchronisation", bw, copy_bandwidth))
    assert rel_diff(bw, copy_bandwidth) > AGREE, _agreement(f"{what} without synchronisation", bw, copy_bandwidth)
