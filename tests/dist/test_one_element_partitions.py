"""A tensor no larger than the world (one element per rank) gathers to a contiguous tensor beside
others in its bucket, so ``GatheredParameters(modifier_rank=...)`` can broadcast it: DeepSpeed
views each parameter as bytes there, which a strided tensor refuses. transformers' weight
initialisation under ZeRO-3 does exactly that for every module, so at 9,408 nodes every
GPT-NeoX-20B LayerNorm and bias (6,144 elements, 75,264 ranks) would stop it. 4 real ranks
(gloo), 2 nodes x 1 GPU x 2 GCDs; the node hop of the forward gather is quantized (whole-block
slots), the gathers outside the step are exact (no padding)."""

from zeropp_hier.app.spec import ds_config


def set_on_rank0_and_gather(cfg):
    import deepspeed
    import torch

    import zeropp_hier

    torch.manual_seed(0)
    # weight and bias of 4 elements each, one module: one bucket, one element per rank each
    norm = torch.nn.LayerNorm(4)
    engine, *_ = zeropp_hier.initialize(model=norm, model_parameters=norm.parameters(), config=cfg)
    m = engine.module
    forward: dict[str, bool] = {}
    m.register_forward_pre_hook(
        lambda mod, inp: forward.update(w=mod.weight.is_contiguous(), b=mod.bias.is_contiguous())
    )
    engine(torch.randn(2, 4))  # the forward gather (quantized node hop: whole-block slots)
    rank = torch.distributed.get_rank()
    with deepspeed.zero.GatheredParameters([m.weight, m.bias], modifier_rank=0):  # outside the step
        inside = m.weight.is_contiguous() and m.bias.is_contiguous()
        if rank == 0:
            m.weight.data.copy_(torch.arange(4.0) + 1.0)
            m.bias.data.copy_(torch.arange(4.0) - 10.0)
    with deepspeed.zero.GatheredParameters([m.weight, m.bias]):
        after = {"w": m.weight.detach().tolist(), "b": m.bias.detach().tolist()}
    engine.destroy()
    return {"forward_contiguous": forward, "inside_contiguous": inside, "after": after}


def test_a_one_element_partition_gathers_contiguous_and_broadcasts(world4):
    cfg = ds_config("frontier", gpus_per_node=1, gcds_per_gpu=2)
    for r in world4.run(set_on_rank0_and_gather, cfg):
        assert r["forward_contiguous"] == {"w": True, "b": True}
        assert r["inside_contiguous"]
        # rank 0's values reached every rank through the broadcast and the re-partition
        assert r["after"] == {"w": [1.0, 2.0, 3.0, 4.0], "b": [-10.0, -9.0, -8.0, -7.0]}
