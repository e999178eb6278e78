"""The per-layer wait DeepSpeed gets for a prefetched gather ([Note: a job per layer] in
deepspeed/inflight.py), on a real executor with jobs that move no data: waiting for one layer's
parameters returns while a later layer of the same handle is still running, and the full wait
takes every layer. (The gathers themselves, on real ranks: tests/dist/test_overlap.py.)"""

import threading

import pytest
import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from zeropp_hier.comm.executor import CommExecutor, Move
from zeropp_hier.deepspeed.inflight import GatherHandle, LayerRegistry


class _Param:
    """What the handle and DeepSpeed's registry read of a parameter (hashed by identity)."""

    def __init__(self, ds_id: int):
        self.ds_id, self.ds_status, self.data = ds_id, ZeroParamStatus.INFLIGHT, None

    def ds_summary(self) -> str:
        return f"param {self.ds_id}"


def _job(params, gate: threading.Event | None = None):
    yield Move("node")
    if gate is not None:
        assert gate.wait(30), "the test never released this layer"
    return {p.ds_id: torch.full((2,), float(p.ds_id)) for p in params}


@pytest.fixture
def executor():
    ex = CommExecutor("test", torch.device("cpu"), overlap=True)
    yield ex
    ex.close()


def test_a_layer_wait_leaves_later_layers_in_flight(executor):
    layers = [[_Param(0), _Param(1)], [_Param(2)], [_Param(3), _Param(4)]]
    gate = threading.Event()
    futures = [[executor.submit(_job(ps, gate if i == 2 else None), ["node"])] for i, ps in enumerate(layers)]
    handle = GatherHandle(list(zip(layers, futures)), executor)
    registry = LayerRegistry()
    for ps in layers:
        for p in ps:
            registry[p] = handle

    registry.pop(layers[1][0]).wait()  # layer 1: layers 0 and 1 handed over, layer 2 still held
    assert [p.ds_status for ps in layers[:2] for p in ps] == [ZeroParamStatus.AVAILABLE] * 3
    assert torch.equal(layers[1][0].data, torch.full((2,), 2.0))
    assert [p.ds_status for p in layers[2]] == [ZeroParamStatus.INFLIGHT] * 2
    assert not handle.complete and not futures[2][0].done()

    registry.pop(layers[0][1]).wait()  # an earlier layer: already handed over, nothing to wait for
    gate.set()
    registry.pop(layers[2][1]).wait()
    assert handle.complete
    assert [p.data[0].item() for ps in layers for p in ps] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_the_full_wait_takes_every_layer_and_other_handles_pass_through(executor):
    layers = [[_Param(7)], [_Param(8)]]
    handle = GatherHandle([(ps, [executor.submit(_job(ps), ["node"])]) for ps in layers], executor)
    handle.wait()
    assert handle.complete and all(p.ds_status == ZeroParamStatus.AVAILABLE for ps in layers for p in ps)

    stock = object()  # a handle of DeepSpeed's own (not ours) is handed back as it is
    registry = LayerRegistry()
    x = _Param(9)
    registry[x] = stock
    assert registry.pop(x) is stock
    assert registry.pop("missing", None) is None


def test_a_failed_layer_raises_at_its_wait(executor):
    def failing():
        yield Move("node")
        raise RuntimeError("collective failed")

    p = _Param(1)
    handle = GatherHandle([([p], [executor.submit(failing(), ["node"])])], executor)
    with pytest.raises(RuntimeError, match="collective failed"):
        handle.for_param(p).wait()
    assert p.ds_status == ZeroParamStatus.INFLIGHT
