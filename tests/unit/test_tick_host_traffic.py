"""The tick mode's hop state makes no host-to-device copy once warm: a log-step exchange's block
indices are made once per device ([Note: no host traffic in the hot path] in core/layout.py; on a
GPU a list moved to the device inside a tick is a pageable copy that synchronises the host)."""

import torch

from zeropp_hier.comm import tick_plan
from zeropp_hier.comm.collectives import Wire
from zeropp_hier.comm.groups import HopGroup
from zeropp_hier.comm.ticks import HopRun


def _exchange_hop(n: int, me: int) -> None:
    """One member's log-step exchange over ``n`` members, every step's receive filled locally."""
    peers = tuple(range(n))
    send = torch.arange(n * 4, dtype=torch.float32).view(n, 4)
    run = HopRun(Wire("exchange", HopGroup(("node",), None, peers, None, None), send, "grad_reduce"), me, "log")  # type: ignore[arg-type]
    assert run.mode == tick_plan.LOG and run.steps == 3
    for step in range(run.steps):
        for unit in run.units(step):
            for _, out, got in unit:
                if got is not None:
                    got.copy_(out if out is not None else torch.zeros_like(got))
        run.after(step)
    assert run.result().shape == (n, 4)


def test_log_exchange_makes_no_index_tensor_once_warm(monkeypatch):
    _exchange_hop(6, 2)  # warm: the indices of 6 members' steps (and member 2's order) are made here
    made = []
    real = torch.tensor

    def counting(*args, **kwargs):
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", counting)
    _exchange_hop(6, 2)
    assert made == [], f"index tensors made inside the ticks: {made}"


def test_index_tensors_one_rank_keeps_at_9408_nodes_are_bounded():
    # the one hop that runs a log-step exchange at Frontier's full size: the node stage of the
    # gradient reduce over 9,408 members (above 256: [Note: log-step hops]); every other hop is
    # direct and makes no index tensor. One rank keeps each step's blocks and its receive order.
    n = 9408
    mode = tick_plan.step_mode(n, tick_plan.AUTO, tick_plan.EXCHANGE)
    steps = tick_plan.step_count(n, mode)
    assert (mode, steps) == (tick_plan.LOG, 14)
    elems = sum(tick_plan.exchange_block_count(n, s) for s in range(steps)) + n
    assert steps + 1 <= 256  # within the cache's size: no index is made twice
    assert elems * 8 < 1 << 20, elems  # under 1 MiB of int64 on the device
