"""``zeropp_hier.patch_deepspeed()`` under the Hugging Face Trainer, as a ``run_clm.py``-style job
runs it, at the real world size: 8 ranks (2 nodes x 2 packages x 2 GCDs) of the shared world.

Each job: ``TrainingArguments`` with a ZeRO-3 DeepSpeed config, ``from_pretrained`` of a small
saved GPT-NeoX (built by transformers under DeepSpeed's ``zero.Init``), the Trainer for 4 steps
with a checkpoint every 2 (``save_steps``), and a second Trainer that resumes from the step-2
checkpoint (``resume_from_checkpoint``). Stock DeepSpeed and our engine (``frontier``, exact: no
compression) run the same jobs on the same data in the same world.

On CPU ranks the Trainer sees the world only with ``TrainingArguments(use_cpu=True)``: without
it Accelerate 1.15 finds no backend for a CPU device (accelerate/state.py,
``PartialState._prepare_backend`` and ``# No backend == no distributed training`` in
``PartialState.__init__``), and every rank trains alone on the same batches while DeepSpeed
averages identical gradients ([Note: the Trainer's world on CPU ranks] in ranks_hf.py). The
first test shows that; the others assert the sharding. The patch itself, without a world:
tests/unit/test_patch.py."""

import os

import pytest

from ..helpers import assert_losses_close, assert_states_close
from . import ranks_hf

STEPS, SAVE = 4, 2
WORLD = 8
RTOL = ATOL = 1e-5  # the parity tests' tolerance for exact presets (tests/dist/test_parity.py)


@pytest.fixture(scope="module")
def jobs(world8, tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    model_dir = str(root / "pretrained")
    out = {
        "model_dir": model_dir,
        "pretrained": ranks_hf.save_tiny_neox(model_dir),
        "left": world8.run(ranks_hf.shm_buffers_left),
    }
    for name, preset in (("stock", None), ("ours", "frontier")):
        full = str(root / name)
        out[name] = world8.run(ranks_hf.hf_trainer_run, model_dir, full, preset, STEPS, SAVE)
        out[f"{name}_resumed"] = world8.run(
            ranks_hf.hf_trainer_run,
            model_dir,
            str(root / f"{name}_resumed"),
            preset,
            STEPS,
            SAVE,
            resume_from=os.path.join(full, f"checkpoint-{SAVE}"),
        )
        out[f"{name}_dir"] = full
    return out


def test_local_world_leaves_no_deepspeed_shm_buffers(jobs):
    assert jobs["left"] == [[]] * WORLD


def test_trainer_sees_a_world_of_one_on_cpu_ranks_without_use_cpu(world8):
    alone, seen = world8.run(ranks_hf.trainer_world, False), world8.run(ranks_hf.trainer_world, True)
    # if this fails, Accelerate now finds the CPU world itself: docs/usage.md's Hugging Face
    # section and [Note: the Trainer's world on CPU ranks] should say so
    assert [r["world_size"] for r in alone] == [1] * WORLD and {r["process_index"] for r in alone} == {0}
    assert [r["world_size"] for r in seen] == [WORLD] * WORLD
    assert [r["process_index"] for r in seen] == list(range(WORLD))


@pytest.mark.parametrize("job", ["stock", "ours", "stock_resumed", "ours_resumed"])
def test_trainer_runs_at_the_world_size_with_sharded_batches(jobs, job):
    runs = jobs[job]
    rows = {r[0]: r for r in ranks_hf.dataset_rows()}  # a row's first token names its sample
    steps = STEPS - SAVE if job.endswith("resumed") else STEPS
    for rank, r in enumerate(runs):
        assert r["world_size"] == WORLD and r["process_index"] == rank
        assert r["distributed_type"] == "DistributedType.DEEPSPEED" and r["deepspeed"]
        assert r["engine"] == ("HierEngine" if job.startswith("ours") else "DeepSpeedEngine")
        assert (r["sampler"], r["sampler_processes"], r["sampler_index"]) == ("BatchSamplerShard", WORLD, rank)
        assert r["train_batch_size"] == 2 * WORLD  # DeepSpeed checked it against its own world
        assert r["global_step"] == STEPS and len(r["losses"]) == steps
        assert r["everyone_rows"] == runs[0]["everyone_rows"]  # the all_gather agrees everywhere
        assert r["everyone_rows"][rank] == r["rows"]  # its own entry is what its model was given
    everyone = runs[0]["everyone_rows"]
    for rank in range(WORLD):
        assert len(everyone[rank]) == steps and all(len(batch) == 2 for batch in everyone[rank])
        for batch in everyone[rank]:
            for row in batch:
                assert rows[row[0]] == row  # a sample of the data set, whole
    for step in range(steps):
        ids = [row[0] for rank in range(WORLD) for row in everyone[rank][step]]
        assert len(set(ids)) == 2 * WORLD, f"{job} step {step}: ranks share samples {sorted(ids)}"
    if not job.endswith("resumed"):  # one epoch: every sample once
        assert sorted(row[0] for rank in range(WORLD) for batch in everyone[rank] for row in batch) == list(rows)


@pytest.mark.parametrize("job", ["stock", "ours"])
def test_from_pretrained_builds_the_model_partitioned_with_the_saved_weights(jobs, job):
    for r in jobs[job]:
        loaded = r["loaded"]
        assert loaded["partitioned"] and loaded["shard_numel"] * WORLD >= loaded["numel"] > loaded["shard_numel"]
        assert_states_close(loaded["state"], jobs["pretrained"], 0.0, f"{job} from_pretrained")


def test_ours_matches_stock(jobs):
    for rank, (ours, stock) in enumerate(zip(jobs["ours"], jobs["stock"])):
        assert_losses_close(ours["losses"], stock["losses"], RTOL, f"rank {rank}")
        assert_states_close(ours["state"], stock["state"], ATOL, f"rank {rank}")
        assert ours["everyone_rows"] == stock["everyone_rows"]
    assert jobs["stock"][0]["losses"][-1] != jobs["stock"][0]["losses"][0]  # it trained


@pytest.mark.parametrize("name", ["stock", "ours"])
def test_resumed_run_equals_the_uninterrupted_one(jobs, name):
    for rank, (resumed, full) in enumerate(zip(jobs[f"{name}_resumed"], jobs[name])):
        assert resumed["everyone_rows"] == [steps[SAVE:] for steps in full["everyone_rows"]]
        assert resumed["losses"] == full["losses"][SAVE:], f"{name} rank {rank}"
        assert_states_close(resumed["state"], full["state"], 0.0, f"{name} rank {rank} resumed")
        assert resumed["checkpoints"] == [f"checkpoint-{STEPS}"]
    assert jobs[name][0]["checkpoints"] == [f"checkpoint-{SAVE}", f"checkpoint-{STEPS}"]


def test_checkpoint_holds_the_trained_weights_for_from_pretrained(jobs):
    """stage3_gather_16bit_weights_on_model_save: the Trainer saves whole weights through the engine."""
    saved = ranks_hf.load_whole(os.path.join(jobs["ours_dir"], f"checkpoint-{STEPS}"))
    assert_states_close(saved, jobs["ours"][0]["state"], 0.0, "checkpoint model.safetensors")


def test_backward_regathers_over_the_gcd_link_only(jobs):
    for r in jobs["ours"]:
        assert r["topology"] == [2, 2, 2]
        calls, sent = r["stats"]["calls"], r["stats"]["bytes"]
        assert calls["backward_gather"]["gcd"] > 0 and sent["backward_gather"]["gcd"] > 0  # tertiary gathers
        assert sent["backward_gather"]["gpu"] == 0 and sent["backward_gather"]["node"] == 0
        assert sent["forward_gather"]["gpu"] > 0 and sent["grad_reduce"]["gpu"] > 0
