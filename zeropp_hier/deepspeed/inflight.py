"""Gathers in flight: the handle DeepSpeed waits on, one job per layer, and the registry that lets
DeepSpeed wait for one layer's parameters without waiting for the rest of its prefetch.

[Note: a job per layer]
DeepSpeed's prefetch hands one ``all_gather_coalesced`` call every parameter it fetches ahead,
the next ``stage3_prefetch_bucket_size`` elements of the trace, several layers at a deep
prefetch, and files the one handle it gets under each of those parameters
(``PartitionedParameterCoordinator.__all_gather_params_``). Made into one job, that bucket runs
its hops in sequence over all its layers: the first layer's weights wait for the last layer's
``node`` hop, and while the ``node`` hop of the whole bucket runs, the ``gpu`` and ``gcd`` links
have nothing to do.

So ``HierRuntime.all_gather_coalesced`` submits, in forward and backward, one job per layer
(``core/levels.layer_of`` of the parameter's name), in the order the step uses them: ascending
parameter id in forward, the reverse in backward (gathers outside the step stay one job). Each
is an executor job of its own, so layer k+1's ``node`` hop runs while layer k's ``gpu`` hop does
([Note: one order of hop collectives] rule 2), and the lanes keep one order on every rank (the
split depends only on parameter ids, names and the phase, the same on every rank).

DeepSpeed then waits through ``registry.pop(param).wait()`` for each parameter of the module
it is about to run. ``LayerRegistry`` (DeepSpeed's ``InflightParamRegistry``, placed on the
module before DeepSpeed looks for one: ``HierOffload``) hands back, for a ``GatherHandle``, a
wait for that parameter's layer alone: the layers before it in the handle (used earlier, so
finished earlier on the same lanes) and its own. The later layers stay in flight. A full
``wait`` (DeepSpeed's registry cleanup, ``param.all_gather``) still takes every layer.

[Note: backward window]
The lanes take collectives in submission order ([Note: one order of hop collectives] in
comm/executor.py). In backward, DeepSpeed's prefetch submits the gathers of the next layers
before the gradients of the layer in use exist, and each gather's ``gcd`` hop shares the ``gcd``
lane with each gradient bucket's first stage. With a deep prefetch the gradient stages queue
behind every gather ahead, and the package links, which only the gradients' later stages use in
backward, wait (the link-bound benchmark: [Note: step schedule] in planner/schedule.py).

``pipeline.backward_layers_ahead`` = N keeps at most N layers' backward gathers in flight
beyond the layer in use (``BackwardWindow``): a further layer's gather is held, and submitted
when a wait hands a layer over and so frees a place, or when the training thread waits for it
itself; the gradient stages submitted in between reach the lanes first. Layers are counted, not
positions in the model (its tied embedding is the backward's first and the forward's first
layer). Every decision is made on the training thread at a point of its program (a gather
call, a wait) from what it submitted and handed over, so every rank submits the same
collectives in the same order. Anything still held is
submitted at the next gather outside backward, and a full ``wait`` submits what it takes.
"""

from __future__ import annotations

from collections import Counter, deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.partitioned_param_coordinator import InflightParamRegistry

from ..comm.executor import CommExecutor
from .zero_param import ZeroParam


@dataclass(eq=False)
class Layer:
    """One layer's part of a gather call: its parameters and, once submitted, its futures."""

    params: Sequence[ZeroParam]
    futures: Sequence[Future] | None = None  # None while a BackwardWindow holds it
    phase: str = "other_gather"
    key: str = ""  # the layer ([Note: a job per layer])


class BackwardWindow:
    """[Note: backward window]: which backward layer gathers are submitted now and which wait.
    ``submit`` submits a layer (sets its futures); ``ahead`` None submits everything at once."""

    def __init__(self, ahead: int | None, submit: Callable[[Layer], None]):
        self.ahead = ahead
        self._submit_fn = submit
        self.held: deque[Layer] = deque()
        self.in_flight: Counter[str] = Counter()  # backward layers submitted, not handed over
        self.in_use: str | None = None  # the layer the backward pass is at

    def add(self, layer: Layer) -> None:
        if layer.phase != "backward_gather" or self.ahead is None:
            self.flush()  # held layers were asked for first: they go first
            if layer.phase != "backward_gather":  # the next backward pass starts afresh
                self.in_flight.clear()
                self.in_use = None
            self._submit(layer)
            return
        if self.in_use is None:  # a pass's first gather is for the layer it is about to use
            self.in_use = layer.key
        self.held.append(layer)
        self._pump()

    def used(self, layer: Layer) -> None:
        """``layer``'s parameters were handed over: the pass is at it."""
        if self.ahead is not None and layer.phase == "backward_gather" and self.in_flight[layer.key] > 0:
            self.in_flight[layer.key] -= 1
            if not self.in_flight[layer.key]:
                del self.in_flight[layer.key]
            self.in_use = layer.key
            self._pump()

    def through(self, layer: Layer) -> None:
        """A wait reached ``layer`` while it is held: it and everything held before it go now."""
        while layer.futures is None:
            self._submit(self.held.popleft())

    def flush(self) -> None:
        while self.held:
            self._submit(self.held.popleft())

    def _submit(self, layer: Layer) -> None:
        if self.ahead is not None and layer.phase == "backward_gather":
            self.in_flight[layer.key] += 1
        self._submit_fn(layer)

    def _pump(self) -> None:
        # in order only: a held layer never passes one held before it. A layer already in flight
        # or in use adds nothing to the window; another goes while fewer than ``ahead`` layers
        # other than the one in use are in flight.
        assert self.ahead is not None
        while self.held:
            key = self.held[0].key
            ahead_now = len(self.in_flight.keys() - {self.in_use})
            if not (key in self.in_flight or key == self.in_use or ahead_now < self.ahead):
                return
            self._submit(self.held.popleft())


class GatherHandle:
    """DeepSpeed's gather-handle protocol over one job (or one per chunk) per layer. The hops run
    on the executor from the moment a layer is submitted (at once, or when ``window`` lets it
    go); ``wait`` hands each layer's full tensors to its parameters, layer by layer in
    submission order."""

    def __init__(self, layers: Sequence[Layer], executor: CommExecutor, window: BackwardWindow | None = None):
        self.layers = list(layers)  # in submission order
        self.executor = executor
        self.window = window
        self.taken = 0  # layers handed over so far
        self.layer_index = {p.ds_id: i for i, layer in enumerate(self.layers) for p in layer.params}

    @property
    def complete(self) -> bool:
        return self.taken == len(self.layers)

    def wait(self, handle_dependency: bool = True) -> None:
        self.wait_upto(len(self.layers))

    def for_param(self, param: ZeroParam) -> LayerWait:
        return LayerWait(self, self.layer_index[param.ds_id] + 1)

    def wait_upto(self, n: int) -> None:
        """Hand over the first ``n`` layers (the earlier ones finish first: same lanes, FIFO)."""
        while self.taken < n:
            layer = self.layers[self.taken]
            if layer.futures is None:
                assert self.window is not None, "a held layer without the window that holds it"
                self.window.through(layer)
            params, futures = layer.params, layer.futures
            assert futures is not None
            full: dict[int, torch.Tensor] = {}
            failed: BaseException | None = None
            for fut in futures:  # in submission order; a pipelined bucket's last chunk returns it
                try:
                    got = self.executor.result(fut)
                except BaseException as e:  # noqa: B036 - the first job's error is raised once all are taken
                    failed = failed or e
                    continue
                if got is not None:
                    full.update(got)
            if failed is not None:
                raise failed
            for p in params:
                t = full[p.ds_id]
                if t.is_cuda:  # made on the executor's stream, used on the caller's from now on
                    t.record_stream(torch.cuda.current_stream(t.device))
                p.data = t
                p.ds_status = ZeroParamStatus.AVAILABLE
            self.taken += 1
            if self.window is not None:
                self.window.used(layer)


class LayerWait:
    """What ``LayerRegistry.pop`` hands DeepSpeed for one parameter: a wait for its layer."""

    def __init__(self, handle: GatherHandle, upto: int):
        self.handle, self.upto = handle, upto

    def wait(self, handle_dependency: bool = True) -> None:
        self.handle.wait_upto(self.upto)


class LayerRegistry(InflightParamRegistry):
    """DeepSpeed's registry of parameters in flight, waiting per layer ([Note: a job per layer])."""

    def pop(self, key: Any, *default: Any) -> Any:
        handle = super().pop(key, *default)
        return handle.for_param(key) if isinstance(handle, GatherHandle) else handle
