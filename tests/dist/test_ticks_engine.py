"""The tick mode ([Note: ticks] in comm/tick/plan.py) in a full DeepSpeed engine on 8 real gloo
ranks (2 nodes x 2 GPUs x 2 GCDs): the same losses, weights and bytes as the hop-by-hop mode a
GPU runs today ("one_lane") with the same chunks, every hop transfer through the one tick group
from one thread, none on the training thread; and a rank killed in the middle of a tick ends
every rank with a named HierCommError within the collective timeout."""

from zeropp_hier.app.spec import ds_config
from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS

from . import ranks_ticks
from .test_failures import BOUND_S, broken_world, parse_error, processes_of

STEPS = 3
TIMEOUT_S = 5.0


# DeepSpeed's prefetch handing each gather call several layers (backward still re-gathers):
# the layers of one call run as one tick stream ([Note: one tick stream per call] in comm/tick/executor.py)
PREFETCH = {"stage3_prefetch_bucket_size": 10**7, "stage3_max_live_parameters": 10**7}
PAIRS = {"frontier": ("frontier", None, 3, False), "zeropp": ("zeropp", "int8", 1, False)}
PAIRS["frontier/prefetch"] = ("frontier", None, 3, True)
# the tick mode's hops in log steps ([Note: log-step hops] in comm/tick/plan.py): zeropp's world
# hop of 8 ranks gathers in 3 steps, its exchange too
PAIRS["zeropp/log"] = ("zeropp", "int8", 3, False)
HOP_STEPS = {"zeropp/log": "log"}
# overlap "gpu" (true as NCCL/RCCL resolve it) with the chunks left out: frontier, every hop
# within one tier, runs ticks in the tick mode's chunks; zeropp, whose flat hops ticks would
# send to every member, runs one lane unchunked ([Note: one issuing thread on GPUs])
GPU_DEFAULT = {"frontier": ("ticks", DEFAULT_TICK_CHUNKS), "zeropp": ("one_lane", 1)}


def _configs() -> dict:
    out = {}
    for pair, (preset, compression, chunks, prefetch) in PAIRS.items():
        for mode in ("one_lane", "ticks"):
            cfg = ds_config(preset) if compression is None else ds_config(preset, compression=compression)
            cfg["zeropp_hier"]["overlap"] = mode
            cfg["zeropp_hier"]["pipeline"] = {"chunks": chunks, "hop_steps": HOP_STEPS.get(pair, "auto")}
            if prefetch:
                cfg["zero_optimization"].update(PREFETCH)
            out[f"{pair}/{mode}"] = cfg
    for preset in GPU_DEFAULT:
        cfg = ds_config(preset)
        cfg["zeropp_hier"]["overlap"] = "gpu"
        out[f"{preset}/gpu"] = cfg
    return out


def test_ticks_train_like_the_gpu_mode_through_one_group_and_one_thread(world8):
    for rank, res in enumerate(world8.run(ranks_ticks.engine_run, _configs(), STEPS)):
        for pair, (_, _, _, prefetch) in PAIRS.items():
            ref, got = res[f"{pair}/one_lane"], res[f"{pair}/ticks"]
            what = f"rank {rank} {pair}"
            assert (ref["mode"], got["mode"]) == ("one_lane", "ticks"), what
            # bit for bit: the same values moved, the same sums, the same optimizer steps
            assert got["losses"] == ref["losses"], (what, got["losses"], ref["losses"])
            for name, t in ref["state"].items():
                assert bool((got["state"][name] == t).all()), f"{what}: {name} differs"
            for phase in ("forward_gather", "backward_gather", "grad_reduce"):
                assert got["stats"]["bytes"][phase] == ref["stats"]["bytes"][phase], (what, phase)
            # the watch sees the hop collectives of the hop-by-hop mode, and none in ticks
            assert ref["calls"]["hop_collectives"] > 0 and ref["calls"]["batches"] == 0, (what, ref["calls"])
            c = got["calls"]
            assert c["hop_collectives"] == 0 and c["batches"] > 0, (what, c)
            assert c["groups"] == ["tick"] and c["threads"] == 1 and not c["training_thread"], (what, c)
            assert c["pending_at_issue"] == 0, (what, c)
            if prefetch:  # the layers of one gather call ran as one stream, the values above bit for bit
                assert 0 < got["streams"] < got["pieces"], (what, got["streams"], got["pieces"])
            else:  # a layer per call
                assert 0 < got["streams"] <= got["pieces"], (what, got["streams"], got["pieces"])
        for preset, mode_chunks in GPU_DEFAULT.items():
            got = res[f"{preset}/gpu"]
            assert (got["mode"], got["chunks"]) == mode_chunks, (rank, preset, got["mode"], got["chunks"])
            # the same values as the explicit modes, whatever the chunks
            ref = res[f"{preset}/one_lane"]
            if preset == "frontier":
                assert got["losses"] == ref["losses"], (rank, got["losses"], ref["losses"])
            assert (got["calls"]["batches"] > 0) == (mode_chunks[0] == "ticks"), (rank, preset, got["calls"])


def test_a_rank_killed_mid_tick_ends_every_rank_with_a_named_error():
    cfg = ds_config("frontier")
    cfg["zeropp_hier"].update(overlap="ticks", pipeline={"chunks": 3}, collective_timeout_s=TIMEOUT_S)
    victim = 5
    world, err = broken_world(8, ranks_ticks.die_mid_tick, cfg, victim, 40)
    assert "killed by SIGKILL" in err.failures[victim]
    assert err.killed == [], f"the launcher had to kill {err.killed}: a rank hung"
    for rank in range(8):
        assert err.exit_after_s[rank] <= BOUND_S, (rank, err.exit_after_s)
        if rank == victim:
            continue
        p = parse_error(err.failures[rank])
        assert p is not None, f"rank {rank} did not end with a HierCommError:\n{err.failures[rank]}"
        assert p["rank"] == rank and p["tier"] in ("gcd", "gpu", "node"), p
    assert processes_of(world) == [], "a process of the failed world is still running"
