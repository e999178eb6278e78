"""The package's layers import lazily: pure modules pull in neither DeepSpeed nor process groups,
the public names still resolve, the DeepSpeed version check still fires on first use, and the
tools' modules run on their own (``python -m zeropp_hier.app.train``, ``...tools.cli``).
Each check runs in a fresh interpreter: this process has long imported everything."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# modules that must import without DeepSpeed and without touching torch.distributed's state:
# all of core/ (listed by the child itself) and the pure modules of the other layers
PURE = [
    "zeropp_hier.detect.autodetect",
    "zeropp_hier.detect.node_maps",
    "zeropp_hier.detect.node_read",
    "zeropp_hier.detect.rocm_topo",
    "zeropp_hier.detect.slurm_env",
    "zeropp_hier.detect.xgmi_links",
    "zeropp_hier.planner",
    "zeropp_hier.planner.schedule",
    "zeropp_hier.planner.tables",
    "zeropp_hier.tools.sweep_report",
    "zeropp_hier.app.data.documents",
    "zeropp_hier.app.data.indexed",
]

CHILD = r"""
import importlib, json, pkgutil, sys
import zeropp_hier.core
core = sorted(m.name for m in pkgutil.iter_modules(zeropp_hier.core.__path__, "zeropp_hier.core."))
for name in core + PURE:
    importlib.import_module(name)

def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] == "deepspeed" or m.startswith("zeropp_hier.deepspeed"))

def pg_initialized():
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())

out = {"core": core, "after_pure": loaded(), "pg_after_pure": pg_initialized()}
import zeropp_hier
cheap = ["Topology", "HierConfig", "parse_section", "HierConfigError", "HierTopologyError",
         "HierNonFiniteError", "DeepSpeedVersionError", "HierCommError", "comm_stats", "__version__"]
for name in cheap:
    getattr(zeropp_hier, name)
out["after_cheap_names"] = loaded()

import deepspeed
from zeropp_hier.core.errors import DeepSpeedVersionError
real, deepspeed.__version__ = deepspeed.__version__, "0.18.9"
try:
    zeropp_hier.initialize
    out["old_deepspeed"] = "accepted"
except DeepSpeedVersionError as e:
    out["old_deepspeed"] = str(e)
deepspeed.__version__ = real
from zeropp_hier.deepspeed.engine import initialize
out["initialize_resolves"] = zeropp_hier.initialize is initialize
out["all_resolve"] = all(getattr(zeropp_hier, n) is not None for n in zeropp_hier.__all__)
out["dir_lists_all"] = set(zeropp_hier.__all__) <= set(dir(zeropp_hier))
try:
    zeropp_hier.no_such_name
except AttributeError:
    out["unknown_is_attribute_error"] = True
print("RESULT " + json.dumps(out))
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, not another installed copy
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_pure_modules_import_without_deepspeed_and_the_public_api_resolves_lazily():
    p = _python("-c", f"PURE = {PURE!r}\n" + CHILD)
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.split("RESULT ", 1)[1])
    assert {
        "zeropp_hier.core.topology",
        "zeropp_hier.core.config",
        "zeropp_hier.core.plan",
        "zeropp_hier.core.layout",
        "zeropp_hier.core.policy",
        "zeropp_hier.core.errors",
    } <= set(out["core"])
    assert out["after_pure"] == [] and not out["pg_after_pure"]
    assert out["after_cheap_names"] == []
    # the version check fires when the first DeepSpeed-dependent name is used
    assert "found DeepSpeed 0.18.9" in out["old_deepspeed"]
    assert out["initialize_resolves"] and out["all_resolve"] and out["dir_lists_all"]
    assert out["unknown_is_attribute_error"]


def test_the_jobs_spec_and_memory_check_import_without_torch():
    """The job's spec (``app/spec.py``) and its memory check are plain data and arithmetic: the
    Hydra face and the launcher read them before any rank exists, without paying for torch."""
    child = (
        "import sys, zeropp_hier.app.spec, zeropp_hier.app.memory_check\n"
        "spec = zeropp_hier.app.spec.JobSpec()\n"
        "cfg = spec.ds_config()\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed'))\n"
        "print('RESULT', cfg['zeropp_hier']['preset'], heavy)"
    )
    p = _python("-c", child)
    assert p.returncode == 0, p.stderr[-4000:]
    assert p.stdout.split("RESULT ", 1)[1].strip() == "frontier []"


def test_module_commands_run_on_their_own():
    cli = _python("-m", "zeropp_hier.tools.cli", "--help")
    assert cli.returncode == 0 and "plan" in cli.stdout and "probe" in cli.stdout, cli.stderr[-2000:]
    # Hydra prints the composed config and exits without running the job
    train = _python("-m", "zeropp_hier.app.train", "--cfg", "job", "steps=3")
    assert train.returncode == 0 and "steps: 3" in train.stdout, train.stderr[-2000:]


def test_one_command_dispatches_to_each_tool():
    top = _python("-m", "zeropp_hier", "--help")
    assert top.returncode == 0, top.stderr[-2000:]
    for sub in ("train", "plan", "probe", "report", "checkpoint", "cluster"):
        assert sub in top.stdout
    # "train" hands its arguments to Hydra unchanged: Hydra prints the composed job and exits
    train = _python("-m", "zeropp_hier", "train", "--cfg", "job", "preset=zeropp", "steps=5")
    assert train.returncode == 0 and "steps: 5" in train.stdout and "name: zeropp" in train.stdout, train.stderr[
        -2000:
    ]
    plan = _python("-m", "zeropp_hier", "plan", "--params", "3.4M", "--cluster", "emulated", "--json")
    assert plan.returncode == 0 and '"name": "frontier"' in plan.stdout, plan.stderr[-2000:]
    ckpt = _python("-m", "zeropp_hier", "checkpoint", "--help")
    assert ckpt.returncode == 0 and "to-universal" in ckpt.stdout, ckpt.stderr[-2000:]
    cluster = _python("-m", "zeropp_hier", "cluster", "--help")
    assert cluster.returncode == 0 and "teardown" in cluster.stdout, cluster.stderr[-2000:]
    bad = _python("-m", "zeropp_hier", "trian")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_cluster_outside_the_checkout_says_how_to_run_it(tmp_path):
    """``benchmarks/`` is not installed with the package: with only ``zeropp_hier`` importable
    (as after ``pip install``), ``cluster`` stops with one line saying how to run it."""
    (tmp_path / "zeropp_hier").symlink_to(ROOT / "zeropp_hier")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    p = subprocess.run(
        [sys.executable, "-m", "zeropp_hier", "cluster", "status"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "needs the repository checkout" in p.stderr and "python -m benchmarks.cluster" in p.stderr
