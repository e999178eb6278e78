"""Quantization blocks never straddle tensors: a small tensor gathered beside a large one keeps
the precision of its own scale ([Note: blocks never straddle] in core/layout.py). 4 real ranks,
2 nodes x 1 GPU x 2 GCDs: the node hop of the gather is quantized."""

import pytest

from zeropp_hier.app.spec import ds_config

BITS = {"int8": 8, "int4": 4}


def gathered_beside_a_large_tensor(cfg):
    import deepspeed
    import torch

    import zeropp_hier

    torch.manual_seed(0)
    # one module, so weight and bias are gathered in one bucket; 250 x 250 / 4 ranks is not a
    # whole number of blocks, so without alignment the bias would start inside a weight block
    lin = torch.nn.Linear(250, 250)
    with torch.no_grad():
        lin.weight.normal_(0.0, 0.02)
        lin.bias.normal_(0.0, 0.002)  # ten times smaller, as biases beside Linear weights are
    exact = {n: p.detach().clone() for n, p in lin.named_parameters()}
    engine, *_ = zeropp_hier.initialize(model=lin, model_parameters=lin.parameters(), config=cfg)
    m = engine.module
    got = {}
    # registered after DeepSpeed's own pre-forward hook, which has gathered the weights by then
    m.register_forward_pre_hook(
        lambda mod, inp: got.update(weight=mod.weight.detach().clone(), bias=mod.bias.detach().clone())
    )
    engine(torch.randn(2, 250))  # the forward gather: through the quantized node hop
    stats = zeropp_hier.comm_stats(engine)["bytes"]
    with deepspeed.zero.GatheredParameters([m.weight, m.bias]):  # outside the step: exact
        gathered = {"weight": m.weight.detach().clone(), "bias": m.bias.detach().clone()}
    engine.destroy()
    return {
        n: {"err": float((got[n] - exact[n]).abs().max()), "absmax": float(exact[n].abs().max())} for n in exact
    } | {
        "node_bytes": stats["forward_gather"]["node"],
        "gathered_exact": all(torch.equal(gathered[n], exact[n]) for n in exact),
    }


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_small_tensor_keeps_its_own_precision_beside_a_large_one(world4, scheme):
    cfg = ds_config(
        "frontier", gpus_per_node=1, gcds_per_gpu=2, compression={"weights": {"node": scheme}, "gradients": "none"}
    )
    for r in world4.run(gathered_beside_a_large_tensor, cfg):
        assert r["node_bytes"] > 0  # the gather did cross the quantized node hop
        assert r["gathered_exact"]  # GatheredParameters hands out the exact weights
        qmax = 2 ** (BITS[scheme] - 1) - 1
        for name in ("weight", "bias"):
            e = r[name]
            # round to nearest with the block's own scale (absmax / qmax): error <= half a step
            # of a scale no larger than the tensor's own absmax. Had the bias shared a block with
            # the weight, its step would be set by the weight's ten-times-larger values.
            assert 0 < e["err"] <= e["absmax"] / qmax / 2 * 1.001, (name, e)


def test_a_gather_quantizes_once(world4):
    """[Note: quantize once per gather]: after the int8 node hop, the gcd hop (asked for int4)
    carries the int8 rows as they are, so the weights keep int8 precision; re-quantized to int4
    they would err by up to eight times more."""
    cfg = ds_config(
        "frontier",
        gpus_per_node=1,
        gcds_per_gpu=2,
        compression={"weights": {"node": "int8", "gcd": "int4"}, "gradients": "none"},
    )
    for r in world4.run(gathered_beside_a_large_tensor, cfg):
        assert r["gathered_exact"]
        for name in ("weight", "bias"):
            e = r[name]
            assert 0 < e["err"] <= e["absmax"] / 127 / 2 * 1.001, (name, e)
