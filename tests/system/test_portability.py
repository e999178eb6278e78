"""The package runs on CPUs narrower than the build machine's.

User-mode QEMU (Debian's qemu-user) runs the same Python, torch and compiled extension as an
emulated CPU that reports, and only executes, an older instruction set:
- ``Haswell-v4``: AVX2 but no AVX-512 (like Frontier's EPYC 7A53 hosts and most AMD EPYC before
  Zen 4);
- ``Nehalem``: SSE4.2, no AVX at all.
QEMU's TCG never emulates AVX-512 and raises #UD (SIGILL) for any instruction the chosen model
lacks, so a variant of the CPU kernels that ran on the wrong CPU kills the process here exactly as
it would on real hardware. The build machine's own CPU does not matter: the extension is the one
built for this checkout, the emulated CPU is chosen by name.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from zeropp_hier.launch.world import free_port

ROOT = Path(__file__).resolve().parents[2]
NO_AVX512, NO_AVX2 = "Haswell-v4", "Nehalem"


@pytest.fixture(scope="module")
def qemu() -> str:
    exe = shutil.which("qemu-x86_64")
    if exe is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user",
            shell=True,
            capture_output=True,
            timeout=900,
        )
        exe = shutil.which("qemu-x86_64")
    if exe is None:
        pytest.skip("this machine lacks qemu-x86_64 (Debian package qemu-user) and cannot install it")
    return exe


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT), **extra)
    env.pop("ZEROPP_HIER_CPU_ISA", None)
    return env


def _emulated(qemu: str, cpu: str, *args: str) -> list:
    return [qemu, "-cpu", cpu, sys.executable, *args]


def _clean(text: str) -> str:  # QEMU warns once per CPUID feature TCG cannot model
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("qemu-x86_64: warning"))


# The tests of the kernels' arithmetic, on the emulated CPU. Left to the native unit lane: the
# two that check the ops' registration with torch (fake tensors, opcheck's schema and autograd
# checks), which no instruction set changes. The baseline variant's parametrised tests run on
# the CPU without AVX only: the AVX2-only CPU runs the AVX2 variant's and the dispatched tests.
_NOT_ON_ANY = "not test_opcheck and not test_fake_impls"
_SELECT = {NO_AVX512: f"{_NOT_ON_ANY} and not default", NO_AVX2: _NOT_ON_ANY}


def _kernel_tests(select: str) -> str:
    return (
        "import sys, torch, pytest, zeropp_hier.quant as q; "
        "print('CPU capability:', torch.backends.cpu.get_cpu_capability(), '| kernels:', q.kernel_info('cpu'), "
        "flush=True); sys.exit(pytest.main(['-v', '-p', 'no:cacheprovider', 'tests/unit/test_quant_kernels.py', "
        f"'-k', {select!r}]))"
    )


class Run(NamedTuple):
    returncode: int | None  # None: killed (still running at the deadline)
    out: str  # stdout and stderr, QEMU's CPUID warnings removed
    stdout: str


def _job_rank(qemu: str, rank: int, run_dir: Path, port: int) -> tuple[list, dict]:
    """Rank ``rank`` of the 8-rank main job (torchrun-style: one process per rank); rank 7 on
    the CPU without AVX, the others native."""
    args = [
        "-m",
        "zeropp_hier.app.train",
        "steps=2",
        "progress=off",
        f"hydra.run.dir={run_dir}",
        "hydra.output_subdir=null",
    ]
    cmd = _emulated(qemu, NO_AVX2, *args) if rank == 7 else [sys.executable, *args]
    env = _env(
        RANK=str(rank),
        WORLD_SIZE="8",
        LOCAL_RANK=str(rank),
        LOCAL_SIZE="8",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    return cmd, env


@pytest.fixture(scope="module")
def emulated(qemu, tmp_path_factory) -> dict:
    """Every emulated workload of this module, started at once: an emulated process runs on one
    core, so run one after another they would leave the other core idle for minutes (the
    8-rank job's native ranks mostly wait for the emulated one). Each writes to a file of its
    own (a full pipe would stall a process while another is being read) and is waited for up
    to one deadline; each test then asserts on its own runs only, so one failing workload fails
    one test."""
    logs = tmp_path_factory.mktemp("emulated")
    fp16_dir, job_dir = tmp_path_factory.mktemp("fp16"), tmp_path_factory.mktemp("mixed")
    port = free_port()
    cmds = {("kernels", cpu): (_emulated(qemu, cpu, "-c", _kernel_tests(_SELECT[cpu])), _env()) for cpu in _SELECT}
    fp16 = ["-m", "zeropp_hier.app.train", "dtype=fp16", "steps=1", f"hydra.run.dir={fp16_dir}"]
    cmds[("fp16",)] = (_emulated(qemu, NO_AVX512, *fp16), _env(HYDRA_FULL_ERROR="0"))
    for rank in range(8):
        cmds[("job", rank)] = _job_rank(qemu, rank, job_dir, port)
    procs, files = {}, {}
    try:
        for key, (cmd, env) in cmds.items():
            out, err = (open(logs / f"{'-'.join(map(str, key))}.{ext}", "w+") for ext in ("out", "err"))
            files[key] = (out, err)
            procs[key] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        deadline = time.monotonic() + 1500
        for p in procs.values():
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        runs = {}
        for key, (out, err) in files.items():
            out.seek(0)
            err.seek(0)
            code = procs[key].returncode
            stdout = out.read()
            runs[key] = Run(None if code == -signal.SIGKILL else code, _clean(stdout + err.read()), stdout)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for pair in files.values():
            for f in pair:
                f.close()
    return {"runs": runs, "fp16_dir": fp16_dir, "job_dir": job_dir}


def test_kernel_tests_pass_on_cpus_without_avx512_and_without_avx2(emulated):
    outs = {}
    for cpu, want_capability, want_kernels in (
        (NO_AVX512, "AVX2", "cpu-ext/avx2"),
        (NO_AVX2, "DEFAULT", "cpu-ext/default"),
    ):
        run = emulated["runs"][("kernels", cpu)]
        out = outs[cpu] = run.out
        assert run.returncode == 0, f"{cpu}: exit {run.returncode}\n{out[-3000:]}"
        # the emulation took: torch sees the narrower CPU and so does the kernels' dispatch
        assert f"CPU capability: {want_capability} | kernels: {want_kernels}" in out, out[:2000]
        # pytest's closing line: "N passed, M deselected in T s" and nothing failed or errored
        summary = [ln for ln in out.splitlines() if " passed" in ln and " in " in ln][-1:]
        assert summary and not re.search(r"failed|error", summary[0]), out[-2000:]
    # each variant's own parametrised tests ran where it is the widest (-v names every test)
    assert re.search(r"\[avx2-[^]]*\] PASSED", outs[NO_AVX512]), outs[NO_AVX512][-2000:]
    assert re.search(r"\[default-[^]]*\] PASSED", outs[NO_AVX2]), outs[NO_AVX2][-2000:]


def test_fp16_job_stops_before_starting_ranks_on_a_cpu_without_fp16(emulated):
    run = emulated["runs"][("fp16",)]
    out = run.out
    assert run.returncode not in (0, None), out
    assert "zeropp_hier config error at 'dtype': got 'fp16'" in out, out[-3000:]
    assert "AVX512-FP16" in out and "use dtype=bf16" in out, out[-3000:]
    assert "starting" not in run.stdout  # no rank was started
    assert not (emulated["fp16_dir"] / "summary.json").exists()


def test_eight_rank_training_with_ranks_on_narrower_cpus(emulated):
    """8 ranks of the main job (torchrun-style: one process per rank): ranks 0-6 native, rank 7
    on an emulated CPU without AVX. Gathers and reductions pass through the compiled kernels on
    every rank, so the narrowest variant meets the native one's bytes (AVX-512 or AVX2, the
    build machine's). Each variant's bytes equal the reference quantizer's on its CPU (the
    kernel tests above), which is what lets any two meet; a second emulated rank (AVX2-only)
    would add the AVX2 variant's bytes in a job on an AVX-512 machine, which that already
    implies, for 30 s of this test on 2 cores."""
    outs = [emulated["runs"][("job", rank)].out for rank in range(8)]
    for rank in range(8):
        code = emulated["runs"][("job", rank)].returncode
        assert code == 0, f"rank {rank} exit {code}\n{outs[rank][-3000:]}"
    summary = json.loads((emulated["job_dir"] / "summary.json").read_text())
    native = summary["kernels"][0]
    assert native.startswith("cpu-ext/"), native
    assert summary["kernels"] == [native] * 7 + ["cpu-ext/default"], outs[0][-3000:]
    assert "quantization kernels: " in outs[0] and "cpu-ext/default on ranks 7" in outs[0]
    # it trained: finite, falling loss, compressed node traffic went through the kernels
    assert summary["final_loss"] < summary["first_loss"] < 10
    assert summary["bytes_per_step"]["forward_gather"]["node"] > 0
