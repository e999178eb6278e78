"""One run in the monitor across the links of a chain (app/longrun/chain.py) or any resume: where the
run's ``metrics.jsonl``, TensorBoard and csv directories and wandb files are, its wandb id, and
how a resumed job continues them.

[Note: one run in the monitor]
A fresh job writes its monitors under its own run directory (``out_dir``) and picks a wandb run
id. Both go into every checkpoint it saves (the job's client state, app/longrun/resume.py), so a job that
resumes (a chain's next link, or ``resume=`` by hand) writes into the *same* files, not into its
own run directory: ``metrics.jsonl`` is continued, DeepSpeed's TensorBoard and csv monitors write
into the same directories (TensorBoard reads every event file of a directory as one run) and
wandb resumes the run by its id (``WANDB_RUN_ID`` / ``WANDB_RESUME=allow``, which DeepSpeed's
``wandb.init`` reads from the environment). The resumed job's own run directory keeps its log,
``ds_config.json``, ``summary.json`` and chart. When the saved directory no longer exists (the
checkpoint was moved) the job continues in its own directory and says so; a job that starts
fresh (no checkpoint yet) starts a new run in the monitor.

Steps logged after the last checkpoint by a job that then died are trained again by the next one.
What the monitors keep of them:

- ``metrics.jsonl`` and csv: rows at or past the resumed step are removed before the job appends,
  so every step is in the file once, with the values of the training the checkpoints continue;
- TensorBoard: the resumed job writes TensorBoard's own restart marker (``SessionLog.START`` at
  the resumed step, what ``SummaryWriter(purge_step=)`` writes), after which TensorBoard's reader
  drops the earlier events at steps at or past it. That marker applies to every series of the
  directory, so DeepSpeed's own ``Train/Samples/*`` series (x axis: samples, not steps) keep only
  their points below that step number; the job's ``train/*`` series carry the same loss and lr
  by step. Written only when the earlier job logged such steps (not after a save in time);
- wandb has one step axis per run and refuses a step below one it holds, so the re-trained steps
  are not sent again: wandb keeps the values first logged for them.

Pure but for the file operations named as such; the collective that shares the choice is in
app/run.py.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import string
from dataclasses import dataclass
from typing import Any, Mapping

from ...files import write_atomic

METRICS = "metrics.jsonl"
_ID_CHARS = string.ascii_lowercase + string.digits  # what wandb's own generate_id uses


@dataclass(frozen=True)
class MonitorRun:
    """Where this job's monitors write and how it continues them."""

    dir: str | None  # metrics.jsonl, tensorboard/, csv_monitor/, wandb/ (None: no run directory)
    wandb_id: str | None  # the run's wandb id, the same for every job of the run
    start: int = 0  # the first step this job trains
    continued: bool = False  # the directory is an earlier job's of the same run
    logged_to: int = -1  # the last step the metrics file held before this job (-1: none)

    def state(self) -> dict:
        """What a checkpoint keeps of it (``resume.save``'s client state)."""
        return {"dir": self.dir, "wandb_id": self.wandb_id}

    @property
    def retrained(self) -> bool:
        """An earlier job logged steps this one trains again."""
        return self.continued and self.logged_to >= self.start


def new_wandb_id() -> str:
    """8 characters of [a-z0-9], as wandb's ``generate_id``."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(8))


def choose(out_dir: str | None, saved: Mapping[str, Any] | None, start: int, fresh_id: str) -> tuple[MonitorRun, str]:
    """This job's monitor run and a line saying where it writes (rank 0: it looks at the saved
    directory). ``saved``: the checkpoint's ``state()`` (None: a fresh run or an older checkpoint)."""
    saved = saved or {}
    wandb_id = str(saved.get("wandb_id") or fresh_id)
    old = saved.get("dir")
    if not out_dir:  # a job without a run directory writes no monitor (JobSpec.check refuses one on)
        return MonitorRun(None, wandb_id, start), ""
    if old and os.path.isdir(old):
        if os.path.abspath(old) == os.path.abspath(out_dir):
            return MonitorRun(out_dir, wandb_id, start, continued=True), f"monitor: continuing the run in {old}"
        run = MonitorRun(str(old), wandb_id, start, continued=True)
        return run, f"monitor: continuing the run's metrics.jsonl and monitors in {old} (wandb id {wandb_id})"
    run = MonitorRun(out_dir, wandb_id, start)
    if old:
        return run, f"monitor: the run's directory {old} is gone: continuing in {out_dir} (wandb id {wandb_id})"
    return run, ""


def ds_paths(sections: Mapping[str, Mapping[str, Any]], run: MonitorRun) -> dict[str, dict]:
    """Overrides of DeepSpeed's monitor sections (``monitor.ds_sections``) that point those with
    a directory at the run's (pure)."""
    return {name: {"output_path": run.dir} for name, sec in sections.items() if "output_path" in sec}


def continue_metrics(run: MonitorRun) -> MonitorRun:
    """File operation: keep the rows of the run's metrics.jsonl below ``run.start`` (a row at or
    past it was logged after the checkpoint this job resumes and is trained again); returns the
    run with ``logged_to``, the last step the file held."""
    if not run.continued or run.dir is None:
        return run
    path = os.path.join(run.dir, METRICS)
    if not os.path.isfile(path):
        return run
    kept, last, cut = [], -1, False
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):  # a line cut by a kill mid-write
                cut = True
                continue
            last = max(last, step)
            if step < run.start:
                kept.append(line if line.endswith("\n") else line + "\n")
    if last >= run.start or cut:
        write_atomic(path, "".join(kept))
    return MonitorRun(run.dir, run.wandb_id, run.start, run.continued, last)


def csv_rows_below(path: str, below: int) -> tuple[list[list[str]], bool]:
    """A csv_monitor file's rows (after its header) whose step is below ``below``; and whether
    any was dropped (pure but for the read)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    body = [r for r in rows[1:] if r and r[0].lstrip("-").isdigit()]
    kept = [r for r in body if int(r[0]) < below]
    return [rows[0], *kept] if rows else [], len(kept) != len(body)


def continue_csv(csv_dir: str, start: int, samples: int) -> list[str]:
    """File operation: cut DeepSpeed's csv files back to the resumed point (the job's series by
    step, DeepSpeed's ``Train_Samples_*`` by sample count) and return their names, which the csv
    monitor must treat as started (it writes a header into a file it has not written yet)."""
    names: list[str] = []
    if not os.path.isdir(csv_dir):
        return names
    for name in sorted(os.listdir(csv_dir)):
        if not name.endswith(".csv"):
            continue
        path = os.path.join(csv_dir, name)
        rows, dropped = csv_rows_below(path, samples if name.startswith("Train_Samples") else start)
        if dropped:
            with open(path, "w", newline="") as f:
                csv.writer(f).writerows(rows)
        names.append(name[: -len(".csv")])
    return names


def continue_monitors(engine: Any, run: MonitorRun) -> None:
    """Rank 0, after the engine (and its monitors) is built and the checkpoint loaded: make
    DeepSpeed's TensorBoard and csv monitors continue the run ([Note: one run in the monitor])."""
    master = getattr(engine, "monitor", None)
    if master is None or not run.continued:
        return
    csv_mon = getattr(master, "csv_monitor", None)
    if csv_mon is not None and getattr(csv_mon, "log_dir", None):
        csv_mon.filenames.extend(continue_csv(csv_mon.log_dir, run.start, int(engine.global_samples)))
    tb = getattr(master, "tb_monitor", None)
    writer = getattr(tb, "summary_writer", None)
    if writer is not None and run.retrained:
        mark_restart(writer, run.start)


def mark_restart(writer: Any, step: int) -> None:
    """TensorBoard's restart marker at ``step`` in ``writer``'s event file (what torch's
    ``SummaryWriter(purge_step=step)`` writes when it opens its file): TensorBoard's reader then
    drops the directory's earlier events at steps >= ``step``."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    fw = writer._get_file_writer()
    fw.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
    writer.flush()
