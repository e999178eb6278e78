"""``scripts/install.sh`` never installs a CUDA torch on a ROCm GPU node, and goes to PyTorch's CPU
index elsewhere; ``scripts/frontier/install.sh`` renders OLCF's recipe. Real processes: bash runs
the scripts with a Python that has no torch (a fresh venv); nothing is downloaded (the ROCm case
stops before pip, the CPU case is rendered with RENDER_ONLY=1)."""

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROCMINFO = ROOT / "tests" / "data" / "rocminfo" / "aiter179_mi250x_excerpt.txt"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A Python without torch (a venv without pip or system site-packages)."""
    d = tmp_path_factory.mktemp("venv")
    venv.create(d, with_pip=False, system_site_packages=False)
    py = d / "bin" / "python"
    assert subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode != 0
    return py


def _bin(tmp_path: Path, **scripts: str) -> Path:
    b = tmp_path / "bin"
    b.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        (b / name).write_text("#!/bin/sh\n" + body)
        (b / name).chmod(0o755)
    return b


def _env(python: Path, path_first: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ROCM_PATH", "RENDER_ONLY")}
    env.update(PYTHON=str(python), PATH=f"{path_first}:/usr/bin:/bin", **extra)
    return env


def _install(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh")], env=env, capture_output=True, text=True, timeout=120
    )


def test_frontier_node_without_torch_stops_with_rocm_instructions(bare_python, tmp_path):
    """After `module load rocm` on Frontier: ROCM_PATH set, rocminfo lists gfx90a agents (a real
    published rocminfo of an MI250X node prints here)."""
    rocm = tmp_path / "rocm-7.1.1"
    rocm.mkdir()
    b = _bin(tmp_path, rocminfo=f"tail -n +2 '{ROCMINFO}'\n", hostname="echo frontier08001\n")
    p = _install(_env(bare_python, b, ROCM_PATH=str(rocm)))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "ROCm GPU node (rocminfo lists: gfx90a)" in p.stderr
    assert "bash scripts/frontier/install.sh" in p.stderr
    assert "https://download.pytorch.org/whl/rocm" in p.stderr
    assert "installing torch" not in p.stdout
    # no torch was installed into that Python, and nothing else was either
    assert subprocess.run([str(bare_python), "-c", "import torch"], capture_output=True).returncode != 0
    assert not list((bare_python.parent.parent / "lib").glob("python*/site-packages/torch*"))


def test_frontier_login_node_without_gpu_agents_also_stops(bare_python, tmp_path):
    """A Frontier login node (OLCF's user guide: loginNN.frontier.olcf.ornl.gov) lists no GPU agent,
    but the torch installed there must still be the ROCm one."""
    b = _bin(tmp_path, hostname="echo login01.frontier.olcf.ornl.gov\n")
    p = _install(_env(bare_python, b))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "a Frontier node (login01.frontier.olcf.ornl.gov)" in p.stderr
    assert "bash scripts/frontier/install.sh" in p.stderr


def test_debian_hipcc_only_goes_to_the_cpu_index(bare_python, tmp_path):
    """Debian's hipcc alone (no ROCm runtime: no rocminfo agents) is not a ROCm GPU node: torch
    2.13.0 from PyTorch's CPU index (rendered, not downloaded)."""
    b = _bin(tmp_path, hipcc="echo 'HIP version: 5.7 (Debian)'\n", hostname="echo ci-runner-3\n")
    p = _install(_env(bare_python, b, RENDER_ONLY="1"))
    assert p.returncode == 0, p.stderr
    assert f"+ {bare_python} -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in p.stdout
    # ROCm present but its runtime sees no GPU agent (a login node): the CPU index as well
    b2 = _bin(
        tmp_path / "login",
        rocminfo="echo 'HSA Agents'; echo '  Name:                    AMD EPYC 7A53'\n",
        hostname="echo workstation\n",
    )
    rocm = tmp_path / "rocm"
    rocm.mkdir()
    p2 = _install(_env(bare_python, b2, ROCM_PATH=str(rocm), RENDER_ONLY="1"))
    assert p2.returncode == 0 and "--index-url https://download.pytorch.org/whl/cpu" in p2.stdout, p2.stderr


def test_existing_torch_is_kept():
    env = {k: v for k, v in os.environ.items() if k != "ROCM_PATH"}
    p = _install({**env, "PYTHON": sys.executable, "RENDER_ONLY": "1"})
    assert p.returncode == 0, p.stderr
    assert "[install] keeping torch" in p.stdout and "pip install torch" not in p.stdout
    assert "-m pip install --no-build-isolation -e .\\[test\\,frontier\\]" in p.stdout  # shell-quoted


def test_a_kept_torch_of_another_version_stays_the_package_goes_in_without_deps(bare_python, tmp_path):
    """pyproject.toml declares the tested torch (2.13.0); a kept ROCm 2.10.0 (a stand-in module
    with that version) must not be resolved against it: the other requirements without torch,
    then the package with --no-deps ([Note: the torch versions claimed])."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "2.10.0+rocm7.1"\n')
    env = {**_env(bare_python, _bin(tmp_path, hostname="echo ci-runner-3\n"), RENDER_ONLY="1")}
    env["PYTHONPATH"] = str(tmp_path / "site")
    p = _install(env)
    assert p.returncode == 0, p.stderr
    assert "[install] keeping torch 2.10.0+rocm7.1" in p.stdout
    reqs = next(ln for ln in p.stdout.splitlines() if ln.startswith(f"+ {bare_python} -m pip install deepspeed"))
    assert "deepspeed==0.19.8" in reqs and "torch" not in reqs and "pytest" in reqs, reqs
    assert f"+ {bare_python} -m pip install --no-deps --no-build-isolation -e .\\[test\\,frontier\\]" in p.stdout
    assert p.stdout.index(reqs) < p.stdout.index("--no-deps")


def test_requirements_reader_expands_own_extras_and_leaves_torch_out():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import requirements as r
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    project = {
        "name": "zeropp-hier",
        "dependencies": ["torch==2.13.0", "deepspeed==0.19.8", "numpy"],
        "optional-dependencies": {"data": ["pyarrow"], "test": ["pytest", "zeropp-hier[data]", "numpy"]},
    }
    assert r.requirements(project, ["test"], {"torch"}) == ["deepspeed==0.19.8", "numpy", "pytest", "pyarrow"]
    assert r.requirements(project, [], {"Torch"}) == ["deepspeed==0.19.8", "numpy"]
    assert r.distribution("Hydra_Core>=1.3") == "hydra-core"
    with pytest.raises(SystemExit, match="no extra 'gpu'"):
        r.requirements(project, ["gpu"], set())
    # the real file: every requirement of pyproject.toml but torch, the extras expanded
    real = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "requirements.py"), "--without", "torch", "frontier"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "deepspeed==0.19.8" in real and not any(r.distribution(x) in ("torch", "zeropp-hier") for x in real)


def test_frontier_install_renders_olcf_recipe(tmp_path):
    env = {**os.environ, "RENDER_ONLY": "1", "MEMBERWORK": "/lustre/orion/alice"}
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "frontier" / "install.sh")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("+ module load")] == [
        "+ module load PrgEnv-gnu/8.7.0",
        "+ module load cpe/26.03",
        "+ module load miniforge3/23.11.0-0",
        "+ module load rocm/7.1.1",
        "+ module load craype-accel-amd-gfx90a",
    ]
    py = "/lustre/orion/alice/zeropp-hier-env/bin/python"
    text = p.stdout
    assert f"+ {py} -m pip install torch==2.10.0 --index-url https://download.pytorch.org/whl/rocm7.1" in text
    # non-editable, no build isolation, HIP kernels for gfx90a; then checked to load; then packed
    # OLCF's torch stays: the requirements without torch, then the package with --no-deps
    reqs = next(ln for ln in lines if ln.startswith(f"+ {py} -m pip install deepspeed"))
    assert "deepspeed==0.19.8" in reqs and "tensorboard" in reqs and "torch" not in reqs, reqs
    build = f"+ env PYTORCH_ROCM_ARCH=gfx90a {py} -m pip install --no-deps --no-build-isolation {ROOT}\\[frontier\\]"
    assert build in text and " -e " not in text and text.index(reqs) < text.index(build)
    assert text.index(build) < text.index("kernels loaded") < text.index("conda-pack --format tar.gz")
    assert "--output /lustre/orion/alice/zeropp-hier-env.tar.gz" in text
