import pytest

from zeropp_hier.launch.world import SharedWorld


def _world(size):
    # SharedWorld rebuilds the world before a test if an earlier test left it failed (a rank died,
    # a task raised or timed out), so one failing test never takes the following ones down.
    w = SharedWorld(size, timeout=600)
    yield w
    w.close()


@pytest.fixture(scope="session")
def world8():
    """8 ranks = 2 nodes x 2 GPUs x 2 GCDs, started once for the session (again after a failure)."""
    yield from _world(8)


@pytest.fixture(scope="module")
def world4():
    yield from _world(4)


@pytest.fixture(scope="module")
def world6():
    yield from _world(6)
