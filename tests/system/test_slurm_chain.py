"""A run longer than its allocation, on the real one-node Slurm ([Note: chained jobs] in
zeropp_hier/app/chain.py, [Note: saving before the wall clock ends] in app/deadline.py): the CPU
batch script, given checkpoint_dir= and steps=, chains itself through several allocations with
a time limit of 3 minutes; each link gets Slurm's warning signal once its ranks train, forwards it
to srun, and every rank saves at the same step and exits 0; the next link resumes. The losses and
the final fp32 weights equal one uninterrupted job's.

The warning is sent by the test, with ``scancel --signal=USR1 --batch`` (what ``--signal=B:USR1``
asks Slurm to do before the limit: the signal to the batch shell only), as soon as a link has
built its engine: Slurm's own timer sends it up to a minute early, so on this machine it could
come before the ranks have started; the test makes every link train first."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from zeropp_hier.app import chain
from zeropp_hier.deepspeed import checkpoint
from zeropp_hier.launch.world import free_port

from .slurm_cluster import LocalSlurm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "frontier" / "train_cpu.sbatch"
STEPS = 5
# steps of a few seconds (16 sequences per rank), so that the warning lands within a step or two
MICRO = "data.micro_batch=16"
# 4 ranks (1 simulated node x 2 x 2), a 3-minute limit for every link
OPTIONS = ["--ntasks-per-node=4", "-t", "3"]
# printed by rank 0 once the engine is built, before the first step: each link, warned then, trains
# a step or two (the ranks record the signal from their start and stop at the next boundary)
READY_LINE = re.compile(r"^zeropp-hier: preset=", re.MULTILINE)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


def _env(slurm, **extra) -> dict:
    # a port of its own: another test cluster on this host has jobs of the same numbers
    port = str(free_port())
    return {**slurm.env, "ZEROPP_HIER_ROOT": str(ROOT), "PYTHONPATH": str(ROOT), "ZH_MASTER_PORT": port, **extra}


def _submit(slurm, work: Path, args: list[str], wait: bool = False, **env) -> subprocess.CompletedProcess:
    cmd = ["sbatch", "--parsable", *(["--wait"] if wait else []), "-D", str(work), "-o", str(work / "job-%j.out")]
    return subprocess.run(
        [*cmd, *OPTIONS, str(SCRIPT), *args], env=_env(slurm, **env), capture_output=True, text=True, timeout=900
    )


def _losses(work: Path, job: str) -> dict[int, float]:
    path = work / "outputs" / f"slurm-{job}.0" / "metrics.jsonl"
    if not path.is_file():
        return {}
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {int(r["step"]): float(r["loss"]) for r in rows}


def _chain_until_done(slurm, work: Path, args: list[str], timeout: float) -> list[str]:
    """Submit the first link; send each running link the warning once its engine is built; return the ids
    of the jobs that ran, once the queue is empty."""
    p = _submit(slurm, work, args)
    assert p.returncode == 0, p.stderr
    signalled: set[str] = set()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        q = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=slurm.env, capture_output=True, text=True).stdout
        jobs = dict(line.split() for line in q.splitlines() if line.strip())
        if not jobs:
            return sorted((f.stem.split("-")[1] for f in work.glob("job-*.out")), key=int)
        for job, state in jobs.items():
            out = work / f"job-{job}.out"
            if state == "RUNNING" and job not in signalled and out.is_file() and READY_LINE.search(out.read_text()):
                subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=slurm.env, check=True)
                signalled.add(job)
        time.sleep(1)
    subprocess.run(["scancel", "--user=root"], env=slurm.env)
    raise AssertionError(f"the chain did not end within {timeout} s:\n{slurm.logs()}")


def test_a_chain_of_allocations_equals_one_uninterrupted_job(slurm, tmp_path):
    # the reference: one job, chain off, saving at its last step
    ref = tmp_path / "ref"
    ref.mkdir()
    args = [f"steps={STEPS}", f"save_every={STEPS}", f"checkpoint_dir={ref / 'ck'}", MICRO]
    p = _submit(slurm, ref, args, wait=True, ZH_CHAIN="0")
    ref_job = p.stdout.strip().split(";")[0]
    out = (ref / f"job-{ref_job}.out").read_text(errors="replace")
    assert p.returncode == 0, out[-4000:]
    assert "chain: off" in out
    ref_losses = _losses(ref, ref_job)
    assert sorted(ref_losses) == list(range(STEPS)), out[-3000:]

    work = tmp_path / "chain"
    work.mkdir()
    ck = work / "ck"
    jobs = _chain_until_done(slurm, work, [f"steps={STEPS}", f"checkpoint_dir={ck}", MICRO], timeout=1800)
    outs = {j: (work / f"job-{j}.out").read_text(errors="replace") for j in jobs}
    links = chain.read_links(str(ck))
    print("links:", [(lk.job, lk.start_step, lk.end_step, lk.exit) for lk in links])
    # at least three allocations, each trained and ended by the warning at a step boundary, exit 0
    assert len(links) >= 3 and all(lk.end_step > lk.start_step for lk in links), links
    assert all(lk.exit == 0 for lk in links), links
    assert [lk.start_step for lk in links[1:]] == [lk.end_step for lk in links[:-1]], links
    assert links[-1].end_step == STEPS
    for lk in links[:-1]:
        text = outs[lk.job]
        assert "batch shell: Slurm warning signal USR1, forwarded to srun" in text, text[-3000:]
        assert f"stopping with {lk.end_step} steps done: Slurm's warning signal reached a rank" in text, text[-3000:]
    for lk in links[1:]:
        resumed = f"chain: job {lk.job}: resuming from the newest complete checkpoint, step {lk.start_step}"
        assert resumed in outs[lk.job], outs[lk.job][-3000:]
    assert "starting fresh" in outs[links[0].job]
    # the run ended by itself: the last link says so (and cancelled the successor it had submitted)
    assert "the run is done" in outs[links[-1].job], outs[links[-1].job][-2000:]

    # every step's loss, from whichever link trained it, equals the uninterrupted job's
    got: dict[int, float] = {}
    for lk in links:
        got.update(_losses(work, lk.job))
    assert sorted(got) == list(range(STEPS)), got
    for step in range(STEPS):
        assert abs(got[step] - ref_losses[step]) <= 1e-6 * abs(ref_losses[step]), (step, got[step], ref_losses[step])
    # and so do the final fp32 weights (DeepSpeed's zero_to_fp32 of each run's last checkpoint)
    mine, theirs = checkpoint.to_fp32(str(ck)), checkpoint.to_fp32(str(ref / "ck"))
    assert mine.keys() == theirs.keys()
    for name in theirs:
        a, b = mine[name].detach().float(), theirs[name].detach().float()
        scale = max(float(b.abs().max()), 1e-12)
        assert float((a - b).abs().max()) <= 1e-6 * scale, name
    assert torch.equal(torch.tensor(sorted(got)), torch.arange(STEPS))
    assert os.path.isfile(ck / chain.RECORDS)
