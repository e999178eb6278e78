"""The tick mode on a GPU, checked on the CPU: its hop state makes no host-to-device copy once warm
(a log-step exchange's block indices are made once per device: [Note: no host traffic in the hot
path] in core/layout.py; on a GPU a list moved to the device inside a tick is a pageable copy that
synchronises the host), and the tensors a hop reads from another stream are recorded on the tick
driver's stream, as a lane records them on its own."""

import contextlib

import torch

from zeropp_hier.comm.collectives import Wire
from zeropp_hier.comm.groups import HopGroup
from zeropp_hier.comm.tick import plan as tick_plan
from zeropp_hier.comm.tick.executor import HopRun


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


def test_every_hops_carry_is_recorded_on_the_tick_drivers_stream(monkeypatch):
    """tick_job hands each chunk's ``Move`` carry (tensors made on another stream) to
    ``record_carry`` (record_stream on the tick lane's stream on a GPU; a no-op for CPU tensors),
    as a lane does with ``_record_carry``; here the calls are collected."""
    from zeropp_hier.comm.job import Move
    from zeropp_hier.comm.tick import executor as ticks

    seen: list[tuple[int, ...]] = []
    monkeypatch.setattr(ticks, "record_carry", lambda carry: seen.append(tuple(id(t) for t in carry)))
    hg = HopGroup(("gcd",), None, (0, 1), None, None)  # type: ignore[arg-type]
    made = [torch.ones(4), torch.ones(4) * 2]

    def job(c):
        got = None
        for h in range(2):
            yield Move(("gcd",), (made[c],) if h == 0 else ())
            got = yield Wire("gather", hg, made[c] if got is None else got[0], "forward_gather")
        return got

    class Local:  # moves nothing: each receive row is this rank's own
        def sub_hops(self, lanes, kind):
            return [(0, 0), (1, 0)]

        def start(self, wire):
            return wire

        def run(self, tick, runs):
            return [torch.stack([w.send, w.send]) for w, _ in runs]

    driver = ticks.tick_job(Local(), [job(0), job(1)], [[("gcd",), ("gcd",)]] * 2)  # type: ignore[arg-type]
    with contextlib.suppress(StopIteration):
        while True:
            next(driver)
    # each chunk's two hops, in schedule order: chunk 0 hop 0, chunk 1 hop 0 / chunk 0 hop 1, ...
    assert sorted(seen) == sorted([(id(made[0]),), (), (id(made[1]),), ()])
