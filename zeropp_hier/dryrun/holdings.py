"""What the engine holds on the dry run's rank, by the planner's memory parts
(docs/design.md#memory-per-gcd), counted from the engine's own tensors: the bytes a GPU rank of
the job would hold on its device for each part the engine keeps by name. A CPU dry run has no
device allocator to ask, so the transient buffers (the gradient and pipeline staging, the
activations, the gathers' wire buffers) are not counted here; they are inside the host's peak RSS.

- primary: this rank's partition of every parameter (``ds_tensor``);
- optimizer: the fp32 master partitions and the optimizer's state tensors (Adam's moments);
- gradients: the gradient partitions (DeepSpeed's flat buffer);
- gradient bucket (DeepSpeed): its reduce bucket's contiguous buffers (``ipg_buckets``);
- kept copies: the most bytes of kept copies held at once (``stats.kept_bytes_peak``);
- error-feedback residuals: their bytes now;
- gathered parameters: the most bytes of full (gathered) parameters present at once, sampled
  at every module's forward entry (backward's recomputation included), prefetched ones too.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


def _bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages among ``tensors`` (views of one buffer counted once)."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def _state_tensors(state: Any) -> Iterable[torch.Tensor]:
    for per_param in state.values():
        for v in per_param.values() if isinstance(per_param, dict) else ():
            if isinstance(v, torch.Tensor):
                yield v


class GatheredPeak:
    """The most bytes of gathered parameters present at once while stepping (forward pre-hooks
    on every module, run after DeepSpeed's own gather hook: registered later)."""

    def __init__(self, module: torch.nn.Module) -> None:
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        self._available = ZeroParamStatus.AVAILABLE
        self._params = [p for p in module.parameters() if hasattr(p, "ds_status")]
        self.peak = 0
        self._handles = [m.register_forward_pre_hook(self._sample) for m in module.modules()]

    def _sample(self, *_: Any) -> None:
        now = sum(p.data.numel() * p.data.element_size() for p in self._params if p.ds_status == self._available)
        self.peak = max(self.peak, now)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def held(engine: Any, gathered_peak: int) -> dict[str, int]:
    """Bytes by part that the engine holds on this rank (see the module's docstring)."""
    params = [p for p in engine.module.parameters() if hasattr(p, "ds_tensor")]
    opt = engine.optimizer
    out = {
        "primary": _bytes(p.ds_tensor for p in params),
        "optimizer": _bytes([*getattr(opt, "fp32_partitioned_groups_flat", []), *_state_tensors(opt.optimizer.state)]),
        "gradients": _bytes([getattr(opt, "grad_partitions_flat_buffer", None)]),
        "gradient bucket (DeepSpeed)": _bytes(
            getattr(b, "buffer", None) for b in (getattr(opt, "ipg_buckets", None) or {}).values()
        ),
        "gathered parameters (peak)": gathered_peak,
    }
    runtime = getattr(engine, "hier_runtime", None)
    if runtime is not None:
        out["kept copies (peak)"] = int(runtime.stats.kept_bytes_peak)
        out["error-feedback residuals"] = int(runtime.numerics.error_feedback.nbytes())
    return out


__all__ = ["GatheredPeak", "held"]
