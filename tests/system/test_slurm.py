"""The Slurm batch scripts: the CPU variant runs as a real 8-task job on a real one-node Slurm
cluster started here; the Frontier variant is rendered (RENDER_ONLY=1) and its srun line and
environment are checked — it is not executed (no Frontier here)."""

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from .slurm_cluster import LocalSlurm

ROOT = Path(__file__).resolve().parents[2]
FRONTIER = ROOT / "scripts" / "frontier"
STEPS = 2


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


def _job_env():
    # the job must import this checkout (not another installed copy) and find its scripts
    return {"ZEROPP_HIER_ROOT": str(ROOT), "PYTHONPATH": str(ROOT)}


def test_cpu_batch_job_detects_topology_and_reports_bytes_per_tier(slurm, tmp_path):
    rc, job, out = slurm.sbatch_wait(
        FRONTIER / "train_cpu.sbatch", [f"steps={STEPS}"], tmp_path, _job_env(), timeout=1500
    )
    assert rc == 0, f"job {job} failed:\n{out[-6000:]}\n{slurm.logs()}"
    # MASTER_ADDR came from the job's node list (scontrol show hostnames)
    assert f"MASTER_ADDR={slurm.host}" in out
    # the ranks exchanged what they saw and built the layout: one host, 8 tasks, no GPU
    assert "auto topology: 2 nodes x 2 GPUs x 2 GCDs on 1 host(s)" in out, out[-4000:]
    assert "topology (auto-detected): 2 nodes x 2 GPUs x 2 GCDs" in out
    assert "world=8" in out
    steps = re.findall(
        r"step +(\d+) \| loss ([\d.]+) \| +\d+ tok/s \| [\d.e+-]+ TFLOP/s/GCD [^|]*"
        r"\| sent/rank node +([\d.]+) (K?M?B) +gpu",
        out,
    )
    assert [int(s[0]) for s in steps] == list(range(STEPS)), out[-4000:]
    # rank 0's metrics, in the run directory named after the job and step (launcher=srun)
    run_dir = tmp_path / "outputs" / f"slurm-{job}.0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world"] == 8 and summary["topology"]["mode"] == "auto"
    assert summary["topology"]["dims"] == [2, 2, 2]
    bps = summary["bytes_per_step"]
    assert bps["forward_gather"]["node"] > 0  # 2 simulated nodes: the forward gather crosses them
    assert bps["backward_gather"]["node"] == 0 and bps["backward_gather"]["gpu"] == 0
    assert bps["backward_gather"]["gcd"] > 0
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == STEPS and set(json.loads(lines[0])["bytes"]) == {"gcd", "gpu", "node"}
    # the job really ran 8 tasks (Slurm's own record of the job)
    show = subprocess.run(["scontrol", "show", "job", job], env=slurm.env, capture_output=True, text=True).stdout
    assert re.search(r"NumTasks=8\b", show), show


def test_a_task_that_dies_at_start_ends_the_step_at_once(slurm, tmp_path):
    """Task 7 of the CPU batch job exits at interpreter start (status 3, from ``sitecustomize``,
    before any of the job's code): srun's ``--kill-on-bad-exit=1`` ends the other seven tasks
    at once, instead of leaving them in the rendezvous for the join bound (600 s by default)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nif os.environ.get('SLURM_PROCID') == '7':\n    os._exit(3)\n")
    env = {**_job_env(), "PYTHONPATH": f"{site}:{ROOT}"}
    t0 = time.monotonic()
    # the wait is bounded far below the join bound: a step left to wait it out fails here
    rc, job, out = slurm.sbatch_wait(FRONTIER / "train_cpu.sbatch", ["steps=1"], tmp_path, env, timeout=300)
    print(f"job {job} ended {time.monotonic() - t0:.1f} s after submission, exit {rc}")
    assert rc != 0, out[-4000:]
    assert re.search(r"task 7: Exited with exit code 3", out), out[-4000:]
    assert "HierStartupError" not in out  # ended by Slurm, not by the join's own bound
    assert "done:" not in out


def _render(slurm, nnodes: int, nodelist: str, tmp_path: Path, overrides=("preset=zeropp",)) -> str:
    return slurm.render(FRONTIER / "train.sbatch", ROOT, nnodes, nodelist, tmp_path, overrides)


def test_frontier_script_renders_olcf_srun_line_and_environment(slurm, tmp_path):
    out = _render(slurm, 2, "frontier[08001-08002]", tmp_path)
    sruns = [ln for ln in out.splitlines() if ln.startswith("+ srun")]
    train = [ln for ln in sruns if "zeropp_hier.app.train" in ln]
    assert len(train) == 1, out
    # the ranks run the NVMe environment's python (-P: not the checkout in the submit directory)
    assert train[0] == (
        "+ srun -N 2 -n 16 --ntasks-per-node=8 -c7 --gpus-per-task=1 --kill-on-bad-exit=1 --gpu-bind=closest "
        "/mnt/bb/alice/zeropp-hier-env/bin/python -P -m zeropp_hier.app.train launcher=srun topology=auto "
        "preset=zeropp"
    )
    env = dict(ln.split("=", 1) for ln in out.splitlines() if re.match(r"^[A-Z_0-9]+=", ln))
    assert env["MASTER_ADDR"] == "frontier08001"  # first host of the node list, via scontrol
    assert env["NCCL_NET"] == "AWS Libfabric"  # the plugin or no start: never TCP sockets silently
    assert "PYTHONPATH" not in env  # nothing imported from the checkout
    assert env["PATH"].split(":")[0] == "/mnt/bb/alice/zeropp-hier-env/bin"
    # OLCF "PyTorch on Frontier": modules in its order, the RCCL plugin module after rocm, and
    # the RCCL/libfabric variables it lists
    modules = [ln for ln in out.splitlines() if ln.startswith("+ module load")]
    assert modules == [
        "+ module load PrgEnv-gnu/8.7.0",
        "+ module load cpe/26.03",
        "+ module load rocm/7.1.1",
        "+ module load rccl-net-plugin",
        "+ module load craype-accel-amd-gfx90a",
    ]
    olcf = {
        "NCCL_CROSS_NIC": "1",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3",
        "HSA_FORCE_FINE_GRAIN_PCIE": "1",
        "FI_MR_CACHE_MONITOR": "kdreg2",
        "FI_CXI_DISABLE_HOST_REGISTER": "1",
        "FI_CXI_DEFAULT_CQ_SIZE": "131072",
        "FI_CXI_RDZV_PROTO": "alt_read",
        "FI_CXI_RDZV_EAGER_SIZE": "0",
        "FI_CXI_RDZV_THRESHOLD": "0",
        "FI_CXI_RDZV_GET_MIN": "0",
        "FI_CXI_DEFAULT_TX_SIZE": "2048",
        "FI_CXI_RX_MATCH_MODE": "hybrid",
    }
    assert {k: env.get(k) for k in olcf} == olcf
    # alt_read needs the allocation flag OLCF names
    assert "#SBATCH --network=disable_rdzv_get" in (FRONTIER / "train.sbatch").read_text()
    assert env["MIOPEN_USER_DB_PATH"].startswith("/tmp/") and env["MIOPEN_CUSTOM_CACHE_DIR"].startswith("/tmp/")
    assert "+ sbcast --force /lustre/alice/zeropp-hier-env.tar.gz /mnt/bb/alice/zeropp-hier-env.tar.gz" in out
    # unpacked on every node and relocated by conda-unpack under the environment's own python
    assert re.search(r"zeropp-hier-env/bin/python\W+/mnt/bb/alice/zeropp-hier-env/bin/conda-unpack", out), out
    # the node count comes from Slurm: a 3-node allocation gives 24 tasks with the same script
    out3 = _render(slurm, 3, "frontier[08001-08003]", tmp_path)
    assert "+ srun -N 3 -n 24 --ntasks-per-node=8 -c7" in out3


# The paper's run (Xu et al., arXiv 2501.04266: a 20B GPT on 48 Frontier nodes = 384 GCDs) and
# its ZeRO++ side-by-side, as docs/frontier.md gives them.
NEOX_20B = (
    "model=neox_20b",
    "recipe=neox20b",
    "data=tokens",
    "data.path=/lustre/orion/alice/tokens",
    "steps=150000",
)


@pytest.mark.parametrize("preset", ["frontier", "zeropp"])
def test_frontier_script_renders_the_20b_run_as_a_job_the_app_accepts(slurm, tmp_path, preset):
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from zeropp_hier.app import memory_check
    from zeropp_hier.app.train import spec_from_config

    out = _render(slurm, 48, "frontier[00001-00048]", tmp_path, (*NEOX_20B, f"preset={preset}"))
    train = [ln for ln in out.splitlines() if ln.startswith("+ srun") and "zeropp_hier.app.train" in ln]
    assert len(train) == 1 and train[0].startswith("+ srun -N 48 -n 384 --ntasks-per-node=8 "), out
    # the overrides the ranks receive compose into the job's typed spec: the published 20B shape
    overrides = train[0].split(" -m zeropp_hier.app.train ")[1].split()
    assert overrides[:2] == ["launcher=srun", "topology=auto"]
    with initialize_config_module(version_base="1.3", config_module="zeropp_hier.app.configs"):
        cfg = compose("train", overrides=[o for o in overrides if not o.startswith(("launcher=", "topology="))])
    spec = spec_from_config(OmegaConf.to_container(cfg, resolve=True))
    assert spec.preset == preset and spec.activation_checkpointing == "torch"
    m = spec.model
    assert (m.layers, m.hidden, m.heads, m.seq_len, m.vocab_size) == (44, 6144, 64, 2048, 50432)
    assert spec.data_path == "/lustre/orion/alice/tokens" and spec.dtype == "bf16"
    # the recipe's values reach the DeepSpeed config the job builds (tests/unit/test_recipe.py has the rest)
    ds = spec.ds_config(world=384)
    assert ds["optimizer"]["params"]["lr"] == 0.97e-4  # the recipe's 1536 sequences: 4 x 1 x 384
    assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 384 == 1536
    assert ds["scheduler"]["type"] == "WarmupCosineLR" and ds["scheduler"]["params"]["warmup_num_steps"] == 1500
    assert ds["zero_optimization"]["stage3_prefetch_bucket_size"] > 0 and ds["bf16"]["enabled"]
    # the job's own check before building (the planner's memory model) lets it start on MI250X
    table = memory_check.check(spec, 384, 8, "AMD Instinct MI250X")
    assert any(row.startswith(f"| {preset} |") and row.rstrip().endswith("| yes |") for row in table), table


def test_frontier_script_states_the_node_count_once_and_never_uses_torchrun():
    text = (FRONTIER / "train.sbatch").read_text()
    code = [ln for ln in text.splitlines() if not ln.startswith("# ") and ln.strip() != "#"]
    assert len([ln for ln in code if re.match(r"#SBATCH (-N|--nodes)", ln)]) == 1
    # every other node count is Slurm's variable, never a number
    assert not [ln for ln in code if re.search(r"(-N|--nodes)[ =]?\d", ln) and not ln.startswith("#SBATCH")]
    assert "torchrun" not in "\n".join(code)
