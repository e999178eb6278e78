"""The sweep_report command on a directory without finished runs (tests/system/test_sweep.py
runs a real sweep and reports it)."""

from zeropp_hier.tools import sweep_report


def test_report_refuses_a_directory_without_runs(tmp_path, capsys):
    (tmp_path / "0").mkdir()  # a job that never wrote its summary
    assert sweep_report.main([str(tmp_path)]) == 2
    assert "no summary.json under" in capsys.readouterr().err
