import pytest

from zeropp_hier.launch.world import SharedWorld

from .lanes import xdist_groups, xdist_node, xdist_schedule, xdist_worker

# `-n 2` (pytest-xdist, the README's test command): the dist lane on one worker, the other lanes
# beside it on the other ([Note: two lanes at once] in tests/lanes.py)
pytest_cmdline_main = xdist_schedule
pytest_configure_node = xdist_node
pytest_configure = xdist_worker
pytest_collection_modifyitems = xdist_groups

# Starting a world (W processes importing torch and DeepSpeed) costs tens of seconds on a 2-core
# machine, so each size is started once for the session and shared by every module that asks for
# it; only the rarely used 6-rank world lives with its one module.


def _world(size):
    # SharedWorld rebuilds the world before a test if an earlier test left it failed (a rank died,
    # a task raised or timed out), so one failing test never takes the following ones down.
    w = SharedWorld(size, timeout=600, preload=True)  # [Note: preloaded ranks] in zeropp_hier/launch/world.py
    yield w
    w.close()


@pytest.fixture(scope="session")
def world8():
    """8 ranks = 2 nodes x 2 GPUs x 2 GCDs, started once for the session (again after a failure)."""
    yield from _world(8)


@pytest.fixture(scope="session")
def world4():
    """4 ranks, shared by the session; the layout over them is each test's config's."""
    yield from _world(4)


@pytest.fixture(scope="session")
def world2():
    """2 ranks, shared by the session; the layout over them is each test's config's."""
    yield from _world(2)


@pytest.fixture(scope="module")
def world6():
    yield from _world(6)
