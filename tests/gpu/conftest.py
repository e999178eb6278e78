"""The gpu lane: tests that need a CUDA (or ROCm) device. On a machine without one every test
here skips, saying so; that is the machine lacking the capability, not a test switched off."""

from pathlib import Path

import pytest
import torch

from ..lanes import lane_marker

_mark_lane = lane_marker(__file__)
_HERE = Path(__file__).resolve().parent

NO_GPU = None if torch.cuda.is_available() else f"no GPU: torch {torch.__version__} sees no CUDA/ROCm device"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    _mark_lane(items)
    if NO_GPU:  # a marker, not a fixture: module-scoped fixtures would run before a skip fixture
        for item in items:
            if _HERE in Path(item.path).resolve().parents:
                item.add_marker(pytest.mark.skip(reason=NO_GPU))
