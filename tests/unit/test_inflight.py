"""The per-layer wait DeepSpeed gets for a prefetched gather ([Note: a job per layer] in
deepspeed/inflight.py), on a real executor with jobs that move no data: waiting for one layer's
parameters returns while a later layer of the same handle is still running, and the full wait
takes every layer. (The gathers themselves, on real ranks: tests/dist/test_overlap.py.)"""

import threading

import pytest
import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from zeropp_hier.comm.executor import CommExecutor
from zeropp_hier.comm.job import Move
from zeropp_hier.deepspeed.inflight import BackwardWindow, GatherHandle, Layer, LayerRegistry


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
    handle = GatherHandle([Layer(ps, fs) for ps, fs in zip(layers, futures)], executor)
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
    handle = GatherHandle([Layer(ps, [executor.submit(_job(ps), ["node"])]) for ps in layers], executor)
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
    handle = GatherHandle([Layer([p], [executor.submit(failing(), ["node"])])], executor)
    with pytest.raises(RuntimeError, match="collective failed"):
        handle.for_param(p).wait()
    assert p.ds_status == ZeroParamStatus.INFLIGHT


def _window(ahead):
    order: list[str] = []

    def submit(layer):
        order.append(layer.key)
        layer.futures = []

    return BackwardWindow(ahead, submit), order


def _bw(key, params=()):
    return Layer(list(params), phase="backward_gather", key=key)


def test_backward_window_keeps_at_most_ahead_layers_in_flight_in_order():
    """[Note: backward window], its decisions alone: what is submitted when."""
    w, order = _window(1)
    l5a, l5b, l4, l3, l2 = _bw("b5"), _bw("b5"), _bw("b4"), _bw("b3"), _bw("b2")
    w.add(l5a)  # the pass's first layer: nothing ahead of it yet
    for layer in (l5b, l4, l3, l2):  # DeepSpeed's prefetch: the rest of b5 and three more layers
        w.add(layer)
    assert order == ["b5", "b5", "b4"] and list(w.held) == [l3, l2]  # b4 is the one layer ahead
    w.used(l5a)
    assert order == ["b5", "b5", "b4"]  # still at b5 (its other part is in flight)
    w.used(l5b)
    w.used(l4)  # at b4: b3 may go, b2 not
    assert order == ["b5", "b5", "b4", "b3"] and list(w.held) == [l2]
    w.through(l2)  # a wait for a held layer takes it at once
    assert order[-1] == "b2" and not w.held
    w.used(l3)
    w.used(l2)
    # a gather outside backward submits whatever is held, first, and starts the next pass afresh
    w.add(_bw("b1"))
    w.add(_bw("b0"))
    assert order[-1] == "b1" and [x.key for x in w.held] == ["b0"]
    w.add(Layer([], phase="forward_gather", key="wte"))
    assert order[-2:] == ["b0", "wte"] and not w.held and w.in_use is None and not w.in_flight


def test_backward_window_zero_waits_for_each_layer_and_none_submits_at_once():
    w, order = _window(0)
    a, b = _bw("b1"), _bw("b0")
    w.add(a)
    w.add(b)
    assert order == ["b1"]  # the first layer of the pass goes: it is the one about to be used
    w.used(a)
    assert order == ["b1"]  # b0 waits for its own wait
    w.through(b)
    assert order == ["b1", "b0"]
    w, order = _window(None)
    for k in ("b3", "b2", "b1"):
        w.add(_bw(k))
    assert order == ["b3", "b2", "b1"] and not w.held


def test_a_handle_submits_a_held_layer_when_its_parameter_is_waited_for(executor):
    """The handle and the window together, on a real executor: the wait for a held layer's
    parameter submits it (and every layer held before it) and hands its tensors over."""
    params = [[_Param(10)], [_Param(11)], [_Param(12)]]

    def submit(layer):
        layer.futures = [executor.submit(_job(layer.params), ["node"])]

    window = BackwardWindow(0, submit)
    layers = [Layer(ps, phase="backward_gather", key=f"b{i}") for i, ps in enumerate(params)]
    for layer in layers:
        window.add(layer)
    assert [layer.futures is not None for layer in layers] == [True, False, False]
    handle = GatherHandle(layers, executor, window)
    handle.for_param(params[2][0]).wait()
    assert handle.complete and params[2][0].data[0].item() == 12.0
    assert all(p.ds_status == ZeroParamStatus.AVAILABLE for ps in params for p in ps)
