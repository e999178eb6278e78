"""Error feedback for compressed gradient stages: the residuals, their use, their checkpoint form.

Pure tensor logic, no process groups: the runtime calls ``compensate`` before a stage quantizes
its send buffer and ``record`` after, with the values it decoded from its own payload.

[Note: error feedback]
A compressed stage sends Q(x) instead of x; without feedback the difference e = x - deq(Q(x))
is lost, every step, and int4's error is large (~10-20% of the buffer's norm). With error
feedback (1-bit Adam, Tang et al. 2021; LoCo, Xie et al. 2024) the rank keeps e and adds it to
the same buffer at its next compression: x' = x_next + e. Summed over T compressions, what was
sent equals the sum of the true buffers minus the last residual: the error is delayed by one
step and bounded by one quantization step, instead of accumulating in the weights.

- Which buffer: each reduce-scatter stage quantizes its send buffer, the [k, m] fp32 partial
  sums this rank sends to its k peers of that stage (collectives.reduce_stage_steps). The residual is
  the error of what *this rank* sent, so it lives per rank, per stage.
- Which bucket: DeepSpeed reduces gradients bucket by bucket; for a static graph the buckets
  hold the same parameters every step, so the bucket's parameter names (in DeepSpeed's ds_id
  order) name it and fix the shape of every stage's send buffer. Key: (names, stage index).
  Names, not ds_ids: ds_ids count up across every engine a process builds, so the engine that
  loads a checkpoint would not find the residuals of the engine that saved it.
- Gradient accumulation: every micro-step reduces every bucket, so micro-step i's residual is
  added at micro-step i+1 (or at the next step's first): the window's sum is exact up to the
  last residual, as for whole steps.
- Units: fp16 gradients arrive multiplied by the dynamic loss scale, which changes between
  steps; residuals are stored divided by the scale and multiplied by the current one when used.
- Skipped steps (fp16 overflow, non-finite gradients): DeepSpeed discards the step's gradients;
  the residuals carry part of them (and NaN for a non-finite block), so they are discarded too
  (``reset``). That costs one step's worth of quantization error, only when a step is skipped.
  A non-finite element is never stored (it becomes 0), so no bad value outlives its step.
- Memory: one fp32 tensor per (bucket, stage) with feedback, the size of that stage's send
  buffer. Frontier's default (node stage only) keeps 1/(gpus_per_node*gcds_per_gpu) of the
  gradient elements in fp32: M/2 bytes for M parameters on a Frontier node of 8 GCDs.
  Feedback on a first stage (e.g. zeropp with feedback) keeps a full fp32 gradient: 4M bytes.
- Checkpoints: saved in the rank's ZeRO optimizer-state file (``deepspeed/stage3.py``), with a signature of
  the layout; a checkpoint from another world, topology or plan starts with empty residuals
  (logged), since the residuals' shapes and meaning depend on all three.
"""

from __future__ import annotations

import logging
from typing import Hashable, TypedDict

import torch

log = logging.getLogger("zeropp_hier")

STATE_FORMAT = 1
Key = tuple[tuple[str, ...], int]  # (parameter names of the bucket, stage index)


class SavedResidual(TypedDict):
    bucket: list[str]  # parameter names of the bucket
    stage: int
    residual: torch.Tensor  # on the CPU, in the residual dtype


class FeedbackState(TypedDict):
    """The residuals as a checkpoint holds them (``ErrorFeedback.state_dict``)."""

    format: int  # STATE_FORMAT
    signature: dict[str, Hashable]  # the layout the residuals belong to
    entries: list[SavedResidual]


class ErrorFeedback:
    def __init__(self, signature: dict[str, Hashable], dtype: torch.dtype = torch.float32):
        self.signature = signature
        self.dtype = dtype  # storage of the residuals; added back in fp32
        self.residuals: dict[Key, torch.Tensor] = {}

    def compensate(self, key: Key, send: torch.Tensor, loss_scale: float) -> torch.Tensor:
        """send: [k, m] fp32 -> send + residual (a new tensor; ``send`` may alias the caller's
        buffer). Unchanged when there is no residual for this key yet."""
        r = self.residuals.get(key)
        if r is None:
            return send
        if r.shape != send.shape:
            raise RuntimeError(
                f"zeropp_hier: error-feedback residual for bucket {list(key[0][:3])}... stage "
                f"{key[1]} has shape {tuple(r.shape)} but the send buffer has "
                f"{tuple(send.shape)}; the same parameters must give the same buffer"
            )
        return send + r if loss_scale == 1.0 else torch.add(send, r, alpha=loss_scale)

    def record(self, key: Key, sent: torch.Tensor, decoded: torch.Tensor, loss_scale: float) -> None:
        """sent: the (compensated) buffer that was compressed; decoded: what its payload
        decodes to. Stores (sent - decoded) / loss_scale, with non-finite elements as 0."""
        r = self.residuals.get(key)
        if r is None or r.shape != sent.shape:
            r = torch.empty(sent.shape, dtype=self.dtype, device=sent.device)
        # computed in fp32 (in place in r when it is fp32), rounded to the storage dtype once
        diff = r if r.dtype == torch.float32 else torch.empty(sent.shape, dtype=torch.float32, device=sent.device)
        torch.sub(sent, decoded, out=diff)
        if loss_scale != 1.0:
            diff.div_(loss_scale)
        diff.masked_fill_(~torch.isfinite(diff), 0.0)
        if diff is not r:
            r.copy_(diff)
        self.residuals[key] = r

    def reset(self) -> None:
        self.residuals.clear()

    def nbytes(self) -> int:
        return sum(r.numel() * r.element_size() for r in self.residuals.values())

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> FeedbackState:
        return {
            "format": STATE_FORMAT,
            "signature": dict(self.signature),
            "entries": [
                {"bucket": list(ids), "stage": stage, "residual": r.detach().cpu().clone()}
                for (ids, stage), r in sorted(self.residuals.items())
            ],
        }

    def load_state_dict(self, state: FeedbackState | None, device: torch.device | str = "cpu") -> str | None:
        """Replace the residuals by the checkpoint's. Returns None when loaded, else why not (the
        residuals are then empty: feedback restarts from zero, which is safe, only less exact)."""
        self.reset()
        if state is None:
            return "the checkpoint has no error-feedback state (saved without feedback or by another engine)"
        if state.get("format") != STATE_FORMAT:
            return f"unknown error-feedback state format {state.get('format')!r}"
        saved = state.get("signature")
        if saved != self.signature:
            return f"the checkpoint's layout {saved} differs from this engine's {self.signature}"
        for e in state["entries"]:
            self.residuals[(tuple(str(n) for n in e["bucket"]), int(e["stage"]))] = e["residual"].to(
                device=device, dtype=self.dtype
            )
        return None
