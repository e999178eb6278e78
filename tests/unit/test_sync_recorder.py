"""The sync attribution the GPU lane relies on (benchmarks/gpu_engine.py): torch's sync-debug
warnings are recorded with the phase and the innermost frame of this package or DeepSpeed;
other warnings pass through untouched. Runs without a GPU: the warning is raised by hand."""

import warnings

from benchmarks.gpu_engine import SyncRecorder


def _sync_from_this_package():
    # stands in for torch raising its warning inside one of our functions
    warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)


def test_sync_warnings_are_recorded_by_phase_and_origin_and_others_pass_through():
    shown = []
    saved = warnings.showwarning
    warnings.showwarning = lambda *a, **k: shown.append(str(a[0]))
    try:
        with SyncRecorder() as rec:
            rec.phase = "forward"
            _sync_from_this_package()
            _sync_from_this_package()
            rec.phase = "backward"
            warnings.warn("something else", UserWarning, stacklevel=1)
    finally:
        warnings.showwarning = saved
    summary = rec.summary()
    assert sum(summary.values()) == 2, summary
    (key,) = summary
    phase, origin, thread = key.split(" | ")
    assert phase == "forward" and thread == "MainThread"
    # the innermost frame on the way: this test module (no zeropp_hier/deepspeed frame is on the stack)
    assert origin.endswith("(_sync_from_this_package)"), origin
    assert shown == ["something else"]
