"""The issue modes' benchmark (benchmarks/gpu/modes.py) on CPU ranks, the code path the GPU run
takes: on 8 real gloo ranks (2 nodes x 2 GPUs x 2 GCDs) one lane, serial, inline and ticks train
frontier (its default compression) and frontier exact to the same losses and weights bit for bit,
whatever their chunks; the serial mode's wait is reported per step (0 here: a gloo collective on
CPU tensors has ended when its call returns, so there is no event to wait for); and the tick
mode's refusal for gloo with CUDA tensors is what the benchmark records as that mode's result.
(tests/dist/test_ticks_engine.py holds ticks against one lane in more shapes; this adds serial
and inline, through the benchmark's own rank code.)"""

from benchmarks.gpu import modes as gpu_modes
from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS

STEPS = 2
NAMES = {"one_lane": "one_lane", "serial": "one_lane/serial", "inline": "inline", "ticks": "ticks"}


def test_every_issue_mode_trains_alike_and_serial_wait_is_reported(world8):
    cfgs = gpu_modes.configs_for(2, 2)
    assert sorted(cfgs) == sorted(f"{p}/{m}" for p in gpu_modes.PRESETS for m in gpu_modes.MODES)
    results = world8.run(gpu_modes.rank_modes, cfgs, STEPS, gpu_modes.MODEL_KW["cpu"], "cpu")
    for rank, r in enumerate(results):
        for name, got in r.items():
            preset, mode = name.split("/")
            assert got["mode"] == NAMES[mode], (rank, name, got["mode"])
            assert got["chunks"] == (DEFAULT_TICK_CHUNKS if mode == "ticks" else 1), (rank, name)
            ref = r[f"{preset}/one_lane"]
            # the modes reorder when collectives are issued, never what they compute
            assert got["losses"] == ref["losses"], (rank, name, got["losses"], ref["losses"])
            assert len(got["serial_wait_s"]) == STEPS and got["serial_wait_s"] == [0.0] * STEPS, (rank, name)
            assert len(got["step_s"]) == STEPS and got["syncs"] is None  # no CUDA: no sync counts
    table = gpu_modes.compare(results, STEPS)
    for name, row in table.items():
        assert row["max_abs_loss_diff_vs_one_lane"] == 0.0, (name, row)
        assert row["max_abs_weight_diff_vs_one_lane_rank0"] == 0.0, (name, row)
        assert row["serial_wait_s_per_step"] == 0.0 and row["step_s"] > 0, (name, row)
    # the compressed preset and the exact one differ: the comparison is not of one run with itself
    assert table["frontier/one_lane"]["losses_rank0"] != table["frontier_exact/one_lane"]["losses_rank0"]
    assert len(gpu_modes.table_lines(table)) == 1 + len(cfgs)


def test_ticks_are_refused_for_cuda_tensors_on_gloo_by_the_runtimes_check(world8):
    for refusal, allowed, other in world8.run(_refusals):
        assert refusal is not None and "gloo does only for CPU tensors" in refusal, refusal
        assert allowed is None and other is None


def _refusals():
    # on the world's gloo group: ticks with CUDA tensors (the GPU run), ticks with CPU tensors,
    # the serial mode with CUDA tensors
    return (
        gpu_modes.tick_refusal("ticks", "cuda"),
        gpu_modes.tick_refusal("ticks", "cpu"),
        gpu_modes.tick_refusal("serial", "cuda"),
    )
