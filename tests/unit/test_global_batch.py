"""``global_batch`` (zeropp_hier.app.spec.JobSpec.accum): the accumulation follows the world, so a
resume on half the ranks trains the same global batches; a batch the ranks cannot split, or a
``grad_accum`` beside it, is refused naming the field."""

import pytest

from zeropp_hier.app.spec import JobSpec


def test_the_accumulation_keeps_the_global_batch_on_any_world():
    spec = JobSpec(micro_batch=16, global_batch=64)
    assert [spec.accum(w) for w in (4, 2, 1)] == [1, 2, 4]
    assert spec.ds_config(world=2)["gradient_accumulation_steps"] == 2
    assert spec.ds_config(world=2)["train_micro_batch_size_per_gpu"] == 16
    assert JobSpec(grad_accum=3).accum(8) == 3  # without it: grad_accum, whatever the world


def test_a_batch_the_ranks_cannot_split_is_refused():
    with pytest.raises(ValueError, match="'global_batch'.*not a multiple of 3 ranks x micro_batch 16 = 48"):
        JobSpec(micro_batch=16, global_batch=64).accum(3)
    with pytest.raises(ValueError, match="'global_batch'"):
        JobSpec(global_batch=0).check()
    with pytest.raises(ValueError, match="'grad_accum'.*global_batch sets the accumulation"):
        JobSpec(global_batch=64, grad_accum=2).check()
