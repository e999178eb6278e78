import pytest

from zeropp_hier.launch.world import SharedWorld

from ..lanes import lane_marker

pytest_collection_modifyitems = lane_marker(__file__)


@pytest.fixture(scope="module")
def bare8():
    """8 ranks that never import DeepSpeed (torch's own gloo group), per module: the drivers of
    comm/ by themselves."""
    w = SharedWorld(8, timeout=600, with_deepspeed=False)
    yield w
    w.close()
