import pytest

from zeropp_hier.launch.world import LocalWorld

from ..lanes import lane_marker

pytest_collection_modifyitems = lane_marker(__file__)


@pytest.fixture(autouse=True)
def _no_worlds(monkeypatch):
    """The unit lane starts no process worlds: those tests belong in tests/dist."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("a unit test started a LocalWorld; move it to tests/dist")

    monkeypatch.setattr(LocalWorld, "__init__", refuse)
