"""The gradient reduce of every simulated rank in one process, stage by stage, with the package's
own pieces: the plan's hops (``core.plan.make_plan``), the engine's row layout
(``layout.pack_grad_rows`` / ``split_for_stage`` / ``unpack_my_chunks``), the quantizer
(``quant``: the compiled kernels, with the block rotation where a stage rotates: the same bits as
``quant.reference``, several times faster), and error feedback
(``comm.error_feedback.ErrorFeedback``).

Each stage does what ``comm.collectives.reduce_stage_steps`` does on one rank, here for all
ranks at once: every rank splits its buffer by destination (``split_for_stage``), adds its
residual (feedback), encodes the whole send buffer, and each rank then sums the parts its peers
sent it in peer order (``Topology.peers``), in fp32 after dequantization. What the benchmark
adds beside the package: a LoCo-style moving-average residual, and the block rotation on chosen
stages ([Note: block rotation] in quant/reference.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import torch

from zeropp_hier import quant
from zeropp_hier.comm.error_feedback import ErrorFeedback
from zeropp_hier.core import layout
from zeropp_hier.core.plan import Hop, make_plan
from zeropp_hier.core.policy import BITS, QUANTIZED, parse_compression
from zeropp_hier.core.topology import Topology

_CAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
FEEDBACK = ("off", "package", "loco")


@dataclass(frozen=True)
class Stage:
    """One reduce stage: the package's hop, the residual kept at its sender ("off", "package":
    ``ErrorFeedback``, "loco": e <- beta*e + (1-beta)*((x+e) - Q(x+e))), and the block rotation
    (0: none; else R, [Note: block rotation])."""

    hop: Hop
    feedback: str = "off"
    beta: float = 0.9
    rotate: int = 0

    def __post_init__(self) -> None:
        if self.feedback not in FEEDBACK:
            raise ValueError(f"feedback {self.feedback!r}: use one of {FEEDBACK}")
        if self.feedback != "off" and self.hop.scheme not in QUANTIZED:
            raise ValueError(
                f"feedback on the {self.hop.tier} stage, which is {self.hop.scheme!r}: nothing to feed back"
            )
        if self.rotate and self.hop.scheme not in QUANTIZED:
            raise ValueError(f"rotation on the {self.hop.tier} stage, which is {self.hop.scheme!r}")


def plan_stages(preset: str, compression: object, topo: Topology) -> tuple[Stage, ...]:
    """The preset's gradient stages as the engine would run them for ``compression`` (the
    section's ``compression`` value), with the package's error feedback where the plan has it."""
    cfg = parse_compression(compression, preset, "compression")  # type: ignore[arg-type]
    return tuple(Stage(hop, "package" if hop.error_feedback else "off") for hop in make_plan(preset, cfg, topo).reduce)


def modify(stages: Sequence[Stage], tier: str, **changes) -> tuple[Stage, ...]:
    """``stages`` with the stage of ``tier`` changed (``feedback``, ``beta``, ``rotate``);
    a tier the plan has no stage for (an axis of size 1) leaves them as they are."""
    return tuple(replace(s, **changes) if s.hop.tier == tier else s for s in stages)


def row_pad(stages: Sequence[Stage]) -> int:
    """As ``comm.reduce.row_pad``: rows padded to the largest quantized block size."""
    return max((s.hop.block_size for s in stages if s.hop.scheme in QUANTIZED), default=1)


class LoCoFeedback:
    """A moving-average residual per key: compensate adds it, record folds in the new error
    (the interface of ``ErrorFeedback``, loss scale 1)."""

    def __init__(self, beta: float):
        self.beta = beta
        self.residuals: dict[object, torch.Tensor] = {}

    def compensate(self, key: object, send: torch.Tensor, loss_scale: float = 1.0) -> torch.Tensor:
        r = self.residuals.get(key)
        return send if r is None else send + r

    def record(self, key: object, sent: torch.Tensor, decoded: torch.Tensor, loss_scale: float = 1.0) -> None:
        err = sent - decoded
        r = self.residuals.get(key)
        self.residuals[key] = (
            (1.0 - self.beta) * err if r is None else r.mul_(self.beta).add_(err, alpha=1.0 - self.beta)
        )


def _feedback(stage: Stage) -> ErrorFeedback | LoCoFeedback:
    return LoCoFeedback(stage.beta) if stage.feedback == "loco" else ErrorFeedback({})


def _encode(send: torch.Tensor, stage: Stage) -> tuple[object, torch.Tensor | None]:
    """This rank's payload of one stage and, where feedback needs it, what it decodes to."""
    hop = stage.hop
    if hop.scheme in BITS:
        q = quant.quantize(send.reshape(-1), BITS[hop.scheme], hop.block_size, stage.rotate)
        dec = quant.dequantize(q, torch.float32, stage.rotate) if stage.feedback != "off" else None
        return q, None if dec is None else dec.view_as(send)
    return send.to(_CAST.get(hop.scheme, torch.float32)), None


def _part(payload: object, k: int, j: int, m: int) -> object:
    """Row j (of k) of a rank's payload: what it sends its j-th peer."""
    if isinstance(payload, quant.Quantized):
        return quant.Quantized(
            payload.data.view(k, -1)[j], payload.scales.view(k, -1)[j], m, payload.bits, payload.block_size
        )
    assert isinstance(payload, torch.Tensor)
    return payload.view(k, m)[j]


def _sum(parts: list, stage: Stage) -> torch.Tensor:
    """The received parts summed as the engine sums them: dequantized and added in fp32 in peer
    order (quant.dequantize_sum), or the exact wire's ``.to(float32).sum(0)``."""
    if isinstance(parts[0], quant.Quantized):
        return quant.dequantize_sum(parts, torch.float32, stage.rotate)
    return torch.stack(parts).to(torch.float32).sum(0)


class Reducer:
    """Gradient reduces over ``topo``'s ranks, one per named list of stages, keeping each
    stage's residuals (one per rank) from call to call, as a job keeps them across steps.

    Pipelines that begin with the same stages (and the same row padding, hence layout) share
    that prefix's work and residuals: the same inputs through the same stages give the same
    buffers, so each prefix is computed once per call."""

    def __init__(self, topo: Topology, pipelines: Mapping[str, Sequence[Stage]]):
        for name, stages in pipelines.items():
            for st in stages:
                if topo.axes_size(st.hop.axes) < 2:
                    raise ValueError(f"{name}: stage over {st.hop.axes} spans one rank in {topo.dims}")
        self.topo = topo
        self.pipelines = {name: tuple(stages) for name, stages in pipelines.items()}
        self.state: dict[tuple, list | None] = {}

    def reduce(self, grads: Sequence[Sequence[torch.Tensor]]) -> dict[str, list[torch.Tensor]]:
        """grads[r]: rank r's gradients (the bucket's tensors, the same shapes on every rank).
        Returns, per pipeline, the world's average of each tensor (fp32, flat), assembled from
        every rank's reduced chunks."""
        topo, world = self.topo, self.topo.world_size
        numels = [t.numel() for t in grads[0]]
        cache: dict[tuple, list[torch.Tensor]] = {}
        packed: dict[int, list[layout.GradRows]] = {}
        out = {}
        for name, stages in self.pipelines.items():
            pad = row_pad(stages)
            if pad not in packed:
                packed[pad] = [
                    layout.pack_grad_rows(g, world, pad, scale=1.0 / world, align_chunks=pad > 1) for g in grads
                ]
            rows = packed[pad]
            width = rows[0].rows.shape[1]
            # coordinate index == rank (identity map): rows_by_coord is the identity
            bufs = [p.rows.view(*topo.dims, width) for p in rows]
            for s, stage in enumerate(stages):
                key = (pad, stages[: s + 1])
                if key not in cache:
                    if key not in self.state:
                        self.state[key] = [_feedback(stage) for _ in range(world)] if stage.feedback != "off" else None
                    cache[key] = self._stage(s, stage, bufs, self.state[key])
                bufs = cache[key]
            pieces = [
                layout.unpack_my_chunks(b.reshape(-1), numels, rows[0].chunk, r, rows[0].slots)
                for r, b in enumerate(bufs)
            ]
            out[name] = [torch.cat([pieces[r][t] for r in range(world)]) for t in range(len(numels))]
        return out

    def _stage(self, s: int, stage: Stage, bufs: list[torch.Tensor], fb: list | None) -> list[torch.Tensor]:
        axes, topo = stage.hop.axes, self.topo
        payloads = []
        k = m = 0
        for r, buf in enumerate(bufs):
            send = layout.split_for_stage(buf, axes)  # [k, m]
            k, m = send.shape
            if fb is not None:
                send = fb[r].compensate(("bucket", s), send, 1.0)
            payload, decoded = _encode(send, stage)
            if fb is not None:
                assert decoded is not None
                fb[r].record(("bucket", s), send, decoded, 1.0)
            payloads.append(payload)
        out = []
        for r, buf in enumerate(bufs):
            peers = topo.peers(r, axes)
            me = peers.index(r)
            summed = _sum([_part(payloads[p], k, me, m) for p in peers], stage)
            dims = layout.dims_after_stage((buf.shape[0], buf.shape[1], buf.shape[2]), axes)
            out.append(summed.view(*dims, buf.shape[3]))
        return out
