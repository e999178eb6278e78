"""Chained jobs, the decisions ([Note: chained jobs] in app/longrun/chain.py): when a link runs, resumes
or starts fresh, and when the chain is done or stops; run through the CLI the batch scripts call,
on checkpoint directories committed by the package's own commit."""

import dataclasses
import json
import os

import pytest

from zeropp_hier.app.longrun import chain
from zeropp_hier.app.longrun.resume_rules import decide, record
from zeropp_hier.app.spec import JobSpec
from zeropp_hier.core.errors import HierConfigError
from zeropp_hier.deepspeed.checkpoint.files import TMP_PREFIX, commit


def _save(root, step: int) -> None:
    """A committed tag step<N> (manifest, rename, 'latest'), as a job's save leaves it."""
    tag = f"step{step}"
    tmp = os.path.join(root, TMP_PREFIX + tag)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "f.pt"), "wb") as f:
        f.write(b"x")
    commit(str(root), tmp, tag, {"f.pt": {"bytes": 1, "sha256": "0" * 64}}, {"global_steps": step}, True)


def _start(root, job, steps=10):
    return chain.main(["start", "--dir", str(root), "--steps", str(steps), "--job", str(job)])


def _end(root, job, rc, log=None, steps=10):
    args = ["end", "--dir", str(root), "--steps", str(steps), "--job", str(job), "--exit", str(rc)]
    return chain.main(args + ["--log", str(log) if log else os.devnull])


def test_fresh_then_resume_then_done(tmp_path, capsys):
    root = tmp_path / "ckpt"
    assert _start(root, 1) == chain.RUN
    out = capsys.readouterr()
    assert out.out == "" and "starting fresh" in out.err  # no resume override without a checkpoint
    _save(root, 4)
    assert _end(root, 1, 0) == chain.RUN
    assert _start(root, 2) == chain.RUN
    out = capsys.readouterr()
    assert out.out.strip() == "resume=latest" and "step 4" in out.err
    _save(root, 10)
    assert _end(root, 2, 0) == chain.DONE
    assert _start(root, 3) == chain.DONE
    assert "the run is done" in capsys.readouterr().err
    links = chain.read_links(str(root))
    assert [(lk.job, lk.start_step, lk.end_step, lk.exit) for lk in links] == [("1", 0, 4, 0), ("2", 4, 10, 0)]


def test_two_failures_at_the_same_step_stop_the_chain(tmp_path, capsys):
    root = tmp_path / "ckpt"
    _save(root, 3)
    assert _start(root, 7) == chain.RUN  # killed before it could record its end
    assert _start(root, 8) == chain.RUN  # the first failure at step 3: one more try
    assert _end(root, 8, 1) == chain.STOP
    assert _start(root, 9) == chain.STOP
    err = capsys.readouterr().err
    assert "jobs 7 and 8 both failed at step 3" in err and "exit None, 1" in err


def test_two_links_without_a_new_checkpoint_stop_the_chain(tmp_path, capsys):
    root = tmp_path / "ckpt"
    _save(root, 3)
    assert _start(root, 1) == chain.RUN
    assert _end(root, 1, 0) == chain.RUN  # the time limit came before a step and a save fitted
    assert _start(root, 2) == chain.RUN
    assert _end(root, 2, 0) == chain.STOP
    assert "jobs 1 and 2 both ended without a new checkpoint at step 3" in capsys.readouterr().err


def test_a_failure_after_progress_runs_again(tmp_path):
    root = tmp_path / "ckpt"
    _save(root, 3)
    assert _start(root, 1) == chain.RUN
    assert _end(root, 1, 1) == chain.RUN
    _save(root, 6)  # the next link saved before failing: progress, not the same step
    assert _start(root, 2) == chain.RUN
    assert _end(root, 2, 137) == chain.RUN


def _refusal_text() -> str:
    """The message the job prints when resume refuses a seed change (resume_rules' own)."""
    saved = JobSpec()
    with pytest.raises(HierConfigError) as e:
        decide(record(saved, 8, 1, None), 8, dataclasses.replace(saved, seed=saved.seed + 1), 8, None, "step4")
    return f"[rank0]: Traceback ...\n[rank0]: zeropp_hier.core.errors.HierConfigError: {e.value}\nsrun: error: ...\n"


def test_a_refused_resume_stops_the_chain_naming_the_field(tmp_path, capsys):
    root = tmp_path / "ckpt"
    _save(root, 4)
    log = tmp_path / "link.out"
    log.write_text(_refusal_text())
    assert _start(root, 5) == chain.RUN
    assert _end(root, 5, 1, log) == chain.STOP
    assert _start(root, 6) == chain.STOP
    err = capsys.readouterr().err
    assert "configuration error" in err and "at 'seed'" in err and "step4 was saved with seed=" in err
    rec = [json.loads(x) for x in (root / chain.RECORDS).read_text().splitlines()]
    assert rec[-1]["config_error"].startswith("zeropp_hier config error at 'seed'")


def test_an_incomplete_latest_is_no_checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    os.makedirs(root / "step5")
    (root / "latest").write_text("step5")  # a tag without a manifest: never committed
    assert chain.newest_step(str(root)) == (0, None)
    _save(root, 2)
    assert chain.newest_step(str(root)) == (2, "step2")
