"""Rank 0's reporter (app/report.py): the progress bar on a resumed run."""

from zeropp_hier.app.report import Reporter
from zeropp_hier.app.spec import JobSpec


def test_a_resumed_run_counts_the_steps_left(tmp_path):
    rep = Reporter(JobSpec(steps=10, progress="on", out_dir=str(tmp_path)), enabled=True)
    try:
        assert rep.bar.total == 10
        rep.resumed_at(4, 10)
        assert rep.bar.total == 6 and rep.bar.n == 0
        for step in range(4, 10):
            rep.step({"step": step, "loss": 1.0}, f"step {step}")
        assert rep.bar.n == rep.bar.total == 6
    finally:
        rep.close()
