"""The issue modes' benchmark (benchmarks/gpu/modes.py) reduces the ranks' results to its table:
loss and weight differences against one lane, serial wait and step time per step, and the sync
counts of all ranks by phase, package and thread (the CUDA-only part, fed here by hand), and a
refused mode's row is its refusal. Pure; tests/dist/test_gpu_modes.py runs the ranks on CPU."""

import torch

from benchmarks.gpu.modes import compare, table_lines

STEPS = 3


def _rank(rank: int, loss_shift: float, weight_shift: float, waits: list, syncs: dict | None) -> dict:
    def run(mode, losses, w, wait, sync):
        out = {
            "mode": mode,
            "chunks": 1,
            "losses": losses,
            "serial_wait_s": wait,
            "step_s": [0.5, 0.2 + rank / 10, 0.2],
            "syncs": sync,
            "sync_origins": None if sync is None else {"forward | deepspeed/x.py:1 (f) | MainThread": 1},
        }
        if rank == 0:
            out["state"] = {"w": torch.full((2,), w)}
        return out

    base = [4.0, 3.5, 3.0]
    return {
        "frontier/one_lane": run("one_lane", base, 1.0, [0.0] * STEPS, syncs),
        "frontier/serial": run("one_lane/serial", [x + loss_shift for x in base], 1.0 + weight_shift, waits, syncs),
        "frontier/ticks": {"refused": "zeropp_hier.overlap: ticks: gloo does only for CPU tensors\nmore"},
    }


def test_modes_table_from_the_ranks_results():
    syncs = {
        "forward": {"deepspeed": {"training": 1, "other_thread": 0}},
        "backward": {"zeropp_hier": {"training": 0, "other_thread": 2}},
    }
    results = [
        _rank(0, 0.0, 0.0, [0.1, 0.2, 0.4], syncs),
        _rank(1, 1e-3, 0.0, [0.3, 0.4, 0.2], syncs),
    ]
    results[0]["frontier/serial"]["state"]["w"][1] += 0.25  # rank 0's weights differ by 0.25
    table = compare(results, STEPS)
    serial = table["frontier/serial"]
    assert abs(serial["max_abs_loss_diff_vs_one_lane"] - 1e-3) < 1e-12
    assert serial["max_abs_weight_diff_vs_one_lane_rank0"] == 0.25
    assert table["frontier/one_lane"]["max_abs_loss_diff_vs_one_lane"] == 0.0
    # mean over ranks per step; the figure per step leaves the first step out
    assert [round(x, 9) for x in serial["serial_wait_s_per_step_mean_ranks"]] == [0.2, 0.3, 0.3]
    assert abs(serial["serial_wait_s_per_step"] - 0.3) < 1e-9
    assert abs(serial["serial_wait_s_total_max_rank"] - 0.9) < 1e-9
    # the slowest rank per step
    assert serial["step_s_per_step_slowest_rank"] == [0.5, 0.30000000000000004, 0.2]
    assert abs(serial["step_s"] - 0.25) < 1e-9
    assert serial["syncs_all_ranks"] == {
        "forward": {"deepspeed": {"training": 2, "other_thread": 0}},
        "backward": {"zeropp_hier": {"training": 0, "other_thread": 4}},
    }
    assert serial["sync_origins_all_ranks"] == {"forward | deepspeed/x.py:1 (f) | MainThread": 2}
    assert table["frontier/ticks"] == {"refused": results[0]["frontier/ticks"]["refused"]}
    lines = table_lines(table)
    assert len(lines) == 4
    assert lines[2].split()[:2] == ["frontier/serial", "one_lane/serial"]
    assert lines[2].endswith("4 / 2 / 0")  # forward + backward: zeropp_hier / deepspeed / other
    assert "refused: zeropp_hier.overlap: ticks: gloo does only for CPU tensors" in lines[3]
    assert "more" not in lines[3]


def test_no_sync_counts_without_cuda():
    results = [_rank(0, 0.0, 0.0, [0.0] * STEPS, None)]
    row = compare(results, STEPS)["frontier/serial"]
    assert row["syncs_all_ranks"] is None and row["sync_origins_all_ranks"] is None
    assert table_lines({"frontier/serial": row})[1].endswith("- / - / -")
