"""The sync attribution the GPU lane relies on (benchmarks/gpu/engine.py): torch's sync-debug
warnings are recorded with the phase and the innermost frame of this package or DeepSpeed;
other warnings pass through untouched. Runs without a GPU: the warning is raised by hand."""

import warnings

from benchmarks.gpu.engine import SyncRecorder


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


def test_sync_records_split_by_phase_package_and_thread():
    from benchmarks.gpu.modes import package_of, split_syncs

    records = [
        {"phase": "forward", "thread": "MainThread", "origin": "zeropp_hier/comm/gather.py:10 (f)"},
        {"phase": "forward", "thread": "zeropp_hier-rank0-one_lane", "origin": "zeropp_hier/comm/x.py:1 (g)"},
        {"phase": "forward", "thread": "MainThread", "origin": "deepspeed/runtime/zero/stage3.py:5 (h)"},
        {"phase": "backward", "thread": "MainThread", "origin": "/usr/lib/python3/threading.py:9 (run)"},
        {"phase": "backward", "thread": "MainThread", "origin": "deepspeed/runtime/engine.py:7 (k)"},
    ]
    assert [package_of(r["origin"]) for r in records] == [
        "zeropp_hier",
        "zeropp_hier",
        "deepspeed",
        "other",
        "deepspeed",
    ]
    assert split_syncs(records, "MainThread") == {
        "forward": {
            "zeropp_hier": {"training": 1, "other_thread": 1},
            "deepspeed": {"training": 1, "other_thread": 0},
        },
        "backward": {
            "other": {"training": 1, "other_thread": 0},
            "deepspeed": {"training": 1, "other_thread": 0},
        },
    }
