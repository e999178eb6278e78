"""The job stopped after step k and resumed with ``resume=latest`` trains on exactly as the
uninterrupted run: the same losses from step k+1 on and the same final weights (8 ranks, the
frontier preset, real token data, through ``zeropp_hier.app.run.rank_main``)."""

import pytest

from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import stdlib_files
from zeropp_hier.app.run import rank_main
from zeropp_hier.app.spec import JobSpec

from ..helpers import data_job_spec, max_state_diff

STEPS, K = 4, 2


def _spec(tmp_path, name, **kw) -> JobSpec:
    return data_job_spec(tmp_path, name, **{"steps": STEPS, **kw})


def test_resume_latest_continues_exactly(world8, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    data.prepare(stdlib_files()[:41], str(tmp_path / "data"))
    full = world8.run(rank_main, _spec(tmp_path, "full", save_every=STEPS))
    ckpt = str(tmp_path / "ckpt")
    first = world8.run(rank_main, _spec(tmp_path, "first", steps=K, save_every=K, checkpoint_dir=ckpt))
    second = world8.run(rank_main, _spec(tmp_path, "second", save_every=K, checkpoint_dir=ckpt, resume="latest"))
    assert len(first[0]["losses"]) == K and first[0]["losses"] == pytest.approx(full[0]["losses"][:K], rel=1e-6)
    assert len(second[0]["losses"]) == STEPS - K
    assert second[0]["losses"] == pytest.approx(full[0]["losses"][K:], rel=1e-6, abs=1e-7)
    ref = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "full" / "checkpoints"), tag=f"step{STEPS}")
    got = get_fp32_state_dict_from_zero_checkpoint(ckpt, tag=f"step{STEPS}")
    assert set(ref) == set(got) and ref
    worst = max_state_diff(got, ref)
    assert worst <= 1e-6, f"final weights differ by {worst}"
    # and training moved them: the resumed run is not the saved state at step K
    at_k = get_fp32_state_dict_from_zero_checkpoint(ckpt, tag=f"step{K}")
    assert max_state_diff(got, at_k) > 1e-4


def test_resume_refuses_a_missing_checkpoint(world8, tmp_path):
    from zeropp_hier.launch.world import WorldError

    data.prepare(stdlib_files()[:41], str(tmp_path / "data"))
    spec = _spec(tmp_path, "x", checkpoint_dir=str(tmp_path / "none"), resume="latest")
    with pytest.raises(WorldError, match="'resume'.*no checkpoint found"):
        world8.run(rank_main, spec)
