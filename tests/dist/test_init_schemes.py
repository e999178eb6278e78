"""GPT-NeoX's init schemes on a model partitioned while it is built (app/model/init_schemes.py): each
weight is drawn whole on rank 0 and scattered, so 4 ranks under the hierarchy hold exactly the
weights one process draws for the same seed (tests/unit/test_init_schemes.py checks their
statistics against the formulas)."""

from zeropp_hier.app.spec import ModelSpec, ds_config

SPEC = ModelSpec(vocab_size=128, seq_len=16, hidden=64, heads=4, layers=3, intermediate=256)


def built_and_redrawn(spec, config):
    import deepspeed

    from zeropp_hier.app.model import init_schemes, models

    model = models.build(spec, config, seed=5)
    n = init_schemes.apply(model, spec.hidden, spec.layers, "small_init", "wang_init", seed=5)
    params = dict(model.named_parameters())
    partitioned = all(hasattr(p, "ds_id") for p in params.values())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        state = {k: p.detach().float().clone() for k, p in params.items()}
    return {"n": n, "partitioned": partitioned, "state": state}


def test_sharded_build_draws_the_weights_one_process_draws(world4):
    from zeropp_hier.app.model import init_schemes, models

    cfg = ds_config("frontier", gpus_per_node=1, gcds_per_gpu=2)
    whole = models.build(SPEC, {"zero_optimization": {"stage": 0}}, seed=5)
    init_schemes.apply(whole, SPEC.hidden, SPEC.layers, "small_init", "wang_init", seed=5)
    want = {k: p.detach().float() for k, p in whole.named_parameters()}
    for rank, r in enumerate(world4.run(built_and_redrawn, SPEC, cfg)):
        assert r["partitioned"] and r["n"] == 2 + 4 * SPEC.layers
        for k, t in want.items():
            assert bool((r["state"][k] == t).all()), (rank, k)
