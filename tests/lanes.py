"""Test lanes: every test under tests/<lane>/ carries the marker <lane> (registered in
pyproject.toml), set by that directory's conftest.py.

    python -m pytest -m unit tests   # unit: pure, no processes, no worlds (the inner loop, < 1 min)
    python -m pytest -m dist tests   # dist: LocalWorld process worlds
    python -m pytest -m system tests # system: Slurm, the emulated cluster, compilers, whole jobs
    python -m pytest -m gpu tests    # gpu: CUDA/ROCm kernels and the engine on CUDA tensors
    python -m pytest tests           # everything
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
