"""Save in time: when the allocation ends, how long a save takes, and the step at which every
rank stops.

[Note: saving before the wall clock ends]
A Slurm job ends at its time limit (on Frontier 2 hours for 1-91 nodes); whatever was trained
since the last ``save_every`` is lost. So at each step boundary the job asks ``Deadline.check``
whether to save now and exit. Two things can say yes on a rank:

- *the clock*: the allocation's end (Slurm's ``EndTime`` for the job, read once at start from
  ``$SLURM_JOB_END_TIME`` where Slurm sets it (23.02 and later), else ``squeue -h -j <id> -o %e``,
  else ``scontrol show job <id>``) is closer than one more step, a save and a margin;
- *a signal*: the batch script asks Slurm for a warning (``#SBATCH --signal=B:USR1@<seconds>``);
  ``B:`` delivers it to the batch shell only, so the script traps it and forwards it to srun,
  which forwards it to every task (scripts/frontier/train.sbatch). A handler installed by
  ``watch_signal`` only sets a flag: the step in progress finishes, the flag is read at the next
  boundary.

A rank must not decide alone: a signal may reach one rank only (or one rank first), and clocks
and step times differ a little between nodes, so one rank would save and exit while the others
enter the next step and wait for it. So each rank's two flags go into one all-reduce (MAX) over
the world at every boundary, and every rank acts on the same agreed flags at the same step. The
cost is one 8-byte all-reduce per step.

How long a save takes: the last save's measured seconds once there is one (``record_save``);
before the first, the bytes each rank writes divided by a stated per-rank write rate (the
planner's bytes per rank, ``planner.memory``'s fp32 master weights and Adam moments plus the
weights, and ``rate_gbps``). The default rate is a cautious share of Orion's published write
rate (OLCF: the capacity tier's peak write is 4.6 TB/s over 47,700 disks, the NVMe performance
tier's 10 TB/s; the whole machine shares them): ``DEFAULT_RATE_GBPS_PER_RANK`` = 0.5 GB/s per
GCD, i.e. 4 GB/s per node, about 0.2 TB/s for the 48-node run, under a twentieth of the capacity
tier's peak. The estimate is multiplied by ``safety`` (2) and ``margin_s`` (60 s) is added.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

# bytes per second one rank writes to the checkpoint file system before any save was measured
DEFAULT_RATE_GBPS_PER_RANK = 0.5
DEFAULT_SAFETY = 2.0
DEFAULT_MARGIN_S = 60.0
_UNSET = ("", "N/A", "NONE", "UNKNOWN", "UNLIMITED", "INVALID")


class DeadlineError(ValueError):
    """A time string from Slurm that cannot be read."""


# -- Slurm's end time (pure) ----------------------------------------------------------------------


def parse_slurm_time(text: str, tz: _dt.tzinfo | None = None) -> float | None:
    """Epoch seconds of a Slurm time stamp (``2026-11-26T14:25:01``, in the local time zone of
    the command that printed it, or ``tz``); None for Slurm's "no time" words (N/A, NONE,
    Unknown, Unlimited)."""
    t = text.strip()
    if t.upper() in _UNSET:
        return None
    try:
        stamp = _dt.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        raise DeadlineError(f"not a Slurm time stamp: {text!r} (expected YYYY-MM-DDTHH:MM:SS)") from None
    if tz is not None:
        return stamp.replace(tzinfo=tz).timestamp()
    return time.mktime(stamp.timetuple())  # local time, daylight saving included


def scontrol_fields(text: str) -> dict[str, str]:
    """``Key=Value`` pairs of ``scontrol show job`` output (values up to the next space)."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][A-Za-z:/]*)=(\S*)", text))


def end_from_squeue(text: str, tz: _dt.tzinfo | None = None) -> float | None:
    """The end time in ``squeue -h -j <id> -o %e`` output."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return parse_slurm_time(lines[0], tz) if lines else None


def end_from_scontrol(text: str, tz: _dt.tzinfo | None = None) -> float | None:
    """The job's ``EndTime`` in ``scontrol show job <id>`` output."""
    value = scontrol_fields(text).get("EndTime")
    return None if value is None else parse_slurm_time(value, tz)


@dataclass(frozen=True)
class AllocationEnd:
    """When Slurm ends this job (epoch seconds, or None: no limit known) and where that came from."""

    at: float | None
    source: str


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def allocation_end(
    env: Mapping[str, str] | None = None, run: Callable[[list[str]], str | None] = _run
) -> AllocationEnd:
    """This job's end: ``$SLURM_JOB_END_TIME``, else squeue's ``%e``, else scontrol's ``EndTime``;
    ``AllocationEnd(None, ...)`` outside Slurm or when Slurm names no end."""
    if env is None:
        env = os.environ
    job = env.get("SLURM_JOB_ID")
    if not job:
        return AllocationEnd(None, "not a Slurm job (no SLURM_JOB_ID)")
    stamp = env.get("SLURM_JOB_END_TIME", "").strip()
    if stamp.isdigit():
        return AllocationEnd(float(stamp), "SLURM_JOB_END_TIME")
    out = run(["squeue", "-h", "-j", job, "-o", "%e"])
    if out is not None and out.strip():
        return AllocationEnd(end_from_squeue(out), f"squeue -h -j {job} -o %e")
    out = run(["scontrol", "show", "job", job])
    if out is not None:
        return AllocationEnd(end_from_scontrol(out), f"scontrol show job {job}")
    return AllocationEnd(None, "neither squeue nor scontrol answered")


# -- how long a save takes (pure) ------------------------------------------------------------------


@dataclass
class SaveEstimate:
    """Seconds a save takes: the last measured one, else ``bytes_per_rank`` at ``rate_gbps``."""

    bytes_per_rank: float
    rate_gbps: float = DEFAULT_RATE_GBPS_PER_RANK
    measured_s: float | None = None

    def seconds(self) -> float:
        if self.measured_s is not None:
            return self.measured_s
        return self.bytes_per_rank / (self.rate_gbps * 1e9)

    def source(self) -> str:
        if self.measured_s is not None:
            return f"the last save ({self.measured_s:.1f} s)"
        return f"{self.bytes_per_rank / 1e9:.2f} GB per rank at {self.rate_gbps:g} GB/s per rank"


def checkpoint_bytes_per_rank(params: int, world: int) -> float:
    """Bytes one rank writes in a ZeRO-3 save: its partition of the fp32 master weights and the
    two Adam moments, 12 bytes per parameter (DeepSpeed does not write the 16-bit weights, which
    the master weights stand for; measured on the CPU runs, docs/frontier.md)."""
    return params / world * 12


# -- the decision ----------------------------------------------------------------------------------

SIGNAL, CLOCK = 0, 1  # the flags each rank contributes to the agreement


@dataclass
class SignalFlag:
    """Set by the signal handler; read at the next step boundary."""

    signum: int
    received: bool = False
    previous: Any = None


def watch_signal(signum: int = signal.SIGUSR1) -> SignalFlag:
    """Install a handler for ``signum`` that only records it (main thread only)."""
    flag = SignalFlag(signum)

    def handler(_signum, _frame):
        flag.received = True

    flag.previous = signal.signal(signum, handler)
    return flag


_EARLY: list[SignalFlag] = []  # the flag ``watch_signal_early`` installed in this process


def watch_signal_early(signum: int = signal.SIGUSR1) -> SignalFlag | None:
    """Record ``signum`` from the job's start (its entry point, before the slow imports and the
    engine), so that a warning that comes early does not end the process (SIGUSR1's default);
    ``for_job`` takes this flag over. Main thread only (else None)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    if not _EARLY:
        _EARLY.append(watch_signal(signum))
    return _EARLY[0]


def unwatch_signal(flag: SignalFlag) -> None:
    signal.signal(flag.signum, flag.previous if flag.previous is not None else signal.SIG_DFL)


@dataclass(frozen=True)
class Decision:
    stop: bool
    by_signal: bool
    by_clock: bool
    left_s: float | None  # seconds to the allocation's end at the check, if known

    def why(self) -> str:
        parts = []
        if self.by_signal:
            parts.append("Slurm's warning signal reached a rank")
        if self.by_clock:
            left = f"{self.left_s:.0f} s" if self.left_s is not None else "too little time"
            parts.append(f"{left} left in the allocation, less than one more step and a save")
        return " and ".join(parts) or "no reason"


@dataclass
class Deadline:
    """Whether to save now and exit, agreed by every rank ([Note: saving before the wall clock
    ends])."""

    end: AllocationEnd
    estimate: SaveEstimate
    flag: SignalFlag | None = None
    safety: float = DEFAULT_SAFETY
    margin_s: float = DEFAULT_MARGIN_S
    clock: Callable[[], float] = time.time
    step_s: float = 0.0  # the longest step seen: one more must fit
    _last: float | None = field(default=None, repr=False)

    def local_flags(self, now: float | None = None) -> tuple[bool, bool, float | None]:
        """(signal received, too little time left, seconds left) on this rank (pure)."""
        now = self.clock() if now is None else now
        if self._last is not None:
            self.step_s = max(self.step_s, now - self._last)
        self._last = now
        by_signal = self.flag is not None and self.flag.received
        left = None if self.end.at is None else self.end.at - now
        need = self.step_s + self.safety * self.estimate.seconds() + self.margin_s
        by_clock = left is not None and left < need
        return by_signal, by_clock, left

    def record_save(self, seconds: float) -> None:
        self.estimate.measured_s = seconds
        self._last = None  # the save is not a step

    def check(self, group: Any = None, device: Any = "cpu") -> Decision:
        """Collective over ``group`` (default: the world), at a step boundary, from the training
        thread with nothing of ours in flight: every rank returns the same decision."""
        import torch
        import torch.distributed as dist

        by_signal, by_clock, left = self.local_flags()
        flags = torch.tensor([int(by_signal), int(by_clock)], dtype=torch.int32, device=device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        agreed = [bool(v) for v in flags.tolist()]
        return Decision(agreed[SIGNAL] or agreed[CLOCK], agreed[SIGNAL], agreed[CLOCK], left)


def stop_line(decision: Decision, step_done: int, where: str) -> str:
    """The one line a job prints when it stops early."""
    return f"stopping with {step_done} steps done: {decision.why()}; saved {where}; resume with resume=latest"


# -- the job's use of it ---------------------------------------------------------------------------


class SavedInTime(Exception):
    """Raised from the job's step callback after the agreed early save: ends the training loop
    (``line`` says why and where it saved)."""

    def __init__(self, line: str, step_done: int):
        self.line, self.step_done = line, step_done
        super().__init__(line)


class JobWatch:
    """The training loop's side of [Note: saving before the wall clock ends]: one call per step,
    ``after_step``, on every rank."""

    def __init__(self, deadline: Deadline, where: str, device: Any = "cpu", quiet: Callable[[], Any] | None = None):
        self.deadline, self.where, self.device, self.quiet = deadline, where, device, quiet

    def after_step(self, step_done: int, saved: bool, save: Callable[[str], str]) -> None:
        """Collective. ``saved``: this step's regular save already ran; ``save(directory)`` saves
        and returns the tag. Raises ``SavedInTime`` once every rank agreed to stop."""
        if self.quiet is not None:
            self.quiet()  # nothing of ours in flight beside the agreement ([Note: quiet boundaries])
        decision = self.deadline.check(device=self.device)
        if not decision.stop:
            return
        t0 = time.monotonic()
        tag = None if saved else save(self.where)
        if tag is not None:
            self.deadline.record_save(time.monotonic() - t0)
        at = os.path.join(self.where, tag) if tag is not None else f"{self.where} (this step's regular save)"
        raise SavedInTime(stop_line(decision, step_done, at), step_done)

    def close(self) -> None:
        if self.deadline.flag is not None:
            unwatch_signal(self.deadline.flag)


def for_job(
    ckpt_dir: str | None, params: int, world: int, device: Any = "cpu", executor: Any = None
) -> JobWatch | None:
    """The watch of a job that can save (a checkpoint directory), or None. Reads Slurm's end time
    once and, from the main thread, records SIGUSR1 (the batch scripts forward Slurm's warning)."""
    import threading

    if ckpt_dir is None:
        return None
    flag = _EARLY[0] if _EARLY else None
    if flag is None and threading.current_thread() is threading.main_thread():
        flag = watch_signal(signal.SIGUSR1)
    estimate = SaveEstimate(checkpoint_bytes_per_rank(params, world))
    quiet = None
    if executor is not None:
        from ...comm.boundary import quiesce

        quiet = lambda: quiesce(executor, "the agreed time-limit check")  # noqa: E731
    return JobWatch(Deadline(allocation_end(), estimate, flag=flag), ckpt_dir, device, quiet)
