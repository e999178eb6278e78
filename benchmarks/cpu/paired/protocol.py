"""The paired test's protocol: ``protocol.json`` beside this module, read and checked before
anything runs. A full run takes every setting from it and nothing from the command line; a pilot
(``--pilot``) may shorten it, and its results say so. The file's hash goes into every result
file, so that an analysis made against another margin or design is refused
([Note: protocol before the runs]).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PATH = os.path.join(HERE, "protocol.json")
V2_PATH = os.path.join(HERE, "protocol_v2.json")  # version 2 (PROTOCOL.md), run beside version 1
RUN_KEYS = {
    "steps": int,
    "micro_batch": int,
    "seq_len": int,
    "hidden": int,
    "heads": int,
    "layers": int,
    "lr": float,
    "lr_decay": str,
    "min_lr_ratio": float,
    "warmup_steps": int,
    "eval_every": int,
    "eval_last": int,
    "eval_batches": int,
    "eval_seed": int,
    "train_last": int,
}
METRICS = ("held_out", "train")

# [Note: protocol before the runs]
# The margin, the arms, the seeds, the run and the decision rule are fixed in protocol.json and
# committed before a full run, so that no choice can follow the numbers it would decide. The
# harness enforces what it can: a full run refuses command-line overrides and a protocol git
# does not hold unchanged; each result file records the protocol's sha256, and --analyze refuses
# a file made under another. A pilot may shorten the run to size it; its results say "pilot",
# and the analysis draws no decision from them.


class ProtocolError(ValueError):
    """The protocol file is missing, malformed or does not allow what was asked."""


@dataclass(frozen=True)
class Protocol:
    path: str
    sha256: str
    data: dict

    @property
    def margin(self) -> float:
        return float(self.data["margin"])

    @property
    def level(self) -> float:
        return float(self.data["level"])

    @property
    def arms(self) -> dict[str, dict]:
        return self.data["arms"]

    @property
    def seeds(self) -> list[int]:
        return list(self.data["seeds"])

    @property
    def run(self) -> dict[str, Any]:
        return self.data["run"]

    @property
    def reference(self) -> str:
        return self.data["reference"]

    @property
    def control(self) -> str:
        return self.data["control"]

    @property
    def contrasts(self) -> list[tuple[str, str]]:
        return [(a, b) for a, b in self.data.get("contrasts", [])]

    @property
    def version(self) -> int:
        return int(self.data.get("version", 1))

    @property
    def reproduce(self) -> dict | None:
        """An earlier result file and the arm whose per-seed losses this run should reproduce
        (reported, not required: a check that the same seed and arm train alike run after run)."""
        return self.data.get("reproduce")

    def default_out(self, pilot: bool) -> str:
        """``paired.json`` for version 1 (its committed result), ``paired_v<N>.json`` after."""
        stem = "paired" if self.version == 1 else f"paired_v{self.version}"
        return f"{stem}_pilot.json" if pilot else f"{stem}.json"


def eval_steps(run: dict) -> list[int]:
    """The steps (1-based: after that many optimizer steps) whose held-out losses are averaged:
    the last ``eval_last`` multiples of ``eval_every``, ending at ``steps``."""
    steps, every, last = run["steps"], run["eval_every"], run["eval_last"]
    out = [steps - k * every for k in range(last)][::-1]
    if out[0] < 1:
        raise ProtocolError(
            f"run.eval_last={last} evaluations every {every} steps need more than {steps} steps: "
            "lower eval_last or eval_every"
        )
    return out


def check(data: Any, where: str) -> None:
    """Refuse a protocol that lacks a field or whose values cannot be right, naming the field."""
    if not isinstance(data, dict):
        raise ProtocolError(f"{where}: the protocol is not a JSON object")
    for key in ("margin", "level", "reference", "control", "arms", "seeds", "run", "metric"):
        if key not in data:
            raise ProtocolError(f"{where}: field {key!r} is missing; the protocol must name it before any run")
    if not (isinstance(data["margin"], (int, float)) and 0 < data["margin"] < 0.1):
        raise ProtocolError(f"{where}: margin={data['margin']!r}; use a relative difference such as 0.003 (0.3%)")
    cm = data.get("control_margin")
    if not (isinstance(cm, (int, float)) and 0 < cm <= data["margin"]):
        raise ProtocolError(f"{where}: control_margin={cm!r}; use a positive bound no wider than margin, e.g. 0.001")
    if not (isinstance(data["level"], float) and 0.5 < data["level"] < 1):
        raise ProtocolError(f"{where}: level={data['level']!r}; use a confidence level such as 0.95")
    if data["metric"] not in METRICS:
        raise ProtocolError(f"{where}: metric={data['metric']!r}; use one of {list(METRICS)}")
    arms = data["arms"]
    if not isinstance(arms, dict) or not arms:
        raise ProtocolError(f"{where}: arms={arms!r}; use an object of name -> {{preset, compression}}")
    for name, arm in arms.items():
        if not isinstance(arm, dict) or set(arm) != {"preset", "compression"}:
            raise ProtocolError(f"{where}: arms[{name!r}]={arm!r}; give exactly 'preset' and 'compression'")
    for key in ("reference", "control"):
        if data[key] not in arms:
            raise ProtocolError(f"{where}: {key}={data[key]!r} is not one of the arms {list(arms)}")
    for pair in data.get("contrasts", []):
        if not (isinstance(pair, list) and len(pair) == 2 and all(p in arms for p in pair)):
            raise ProtocolError(f"{where}: contrast {pair!r}; use [arm, reference arm] with names from {list(arms)}")
    version = data.get("version", 1)
    if not (isinstance(version, int) and not isinstance(version, bool) and version >= 1):
        raise ProtocolError(f"{where}: version={version!r}; use a whole number from 1 (a new design is a new version)")
    rep = data.get("reproduce")
    if rep is not None and not (
        isinstance(rep, dict) and set(rep) == {"file", "arm"} and isinstance(rep["file"], str) and rep["arm"] in arms
    ):
        raise ProtocolError(
            f'{where}: reproduce={rep!r}; use {{"file": an earlier result file, "arm": one of {list(arms)}}}'
        )
    seeds = data["seeds"]
    if not (isinstance(seeds, list) and len(seeds) >= 2 and all(isinstance(s, int) for s in seeds)):
        raise ProtocolError(f"{where}: seeds={seeds!r}; use a list of at least 2 whole numbers")
    if len(set(seeds)) != len(seeds):
        raise ProtocolError(f"{where}: seeds={seeds!r} repeat a seed; each seed is one independent pair")
    run = data["run"]
    for key, kind in RUN_KEYS.items():
        if key not in run:
            raise ProtocolError(f"{where}: run.{key} is missing")
        ok = isinstance(run[key], kind) or (kind is float and isinstance(run[key], int))
        if not ok or isinstance(run[key], bool):
            raise ProtocolError(f"{where}: run.{key}={run[key]!r}; use a {kind.__name__}")
    eval_steps(run)


def load(path: str = DEFAULT_PATH) -> Protocol:
    if not os.path.exists(path):
        raise ProtocolError(
            f"no protocol at {path}: the margin, arms, seeds and run must be written (and committed) "
            "before the harness runs; see benchmarks/cpu/paired/PROTOCOL.md"
        )
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ProtocolError(f"{path}: not JSON ({e})") from e
    check(data, path)
    return Protocol(path, hashlib.sha256(raw).hexdigest(), data)


def uncommitted(path: str) -> str | None:
    """Why ``path`` does not count as committed (changed, untracked, or no git here), or None."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", name], cwd=folder, capture_output=True, text=True
        )
        status = subprocess.run(["git", "status", "--porcelain", name], cwd=folder, capture_output=True, text=True)
    except OSError as e:
        return f"git could not be run ({e})"
    if tracked.returncode != 0:
        return "it is not tracked by git"
    if status.stdout.strip():
        return "it has uncommitted changes"
    return None


def pilot_run(run: dict, steps: int | None, eval_every: int | None, eval_last: int | None) -> dict:
    """The protocol's run shortened for a pilot or a smoke test (warm-up scaled with the steps)."""
    out = dict(run)
    if steps is not None:
        out["warmup_steps"] = max(1, round(run["warmup_steps"] * steps / run["steps"]))
        out["steps"] = steps
        out["train_last"] = min(run["train_last"], steps)
    if eval_every is not None:
        out["eval_every"] = eval_every
    if eval_last is not None:
        out["eval_last"] = eval_last
    eval_steps(out)
    return out
