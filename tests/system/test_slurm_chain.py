"""A run longer than its allocation, on the real one-node Slurm ([Note: chained jobs] in
zeropp_hier/app/longrun/chain.py, [Note: saving before the wall clock ends] in app/longrun/deadline.py): the CPU
batch script, given checkpoint_dir= and steps=, chains itself through several allocations with
a time limit of 6 minutes; each of the first three links gets Slurm's warning signal once its
ranks train, forwards it to srun, and every rank saves at the same step and exits 0; the next link
resumes. The fourth link (all four ranks, resuming without a conversion) is not warned: it trains
to the last step and ends the run, so the chain has four links whatever each link's share of steps
(three, should the third already reach the last step). The second link
runs on half the ranks (the test shrinks it while it waits, as an operator would after a node
failure: ``scontrol update NumTasks=2 TasksPerNode=2``) and the third on all four again: each converts the
checkpoint to the universal format, every rank its share, and says how long it took.

The run reads token files with ``global_batch=64`` (4 ranks x 16, or 2 ranks x 16 x 2
accumulated), so every link trains the same global batches as the uninterrupted job, and the
conversion carries the weights, fp32 master weights and Adam moments bit for bit
(tests/dist/test_resume_world.py). What a world change could alter is the order of the fp32
gradient sums (2 ranks of 2 micro-batches instead of 4 ranks); for this model and batch they come
out the same (measured: every loss and the final fp32 weights bit-equal to the uninterrupted
job's), so the chain is held to 1e-6 like the rest. A model whose sums regroup would need the
1e-5 of the project's other world-size-change tests.

The chain is one run in the monitor ([Note: one run in the monitor] in app/monitoring/monitor_run.py): one
metrics.jsonl, and, with the monitors on (csv always; tensorboard and wandb where the test extra
installed them), one TensorBoard run and one wandb id over the links, each step once.

The warning is sent by the test, with ``scancel --signal=USR1 --batch`` (what ``--signal=B:USR1``
asks Slurm to do before the limit: the signal to the batch shell only), as soon as a link has
built its engine: Slurm's own timer sends it up to a minute early, so on this machine it could
come before the ranks have started; the test makes every warned link train first."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import stdlib_files
from zeropp_hier.app.longrun import chain
from zeropp_hier.deepspeed import checkpoint
from zeropp_hier.launch.ports import free_port

from .slurm_cluster import LocalSlurm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "frontier" / "train_cpu.sbatch"
STEPS = 8
# steps of a few seconds (16 sequences per rank), so that the warning lands within a step or two;
# the global batch fixed, so that the link on 2 ranks accumulates 2 micro-batches
MICRO = "data.micro_batch=16"
BATCH = "global_batch=64"
HALF = 2  # the ranks of the second link
# the ranks the test gives the links while they wait, by position (a link submits the next with its own
# tasks per node): the second on half, the third on all four again
RANKS = {1: HALF, 2: 4}
# the links the test warns, by position: the fourth (4 ranks, resuming without a conversion) is not
# warned and runs to the end, so the chain's length does not depend on how the steps fall to the links
WARNED = 3
# 4 ranks (1 simulated node x 2 x 2), a 6-minute limit for every link (the warning, 60 s before it, is
# sent by the test sooner; the limit leaves a loaded machine's start-up and a conversion room), and
# one the reference job does not reach
OPTIONS = ["--ntasks-per-node=4"]
LINK_LIMIT, REF_LIMIT = "6", "30"
# printed by rank 0 once the engine is built, before the first step: each link, warned then, trains
# a step or two (the ranks record the signal from their start and stop at the next boundary)
# the chain's monitors, where the test extra installed their packages (csv needs none)
MONITORS = ["csv", *(m for m in ("tensorboard", "wandb") if importlib.util.find_spec(m) is not None)]
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


def _submit(
    slurm, work: Path, args: list[str], wait: bool = False, limit: str = LINK_LIMIT, **env
) -> subprocess.CompletedProcess:
    cmd = ["sbatch", "--parsable", *(["--wait"] if wait else []), "-D", str(work), "-o", str(work / "job-%j.out")]
    return subprocess.run(
        [*cmd, *OPTIONS, "-t", limit, str(SCRIPT), *args],
        env=_env(slurm, **env),
        capture_output=True,
        text=True,
        timeout=1800,
    )


def _losses(work: Path, job: str) -> dict[int, float]:
    path = work / "outputs" / f"slurm-{job}.0" / "metrics.jsonl"
    if not path.is_file():
        return {}
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {int(r["step"]): float(r["loss"]) for r in rows}


def _chain_until_done(slurm, work: Path, args: list[str], timeout: float) -> list[str]:
    """Submit the first link; give the second ``HALF`` ranks and the third 4 while they wait; send each of the first
    ``WARNED`` links the warning once it runs and its engine is built; return the ids of the jobs that ran, once the
    queue is empty."""
    p = _submit(slurm, work, args)
    assert p.returncode == 0, p.stderr
    order: list[str] = []  # the links' job ids as they appear
    resized: set[str] = set()
    signalled: set[str] = set()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        q = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=slurm.env, capture_output=True, text=True).stdout
        jobs = dict(line.split() for line in q.splitlines() if line.strip())
        if not jobs:
            return sorted((f.stem.split("-")[1] for f in work.glob("job-*.out")), key=int)
        for job, state in sorted(jobs.items(), key=lambda kv: int(kv[0])):
            if job not in order:
                order.append(job)
            size = RANKS.get(order.index(job))
            if size is not None and state == "PENDING" and job not in resized:  # waiting for the link before
                upd = ["scontrol", "update", f"JobId={job}", f"NumTasks={size}", f"TasksPerNode={size}"]
                u = subprocess.run(upd, env=slurm.env, capture_output=True, text=True)
                assert u.returncode == 0, u.stderr
                resized.add(job)
            out = work / f"job-{job}.out"
            warn = order.index(job) < WARNED and state == "RUNNING" and job not in signalled
            if warn and out.is_file() and READY_LINE.search(out.read_text()):
                subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=slurm.env, check=True)
                signalled.add(job)
        time.sleep(1)
    subprocess.run(["scancel", "--user=root"], env=slurm.env)
    raise AssertionError(f"the chain did not end within {timeout} s:\n{slurm.logs()}")


def _one_run_in_the_monitor(run: Path, n_links: int, losses: dict[int, float]) -> None:
    """The chain's TensorBoard directory and wandb runs, in the first link's run directory: one
    TensorBoard run (``EventAccumulator`` over every link's event file) and one wandb id over every
    link's offline run (wandb's own reader), each step once, at the loss of metrics.jsonl."""
    if "tensorboard" in MONITORS:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == n_links
        acc = EventAccumulator(str(run / "tensorboard"))
        acc.Reload()
        series = [(e.step, e.value) for e in acc.Scalars("train/loss")]
        assert [s for s, _ in series] == list(range(STEPS)), series
        assert all(_close(v, losses[s], 1e-6) for s, v in series), (series, losses)
    if "wandb" in MONITORS:
        env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false"}
        ids, steps = set(), []
        offline = sorted((run / "wandb").glob("offline-run-*"))
        assert len(offline) == n_links, offline
        for d in offline:
            cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(d)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            records = [json.loads(x) for x in done.stdout.splitlines() if x.strip()]
            ids |= {r["run"]["run_id"] for r in records if r["type"] == "run"}
            steps += [r["history"]["step"].get("num", 0) for r in records if r["type"] == "history"]
        assert len(ids) == 1 and steps == list(range(STEPS)), (ids, steps)


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * abs(b)


def test_a_chain_of_allocations_equals_one_uninterrupted_job(slurm, tmp_path):
    tokens = tmp_path / "tokens"
    data.prepare(stdlib_files()[:41], str(tokens))
    # no compression: the hops of 2 ranks are not those of 4, and quantized sums would differ by more than order;
    # topology auto: each host one node (auto_sim's simulated nodes of 4 ranks cannot hold 2)
    # the tiny model's sizes in the package's GPT: 18 ranks start without importing transformers
    # (the job's GPT-NeoX under Slurm: tests/system/test_slurm.py)
    common = [
        MICRO,
        BATCH,
        "model.arch=gpt",
        "data=tokens",
        f"data.path={tokens}",
        "compression=none",
        "topology=auto",
    ]
    # the reference: one job, chain off, saving at its last step
    ref = tmp_path / "ref"
    ref.mkdir()
    args = [f"steps={STEPS}", f"save_every={STEPS}", f"checkpoint_dir={ref / 'ck'}", *common]
    p = _submit(slurm, ref, args, wait=True, limit=REF_LIMIT, ZH_CHAIN="0")
    ref_job = p.stdout.strip().split(";")[0]
    out = (ref / f"job-{ref_job}.out").read_text(errors="replace")
    assert p.returncode == 0, out[-4000:]
    assert "chain: off" in out
    ref_losses = _losses(ref, ref_job)
    assert sorted(ref_losses) == list(range(STEPS)), out[-3000:]

    work = tmp_path / "chain"
    work.mkdir()
    ck = work / "ck"
    # the chain's monitors where their packages are installed (the test extra): one run across the links
    mons = [f"monitor.{m}=true" for m in MONITORS]
    jobs = _chain_until_done(slurm, work, [f"steps={STEPS}", f"checkpoint_dir={ck}", *common, *mons], timeout=1800)
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
    # the second link ran on half the ranks, the third on all four: each converted, and said so
    worlds = [(4, HALF), (HALF, 4)]
    for lk, (before, after) in zip(links[1:3], worlds):
        text = outs[lk.job]
        converted = f"converted checkpoint step{lk.start_step} ({before} ranks -> {after}) to the universal format in "
        assert converted in text and f"({before} ranks -> {after}, universal format)" in text, text[-3000:]
        print([x for x in text.splitlines() if "converted checkpoint" in x or "saved in" in x])
    # each save said what it cost (largest rank's bytes, total, seconds, rate)
    assert re.search(
        r"checkpoint step\d+ saved in .*: [0-9.e-]+ GB per rank \(the largest of 4\), [0-9.e-]+ GB in all, "
        r"in [0-9.]+ s: [0-9.e-]+ GB/s in all",
        outs[links[0].job],
    ), outs[links[0].job][-3000:]
    # the run ended by itself: the last link says so (and cancelled the successor it had submitted)
    assert "the run is done" in outs[links[-1].job], outs[links[-1].job][-2000:]

    # one metrics.jsonl for the run, in the first link's directory, which every later link continues
    # ([Note: one run in the monitor] in app/monitoring/monitor_run.py): one row per step, whichever link trained it
    assert all(_losses(work, lk.job) == {} for lk in links[1:]), [lk.job for lk in links]
    metrics = work / "outputs" / f"slurm-{links[0].job}.0" / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    assert [r["step"] for r in rows] == list(range(STEPS)), [r["step"] for r in rows]
    got = _losses(work, links[0].job)
    _one_run_in_the_monitor(metrics.parent, len(links), got)
    # every step's loss equals the uninterrupted job's
    assert sorted(got) == list(range(STEPS)), got
    for step in range(STEPS):
        assert _close(got[step], ref_losses[step], 1e-6), (step, got[step], ref_losses[step])
    # and so do the final fp32 weights (DeepSpeed's zero_to_fp32 of each run's last checkpoint)
    mine, theirs = checkpoint.to_fp32(str(ck)), checkpoint.to_fp32(str(ref / "ck"))
    assert mine.keys() == theirs.keys()
    for name in theirs:
        a, b = mine[name].detach().float(), theirs[name].detach().float()
        scale = max(float(b.abs().max()), 1e-12)
        assert float((a - b).abs().max()) <= 1e-6 * scale, name
    assert torch.equal(torch.tensor(sorted(got)), torch.arange(STEPS))
    assert os.path.isfile(ck / chain.RECORDS)
