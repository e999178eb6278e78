import pytest

from zeropp_hier.testing.launch import LocalWorld


def _world(size):
    w = LocalWorld(size, timeout=600)
    yield w
    w.close()


@pytest.fixture(scope="session")
def world8():
    """8 ranks = 2 nodes x 2 GPUs x 2 GCDs, started once for the whole session."""
    yield from _world(8)


@pytest.fixture(scope="module")
def world4():
    yield from _world(4)


@pytest.fixture(scope="module")
def world6():
    yield from _world(6)
