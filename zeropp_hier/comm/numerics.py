"""Numerics of the compressed collectives, per engine: error feedback, sampled compression error,
and where non-finite gradients appear.

The collectives call a *hook* around each compressed payload (``ReduceHook`` / ``GatherHook``,
the ``StageHook`` / ``PayloadHook`` protocols of comm/hooks.py):
``prepare`` may change the send buffer (error feedback), ``encoded`` sees the buffer and a lazy
decoder of its payload, ``reduced`` sees a stage's fp32 sum. The hooks do local tensor maths
only; the one collective here is ``Numerics.agree``, which every rank enters once per optimizer
step ([Note: non-finite gradients]).

[Note: compression telemetry]
For each (phase, tier) that compresses, every N-th call (``numerics.sample_every``) measures
||x - deq(q(x))|| / ||x|| on this rank's own payload x (for gradients: the buffer after error
feedback, i.e. exactly what was quantized). Sampling by call count keeps it deterministic and
costs one dequantize of a local payload per N calls; stages with error feedback decode every
payload anyway. Non-finite or all-zero payloads are not sampled (the ratio means nothing).

[Note: non-finite gradients]
Each rank checks its local gradient rows before the reduction and each stage's fp32 sum after
it (one pass over the rows, smaller passes after), and raises local flags. At the optimizer
step every rank contributes its flags to one small all-reduce of a count per location; when any
is set, a second all-reduce of one bit per rank and location names the ranks, so every rank
learns where and on which ranks a non-finite value was seen, and all take the same decision:
- fp16: DeepSpeed's own overflow check reads our reduced partitions, in which a non-finite
  input is still non-finite (a block holding NaN/Inf dequantizes to NaN; sums keep Inf/NaN), so
  the step is skipped and the loss scale lowered exactly as in stock DeepSpeed.
- bf16/fp32, "skip": DeepSpeed 0.19 skips a step whose gradient norm is not finite; we check
  that it did (a step we flagged must not be applied) and report it.
- bf16/fp32, "raise": HierNonFiniteError on every rank, before the optimizer runs.
A skipped step also drops the error-feedback residuals ([Note: error feedback]). Skips are
capped: ``numerics.max_consecutive_skips`` skipped steps in a row (any cause, fp16 overflow
included) raise HierSkippedStepsError on every rank, with the step and cause of each skip.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, TypedDict

import torch
import torch.distributed as dist

from ..core.errors import HierNonFiniteError, HierSkippedStepsError, SeenNonFinite, SkippedStep
from ..core.plan import CommPlan, Hop
from ..core.policy import NumericsConfig
from ..core.ranks_text import SHOWN
from ..core.topology import Topology
from .error_feedback import ErrorFeedback, FeedbackState

log = logging.getLogger("zeropp_hier")


# -- telemetry -------------------------------------------------------------------------------


def relative_error(x: torch.Tensor, decoded: torch.Tensor) -> float | None:
    """||x - decoded|| / ||x|| in fp32; None when x is zero or either side is not finite."""
    num, den = _error_norms(x, decoded).tolist()
    return _ratio(num, den)


def _error_norms(x: torch.Tensor, decoded: torch.Tensor) -> torch.Tensor:
    """[||x - decoded||, ||x||] in fp32, on x's device (no host sync)."""
    x = x.reshape(-1).float()
    d = decoded.reshape(-1).float()
    return torch.stack([torch.linalg.vector_norm(x - d), torch.linalg.vector_norm(x)])


def _ratio(num: float, den: float) -> float | None:
    if not den or den != den or den == float("inf") or num != num or num == float("inf"):
        return None
    return num / den


@dataclass
class _Acc:
    samples: int = 0
    total: float = 0.0
    max: float = 0.0
    last: float = 0.0


class ErrorSummary(TypedDict):
    """The sampled relative compression error of one (phase, tier)."""

    mean: float
    max: float
    last: float
    samples: int


class Telemetry:
    """Sampled relative compression error per (phase, tier) ([Note: compression telemetry]).

    A sample is two norms computed on the payload's device and kept there; ``flush`` (once per
    step, and before a snapshot) brings every pending sample to the host in one copy, so the
    gathers and reduce stages never wait for the host ([Note: no host traffic in the hot
    path] in core/layout.py)."""

    def __init__(self, every: int):
        self.every = every
        self._calls: dict[tuple[str, str], int] = {}
        self._acc: dict[tuple[str, str], _Acc] = {}
        self._pending: list[tuple[tuple[str, str], torch.Tensor]] = []
        self._lock = threading.Lock()  # the executor's lanes sample from their own threads

    def due(self, phase: str, tier: str) -> bool:
        """Counts one call of (phase, tier); True for the 1st, (N+1)-th, ... call."""
        if self.every <= 0:
            return False
        with self._lock:
            n = self._calls.get((phase, tier), 0)
            self._calls[(phase, tier)] = n + 1
        return n % self.every == 0

    def record(self, phase: str, tier: str, x: torch.Tensor, decoded: torch.Tensor) -> None:
        norms = _error_norms(x, decoded)
        with self._lock:
            self._pending.append(((phase, tier), norms))

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        keys = [k for k, _ in pending]
        devices = {t.device for _, t in pending}
        if len(devices) == 1:
            values = torch.stack([t for _, t in pending]).cpu().tolist()
        else:  # samples from several devices: one copy per sample, still only here
            values = [t.cpu().tolist() for _, t in pending]
        for key, (num, den) in zip(keys, values):
            err = _ratio(num, den)
            if err is None:
                continue
            a = self._acc.setdefault(key, _Acc())
            a.samples += 1
            a.total += err
            a.max = max(a.max, err)
            a.last = err

    def snapshot(self) -> dict[str, dict[str, ErrorSummary]]:
        self.flush()
        out: dict[str, dict[str, ErrorSummary]] = {}
        for (phase, tier), a in sorted(self._acc.items()):
            out.setdefault(phase, {})[tier] = {
                "mean": a.total / a.samples,
                "max": a.max,
                "last": a.last,
                "samples": a.samples,
            }
        return out

    def reset(self) -> None:
        self._calls.clear()
        self._acc.clear()
        self._pending.clear()


# -- non-finite gradients --------------------------------------------------------------------


class Location(NamedTuple):
    phase: str
    tier: str | None  # None: the rank's local gradient, before any reduction
    where: str  # for messages


def reduce_locations(plan: CommPlan) -> tuple[Location, ...]:
    locs = [Location("grad_reduce", None, "its local gradient, before the reduction")]
    for i, hop in enumerate(plan.reduce):
        locs.append(
            Location("grad_reduce", hop.tier, f"the sum after reduce stage {i} ({'+'.join(hop.axes)}, {hop.scheme})")
        )
    return tuple(locs)


class Verdict(NamedTuple):
    """Where non-finite gradients were seen this step, agreed by every rank."""

    seen: tuple[tuple[Location, tuple[int, ...]], ...]  # (location, ranks), locations in order
    # ranks flagged per entry of ``seen`` when more than ``ranks`` shows (its first and last ten)
    counts: tuple[int, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.seen)

    def first(self) -> tuple[Location, int]:
        loc, ranks = self.seen[0]
        return loc, ranks[0]

    def as_list(self) -> list[SeenNonFinite]:
        out: list[SeenNonFinite] = []
        for i, (loc, ranks) in enumerate(self.seen):
            item: SeenNonFinite = {"phase": loc.phase, "tier": loc.tier or "local", "ranks": list(ranks)}
            if self.counts and self.counts[i] > len(ranks):
                item["count"] = self.counts[i]
            out.append(item)
        return out


def bitmap_bytes(world: int) -> int:
    """Bytes of the second round's table per location: one bit per rank."""
    return -(-world // 8)


def verdict_of(locations: tuple[Location, ...], bits: torch.Tensor, world: int) -> Verdict:
    """The verdict from the agreed [locations, bitmap_bytes(world)] bitmap (bit r%8 of byte r//8:
    rank r saw a non-finite value there)."""
    shifts = torch.arange(8, dtype=torch.uint8)
    flags = ((bits.unsqueeze(-1) >> shifts) & 1).reshape(len(locations), -1)[:, :world]
    seen, counts = [], []
    for i, loc in enumerate(locations):
        where = torch.nonzero(flags[i]).view(-1)
        if where.numel():
            shown = where if where.numel() <= 2 * SHOWN else torch.cat([where[:SHOWN], where[-SHOWN:]])
            seen.append((loc, tuple(int(r) for r in shown)))
            counts.append(int(where.numel()))
    return Verdict(tuple(seen), tuple(counts))


class NonFiniteMonitor:
    """Local flags, one per location, kept on the gradients' device and set without a host sync
    (as DeepSpeed's own overflow tracker); read once per step by ``agree``."""

    def __init__(self, locations: tuple[Location, ...]):
        self.locations = locations
        self.flags: torch.Tensor | None = None  # bool [locations], created on first use

    def note(self, index: int, t: torch.Tensor) -> None:
        if self.flags is None or self.flags.device != t.device:
            self.flags = torch.zeros(len(self.locations), dtype=torch.bool, device=t.device)
        self.flags[index : index + 1].logical_or_(~torch.isfinite(t).all().view(1))

    def agree(self, rank: int, world: int, device: torch.device | str = "cpu") -> Verdict:
        """Collective (every rank of the default group): combine every rank's flags. Round one
        is a fixed-size all-reduce (ranks flagged per location); only when it counts any does a
        second round name them, one bit per rank ([Note: per-rank costs flat in the world] in
        core/layout.py). Every rank sees the same counts, so all take the second round or none."""
        n = len(self.locations)
        mine = torch.zeros(n, dtype=torch.int32, device=device)
        if self.flags is not None:
            mine.copy_(self.flags.to(device=device, dtype=torch.int32))
            self.flags.zero_()
        counts = mine.clone()
        dist.all_reduce(counts)
        if not bool(counts.any()):
            return Verdict(())
        # each rank sets only its own bit, so the sum of the bytes is their OR (no carries)
        bits = torch.zeros(n, bitmap_bytes(world), dtype=torch.uint8, device=device)
        bits[:, rank // 8] = mine.to(torch.uint8) << (rank % 8)
        dist.all_reduce(bits)
        return verdict_of(self.locations, bits.cpu(), world)

    def reset(self) -> None:
        if self.flags is not None:
            self.flags.zero_()


# -- hooks -----------------------------------------------------------------------------------


class ReduceHook:
    """One reduce-scatter stage of one bucket."""

    __slots__ = ("num", "key", "stage", "hop", "loss_scale")

    def __init__(self, num: Numerics, key: tuple[str, ...] | None, stage: int, hop: Hop, loss_scale: float):
        self.num, self.key, self.stage, self.hop, self.loss_scale = num, key, stage, hop, loss_scale

    def _feedback(self) -> bool:
        return self.hop.error_feedback and self.key is not None

    def prepare(self, send: torch.Tensor) -> torch.Tensor:
        if self.key is None or not self._feedback():
            return send
        return self.num.error_feedback.compensate((self.key, self.stage), send, self.loss_scale)

    def encoded(self, sent: torch.Tensor, decode: Callable[[], torch.Tensor]) -> None:
        if self.hop.scheme == "none":
            return
        feedback = self._feedback()
        sample = self.num.telemetry.due("grad_reduce", self.hop.tier)
        if not (feedback or sample):
            return
        decoded = decode()
        if feedback and self.key is not None:
            self.num.error_feedback.record((self.key, self.stage), sent, decoded, self.loss_scale)
        if sample:
            self.num.telemetry.record("grad_reduce", self.hop.tier, sent, decoded)

    def reduced(self, summed: torch.Tensor) -> None:
        self.num.monitor.note(1 + self.stage, summed)


class GatherHook:
    """One compressed gather hop: telemetry only (a gather starts from exact weights each time,
    so there is no error to feed back)."""

    __slots__ = ("num", "phase", "hop")

    def __init__(self, num: Numerics, phase: str, hop: Hop):
        self.num, self.phase, self.hop = num, phase, hop

    def encoded(self, sent: torch.Tensor, decode: Callable[[], torch.Tensor]) -> None:
        if self.num.telemetry.due(self.phase, self.hop.tier):
            self.num.telemetry.record(self.phase, self.hop.tier, sent, decode())


# -- per-engine facade -----------------------------------------------------------------------


@dataclass
class StepReport:
    events: list[dict] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)


class FeedbackStage(TypedDict):
    axes: list[str]
    scheme: str


class FeedbackSummary(TypedDict):
    stages: list[FeedbackStage]  # the reduce stages that feed their error back
    buffers: int  # residuals held
    bytes: int


class NonfiniteSummary(TypedDict):
    policy: str  # numerics.nonfinite
    skipped_steps: list[int]
    events: list[dict[str, object]]  # one per skipped step: its step, action, cause and where seen


class NumericsSnapshot(TypedDict):
    """``comm_stats(engine)["numerics"]``."""

    relative_error: dict[str, dict[str, ErrorSummary]]  # phase -> tier -> its sampled error
    sample_every: int
    error_feedback: FeedbackSummary
    nonfinite: NonfiniteSummary


class Numerics:
    def __init__(self, cfg: NumericsConfig, plan: CommPlan, topo: Topology, rank: int):
        self.cfg = cfg
        self.plan = plan
        self.rank = rank
        self.world = topo.world_size
        ef_stages = [(i, h) for i, h in enumerate(plan.reduce) if h.error_feedback]
        self.error_feedback = ErrorFeedback(
            {
                "world": topo.world_size,
                "dims": tuple(topo.dims),
                "rank_map": topo.rank_map,
                "rank": rank,
                "stages": tuple((i, h.axes, h.scheme, h.block_size) for i, h in ef_stages),
            },
            dtype=torch.bfloat16 if cfg.residual_dtype == "bf16" else torch.float32,
        )
        self.telemetry = Telemetry(cfg.sample_every)
        self.monitor = NonFiniteMonitor(reduce_locations(plan))
        self.report = StepReport()
        self._steps_seen = 0
        # skipped steps since the last applied one (not reset with the stats: the cap counts them)
        self.consecutive_skips: list[SkippedStep] = []
        self._step_of: Callable[[], int] | None = None

    def bind_step_counter(self, owner: object, attr: str = "global_steps") -> None:
        """Report steps as ``owner.<attr>`` (the engine's global step), without keeping the
        engine alive."""
        ref = weakref.ref(owner)
        self._step_of = lambda: getattr(ref(), attr)

    def current_step(self) -> int:
        if self._step_of is not None:
            try:
                return int(self._step_of())
            except (TypeError, AttributeError):  # the engine is gone
                pass
        return self._steps_seen

    # the drivers' hooks (a ``comm.hooks.HookSource``), per bucket / hop
    def check_local(self, rows: torch.Tensor) -> None:
        self.monitor.note(0, rows)

    def reduce_hook(self, key: tuple[str, ...] | None, stage: int, hop: Hop, loss_scale: float) -> ReduceHook:
        return ReduceHook(self, key, stage, hop, loss_scale)

    def gather_hook(self, phase: str, hop: Hop) -> GatherHook | None:
        if hop.scheme == "none" or self.telemetry.every <= 0:
            return None
        return GatherHook(self, phase, hop)

    # called by the optimizer, once per step, on every rank
    def agree(self, device: torch.device | str = "cpu") -> Verdict:
        """``device``: where the collective's tensor lives (the accelerator for NCCL/RCCL)."""
        return self.monitor.agree(self.rank, self.world, device)

    def fail(self, verdict: Verdict) -> HierNonFiniteError:
        """The error to raise for ``verdict``; the step's residuals are dropped as for a skip."""
        self.error_feedback.reset()
        loc, rank = verdict.first()
        return HierNonFiniteError(self.current_step(), rank, loc.phase, loc.tier, loc.where, verdict.as_list())

    def finish_step(self, verdict: Verdict, applied: bool, fp16: bool) -> None:
        self.telemetry.flush()  # the step's samples, in one copy to the host
        step = self.current_step()
        self._steps_seen += 1
        if applied:
            self.consecutive_skips.clear()
            if verdict.any:  # must not happen: DeepSpeed applied non-finite gradients
                loc, rank = verdict.first()
                raise RuntimeError(
                    f"zeropp_hier: step {step} was applied although a non-finite "
                    f"gradient was seen on rank {rank} in {loc.where}; the weights "
                    "are no longer trustworthy (DeepSpeed did not skip the step)"
                )
            return
        self.error_feedback.reset()  # [Note: error feedback], skipped steps
        if verdict.any:
            loc, rank = verdict.first()
            cause = f"non-finite gradient, first seen on rank {rank} in {loc.where}"
        else:
            cause = "DeepSpeed's overflow check (the gradient norm was not finite)"
        self.report.skipped_steps.append(step)
        self.report.events.append({"step": step, "action": "skipped", "cause": cause, "seen": verdict.as_list()})
        self.consecutive_skips.append({"step": step, "cause": cause})
        if self.rank == 0:
            msg = f"zeropp_hier: step {step} skipped, weights unchanged: {cause}"
            # fp16 overflow is routine (the loss scaler is searching); elsewhere it is news
            (log.info if fp16 else log.warning)(msg)
        # every rank took the same verdict and DeepSpeed's overflow decision is agreed: all ranks
        # count the same skips and raise at the same step
        if len(self.consecutive_skips) >= self.cfg.max_consecutive_skips:
            raise HierSkippedStepsError(self.cfg.max_consecutive_skips, list(self.consecutive_skips))

    def restore_error_feedback(self, state: FeedbackState | None, device: torch.device | str) -> None:
        why = self.error_feedback.load_state_dict(state, device)
        if why is not None and any(h.error_feedback for h in self.plan.reduce) and self.rank == 0:
            log.warning(f"zeropp_hier: error-feedback residuals start from zero after this load: {why}")

    def snapshot(self) -> NumericsSnapshot:
        return {
            "relative_error": self.telemetry.snapshot(),
            "sample_every": self.telemetry.every,
            "error_feedback": {
                "stages": [{"axes": list(h.axes), "scheme": h.scheme} for h in self.plan.reduce if h.error_feedback],
                "buffers": len(self.error_feedback.residuals),
                "bytes": self.error_feedback.nbytes(),
            },
            "nonfinite": {
                "policy": self.cfg.nonfinite,
                "skipped_steps": list(self.report.skipped_steps),
                "events": [dict(e) for e in self.report.events],
            },
        }

    def reset_stats(self) -> None:
        self.telemetry.reset()
        self.report = StepReport()
