"""The hot path of the hierarchy, on 4 real ranks (2 nodes x 1 GPU x 2 GCDs, a permuted rank
map so that every permutation is exercised, frontier's default compression, telemetry sampling
every call):
- no host synchronisation and no tensor made from host data inside a gather or a reduce stage
  ([Note: no host traffic in the hot path] in core/layout.py), counted op by op;
- with DeepSpeed's prefetch on, gathers are issued ahead of use (several in flight at once),
  a prefetch of several layers runs as a job per layer and DeepSpeed waits for one layer while
  the later ones stay in flight ([Note: a job per layer] in deepspeed/inflight.py), and a
  backward window holds the later layers back so that gradient buckets go first ([Note:
  backward window]),
  gradient buckets are reduced while backward goes on ([Note: gradient stages beside backward]),
  and the result still equals the inline run, prefetch off ([Note: one order of hop collectives]).
"""

from zeropp_hier.app.spec import ds_config

from ..helpers import assert_losses_close

RANK_MAP = [2, 0, 3, 1]
# ops that make the host wait for the device (.item(), float(), bool(), nonzero) or build a tensor
# from host data (torch.tensor(list)); on a GPU each is a sync or a host-to-device copy
HOST_OPS = ("_local_scalar_dense", "item", "is_nonzero", "nonzero", "lift_fresh", "lift_fresh_copy", "tensor")


def _cfg(prefetch: bool, overlap: bool | str = True, layers: int = 1, backward_ahead: int | None = None) -> dict:
    cfg = ds_config("frontier", gpus_per_node=1, gcds_per_gpu=2, regather=not prefetch)
    if backward_ahead is not None:  # [Note: backward window]
        cfg["zeropp_hier"]["pipeline"] = {"backward_layers_ahead": backward_ahead}
    cfg["zeropp_hier"]["topology"]["rank_map"] = RANK_MAP
    cfg["zeropp_hier"]["numerics"] = {"sample_every": 1}
    cfg["zeropp_hier"]["overlap"] = overlap
    if prefetch:  # a bucket of about ``layers`` layers; release after use so backward gathers again
        cfg["zero_optimization"].update(stage3_prefetch_bucket_size=8000 * layers, stage3_max_reuse_distance=0)
    # gradient buckets of about one layer, so that backward fills several
    cfg["zero_optimization"]["reduce_bucket_size"] = 8000
    return cfg


def hot_path_run(cfgs: dict, steps: int, model_cfg=None) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from zeropp_hier.app import run as app_run
    from zeropp_hier.comm import reduce as comm_reduce
    from zeropp_hier.deepspeed import inflight

    class HostOps(TorchDispatchMode):
        def __init__(self, seen: list):
            super().__init__()
            self.seen = seen

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in HOST_OPS:
                self.seen.append(name)
            if name == "_to_copy":
                src = args[0].device
                dst = (kwargs or {}).get("device") or src
                if torch.device(dst) != src:
                    self.seen.append(f"_to_copy {src}->{dst}")
            return func(*args, **(kwargs or {}))

    out = {}
    for name, cfg in cfgs.items():
        engine = app_run.build_engine(cfg) if model_cfg is None else app_run.build_engine(cfg, model_cfg)
        rt = engine.hier_runtime
        seen: list = []
        # layer waits that returned with later layers of the same handle still in flight
        early = {"waits": 0, "layers_per_handle": 0}
        layer_wait = inflight.LayerWait.wait

        def watched_wait(self, handle_dependency=True):
            layer_wait(self, handle_dependency)
            early["layers_per_handle"] = max(early["layers_per_handle"], len(self.handle.layers))
            early["waits"] += self.handle.taken < len(self.handle.layers)

        calls = {"gather": 0, "reduce": 0, "submit": 0, "submit_past_held": 0}

        def past_held(fn):  # a gradient bucket submitted while the backward window held gathers
            def run(*a, **k):
                calls["submit_past_held"] += bool(rt.window.held)
                return fn(*a, **k)

            return run

        def counted(fn, kind):
            def run(*a, **k):
                calls[kind] += 1
                return fn(*a, **k)

            return run

        def watched(fn):
            def run(*a, **k):
                with HostOps(seen):  # on the thread that runs it
                    return fn(*a, **k)

            return run

        # the jobs (generators: their work runs in the executor's lanes, each step of a job
        # inside ``_step``, on the lane's thread; inline, inside ``submit``), and the caller's
        # part of a reduce; the reduce driver's functions are module attributes, put back after
        rt._gather_bucket = counted(rt._gather_bucket, "gather")
        rt.executor._step = watched(rt.executor._step)
        rt.executor.submit = watched(rt.executor.submit)
        saved = (comm_reduce.reduce_rows, comm_reduce.submit_reduce_scatter)
        comm_reduce.reduce_rows = counted(comm_reduce.reduce_rows, "reduce")
        comm_reduce.submit_reduce_scatter = watched(past_held(counted(comm_reduce.submit_reduce_scatter, "submit")))
        inflight.LayerWait.wait = watched_wait
        try:
            losses = app_run.train_steps(engine, steps)
        finally:
            comm_reduce.reduce_rows, comm_reduce.submit_reduce_scatter = saved
            inflight.LayerWait.wait = layer_wait
        out[name] = {
            "losses": losses,
            "host_ops": sorted(set(seen)),
            "calls": calls,
            "max_outstanding": rt.executor.max_outstanding,
            "early": early,
            "lanes_busy": rt.executor.max_lanes_busy,
            "buckets_overlapped": engine.optimizer.buckets_overlapped,
            "backward_gather_bytes": sum(
                __import__("zeropp_hier").comm_stats(engine)["bytes"]["backward_gather"].values()
            ),
            "samples": sum(
                e["samples"]
                for t in __import__("zeropp_hier").comm_stats(engine)["numerics"]["relative_error"].values()
                for e in t.values()
            ),
        }
        app_run.release(engine)
    return out


def test_no_host_traffic_in_gathers_and_reduce_stages_and_prefetch_overlaps(world4):
    cfgs = {
        "prefetch": _cfg(prefetch=True),
        "deep": _cfg(prefetch=True, layers=3),
        "one_lane": _cfg(prefetch=True, overlap="one_lane"),
        "inline": _cfg(prefetch=False, overlap=False),
    }
    for rank, r in enumerate(world4.run(hot_path_run, cfgs, 3)):
        for name, run in r.items():
            assert run["calls"]["gather"] > 0 and run["calls"]["reduce"] > 0, name
            assert run["samples"] > 0, "telemetry sampled nothing: the test proves less than it says"
            assert run["host_ops"] == [], f"rank {rank} {name}: host traffic in the hot path: {run['host_ops']}"
        # prefetch issued gathers ahead of use; inline, one at a time
        assert r["prefetch"]["max_outstanding"] >= 2, r["prefetch"]["max_outstanding"]
        assert r["inline"]["max_outstanding"] == 1
        # gradient buckets: each but the last reduced beside the next one's backward
        # ([Note: gradient stages beside backward]); inline, none
        assert r["prefetch"]["buckets_overlapped"] >= 2, r["prefetch"]["buckets_overlapped"]
        assert r["inline"]["buckets_overlapped"] == 0
        # same training either way: overlap reorders nothing that matters
        assert_losses_close(r["prefetch"]["losses"], r["inline"]["losses"], 1e-6, f"rank {rank}")
        assert_losses_close(r["one_lane"]["losses"], r["inline"]["losses"], 1e-6, f"rank {rank}")
        assert_losses_close(r["deep"]["losses"], r["inline"]["losses"], 1e-6, f"rank {rank}")
        # a deep prefetch: one DeepSpeed fetch held several layers, each its own job, and
        # DeepSpeed took a layer while later ones of the same fetch were still in flight
        assert r["deep"]["early"]["layers_per_handle"] >= 2, r["deep"]["early"]
        assert r["deep"]["early"]["waits"] >= 1, r["deep"]["early"]
        assert r["one_lane"]["lanes_busy"] == 1  # one lane: never two collectives at once


def test_backward_window_submits_gradient_buckets_before_later_layers_gathers(world4):
    """[Note: backward window]: six blocks, a prefetch of about three and as many parameters live,
    so that backward gathers again once DeepSpeed's trace is complete (without the live limit its
    prefetch runs on into the backward's part of the trace and keeps every layer gathered)."""
    from zeropp_hier.app.model.gpt import GPTConfig

    cfgs = {"deep": _cfg(prefetch=True, layers=3), "window": _cfg(prefetch=True, layers=3, backward_ahead=1)}
    for cfg in cfgs.values():  # as the benchmark: at most the prefetch live, or nothing is released
        cfg["zero_optimization"]["stage3_max_live_parameters"] = 24000
    for rank, r in enumerate(world4.run(hot_path_run, cfgs, 3, GPTConfig(n_layers=6))):
        for name, run in r.items():
            assert run["backward_gather_bytes"] > 0, (name, "backward never gathered: nothing to hold")
            assert run["host_ops"] == [], f"rank {rank} {name}: host traffic in the hot path: {run['host_ops']}"
        # DeepSpeed's prefetch alone submits every gather it asks for at once; with the window,
        # gradient buckets were submitted while later layers' gathers were held back
        assert r["deep"]["calls"]["submit_past_held"] == 0
        assert r["window"]["calls"]["submit_past_held"] >= 1, r["window"]["calls"]
        # the order of the lanes' collectives changed, not what they compute
        assert_losses_close(r["window"]["losses"], r["deep"]["losses"], 1e-6, f"rank {rank}")
