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
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Sequence

import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.partitioned_param_coordinator import InflightParamRegistry

from ..comm.executor import CommExecutor
from .zero_param import ZeroParam


class GatherHandle:
    """DeepSpeed's gather-handle protocol over one job (or one per chunk) per layer. The hops run
    on the executor from the moment the handle is made; ``wait`` hands each layer's full tensors
    to its parameters, layer by layer in submission order."""

    def __init__(self, layers: Sequence[tuple[Sequence[ZeroParam], Sequence[Future]]], executor: CommExecutor):
        self.layers = list(layers)  # (parameters, their futures) per layer, in submission order
        self.executor = executor
        self.taken = 0  # layers handed over so far
        self.layer_index = {p.ds_id: i for i, (ps, _) in enumerate(self.layers) for p in ps}

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
            params, futures = self.layers[self.taken]
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
