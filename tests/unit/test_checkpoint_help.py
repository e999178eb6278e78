"""`zeropp-hier checkpoint --help` names every checkpoint command, the ones the command line runs
before the checkpoint tool's parser (export-hf) too."""

import pytest

from zeropp_hier import __main__ as cli


def test_checkpoint_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["checkpoint", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in ["verify", "to-universal", *cli.CHECKPOINT_TOOLS]:
        assert name in out, (name, out)
    assert "export-hf" in out


def test_export_hf_still_runs_its_own_parser(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["checkpoint", "export-hf", "--help"])
    assert e.value.code == 0
    assert "--out" in capsys.readouterr().out
