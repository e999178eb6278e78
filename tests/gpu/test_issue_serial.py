"""The serial lane on a GPU ([Note: one issuing thread on GPUs] in zeropp_hier/comm/issue.py):
in the one-lane default (a plan with a hop that spans several tiers; ticks otherwise) on ROCm the
lane is ``serial``, its thread issuing a collective only after the previous one completed on the
device; on CUDA it issues at once, behind it on the same stream. A long kernel stands for job A's
collective; job B checks, when it is issued, whether A's work is done."""

import torch

from zeropp_hier.comm.executors import executor_for
from zeropp_hier.comm.issue import resolve_issue_mode
from zeropp_hier.comm.job import Move

CYCLES = 200_000_000  # ~0.1 s of device time


def _b_sees_a_done(is_hip: bool) -> bool:
    dev = torch.device("cuda", torch.cuda.current_device())
    mode = resolve_issue_mode(True, "nccl", is_hip, one_tier=False)
    assert mode.one_lane and not mode.ticks and mode.serial == is_hip, mode
    ex = executor_for(mode, "test", dev)
    a_done = torch.cuda.Event()
    seen = {}

    def a():
        yield Move("node")
        torch.cuda._sleep(CYCLES)  # on the lane's stream
        a_done.record()

    def b():
        yield Move("gcd")
        seen["a_done"] = a_done.query()

    fa, fb = ex.submit(a(), ["node"]), ex.submit(b(), ["gcd"])
    ex.result(fa), ex.result(fb)
    ex.close()
    torch.cuda.synchronize(dev)
    return seen["a_done"]


def test_rccl_default_waits_for_the_previous_collective_cuda_default_does_not():
    assert _b_sees_a_done(is_hip=True) is True
    assert _b_sees_a_done(is_hip=False) is False
