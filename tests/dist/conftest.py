import pytest

from zeropp_hier.launch.world import SharedWorld

from ..lanes import lane_marker

pytest_collection_modifyitems = lane_marker(__file__)


@pytest.fixture(scope="package")
def bare8():
    """8 ranks that never import DeepSpeed (torch's own gloo group): the drivers of comm/ by
    themselves. Started once for tests/dist and shared by its six modules that use it, as world8
    is: a spawned world of 8 costs eight torch imports (tens of CPU-seconds), and SharedWorld
    starts a fresh one after a test that left it failed, so a module still never inherits a
    broken world."""
    w = SharedWorld(8, timeout=600, with_deepspeed=False)
    yield w
    w.close()
