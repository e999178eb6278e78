"""The job KILLED (SIGKILL to the launcher's whole process group: the launcher and its 8 ranks)
after a checkpoint is committed, then resumed with ``resume=latest``, trains on exactly as the
uninterrupted run: the same losses from the step after the checkpoint and the same final
weights. A step's checkpoint counts as committed once ``latest`` names it ([Note: atomic
checkpoint] in zeropp_hier/deepspeed/checkpoint/atomic.py); anything the kill cut short after that is
left on disk and must not be read."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import stdlib_files
from zeropp_hier.app.run import rank_main
from zeropp_hier.app.spec import JobSpec

from ..helpers import data_job_spec, max_state_diff

# the first commit (step 2) is the kill's signal; the job's steps 3 and 4 and their commit are what
# the kill cuts off and the resumed run redoes
STEPS, EVERY = 4, 2

# the killed job: the same JobSpec, run by launch() in a process of its own session
CHILD = """
import sys
from zeropp_hier.app.launch import launch
from zeropp_hier.app.spec import JobSpec
from zeropp_hier.app.spec import ModelSpec
data, out, ckpt, steps, every = sys.argv[1:6]
launch(JobSpec(steps=int(steps), micro_batch=2, model=ModelSpec(seq_len=32), data_path=data, progress="off",
               out_dir=out, save_every=int(every), checkpoint_dir=ckpt, local_world=8))
"""


def _spec(tmp_path, name, **kw) -> JobSpec:
    return data_job_spec(tmp_path, name, **{"steps": STEPS, **kw})


def _committed_step(ckpt: str) -> int | None:
    try:
        with open(os.path.join(ckpt, "latest")) as f:
            tag = f.read().strip()
    except FileNotFoundError:
        return None
    return int(tag.removeprefix("step")) if tag.startswith("step") else None


def test_killed_job_resumes_exactly(world8, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    data.prepare(stdlib_files()[:41], str(tmp_path / "data"))
    ckpt = str(tmp_path / "ckpt")
    args = [str(tmp_path / "data"), str(tmp_path / "killed"), ckpt, str(STEPS), str(EVERY)]
    log = open(tmp_path / "killed.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 600  # a bound against a hang, not a timing assertion
        while _committed_step(ckpt) is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    k = _committed_step(ckpt)
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-3000:]
    assert k is not None and k < STEPS, f"killed at committed step {k} of {STEPS}: the kill came too late"

    full = world8.run(rank_main, _spec(tmp_path, "full", save_every=STEPS))
    resumed = world8.run(rank_main, _spec(tmp_path, "resumed", save_every=EVERY, checkpoint_dir=ckpt, resume="latest"))
    assert len(resumed[0]["losses"]) == STEPS - k
    assert resumed[0]["losses"] == pytest.approx(full[0]["losses"][k:], rel=1e-6, abs=1e-7)
    ref = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "full" / "checkpoints"), tag=f"step{STEPS}")
    got = get_fp32_state_dict_from_zero_checkpoint(ckpt, tag=f"step{STEPS}")
    assert set(ref) == set(got) and ref
    worst = max_state_diff(got, ref)
    assert worst <= 1e-6, f"final weights differ by {worst}"
    # the resumed run's own output: the chart of the steps it trained
    png = tmp_path / "resumed" / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one metrics file for the run ([Note: one run in the monitor]): the killed job's, continued by the
    # resumed one, each step once; the steps the kill cut off (logged or not) hold the resumed run's values
    assert not (tmp_path / "resumed" / "metrics.jsonl").exists()
    lines = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines if x.strip()]
    assert [r["step"] for r in rows] == list(range(STEPS)), [r["step"] for r in rows]
    assert [r["loss"] for r in rows[k:]] == resumed[0]["losses"]
