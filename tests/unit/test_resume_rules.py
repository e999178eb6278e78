"""What a resume may change (zeropp_hier.app.longrun.resume_rules): the same world loads natively,
another world goes through the universal format, and what cannot carry over is refused with
the field, the value and the fix."""

import pytest

from zeropp_hier.app.longrun.resume_rules import decide, record, universal_dir
from zeropp_hier.app.spec import JobSpec, ModelSpec

SHA = "ab" * 32


def _saved(**kw) -> dict:
    spec = JobSpec(model=ModelSpec(vocab_size=256), **kw)
    return record(spec, 8, 1, SHA)


def _now(**kw) -> JobSpec:
    return JobSpec(model=ModelSpec(vocab_size=256), **kw)


def test_same_world_is_native_and_another_universal():
    assert decide(_saved(), 8, _now(), 8, SHA, "step2") == "native"
    # world, micro-batch, topology, hier preset and compression may all change
    other = _now(micro_batch=8, preset="zero3", compression="none", topology={"gpus_per_node": 1, "gcds_per_gpu": 4})
    assert decide(_saved(), 8, other, 4, SHA, "step2") == "universal"
    assert decide(_saved(), 8, _now(preset="zeropp"), 8, SHA, "step2") == "native"


@pytest.mark.parametrize(
    "now,world,sha,field",
    [
        (_now(seed=1), 4, SHA, "seed"),
        (_now(dtype="bf16"), 8, SHA, "dtype"),
        (JobSpec(model=ModelSpec(vocab_size=256, layers=2)), 4, SHA, "model"),
        (_now(), 4, "cd" * 32, "data_path"),
        (_now(), 4, None, "data_path"),
        (_now(preset="stock"), 8, SHA, "preset"),
    ],
)
def test_unsupported_changes_name_the_field(now, world, sha, field):
    with pytest.raises(ValueError, match=f"'{field}'") as e:
        decide(_saved(), 8, now, world, sha, "step2")
    assert e.value.field == field and ("resume with" in e.value.fix or "same prepared directory" in e.value.fix)


def test_stock_resumes_only_at_its_own_world():
    saved = _saved(preset="stock")
    assert decide(saved, 8, _now(preset="stock"), 8, SHA, "t") == "native"
    with pytest.raises(ValueError, match="'preset'.*universal format.*resume at 8 ranks"):
        decide(saved, 8, _now(preset="stock"), 4, SHA, "t")


def test_an_older_record_is_not_checked_and_the_conversion_lives_beside_the_directory():
    assert decide({}, 8, _now(seed=5), 4, SHA, "t") == "universal"
    assert universal_dir("/x/ckpt/") == "/x/ckpt_universal"
