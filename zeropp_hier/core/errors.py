"""Errors raised on bad user input (each names the field, the value found and the fix), on a
checkpoint that cannot be saved or loaded safely (naming the file), and on non-finite training
numerics (naming the step, the rank and where the value was seen)."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class HierConfigError(ValueError):
    """A ``zeropp_hier`` config section (or a DeepSpeed setting next to it) is invalid.

    The message always has the form ``<field>: got <value>; <what to do>`` so that a user
    reading a failed job log knows which line of their JSON to change.
    """

    def __init__(self, field: str, value: object, fix: str):
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(f"zeropp_hier config error at '{field}': got {value!r}; {fix}")

    # Exceptions cross process boundaries (a multiprocessing pool's result, a launcher's report):
    # rebuilt from the constructor's arguments, not from the message alone.
    def __reduce__(self):
        return (type(self), (self.field, self.value, self.fix))


class HierTopologyError(HierConfigError):
    """The declared topology does not fit the world that was actually launched."""


class HierStartupError(RuntimeError):
    """Some ranks of a launched job never joined (or rank 0's store could not be reached)
    within the join timeout. ``missing``: the ranks that never arrived."""

    def __init__(self, message: str, missing: list[int]):
        super().__init__(message)
        self.missing = missing

    def __reduce__(self):
        return (type(self), (str(self), self.missing))


class HierUnsafeSaveError(RuntimeError):
    """``save_checkpoint`` after a failed or interrupted step: this rank's state may be out of
    step with its peers' ([Note: executor failure semantics] in comm/executor.py)."""


class HierCheckpointError(RuntimeError):
    """A checkpoint cannot be saved or loaded safely. Names the file, the problem and the fix."""

    def __init__(self, path: str, problem: str, fix: str):
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"zeropp_hier checkpoint error at '{path}': {problem}; {fix}")

    def __reduce__(self):  # picklable across processes, like the other errors
        return (type(self), (self.path, self.problem, self.fix))


class DeepSpeedVersionError(ImportError):
    """The installed DeepSpeed is outside the range whose internals this package was built on."""


class TorchVersionError(ImportError):
    """The installed torch is older than the oldest whose APIs this package calls
    ([Note: the torch versions claimed])."""


class SeenNonFinite(TypedDict):
    """Where a non-finite gradient was seen: the phase, the tier ("local": before any
    reduction) and the ranks."""

    phase: str
    tier: str
    ranks: list[int]  # the first and last ten when more were flagged
    count: NotRequired[int]  # how many ranks were flagged, when ``ranks`` shows only some


class SkippedStep(TypedDict):
    step: int  # the engine's global step
    cause: str


class HierNonFiniteError(FloatingPointError):
    """A gradient was NaN/Inf in a bf16/fp32 step and ``zeropp_hier.numerics.nonfinite`` is
    "raise". Raised on every rank at the same point, before the optimizer touches the weights.

    ``step`` is the engine's global step; ``rank``, ``phase`` and ``tier`` say where the
    non-finite value was first seen (``tier`` is None for a rank's local gradient, before any
    reduction); ``seen`` lists every (phase, tier, ranks) where it was seen.
    """

    def __init__(self, step: int, rank: int, phase: str, tier: str | None, where: str, seen: list[SeenNonFinite]):
        self.step = step
        self.rank = rank
        self.phase = phase
        self.tier = tier
        self.seen = seen
        self.where = where
        super().__init__(
            f"zeropp_hier: non-finite gradient at step {step}, first seen on rank {rank} in {where} "
            f"(phase '{phase}', tier '{tier or 'local'}'). The weights were not updated. Find the "
            "cause on that rank (inputs, loss, learning rate), or set zeropp_hier.numerics.nonfinite "
            'to "skip" to skip such steps and keep training'
        )

    def __reduce__(self):
        return (type(self), (self.step, self.rank, self.phase, self.tier, self.where, self.seen))


class HierSkippedStepsError(FloatingPointError):
    """``zeropp_hier.numerics.max_consecutive_skips`` steps in a row were skipped (non-finite
    gradients, or fp16 overflow): raised on every rank at the same step, with ``history``, one
    ``{"step", "cause"}`` per skipped step, oldest first."""

    def __init__(self, limit: int, history: list[SkippedStep]):
        self.limit = limit
        self.history = history
        steps = [h["step"] for h in history]
        shown = steps if len(steps) <= 10 else [*steps[:5], "...", *steps[-5:]]
        causes: dict[str, int] = {}
        for h in history:
            causes[h["cause"]] = causes.get(h["cause"], 0) + 1
        why = "; ".join(f"{n} x {c}" for c, n in causes.items())
        super().__init__(
            f"zeropp_hier: {len(history)} steps in a row were skipped (steps {shown}), the limit set by "
            f"zeropp_hier.numerics.max_consecutive_skips = {limit}; the weights have not changed since "
            f"step {steps[0] if steps else '?'}. Causes: {why}. Find the cause (inputs, loss, learning "
            "rate, loss scale), resume from the last checkpoint, or raise max_consecutive_skips"
        )

    def __reduce__(self):
        return (type(self), (self.limit, self.history))
