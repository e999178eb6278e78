"""A missing RCCL/NCCL network plugin stops the job before any rank waits, naming the module
([Note: the network plugin]). The libraries are real: a missing path fails the real dynamic
loader, and a plugin stand-in is a real shared library compiled here (its contents do not
matter to the check, only that the loader finds and loads it)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zeropp_hier.core.errors import HierConfigError
from zeropp_hier.detect import net_plugin
from zeropp_hier.launch import rendezvous

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    # the package's own kernels are compiled at install, so a compiler is there: no skip
    assert cc is not None, "no C compiler (gcc or cc): the install needs one for the kernels too"
    d = tmp_path_factory.mktemp("plugin")
    src = d / "p.c"
    src.write_text("int zeropp_hier_stand_in(void) { return 0; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "librccl-net.so"), str(src)], check=True)
    return d


def test_no_plugin_required_without_nccl_net_or_with_a_built_in_transport():
    assert net_plugin.problem({}) is None
    assert net_plugin.problem({"NCCL_NET": "Socket", "NCCL_NET_PLUGIN": "/nowhere/x.so"}) is None
    assert net_plugin.problem({"NCCL_NET": "IB"}) is None


def test_the_lookup_follows_rccl_naming():
    assert net_plugin.candidates({}) == ["librccl-net.so", "libnccl-net.so"]
    assert net_plugin.candidates({"NCCL_NET_PLUGIN": "ofi"}) == ["librccl-net-ofi.so", "libnccl-net-ofi.so"]
    assert net_plugin.candidates({"NCCL_NET_PLUGIN": "/opt/p/lib/librccl-net.so"}) == ["/opt/p/lib/librccl-net.so"]
    assert net_plugin.candidates({"NCCL_NET_PLUGIN": "none"}) == []


def test_a_missing_plugin_is_named_with_the_module_to_load(tmp_path):
    env = {"NCCL_NET": "AWS Libfabric", "NCCL_NET_PLUGIN": str(tmp_path / "lib" / "librccl-net.so")}
    why = net_plugin.problem(env)
    assert why is not None
    assert str(tmp_path / "lib" / "librccl-net.so") in why  # what was tried, with the loader's reason
    assert "rccl-net-plugin" in why and "ZH_RCCL_PLUGIN" in why


def test_a_plugin_that_loads_passes_by_path_and_by_the_loaders_search(plugin_dir):
    assert (
        net_plugin.problem({"NCCL_NET": "AWS Libfabric", "NCCL_NET_PLUGIN": str(plugin_dir / "librccl-net.so")})
        is None
    )
    # by name, through LD_LIBRARY_PATH: the loader reads it at process start, so a fresh process
    code = "import os; from zeropp_hier.detect import net_plugin; print(net_plugin.problem(os.environ))"
    env = {k: v for k, v in os.environ.items() if k != "NCCL_NET_PLUGIN"}
    env.update(NCCL_NET="AWS Libfabric", PYTHONPATH=str(ROOT))
    found = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "LD_LIBRARY_PATH": str(plugin_dir)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == "None", found.stdout
    missing = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "librccl-net.so" in missing.stdout and "rccl-net-plugin" in missing.stdout, missing.stdout


def test_a_gpu_rank_stops_before_the_rendezvous(tmp_path):
    """Raised before the store is opened: no rank is left waiting on a port nobody serves."""
    env = {
        "NCCL_NET": "AWS Libfabric",
        "NCCL_NET_PLUGIN": str(tmp_path / "missing.so"),
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",  # nothing listens: reaching the store would fail differently
    }
    with pytest.raises(HierConfigError, match="config error at 'NCCL_NET': got 'AWS Libfabric'; .*rccl-net-plugin"):
        rendezvous.init_distributed("nccl", gpus=1, env=env)
