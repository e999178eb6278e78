"""Save in time, the pure parts ([Note: saving before the wall clock ends] in app/longrun/deadline.py):
Slurm's end time read from real squeue/scontrol output (tests/data/slurm_time/, sources in its
README), the save estimate, and each rank's own flags. The agreement across ranks is in
tests/dist/test_deadline_agreement.py."""

import datetime as dt
import signal
from pathlib import Path

import pytest

from zeropp_hier.app.longrun import deadline as dl

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm_time"
UTC = dt.timezone.utc  # the capture's time zone (README)


def _read(name: str) -> str:
    """The command's output as captured: the file's first line names its source."""
    text = (DATA / name).read_text()
    assert text.startswith("# source: ")
    return text.split("\n", 1)[1]


def test_squeue_and_scontrol_name_the_same_end_which_is_start_plus_limit():
    squeue = dl.end_from_squeue(_read("squeue_end.txt"), UTC)
    scontrol = dl.end_from_scontrol(_read("scontrol_show_job.txt"), UTC)
    assert squeue is not None and squeue == scontrol
    fields = dl.scontrol_fields(_read("scontrol_show_job.txt"))
    assert fields["TimeLimit"] == "00:05:00" and fields["JobState"] == "RUNNING"
    start = dl.parse_slurm_time(fields["StartTime"], UTC)
    assert start is not None and scontrol - start == 5 * 60
    assert dt.datetime.fromtimestamp(scontrol, UTC).isoformat() == "2026-11-26T14:13:27+00:00"


@pytest.mark.parametrize("word", ["N/A", "NONE", "Unknown", "UNLIMITED", ""])
def test_slurm_words_for_no_time_are_no_end(word):
    assert dl.parse_slurm_time(word) is None


def test_a_garbled_time_names_what_was_expected():
    with pytest.raises(dl.DeadlineError, match="YYYY-MM-DDTHH:MM:SS"):
        dl.parse_slurm_time("14:13")


def test_allocation_end_takes_the_env_first_then_squeue_then_scontrol():
    asked = []

    def squeue_only(cmd):
        asked.append(cmd[0])
        return _read("squeue_end.txt") if cmd[0] == "squeue" else None

    def scontrol_only(cmd):
        asked.append(cmd[0])
        return _read("scontrol_show_job.txt") if cmd[0] == "scontrol" else None

    assert dl.allocation_end({}, squeue_only).at is None  # not a Slurm job: nothing asked
    assert asked == []
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_END_TIME": "1795702407"}
    assert dl.allocation_end(env, squeue_only) == dl.AllocationEnd(1795702407.0, "SLURM_JOB_END_TIME")
    a = dl.allocation_end({"SLURM_JOB_ID": "1"}, squeue_only)
    b = dl.allocation_end({"SLURM_JOB_ID": "1"}, scontrol_only)
    assert a.at == b.at and a.at is not None
    assert a.source.startswith("squeue") and b.source.startswith("scontrol")
    assert dl.allocation_end({"SLURM_JOB_ID": "1"}, lambda cmd: None).at is None


def test_estimate_uses_bytes_and_rate_until_a_save_is_measured():
    per_rank = dl.checkpoint_bytes_per_rank(20_000_000_000, 384)
    assert per_rank == pytest.approx(20e9 / 384 * 12)
    e = dl.SaveEstimate(per_rank, rate_gbps=0.5)
    assert e.seconds() == pytest.approx(per_rank / 0.5e9)
    assert "GB per rank" in e.source()
    e.measured_s = 12.5
    assert e.seconds() == 12.5 and "last save" in e.source()


class _Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_clock_says_stop_once_one_more_step_and_a_save_no_longer_fit():
    clock = _Clock(0.0)
    d = dl.Deadline(dl.AllocationEnd(1000.0, "test"), dl.SaveEstimate(10e9, rate_gbps=1.0), clock=clock)
    # the save takes 10 s, twice that with the safety factor, plus a 60 s margin: 80 s + one step
    assert d.local_flags() == (False, False, 1000.0)
    steps = []
    for k in range(1, 20):
        clock.t = 100.0 * k
        steps.append(d.local_flags()[1])
    # left after step k: 1000 - 100 k; needed: 100 + 80 = 180 -> stop once left < 180, at k = 9
    assert steps.index(True) == 8 and not any(steps[:8])
    d.record_save(300.0)  # a measured save replaces the estimate
    assert d.estimate.seconds() == 300.0


def test_no_end_and_no_signal_never_stops():
    d = dl.Deadline(dl.AllocationEnd(None, "not a Slurm job"), dl.SaveEstimate(1e12))
    assert d.local_flags()[:2] == (False, False)


def test_the_signal_handler_only_records():
    flag = dl.watch_signal(signal.SIGUSR1)
    try:
        d = dl.Deadline(dl.AllocationEnd(None, "x"), dl.SaveEstimate(0.0), flag=flag)
        assert d.local_flags()[0] is False
        signal.raise_signal(signal.SIGUSR1)
        assert flag.received and d.local_flags()[0] is True
        decision = dl.Decision(True, True, False, None)
        line = dl.stop_line(decision, 42, "/ckpt/step42")
        assert "with 42 steps done" in line and "warning signal" in line and "/ckpt/step42" in line
    finally:
        dl.unwatch_signal(flag)
    assert signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, flag.previous)


def test_an_early_flag_is_taken_over_by_the_jobs_watch(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(dl, "_EARLY", [])
    early = dl.watch_signal_early()
    try:
        assert early is not None and dl.watch_signal_early() is early  # installed once
        signal.raise_signal(signal.SIGUSR1)  # before the engine exists: recorded, not fatal
        watch = dl.for_job("/ckpt", 1_000_000, 4)
        assert watch is not None and watch.deadline.flag is early and early.received
        assert watch.deadline.estimate.bytes_per_rank == 1_000_000 / 4 * 12
        assert watch.deadline.end.at is None  # not a Slurm job
        assert dl.for_job(None, 1, 1) is None  # nowhere to save: no watch
    finally:
        dl.unwatch_signal(early)
