"""What the collectives call around a compressed payload, as types.

A collective takes an optional *hook* per call (``collectives.HierCollectives.gather_hop_steps``,
``encode``, ``reduce_stage``); the drivers (``comm/gather.py``, ``comm/reduce.py``) get one per
hop from a ``HookSource``. ``comm/numerics.py`` implements them (error feedback, sampled
compression error, non-finite flags); ``NO_HOOKS`` is the source that does nothing. Hooks do
local tensor maths only: no collective, no host synchronisation.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from ..core.plan import Hop


class PayloadHook(Protocol):
    """Sees a payload as it is put on the wire."""

    def encoded(self, sent: torch.Tensor, decode: Callable[[], torch.Tensor]) -> None:
        """``sent``: the values handed to the wire format; ``decode()``: what the receivers
        will read of them (computed only if called)."""


class StageHook(PayloadHook, Protocol):
    """One reduce-scatter stage of one gradient bucket."""

    def prepare(self, send: torch.Tensor) -> torch.Tensor:
        """The send buffer [k, m] before encoding; returns the buffer to send (error feedback
        adds the residual of the previous step here)."""

    def reduced(self, summed: torch.Tensor) -> None:
        """The stage's fp32 sum, as this rank received it."""


class HookSource(Protocol):
    """Hands the drivers a hook per hop, and sees a bucket's local gradient rows."""

    def gather_hook(self, phase: str, hop: Hop) -> PayloadHook | None: ...

    def reduce_hook(
        self, key: tuple[str, ...] | None, stage: int, hop: Hop, loss_scale: float
    ) -> StageHook | None: ...

    def check_local(self, rows: torch.Tensor) -> None: ...


class _NoHooks:
    def gather_hook(self, phase: str, hop: Hop) -> PayloadHook | None:
        return None

    def reduce_hook(self, key: tuple[str, ...] | None, stage: int, hop: Hop, loss_scale: float) -> StageHook | None:
        return None

    def check_local(self, rows: torch.Tensor) -> None:
        return None


NO_HOOKS: HookSource = _NoHooks()
