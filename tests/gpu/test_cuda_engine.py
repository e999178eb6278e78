"""The engine on CUDA tensors: 8 ranks (2 nodes x 2 packages x 2 GCDs) sharing one GPU through
gloo, beside stock DeepSpeed ZeRO-3 on the same GPU (benchmarks/gpu/engine.py says what this
proves and what it does not: no NCCL, no link speeds)."""

import pytest

from benchmarks.gpu.engine import compare, configs_for, rank_run
from zeropp_hier.launch.world import LocalWorld

STEPS = 4
MODEL = dict(vocab_size=256, seq_len=32, d_model=64, n_heads=4, n_layers=4)
NAMES = ("stock", "zero3", "frontier_exact", "frontier")


@pytest.fixture(scope="module")
def table():
    cfgs = configs_for(2, 2)
    cfgs = {k: v for k, v in cfgs.items() if k.rsplit("_", 1)[0] in NAMES}
    with LocalWorld(8, timeout=400, gpus=1) as w:
        results = w.run(rank_run, cfgs, STEPS, MODEL)
    return compare(results)


def test_exact_presets_equal_stock_on_the_gpu(table):
    for name in ("zero3_fp32", "frontier_exact_fp32"):
        row = table[name]
        assert row["max_rel_loss_diff_vs_stock"] <= 1e-5, (name, row)
        assert row["max_abs_weight_diff_vs_stock"] <= 1e-5, (name, row)
    for name in ("zero3_bf16", "frontier_exact_bf16"):
        assert table[name]["max_rel_loss_diff_vs_stock"] <= 2e-2, (name, table[name])
        assert table[name]["finite"], name


def test_compressed_preset_trains_like_stock(table):
    for dt in ("fp32", "bf16"):
        row, stock = table[f"frontier_{dt}"], table[f"stock_{dt}"]
        assert abs(row["loss_last"] - stock["loss_last"]) / stock["loss_last"] <= 0.02, (dt, row, stock)
        assert row["max_rel_loss_diff_vs_stock"] > 0, "compression changed nothing: were the kernels run?"


def test_everything_lives_on_the_gpu_and_the_gpu_kernels_ran(table):
    for name, row in table.items():
        assert row["devices"] == ["cuda:0"], (name, row["devices"])
        if not name.startswith("stock"):
            assert row["comm_device"] == "cuda:0", (name, row["comm_device"])
            assert row["kernels"] == "cuda", (name, row["kernels"])


def test_no_host_sync_from_this_package_in_forward_or_backward(table):
    for name, row in table.items():
        ours = {
            k: v
            for k, v in row["syncs_all_ranks"].items()
            if k.split(" | ")[0] in ("forward", "backward") and k.split(" | ")[1].startswith("zeropp_hier/")
        }
        assert not ours, f"{name}: host synchronisation in the hot path: {ours}"
