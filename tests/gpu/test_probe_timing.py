"""The link probe's timing on a GPU ([Note: timing a collective] in zeropp_hier/detect/links.py):
a kernel returns to the host at once, so ``timed`` with the device's synchronisation must report
at least the kernel's device time (measured by CUDA events), and a collective's figure likewise
covers its completion."""

import torch

from zeropp_hier.detect import links


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
