"""The arithmetic of benchmarks/gpu/layer_cost.py (benchmarks/cpu/layer_cost.py: the kernels the
frontier preset runs for one layer, the MI250X scaling, the planner's rate) and a run of the
benchmark itself on the CPU at a toy size."""

import dataclasses
import json

import pytest

from benchmarks.cpu import layer_cost as lc
from benchmarks.gpu import layer_cost as layer_cost_gpu
from zeropp_hier.app.model.flops import PEAK_BF16_TFLOPS
from zeropp_hier.app.spec import MODELS, block_params
from zeropp_hier.core.topology import Topology
from zeropp_hier.planner import clusters
from zeropp_hier.planner.candidates import Candidate, compression_for
from zeropp_hier.planner.cost import collective_cost, collectives

NEOX_20B = MODELS["neox_20b"]
FRONTIER = Topology(48, 4, 2)


def _numels(spec=NEOX_20B):
    return lc.neox_layer_numels(spec.hidden, spec.intermediate)


def _elems(calls, **match):
    """Elements (de)quantized by the calls whose fields equal ``match``."""
    return sum(c.elems * c.calls for c in calls if all(getattr(c, k) == v for k, v in match.items()))


def test_layer_tensors_are_the_blocks_parameters():
    assert sum(_numels()) == block_params(NEOX_20B)
    assert len(_numels()) == 12  # 2 LayerNorms and 4 linear layers, weight and bias each


def test_shard_is_whole_blocks_of_each_tensors_piece():
    numels, w = _numels(), FRONTIER.world_size
    s = lc.shard_elems(numels, w, 256)
    pieces = sum(-(-n // w) for n in numels)
    assert s % 256 == 0
    assert pieces <= s < pieces + 256 * len(numels)
    assert s * w >= sum(numels)


@pytest.mark.parametrize("chunks", [1, 8])
def test_frontier_layer_kernels_follow_the_plan(chunks):
    lk = lc.layer_kernels(_numels(), FRONTIER, "frontier", chunks)
    w, s, full = lk.world, lk.shard, lk.gathered
    assert (w, full) == (384, 384 * s)
    calls = lk.calls
    # forward: this rank's share quantized once (int8, bf16, node hop), the whole layer decoded
    assert _elems(calls, phase="forward_gather", op="quantize", bits=8, dtype="bfloat16", tier="node") == s
    assert _elems(calls, phase="forward_gather", op="dequantize", bits=8) == full
    assert {c.op for c in calls if c.phase == "forward_gather"} == {"quantize", "dequantize"}
    # backward: the kept copy is encoded, so no quantize, and the whole layer decoded again
    assert [(c.op, c.numel, c.calls) for c in calls if c.phase == "backward_gather"] == [("dequantize", full, 1)]
    # gradients: fp32 stages gcd int8 (k 2), gpu int8 (k 4), node int8 (k 48), each buffer 1/k of the last
    buf = full
    for tier, bits, k in (("gcd", 8, 2), ("gpu", 8, 4), ("node", 8, 48)):
        q = [c for c in calls if c.phase == "grad_reduce" and c.tier == tier and c.op == "quantize"]
        sums = [c for c in calls if c.phase == "grad_reduce" and c.tier == tier and c.op == "dequantize_sum"]
        assert {(c.bits, c.dtype) for c in q + sums} == {(bits, "float32")}
        assert {c.parts for c in sums} == {k}
        assert _elems(q) == _elems(sums) == buf
        buf //= k
    # every streamed chunk within the runtime's bound, at most 1/chunks of the rows
    biggest = max(c.numel for c in calls if c.phase == "grad_reduce")
    assert biggest <= min(lc.STREAM_CHUNK_ELEMS, w * -(-s // chunks)) + w * 256


def test_kernels_change_with_the_preset():
    """Derived from the plan, not written down: zeropp's flat gradient stages are int4 over 8
    and 48 ranks, and its gather quantizes at the flat world hop."""
    lk = lc.layer_kernels(_numels(), FRONTIER, "zeropp", 1)
    sums = [c for c in lk.calls if c.op == "dequantize_sum"]
    assert {(c.bits, c.parts) for c in sums} == {(4, 8), (4, 48)}
    assert _elems(lk.calls, phase="forward_gather", op="quantize") == lk.shard


def test_kernel_elements_are_the_planners_up_to_padding():
    """The planner's quant_elems for a layer count the same quantizes and dequantizes, on the
    unpadded parameters: the two agree to within the slot padding."""
    numels = _numels()
    lk = lc.layer_kernels(numels, FRONTIER, "frontier", 8)
    planner = lc.planner_quant_elems(sum(numels), FRONTIER)
    ours = lc.calls_elems(lk.calls)
    pad = lk.gathered / sum(numels)
    assert planner <= ours <= planner * pad * (1 + 1e-9)


def test_planner_rate_reproduces_the_measured_seconds():
    """With quant_rate set to the derived rate, the planner's own quant seconds for the layer's
    collectives are the measured kernel seconds."""
    params = float(block_params(NEOX_20B))
    measured = 0.0123
    rate = lc.planner_quant_rate(lc.planner_quant_elems(int(params), FRONTIER), measured)
    cluster = dataclasses.replace(clusters.frontier(48), quant_rate=rate)
    _, colls = collectives(Candidate("frontier", False, "frontier", compression_for("frontier")), FRONTIER, params)
    total = sum(collective_cost(c, cluster, 2, 256, 1).quant_seconds for c in colls)
    assert total == pytest.approx(measured, rel=1e-12)
    line = lc.planner_line(rate, "NVIDIA H100 80GB HBM3")
    assert line.startswith(lc.PLANNER_FILE) and f"quant_rate={rate:.2e}" in line
    assert f"quant_rate={clusters.frontier().quant_rate:.0e}," in line  # the line's "from" value


def test_mi250x_scaling_by_bandwidth_and_peak():
    h100 = lc.mi250x_scaling("NVIDIA H100 80GB HBM3")
    assert h100.kernel == pytest.approx(3.35 / 1.6)
    assert h100.gemm == pytest.approx(PEAK_BF16_TFLOPS["H100 80GB HBM3"] / PEAK_BF16_TFLOPS["MI250X"])
    nvl = lc.mi250x_scaling("NVIDIA H200 NVL")
    assert nvl.kernel == pytest.approx(4.8 / 1.6) and nvl.gemm == pytest.approx(835.5 / 191.5)
    assert lc.mi250x_scaling(None) == lc.Scaling(None, None)
    assert lc.mi250x_scaling("NVIDIA A100-SXM4-80GB") == lc.Scaling(None, None)
    assert lc.scaled(2.0, h100.kernel) == pytest.approx(2.0 * 3.35 / 1.6)
    assert lc.scaled(2.0, None) is None
    assert lc.ratio(1.0, 4.0) == 0.25
    assert lc.ratio(None, 4.0) is None and lc.ratio(1.0, 0.0) is None


def test_benchmark_runs_on_the_cpu(tmp_path):
    out = tmp_path / "layer.json"
    args = ["--device", "cpu", "--hidden", "64", "--heads", "2", "--tokens", "32", "--nodes", "2"]
    layer_cost_gpu.main([*args, "--chunks", "2", "--iters", "1", "--reps", "1", "--out", str(out)])
    r = json.loads(out.read_text())
    assert r["config"]["world"] == 16 and r["machine"]["device"] == "cpu"
    assert r["layer"]["params"] == block_params(dataclasses.replace(NEOX_20B, hidden=64, intermediate=256))
    c = r["compute"]
    for key in ("forward_s", "forward_backward_s", "gemm_forward_s", "gemm_backward_s", "gemm_s"):
        assert c[key] > 0, key
    assert len(c["linear_shapes"]) == 4
    comp = r["compression"]
    assert set(comp["per_phase_s"]) == {"forward_gather", "backward_gather", "grad_reduce"}
    assert comp["calls"] and all(row["seconds_per_call"] > 0 for row in comp["calls"])
    assert comp["total_s"] == pytest.approx(sum(row["seconds"] for row in comp["calls"]))
    ops = {(row["op"], row["bits"]) for row in r["kernels"]}
    assert {(op, b) for b in (8, 4) for op in ("quantize", "dequantize")} <= ops
    for k in (2, 4):  # gcd, gpu, node (2 nodes here) group sizes
        assert (f"dequantize_sum_requantize(k={k})", 4) in ops
    assert all(row["op_s"] > 0 and row["copy_s"] > 0 for row in r["kernels"])
    assert r["ratios"]["compression_over_forward_backward"] > 0
    # on a CPU nothing is scaled, and the planner's line is not printed as a measurement
    assert r["mi250x"]["compression_s"] is None and r["planner"]["line"] is None
    assert r["planner"]["quant_rate_here"] > 0
