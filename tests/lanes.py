"""Test lanes: every test under tests/<lane>/ carries the marker <lane> (registered in
pyproject.toml), set by that directory's conftest.py.

    python -m pytest -m unit tests   # unit: pure, no processes, no worlds (the inner loop, < 1 min)
    python -m pytest -m dist tests   # dist: LocalWorld process worlds
    python -m pytest -m system tests # system: Slurm, the emulated cluster, compilers, whole jobs
    python -m pytest -m gpu tests    # gpu: CUDA/ROCm kernels and the engine on CUDA tensors
    python -m pytest tests           # everything, one test after another
    python -m pytest tests -n 2      # everything, two lanes at once (pytest-xdist; the README's)
"""

from pathlib import Path

import pytest


def lane_marker(conftest_file: str):
    """The ``pytest_collection_modifyitems`` hook of a lane's conftest.py (the lane is the
    conftest's directory name). A conftest's hook sees every collected item, so it marks only
    the items below its own directory; it runs first, so that ``-m`` deselects by lane."""
    lane_dir = Path(conftest_file).resolve().parent
    mark = getattr(pytest.mark, lane_dir.name)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(items):
        for item in items:
            if lane_dir in Path(item.path).resolve().parents:
                item.add_marker(mark)

    return pytest_collection_modifyitems


# [Note: two lanes at once]
# The suite on 2 cores left about a third of the second core idle: the unit lane and many system
# tests run one process, while the dist lane's worlds of 2-8 ranks wait on each other over
# loopback. Under pytest-xdist (`-n 2`) the lanes run side by side: every dist test is in one
# group, so one worker starts the shared worlds (tests/conftest.py: the world fixtures are per
# session, that is per worker) and runs the lane in its order; every other module is a group of
# its own, so a module's fixtures (a Slurm cluster, the emulated CPUs' runs) start once, on one
# worker. Groups are handed out in collection order (dist, gpu, system, unit), not largest
# first: the long system modules start beside the dist lane, and the many short unit modules
# fill both workers at the end.


def _group(item) -> str:
    path = Path(item.path).resolve()
    lane = path.parent.name if path.parent.parent.name == "tests" else ""
    return "dist" if lane == "dist" else f"{lane}/{path.stem}"


@pytest.hookimpl(tryfirst=True)
def xdist_schedule(config):
    """``pytest_cmdline_main`` (the controller): under ``-n N`` with no ``--dist`` given, hand out
    groups in collection order (before pytest-xdist reads the options)."""
    if getattr(config.option, "numprocesses", None) and config.option.dist == "no":
        config.option.dist = "loadgroup"
        config.option.loadscopereorder = False


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, absent without it
def xdist_node(node):
    """``pytest_configure_node`` (the controller, per worker): a worker parses the command line
    again, without the ``--dist`` chosen above, so it is told."""
    if node.config.option.dist == "loadgroup":
        node.workerinput["zeropp_hier_groups"] = True


def xdist_worker(config):
    """``pytest_configure`` (a worker): pytest-xdist puts each test's group into its id."""
    if getattr(config, "workerinput", {}).get("zeropp_hier_groups"):
        config.option.loadgroup = True


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups into test ids
def xdist_groups(config, items):
    """``pytest_collection_modifyitems``: each test's group, where tests are handed out by group."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
