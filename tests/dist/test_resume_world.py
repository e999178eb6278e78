"""The job (``zeropp_hier.app.run.rank_main``) saved at one world size and resumed at another
([Note: resuming at another world size] in app/longrun/resume.py): 8 ranks (2x2x2) -> 4 ranks (1x2x2)
and 4 ranks -> 8 ranks in another shape (1x2x4), through the universal format the job converts
to itself.

The runs keep the global batch (8 x 2 = 4 x 4 = 16 samples a step) and compress nothing, so a
run at 4 ranks and one at 8 take the same steps on the same samples and differ only in the
order of fp32 sums (the gradient reduction over 4 or 8 ranks, partition boundaries): that is the
1e-5 relative tolerance of the losses, the one the project's other fp32 parity tests use. What
the resume itself carries (weights, fp32 master, Adam moments, lr, step) is a copy and must be
bitwise equal.
"""

import os

import pytest
import torch

from tests.dist.ranks_resume_world import Capture, rank_main_logged
from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import stdlib_files
from zeropp_hier.app.job_vocab import with_data_vocab
from zeropp_hier.app.longrun import io_cost, resume, resume_rules
from zeropp_hier.app.run import rank_main
from zeropp_hier.app.spec import JobSpec, ModelSpec
from zeropp_hier.deepspeed import checkpoint
from zeropp_hier.launch.world import LocalWorld, WorldError

STEPS, K = 4, 2
SHAPE = {8: {"gpus_per_node": 2, "gcds_per_gpu": 2}, 4: {"gpus_per_node": 2, "gcds_per_gpu": 2}}
OTHER_8 = {"gpus_per_node": 2, "gcds_per_gpu": 4}  # 1 node x 2 GPUs x 4 GCDs
MICRO = {8: 2, 4: 4}
TIMEOUT_S = 1800  # an 8-rank job run takes minutes on a loaded 2-core machine


def _run(world: int, *args):
    """One job run on its own ``world`` ranks: one world alive at a time keeps the memory of
    this file's runs to one world's."""
    with LocalWorld(world, timeout=TIMEOUT_S, preload=True) as w:
        return w.run(rank_main, *args)


def _spec(root, name, world, **kw) -> JobSpec:
    fields = dict(
        preset="frontier",
        compression="none",
        steps=STEPS,
        micro_batch=MICRO[world],
        model=ModelSpec(seq_len=32),
        data_path=str(root / "data"),
        progress="off",
        out_dir=str(root / name),
        topology=SHAPE[world],
        local_world=world,
        warmup_steps=3,  # the lr still changes at step K: the scheduler must come back
    )
    return JobSpec(**{**fields, **kw})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Uninterrupted runs of STEPS steps at 8 and at 4 ranks, each saving at step K."""
    root = tmp_path_factory.mktemp("resume_world")
    data.prepare(stdlib_files()[:41], str(root / "data"))
    ref8 = _run(8, _spec(root, "ref8", 8, save_every=K, checkpoint_dir=str(root / "c8")), Capture())
    ref4 = _run(4, _spec(root, "ref4", 4, save_every=K, checkpoint_dir=str(root / "c4")), Capture())
    return root, ref8, ref4


def _assert_same_state(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want) and len(got) > 3
    for name in want:
        for kind in want[name]:
            a, b = got[name][kind], want[name][kind]
            assert a.shape == b.shape and torch.equal(a, b), f"{what}: {name} {kind} differs"


def _close(a: list, b: list, rel: float = 1e-5) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert abs(x - y) <= rel * abs(y), f"{a} vs {b}"


def test_runs_at_4_and_8_ranks_take_the_same_steps(runs):
    """The premise of the comparisons below: same initial weights and the same global batches."""
    _, ref8, ref4 = runs
    _close(ref4[0]["losses"], ref8[0]["losses"])
    assert ref8[0]["losses"][-1] < ref8[0]["losses"][0]  # and they train


def test_resume_8_to_4_ranks(runs):
    root, ref8, ref4 = runs
    spec = _spec(root, "r84", 4, checkpoint_dir=str(root / "c8"), resume=f"step{K}")
    out = _run(4, spec, Capture())
    saved = ref8[0]["hooks"]["saved"][K]
    for rank, r in enumerate(out):
        _assert_same_state(r["hooks"]["loaded"], saved, f"rank {rank} of 4 after the load")
    assert len(out[0]["losses"]) == STEPS - K
    _close(out[0]["losses"], ref4[0]["losses"][K:])
    assert os.path.isfile(
        os.path.join(resume_rules.universal_dir(str(root / "c8")), f"step{K}", "zeropp_hier_manifest.json")
    )


def test_resume_4_to_8_ranks_in_another_shape(runs):
    root, ref8, ref4 = runs
    c4 = str(root / "c4")
    source_bytes = sum(resume.saved_sizes(c4, f"step{K}").values())
    spec = _spec(root, "r48", 8, topology=OTHER_8, checkpoint_dir=c4, resume=f"step{K}", save_every=K)
    with LocalWorld(8, timeout=TIMEOUT_S, preload=True) as w:
        out = w.run(rank_main_logged, str(root / "r48.log"), spec, Capture())
    # the job said what the conversion and each save cost, with the numbers of the files it wrote
    with open(root / "r48.log.0") as f:
        log = f.read()
    assert f"converted checkpoint step{K} (4 ranks -> 8) to the universal format in " in log
    assert f"each of the 8 ranks its share: read {source_bytes / 1e9:.3g} GB, wrote " in log
    per_rank = io_cost.bytes_by_rank(resume.saved_sizes(c4, f"step{STEPS}"))
    assert len(per_rank) == 8 and min(per_rank.values()) > 0
    assert (
        f"checkpoint step{STEPS} saved in {c4}: {max(per_rank.values()) / 1e9:.3g} GB per rank (the largest of 8), "
        f"{sum(per_rank.values()) / 1e9:.3g} GB in all, in "
    ) in log
    saved = ref4[0]["hooks"]["saved"][K]
    for rank, r in enumerate(out):
        _assert_same_state(r["hooks"]["loaded"], saved, f"rank {rank} of 8 (1x2x4) after the load")
    _close(out[0]["losses"], ref8[0]["losses"][K:])
    # and what it saved at the end is the 8-rank run's state, up to the same fp32 sums
    end, want = out[0]["hooks"]["saved"][STEPS], ref8[0]["hooks"]["saved"][STEPS]
    for name in want:
        if not name.startswith("_"):
            assert torch.allclose(end[name]["fp32"], want[name]["fp32"], rtol=1e-4, atol=1e-6), name


def test_an_existing_conversion_is_used_and_a_stale_one_refused(runs):
    """After the 8 -> 4 resume the conversion is there: the next resume reuses it (as it would
    one made ahead with `zeropp-hier checkpoint to-universal`); a conversion of another save
    under the same tag name is refused."""
    import shutil

    root, _, _ = runs
    c8 = str(root / "c8")
    out = resume_rules.universal_dir(c8)
    manifest = os.path.join(out, f"step{K}", "zeropp_hier_manifest.json")
    spec = with_data_vocab(_spec(root, "x", 4, checkpoint_dir=c8, resume=f"step{K}"))  # as rank_main does
    sha = data.TokenData(spec.data_path).index["sha256"]
    if not os.path.exists(manifest):  # run without test_resume_8_to_4_ranks: convert here first
        checkpoint.to_universal(c8, out, f"step{K}")
    before = os.stat(manifest).st_mtime_ns
    plan = resume._plan_on_rank0(spec, 4, sha)
    assert plan == resume.Plan(f"step{K}", out, True, 8) and os.stat(manifest).st_mtime_ns == before
    # without a conversion the plan asks for one (made by every rank, in resume.plan)
    later = with_data_vocab(_spec(root, "x", 4, checkpoint_dir=c8, resume=f"step{STEPS}"))
    assert resume._plan_on_rank0(later, 4, sha) == resume.Plan(f"step{STEPS}", out, True, 8, convert=True)
    # the step-4 conversion put under the name step2: another save
    checkpoint.to_universal(c8, out, f"step{STEPS}")
    stale = str(root / "stale")
    shutil.copytree(out, stale)
    shutil.rmtree(os.path.join(stale, f"step{K}"))
    os.rename(os.path.join(stale, f"step{STEPS}"), os.path.join(stale, f"step{K}"))
    shutil.copytree(c8, str(root / "stale_src"))
    os.rename(stale, resume_rules.universal_dir(str(root / "stale_src")))
    with pytest.raises(ValueError, match="'resume'.*converted from another save"):
        resume._plan_on_rank0(
            with_data_vocab(_spec(root, "x", 4, checkpoint_dir=str(root / "stale_src"), resume=f"step{K}")), 4, sha
        )


def test_unsupported_changes_are_refused_on_every_rank_before_building(runs):
    root, _, _ = runs
    spec = _spec(root, "bad", 4, checkpoint_dir=str(root / "c8"), resume=f"step{K}", model=ModelSpec(seq_len=16))
    with pytest.raises(WorldError) as e:
        _run(4, spec)
    # every rank raises the same error (rank 0's decision is broadcast); the launcher reports the
    # ranks that answered before it stopped the others
    assert e.value.failures
    assert all("'model'" in t and "resume with that value" in t for t in e.value.failures.values())
    spec = _spec(root, "bad", 4, checkpoint_dir=str(root / "c8"), resume=f"step{K}", preset="stock")
    with pytest.raises(WorldError, match="'preset'.*stock DeepSpeed"):
        _run(4, spec)
