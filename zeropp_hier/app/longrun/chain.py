"""A run longer than one allocation: a chain of batch jobs, each one link.

[Note: chained jobs]
The batch scripts (scripts/frontier/train.sbatch, train_cpu.sbatch) chain themselves when they
are given ``checkpoint_dir=`` and ``steps=``. Each link, at its start, asks ``start``:

- *done*: the newest complete checkpoint (what ``latest`` names, with a manifest) is at
  ``steps`` or beyond: nothing to run, the chain ends;
- *stop*: the previous link ended on a configuration error (a change that resume refuses, e.g.
  another model or seed than the checkpoint's, or any other ``zeropp_hier config error``), or
  the last two links both ended at the same step (both failed there, or the later one added no
  checkpoint): another link would do the same, the chain ends and says why;
- *run*: the link resumes from the newest complete checkpoint (``resume=latest``), or starts
  fresh when there is none, and says which. Before running it submits the next link with
  ``sbatch --dependency=afterany:<this job>`` (so the chain goes on even when this job is killed
  at its time limit, or its node fails), and it records its start.

At its end the link records its exit status and the step it reached (``end``); when that makes
the run done or stopped, the script cancels the next link it submitted. A link killed before it
could record its end counts as failed at the step its successor finds.

The links' records are ``chain.jsonl`` in the checkpoint directory (one JSON object a line:
``job``, ``start_step``, then ``end_step``, ``exit``, ``config_error``), so a chain can be read
afterwards and a resubmission by hand continues it. A link that saves early because the
allocation ends (app/longrun/deadline.py) exits 0 and the next link resumes from that save.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass

RECORDS = "chain.jsonl"
RUN, DONE, STOP = 0, 10, 11  # exit statuses of ``start`` and ``end`` for the batch script
_STEP_TAG = re.compile(r"^step(\d+)$")  # app/longrun/resume.py's tag_for
_CONFIG_ERROR = re.compile(r"zeropp_hier config error at '([^']+)': .*")


@dataclass(frozen=True)
class Link:
    job: str
    start_step: int
    end_step: int | None = None  # None: the link never recorded its end (killed)
    exit: int | None = None
    config_error: str | None = None


def newest_step(ckpt_dir: str) -> tuple[int, str | None]:
    """(step, tag) of the checkpoint ``latest`` names when it is complete (has a manifest);
    (0, None) when there is none."""
    from ...core.errors import HierCheckpointError
    from ...deepspeed.checkpoint.files import read_manifest, resolve_tag

    try:
        tag = resolve_tag(ckpt_dir, None)
    except HierCheckpointError:
        return 0, None
    if tag is None:
        return 0, None
    manifest, _ = read_manifest(os.path.join(ckpt_dir, tag))
    if manifest is None:
        return 0, None
    m = _STEP_TAG.match(tag)
    return (int(m.group(1)) if m else int(manifest.get("global_steps") or 0)), tag


def read_links(ckpt_dir: str) -> list[Link]:
    """The chain's links in order; a link's ``end`` line completes its ``start`` line."""
    path = os.path.join(ckpt_dir, RECORDS)
    if not os.path.isfile(path):
        return []
    links: dict[str, Link] = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            job = str(rec["job"])
            if "start_step" in rec:
                links[job] = Link(job, int(rec["start_step"]))
            elif job in links:
                old = links[job]
                links[job] = Link(job, old.start_step, rec.get("end_step"), rec.get("exit"), rec.get("config_error"))
    return list(links.values())


def _append(ckpt_dir: str, rec: dict) -> None:
    os.makedirs(ckpt_dir, exist_ok=True)
    with open(os.path.join(ckpt_dir, RECORDS), "a") as f:
        f.write(json.dumps(rec) + "\n")


def config_error_in(text: str) -> str | None:
    """The last ``zeropp_hier config error`` line of a job's output (every rank prints the same)."""
    lines = [m.group(0).strip() for m in _CONFIG_ERROR.finditer(text)]
    return lines[-1] if lines else None


def verdict(links: list[Link], step: int, steps: int) -> tuple[int, str]:
    """(RUN / DONE / STOP, why) before a new link, from the links so far and the newest complete
    checkpoint's ``step`` (pure)."""
    if step >= steps:
        return DONE, f"the run is done: the newest checkpoint is at step {step} of {steps}"
    if links and links[-1].config_error:
        return (
            STOP,
            f"job {links[-1].job} ended on a configuration error, fix it and resubmit: {links[-1].config_error}",
        )
    ends = []
    for i, link in enumerate(links):  # a link that never recorded its end left what its successor found
        end = link.end_step if link.end_step is not None else (links[i + 1].start_step if i + 1 < len(links) else step)
        ends.append((link, end, link.exit != 0))
    if len(ends) >= 2:
        (a, a_end, a_failed), (b, b_end, b_failed) = ends[-2], ends[-1]
        if a_end == b_end == step == b.start_step:  # the last link added no checkpoint to the one before's
            what = "both failed" if a_failed and b_failed else "both ended without a new checkpoint"
            return STOP, (
                f"jobs {a.job} and {b.job} {what} at step {step} (exit {a.exit}, {b.exit}; None: killed before "
                "it could record its end): another link would do the same; read their logs, fix the cause "
                "(a failure, or a time limit too short for one step and a save) and resubmit"
            )
    if step == 0:
        return RUN, f"starting fresh: no complete checkpoint yet (up to step {steps})"
    return RUN, f"resuming from the newest complete checkpoint, step {step} (up to step {steps})"


def _job_output(job: str) -> str:
    """The job's output so far (its StdOut file, from scontrol), or ''."""
    from .deadline import _run, scontrol_fields

    out = _run(["scontrol", "show", "job", job])
    path = scontrol_fields(out).get("StdOut") if out else None
    if not path or not os.path.isfile(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zeropp_hier.app.longrun.chain", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("start", "end"):
        p = sub.add_parser(name)
        p.add_argument("--dir", required=True, help="the run's checkpoint_dir")
        p.add_argument("--steps", required=True, type=int)
        p.add_argument("--job", required=True)
        if name == "end":
            p.add_argument("--exit", required=True, type=int)
            p.add_argument("--log", default=None, help="the link's output (default: the job's StdOut, from scontrol)")
    a = ap.parse_args(argv)
    step, tag = newest_step(a.dir)
    if a.cmd == "start":
        code, why = verdict(read_links(a.dir), step, a.steps)
        print(f"chain: job {a.job}: {why}", file=sys.stderr)
        if code == RUN:
            _append(a.dir, {"job": a.job, "start_step": step})
            if tag is not None:
                print("resume=latest")  # stdout: the Hydra override the link adds
        return code
    text = ""
    if a.log and os.path.isfile(a.log):
        with open(a.log, errors="replace") as f:
            text = f.read()
    elif a.log is None:
        text = _job_output(a.job)
    error = config_error_in(text) if a.exit != 0 else None
    _append(a.dir, {"job": a.job, "end_step": step, "exit": a.exit, "config_error": error})
    code, why = verdict(read_links(a.dir), step, a.steps)
    print(f"chain: job {a.job} ended with exit {a.exit} at step {step}: next: {why}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
