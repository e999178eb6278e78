"""The gradient-bucket flush that runs the stages beside backward (``HierZeroOptimizer_Stage3.
__reduce_and_partition_ipg_grads``) keeps what DeepSpeed 0.19's own flush checks and guards
([Note: bucket flush against DeepSpeed] in deepspeed/stage3.py), on 4 real ranks with
real engines:
- a gradient whose size is not its parameter's, and a parameter twice in one bucket, are
  refused with an error naming the parameter, before anything is sent;
- DeepSpeed's ``enable_sanity_checks`` still runs its cross-rank check of every bucket (after
  the executor drained) and training is unchanged by it.
"""

from zeropp_hier.app.spec import ds_config

from ..helpers import assert_losses_close


def _cfg(sanity: bool = False) -> dict:
    cfg = ds_config("frontier", gpus_per_node=1, gcds_per_gpu=2)
    cfg["zeropp_hier"]["overlap"] = True  # the override's own path (overlap off runs DeepSpeed's)
    cfg["zero_optimization"]["reduce_bucket_size"] = 8000  # several buckets per backward
    if sanity:
        cfg["zero_optimization"]["enable_sanity_checks"] = True
    return cfg


def refused_buckets(cfg: dict) -> dict:
    import torch

    from zeropp_hier.app import run as app_run

    engine = app_run.build_engine(cfg)
    app_run.train_steps(engine, 1)
    opt = engine.optimizer
    flush = opt._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads
    dtype = next(iter(opt.ipg_buckets))
    bucket = opt.ipg_buckets[dtype]
    named = list(engine.module.named_parameters())
    (name_p, p), (name_q, q) = named[0], named[1]
    out = {"empty_before": not bucket.params, "names": [name_p, name_q]}
    submitted = engine.hier_runtime.executor.outstanding
    # a parameter twice: its gradient would be reduced and added twice
    p.data = torch.zeros(p.ds_shape)
    p.grad = torch.zeros(p.ds_shape)
    bucket.params[:] = [p, p]
    try:
        flush(dtype)
        out["twice"] = None
    except RuntimeError as e:
        out["twice"] = str(e)
    # a gradient that does not match its parameter
    q.data = torch.zeros(3)
    q.grad = torch.zeros(3)
    bucket.params[:] = [q]
    try:
        flush(dtype)
        out["size"] = None
    except RuntimeError as e:
        out["size"] = str(e)
    out["nothing_submitted"] = engine.hier_runtime.executor.outstanding == submitted
    bucket.params.clear()
    engine.hier_runtime.close()  # the engine's weights were spoiled on purpose: no destroy
    return out


def test_bucket_flush_refuses_a_repeated_parameter_and_a_mismatched_gradient(world4):
    for rank, r in enumerate(world4.run(refused_buckets, _cfg())):
        name_p, name_q = r["names"]
        assert r["empty_before"], rank
        assert r["twice"] is not None and name_p in r["twice"] and "twice" in r["twice"], r["twice"]
        assert r["size"] is not None and name_q in r["size"] and "3 elements" in r["size"], r["size"]
        assert r["nothing_submitted"], rank


def sanity_run(cfgs: dict, steps: int) -> dict:
    import deepspeed.runtime.zero.stage3 as ds_stage3

    from zeropp_hier.app import run as app_run

    real = ds_stage3.assert_ints_same_as_other_ranks
    calls: list = []

    def counted(ints):
        calls.append(list(ints))
        return real(ints)

    out = {}
    ds_stage3.assert_ints_same_as_other_ranks = counted
    try:
        for name, cfg in cfgs.items():
            calls.clear()
            engine = app_run.build_engine(cfg)
            losses = app_run.train_steps(engine, steps)
            out[name] = {
                "losses": losses,
                "checked_buckets": len(calls),
                "overlapped": engine.optimizer.buckets_overlapped,
            }
            app_run.release(engine)
    finally:
        ds_stage3.assert_ints_same_as_other_ranks = real
    return out


def test_sanity_checks_still_run_and_change_nothing(world4):
    for rank, r in enumerate(world4.run(sanity_run, {"plain": _cfg(), "sanity": _cfg(sanity=True)}, 2)):
        assert r["plain"]["checked_buckets"] == 0
        # every bucket of both backwards was checked across ranks (several per backward)
        assert r["sanity"]["checked_buckets"] >= 4, r["sanity"]
        assert r["sanity"]["overlapped"] >= 1, r["sanity"]  # still the overlapped path
        assert_losses_close(r["sanity"]["losses"], r["plain"]["losses"], 0.0, f"rank {rank}")
