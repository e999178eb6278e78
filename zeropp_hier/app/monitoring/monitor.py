"""The job's monitoring through DeepSpeed's own monitors (``tensorboard``, ``csv_monitor``,
``wandb``): which of their config sections the job's ``monitor`` settings switch on, the scalars
of one step under their names, the ETA of the rank-0 line, and ``StepMonitor``, which adds lr,
grad norm, bytes per phase and the ETA to each step's row and hands the scalars to
``engine.monitor`` every ``log_every`` steps (DeepSpeed's wandb monitor apart: ``_detach_wandb``).
``begin_wandb`` and ``StepMonitor.close`` give each job its wandb session (offline by default),
finished at the job's end; the jobs of one run (a chain's links) resume one wandb run by its id
([Note: one run in the monitor] in app/monitoring/monitor_run.py).

DeepSpeed's ``MonitorMaster`` (the engine's ``monitor``) writes on global rank 0 only and is a
no-op elsewhere, so every rank may call ``write_events``. No torch at import: ``app/spec.py`` reads
the settings and sections from here.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from ...core.errors import HierConfigError
from ...core.vocab import TIERS

# our name -> (DeepSpeed's config section, the package its writer imports; None: standard library)
BACKENDS: dict[str, tuple[str, str | None]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "csv": ("csv_monitor", None),
    "wandb": ("wandb", "wandb"),
}
WANDB_PROJECT = "zeropp-hier"


@dataclass(frozen=True, kw_only=True)
class MonitorSpec:
    """Which of DeepSpeed's monitors the job switches on; each writes under the run directory
    (``<out_dir>/tensorboard``, ``<out_dir>/csv_monitor``, ``<out_dir>/wandb``, offline)."""

    tensorboard: bool = False
    csv: bool = False
    wandb: bool = False

    def enabled(self) -> list[str]:
        return [name for name in BACKENDS if getattr(self, name)]


def check(mon: MonitorSpec, out_dir: str | None, log_every: Any) -> None:
    """Refuse, before any rank builds anything, a monitor without a run directory or without its
    package (DeepSpeed would raise ImportError on rank 0 only, inside the engine's constructor,
    while the other ranks wait in a collective)."""
    for name in BACKENDS:
        if not isinstance(getattr(mon, name), bool):
            raise HierConfigError(f"monitor.{name}", getattr(mon, name), "use true or false")
    if not isinstance(log_every, int) or isinstance(log_every, bool) or log_every < 1:
        raise HierConfigError("log_every", log_every, "use a positive step count (1: every step)")
    for name in mon.enabled():
        package = BACKENDS[name][1]
        if not out_dir:
            raise HierConfigError(f"monitor.{name}", True, "a monitor writes under the run directory: set out_dir")
        if package is not None and importlib.util.find_spec(package) is None:
            raise HierConfigError(
                f"monitor.{name}",
                True,
                f"the {package} package is not installed here: `pip install {package}`, or use "
                "monitor.csv=true (DeepSpeed's csv_monitor, standard library only)",
            )


def ds_sections(mon: MonitorSpec, out_dir: str | None) -> dict[str, dict]:
    """DeepSpeed's monitor sections for ``mon`` (empty when none is on). DeepSpeed writes into
    ``output_path/job_name``."""
    out: dict[str, dict] = {}
    for name in mon.enabled():
        section = BACKENDS[name][0]
        if name == "wandb":  # its directory and offline mode come from the environment (wandb_env)
            out[section] = {"enabled": True, "project": WANDB_PROJECT}
        else:
            out[section] = {"enabled": True, "output_path": out_dir or "", "job_name": section}
    return out


def wandb_env(mon: MonitorSpec, out_dir: str | None, run_id: str | None = None) -> dict[str, str]:
    """What this process's environment needs before the engine is built for DeepSpeed's wandb
    monitor to run offline under the run directory, as the run ``run_id`` (resumed when it
    exists: ``wandb.init`` reads all of it; DeepSpeed's section has no key for any). A
    ``WANDB_MODE`` already set (e.g. ``online``) is kept. Offline, wandb's own crash reports
    (Sentry, over the network) are off too unless ``WANDB_ERROR_REPORTING`` is set."""
    if not mon.wandb or not out_dir:
        return {}
    env = {"WANDB_MODE": os.environ.get("WANDB_MODE", "offline"), "WANDB_DIR": out_dir}
    if run_id:
        env |= {"WANDB_RUN_ID": run_id, "WANDB_RESUME": "allow"}
    if env["WANDB_MODE"] == "offline":
        env["WANDB_ERROR_REPORTING"] = os.environ.get("WANDB_ERROR_REPORTING", "false")
    return env


def begin_wandb(mon: MonitorSpec, out_dir: str | None, run_id: str | None = None) -> None:
    """Before the engine is built: this job's wandb environment (``wandb_env``), and no wandb
    session left by an earlier job of this process (a test's ranks run several). wandb reads its
    environment once per session (a later ``WANDB_DIR`` would be ignored) and hands a run still
    active back to the next ``wandb.init``, so that job would log into the earlier run."""
    env = wandb_env(mon, out_dir, run_id)
    os.environ.update(env)
    if env and (wandb := sys.modules.get("wandb")) is not None:
        wandb.teardown()


def due(done: int, every: int) -> bool:
    """Whether the step that completes ``done`` steps is one of every ``every``-th (0: never)."""
    return every > 0 and done % every == 0


def scalars(row: Mapping[str, Any]) -> list[tuple[str, float]]:
    """One step's monitor scalars, named as TensorBoard groups them (``section/name``): values
    the row does not have (MFU without a known device peak, grad norm before DeepSpeed computed
    one, bytes without our section, val loss off an evaluation step) are left out, not written
    as a placeholder."""
    out: list[tuple[str, float]] = [("train/loss", row["loss"])]
    for name, key in (("train/lr", "lr"), ("train/grad_norm", "grad_norm"), ("val/loss", "val_loss")):
        if row.get(key) is not None:
            out.append((name, row[key]))
    out += [("perf/tokens_per_s", row["tokens_per_s"]), ("perf/tflops_per_gcd", row["tflops_per_gcd"])]
    if row.get("mfu") is not None:
        out.append(("perf/mfu", row["mfu"]))
    out.append(("memory/peak_bytes", row["peak_memory_bytes"]))
    for phase, tiers in (row.get("bytes_by_phase") or {}).items():
        out += [(f"bytes/{phase}/{tier}", tiers[tier]) for tier in TIERS]
    return [(name, float(value)) for name, value in out]


def eta_seconds(seconds_so_far: float, steps_done: int, steps_left: int) -> float:
    """Steps left x the mean step time so far."""
    return 0.0 if steps_done < 1 else steps_left * seconds_so_far / steps_done


def fmt_duration(seconds: float) -> str:
    """``42s``, ``3m04s``, ``2h05m``, ``3d04h``: the two largest units."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _bytes_by_phase(engine) -> dict[str, dict[str, int]]:
    import zeropp_hier  # torch: only once a rank runs

    snap = zeropp_hier.comm_stats(engine)["bytes"]
    return {phase: {tier: int(snap[phase][tier]) for tier in TIERS} for phase in snap}


def _minus(now: Mapping[str, Mapping[str, int]], before: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    return {p: {t: now[p][t] - before.get(p, {}).get(t, 0) for t in TIERS} for p in now}


class StepMonitor:
    """Per step on every rank (no collective): adds ``lr``, ``grad_norm`` (DeepSpeed's
    ``get_global_grad_norm``, the same on every rank), ``bytes_by_phase`` (under our section:
    this rank's bytes per phase and tier in this step) and ``eta_s`` to the row, and every
    ``log_every`` steps hands the row's scalars to the engine's monitors (rank 0 writes). The
    ETA's mean is over the steps this process trained (a resumed run's own). ``wandb_from``: the
    first step wandb does not hold yet (a resumed run's steps below it were logged there by the
    job before, which then died: wandb refuses them, [Note: one run in the monitor])."""

    def __init__(self, engine: Any, steps: int, log_every: int, hier: bool, wandb_from: int = 0):
        self.engine, self.steps, self.log_every, self.hier = engine, steps, log_every, hier
        self.wandb_from = wandb_from
        self.seconds, self.done = 0.0, 0
        # from zero, as Run's per-tier count: the first row holds what building the engine sent
        self._last: dict[str, dict[str, int]] = {}
        self.wandb = _detach_wandb(getattr(engine, "monitor", None))

    def recount(self) -> dict[str, dict[str, int]] | None:
        """Leave out of the next row the bytes sent since this one (an evaluation's gathers) and
        return them per phase and tier (None without our section)."""
        if not self.hier:
            return None
        now = _bytes_by_phase(self.engine)
        sent = _minus(now, self._last)
        self._last = now
        return sent

    def annotate(self, row: dict) -> None:
        e = self.engine
        row["lr"] = float(e.get_lr()[0])
        norm = e.get_global_grad_norm()
        row["grad_norm"] = None if norm is None else float(norm)
        if self.hier:
            now = _bytes_by_phase(e)
            row["bytes_by_phase"] = _minus(now, self._last)
            self._last = now
        self.seconds += row["seconds"]
        self.done += 1
        row["eta_s"] = eta_seconds(self.seconds, self.done, self.steps - row["step"] - 1)

    def write(self, row: Mapping[str, Any]) -> None:
        """The row's scalars to DeepSpeed's monitors, at the row's step (metrics.jsonl's ``step``),
        when the step is due (``log_every``) or holds a val loss."""
        mon = getattr(self.engine, "monitor", None)
        if mon is None or not mon.enabled:
            return
        if due(row["step"] + 1, self.log_every):
            events = [(name, value, row["step"]) for name, value in scalars(row)]
        elif row.get("val_loss") is not None:  # an evaluation is never dropped by log_every
            events = [("val/loss", float(row["val_loss"]), row["step"])]
        else:
            return
        mon.write_events(events)
        if self.wandb is not None and row["step"] >= self.wandb_from:
            self.wandb.write_events(events)

    def close(self) -> None:
        """At the job's end (rank 0 holds the wandb monitor): finish the wandb run, which writes
        its summary and closes its ``.wandb`` file, and end the session (``begin_wandb``). wandb
        finishes an open run only when the process exits, and a test's ranks outlive their jobs."""
        if self.wandb is not None:
            self.wandb = None
            sys.modules["wandb"].teardown()


def _detach_wandb(master: Any) -> Any:
    """Take DeepSpeed's wandb monitor (rank 0's; None elsewhere or when off) out of the engine's
    ``MonitorMaster`` and return it, for ``StepMonitor`` to write to alone. wandb has one step
    axis per run and drops what is logged at a step lower than one already logged; DeepSpeed
    logs its ``Train/Samples/*`` events at the sample count, which is past every training step,
    so each of our scalars (at the step of metrics.jsonl's row, as in TensorBoard) would be
    dropped. TensorBoard and csv keep DeepSpeed's events."""
    wandb_monitor = getattr(master, "wandb_monitor", None)
    if wandb_monitor is not None:
        master.wandb_monitor = None
    return wandb_monitor
