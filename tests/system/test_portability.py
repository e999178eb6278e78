"""The package runs on CPUs narrower than the build machine's, down to the floor its
dependencies declare ([Note: the CPU floor] in zeropp_hier/detect/cpu_floor.py).

User-mode QEMU (Debian's qemu-user) runs the same Python, torch and compiled extension as an
emulated CPU that reports, and only executes, an older instruction set. The CPUs are not fixed
names: each role takes the narrowest model of its ladder on which the installed NumPy and torch
import (probed with the install's own check), so a dependency that raises its floor moves the
choice up instead of breaking the suite:
- no AVX2 (the baseline kernels): ``qemu64`` (x86-64 with SSE3, below NumPy 2.4's declared
  x86-64-v2), ``Nehalem`` (SSE4.2, x86-64-v2), ``Westmere``, ``SandyBridge`` (AVX), ``IvyBridge``;
- no AVX-512 (the AVX2 kernels): ``Haswell-v4``, ``Broadwell-v4``, ``Skylake-Client-v4`` (like
  Frontier's EPYC 7A53 hosts and most AMD EPYC before Zen 4).
The install check's refusal is tested on purpose, whatever the wheels need: a tiny extension
built here with ``-mavx2`` executes an AVX2 instruction when imported, and the check, asked to
import it too, must stop with one line naming it on the model without AVX2. A ladder model below
the wheels' floor, where there is one, must get the same kind of line naming NumPy or torch.
QEMU's TCG (7.2 on) emulates up to AVX2, never AVX-512, and raises #UD (SIGILL) for any
instruction the chosen model lacks, so a variant of the CPU kernels that ran on the wrong CPU
kills the process here exactly as it would on real hardware. The build machine's own CPU does not
matter: the extension is the one built for this checkout, the emulated CPU is chosen by the probe.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zeropp_hier.launch.ports import free_port

from .processes import cpu_env, rank_env, run_all

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "zeropp_hier" / "detect" / "cpu_floor.py"
NO_AVX2, NO_AVX512 = "no-avx2", "no-avx512"
LADDERS = {
    NO_AVX2: ("qemu64", "Nehalem", "Westmere", "SandyBridge", "IvyBridge"),
    NO_AVX512: ("Haswell-v4", "Broadwell-v4", "Skylake-Client-v4"),
}


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
    if exe is None:  # a tool the suite needs, as slurm-wlm and hipcc are (.ci/run installs them)
        pytest.fail("qemu-x86_64 is missing and could not be installed: run `apt-get install -y qemu-user` as root")
    return exe


def _emulated(qemu: str, cpu: str, *args: str) -> list:
    return [qemu, "-cpu", cpu, sys.executable, *args]


def _clean(text: str) -> str:  # QEMU warns once per CPUID feature TCG cannot model
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("qemu-x86_64: warning"))


def _probe(qemu: str, cpu: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The install's CPU check (a plain script: standard library only) on the emulated CPU."""
    cmd = _emulated(qemu, cpu, str(CHECK), *args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env or cpu_env())
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout, _clean(p.stderr))


def _probe_env(avx2_probe: Path) -> dict:
    env = cpu_env()
    env["PYTHONPATH"] = f"{avx2_probe}{os.pathsep}{env['PYTHONPATH']}"
    return env


# [Note: one emulated check per model]
# Each accepted model costs one NumPy and torch import under emulation (tens of seconds of one
# core), and the install test needs the check asked for ``avx2probe`` on the model without AVX2.
# The check imports NumPy, then torch, then the named modules, and stops at the first that fails:
# a refusal that names avx2probe says that NumPy and torch imported. So the no-AVX2 ladder is
# climbed with the install test's own command line, and the run that accepts the model is the one
# the test reads; a refusal naming NumPy or torch still puts the model below the floor.
_AVX2_ARGS = ("--module", "avx2probe")


def _accepts(role: str, p: subprocess.CompletedProcess) -> bool:
    if role == NO_AVX2:
        return p.returncode == 0 or (p.returncode == 2 and "[cpu] this CPU cannot run avx2probe" in p.stderr)
    return p.returncode == 0


@pytest.fixture(scope="module")
def cpus(qemu, avx2_probe) -> dict:
    """Each role's CPU: the first model of its ladder that the installed wheels accept, the two
    ladders probed side by side; and every model found below the floor, with the check's output.
    Only a model that dies on import is cheap to probe (the first accepted one costs one torch
    import under emulation), so each ladder stops at its first success. ``refusal``: the check
    asked for avx2probe too on the model without AVX2 ([Note: one emulated check per model])."""
    import concurrent.futures as cf

    def climb(role):
        below = []
        args, env = (_AVX2_ARGS, _probe_env(avx2_probe)) if role == NO_AVX2 else ((), None)
        for cpu in LADDERS[role]:
            p = _probe(qemu, cpu, *args, env=env)
            if _accepts(role, p):
                return cpu, below, p
            below.append((cpu, p))
        return None, below, None

    with cf.ThreadPoolExecutor(2) as pool:
        found = dict(zip(LADDERS, pool.map(climb, LADDERS)))
    for role, (cpu, below, _) in found.items():
        tried = "; ".join(f"{c}: exit {p.returncode} {p.stderr.strip()[-300:]}" for c, p in below)
        assert cpu is not None, f"no model of the {role} ladder {LADDERS[role]} runs the installed wheels ({tried})"
    print({role: cpu for role, (cpu, _, _) in found.items()})
    return {
        "role": {role: cpu for role, (cpu, _, _) in found.items()},
        "below": found[NO_AVX2][1],
        "refusal": found[NO_AVX2][2],
    }


# An extension that executes one AVX2 instruction when it loads (an ELF constructor), and a module
# that loads it and checks the result: importing ``avx2probe`` dies of SIGILL on a CPU without AVX2.
_AVX2_C = r"""
static volatile int probe_result;
__attribute__((constructor)) static void probe(void) {
  int out[8];
  __asm__ volatile("vpcmpeqd %%ymm0, %%ymm0, %%ymm0\n\tvpaddd %%ymm0, %%ymm0, %%ymm0\n\t"
                   "vmovdqu %%ymm0, %0\n\tvzeroupper" : "=m"(out) : : "xmm0", "memory");
  probe_result = out[0];
}
int avx2_probe_result(void) { return probe_result; }
"""
_AVX2_PY = """import ctypes, os
_lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "_avx2.so"))
assert _lib.avx2_probe_result() == -2  # all-ones lanes doubled: the instruction ran
"""


@pytest.fixture(scope="module")
def avx2_probe(tmp_path_factory) -> Path:
    """A directory holding the ``avx2probe`` package, built with gcc -mavx2 (the compiler the
    package's own kernels are built with)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is missing (the package's kernels need it too): install it, e.g. `apt-get install -y gcc`")
    root = tmp_path_factory.mktemp("avx2probe")
    pkg = root / "avx2probe"
    pkg.mkdir()
    (pkg / "_avx2.c").write_text(_AVX2_C)
    (pkg / "__init__.py").write_text(_AVX2_PY)
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O1", "-mavx2", "-o", str(pkg / "_avx2.so"), str(pkg / "_avx2.c")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return root


def _refusal_line(cpu: str, p: subprocess.CompletedProcess) -> str:
    """The check's one line on a CPU it refuses (exit 2, one line on stderr, no SIGILL)."""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("qemu:")]
    assert p.returncode == 2, f"{cpu}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert len(lines) == 1 and lines[0].startswith("[cpu] this CPU cannot run "), p.stderr
    assert "died with SIGILL" in lines[0] and "This CPU offers x86-64" in lines[0], lines[0]
    # CPUID, not the host's /proc/cpuinfo: the emulated CPU's level is named
    assert "x86-64-v4" not in lines[0], lines[0]
    return lines[0]


def test_install_check_stops_with_one_line_below_the_floor(qemu, cpus, avx2_probe):
    """The install's check, asked to import a module that needs AVX2, stops with one line naming
    it on the emulated CPU without AVX2 (the one NumPy and torch import on), instead of dying of
    SIGILL; and so on every ladder model found below the wheels' floor, naming NumPy or torch."""
    cpu = cpus["role"][NO_AVX2]
    args = [str(CHECK), *_AVX2_ARGS]
    # the same check on this CPU: the module imports where AVX2 is, so the refusal below is the CPU's
    from zeropp_hier.detect.cpu_floor import cpu_features

    if "avx2" in cpu_features():
        native = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=600, env=_probe_env(avx2_probe)
        )
        assert native.returncode == 0 and "numpy, torch, avx2probe import on this CPU" in native.stdout, native
    # the emulated run of the check with these arguments: the one that chose the model
    # ([Note: one emulated check per model])
    p = cpus["refusal"]
    assert p.args == _emulated(qemu, cpu, *args), p.args
    line = _refusal_line(cpu, p)
    assert line.startswith("[cpu] this CPU cannot run avx2probe: "), line
    offered = line.split("This CPU offers ", 1)[1].split(";")[0]
    assert "avx2" not in offered and "x86-64-v3," not in offered, line  # the model really lacks AVX2
    # NumPy and torch imported first, on this model (the probe chose it for that)
    for model, below in cpus["below"]:
        below_line = _refusal_line(model, below)
        assert re.match(r"\[cpu\] this CPU cannot run (numpy|torch) ", below_line), below_line


# The tests of the kernels' arithmetic (the block rotation's too), on the emulated CPU. Left to
# the native unit lane: the three that check the ops' dispatch within torch, where no kernel
# runs and so no instruction set changes anything: fake tensors, opcheck's schema and autograd
# checks, and the reference serving meta tensors (test_fallback_warns_once_and_matches: torch's
# meta kernels load on first use, which took 195 s of one emulated core in a run on a loaded
# machine, against 11 s for the heaviest arithmetic test, in each of the two emulated runs). The
# baseline variant's parametrised tests run on the CPU without AVX2 only: the AVX2-only CPU runs
# the AVX2 variant's and the dispatched tests.
_NOT_ON_ANY = "not test_opcheck and not test_fake_impls and not test_fallback_warns_once_and_matches"
_SELECT = {NO_AVX512: f"{_NOT_ON_ANY} and not default", NO_AVX2: _NOT_ON_ANY}


def _kernel_tests(select: str) -> str:
    # os._exit once pytest has reported and the output is flushed: the interpreter's own exit would
    # walk and free every object of torch and pytest once more, on the emulated core
    return (
        "import os, sys, torch, pytest, zeropp_hier.quant as q; "
        "print('CPU capability:', torch.backends.cpu.get_cpu_capability(), '| kernels:', q.kernel_info('cpu'), "
        "flush=True); rc = pytest.main(['-v', '-p', 'no:cacheprovider', 'tests/unit/test_quant_kernels.py', "
        "'tests/unit/test_quant_rotation.py', "
        f"'-k', {select!r}]); sys.stdout.flush(); sys.stderr.flush(); os._exit(int(rc))"
    )


# The mixed job: the main job on 2 nodes x 1 package x 2 GCDs (the smallest world with a node tier
# and a tier below it), its last rank on the emulated CPU without AVX2, the others native
JOB_WORLD = 4
EMULATED_RANK = JOB_WORLD - 1


def _job_rank(qemu: str, cpu: str, rank: int, run_dir: Path, port: int) -> tuple[list, dict]:
    """Rank ``rank`` of the mixed job (torchrun-style: one process per rank); ``EMULATED_RANK``
    on the CPU without AVX2, the others native."""
    args = [
        "-m",
        "zeropp_hier.app.train",
        "steps=2",
        "progress=off",
        # the tiny model's sizes in the package's GPT: the emulated rank does not import
        # transformers (tens of CPU-seconds under emulation); the kernels are the same
        "model.arch=gpt",
        "topology.section.gpus_per_node=1",
        f"topology.local_ranks={JOB_WORLD}",
        f"hydra.run.dir={run_dir}",
        "hydra.output_subdir=null",
    ]
    cmd = _emulated(qemu, cpu, *args) if rank == EMULATED_RANK else [sys.executable, *args]
    return cmd, rank_env(rank, JOB_WORLD, port)


@pytest.fixture(scope="module")
def emulated(qemu, cpus, tmp_path_factory) -> dict:
    """Every emulated workload of this module, started at once: an emulated process runs on one
    core, so run one after another they would leave the other core idle for minutes (the
    job's native ranks mostly wait for the emulated one). Each writes to files of its
    own (a full pipe would stall a process while another is being read); the ranks of the job
    are one group, ended as soon as one of them fails (``processes.run_all``). Each test then
    asserts on its own runs only, so one failing workload fails one test."""
    role = cpus["role"]
    logs = tmp_path_factory.mktemp("emulated")
    fp16_dir, job_dir = tmp_path_factory.mktemp("fp16"), tmp_path_factory.mktemp("mixed")
    port = free_port()
    cmds = {
        ("kernels", r): (
            _emulated(qemu, role[r], "-c", _kernel_tests(_SELECT[r])),
            # the kernel tests' short inputs only; none of the installed pytest plugins (Hypothesis,
            # Hydra's, ...: the kernel tests use none, and their imports were a quarter of each run)
            cpu_env(ZEROPP_HIER_TEST_EMULATED="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),
            ("kernels", r),
        )
        for r in _SELECT
    }
    fp16 = ["-m", "zeropp_hier.app.train", "dtype=fp16", "steps=1", f"hydra.run.dir={fp16_dir}"]
    cmds[("fp16",)] = (_emulated(qemu, role[NO_AVX512], *fp16), cpu_env(HYDRA_FULL_ERROR="0"), "fp16")
    for rank in range(JOB_WORLD):
        cmd, env = _job_rank(qemu, role[NO_AVX2], rank, job_dir, port)
        cmds[("job", rank)] = (cmd, env, "job")
    runs = run_all(cmds, logs, deadline_s=1500, cwd=ROOT, clean=_clean)
    return {"runs": runs, "fp16_dir": fp16_dir, "job_dir": job_dir, "role": role}


def test_kernel_tests_pass_on_cpus_without_avx512_and_without_avx2(emulated):
    outs = {}
    for role, want_capability, want_kernels in (
        (NO_AVX512, "AVX2", "cpu-ext/avx2"),
        (NO_AVX2, "DEFAULT", "cpu-ext/default"),
    ):
        run = emulated["runs"][("kernels", role)]
        cpu = emulated["role"][role]
        out = outs[role] = run.out
        print(f"{role}: emulated {cpu}")
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


def test_mixed_job_trains_with_a_rank_on_a_narrower_cpu(emulated):
    """4 ranks of the main job (torchrun-style: one process per rank) on 2 nodes x 1 package x 2
    GCDs: ranks 0-2 native, rank 3 on the emulated CPU without AVX2 (the narrowest the wheels
    accept). Gathers and reductions pass through the compiled kernels on every rank, on both of
    the job's hops (the frontier preset compresses the gradients on each and the weights over the
    node), so the narrowest variant meets the native one's bytes (AVX-512 or AVX2, the build
    machine's). Each variant's bytes equal the reference quantizer's on its CPU (the kernel tests
    above), which is what lets any two meet; the 8 ranks of 2 x 2 x 2 would add a third hop of
    the same kernels and four native ranks' start-up (~50 CPU-s); a second emulated rank
    (AVX2-only) would add the AVX2 variant's bytes in a job on an AVX-512 machine, which that
    already implies, for 30 s of this test on 2 cores."""
    outs = [emulated["runs"][("job", rank)].out for rank in range(JOB_WORLD)]
    for rank in range(JOB_WORLD):
        run = emulated["runs"][("job", rank)]
        assert run.returncode == 0, f"rank {rank} exit {run.returncode} {run.ended_because}\n{outs[rank][-3000:]}"
    print(f"rank {EMULATED_RANK} on an emulated {emulated['role'][NO_AVX2]}")
    summary = json.loads((emulated["job_dir"] / "summary.json").read_text())
    assert summary["world"] == JOB_WORLD and summary["topology"]["dims"] == [2, 1, 2], summary["topology"]
    native = summary["kernels"][0]
    assert native.startswith("cpu-ext/"), native
    assert summary["kernels"] == [native] * EMULATED_RANK + ["cpu-ext/default"], outs[0][-3000:]
    assert "quantization kernels: " in outs[0] and f"cpu-ext/default on ranks {EMULATED_RANK}" in outs[0]
    # it trained: finite, falling loss, compressed traffic on both hops went through the kernels
    assert summary["final_loss"] < summary["first_loss"] < 10
    sent = summary["bytes_per_step"]
    assert sent["forward_gather"]["node"] > 0
    assert sent["grad_reduce"]["gcd"] > 0 and sent["grad_reduce"]["node"] > 0, sent
