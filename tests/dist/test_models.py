"""The job's models are built sharded: no rank ever holds the whole model (measured)."""

from zeropp_hier.app.spec import ModelSpec, ds_config

from . import ranks_models

# ~101M parameters (385 MiB of fp32) in many narrow blocks (56 x 384): one rank's shards are 1/8
# of the whole; what it holds beyond them while building is the largest module gathered for its
# initialisation (one MLP, 4.5 MiB) and the buffers of the hierarchical gather of it, so small
# modules keep that part small. A 2048-token vocabulary keeps the embedding from being the
# largest module by far.
SPEC = ModelSpec(vocab_size=2048, seq_len=16, hidden=384, heads=6, layers=56, intermediate=1536)


def test_no_rank_holds_the_whole_model_while_building_it(world8):
    # Building is what this measures. Models built this way train, as stock DeepSpeed's do, in
    # tests/dist/test_bench_ranks.py and test_activation_checkpointing.py (the same builder,
    # small models): a step of this one would add two minutes of gathers here and no code path.
    cfg = ds_config("frontier", micro_batch=1)
    results = world8.run(ranks_models.build_peak, SPEC, cfg)
    full = results[0]["full_fp32_bytes"]
    print(
        "peak MiB per rank while building:",
        [round(r["peak_delta_bytes"] / 2**20) for r in results],
        f"model {full / 2**20:.0f} MiB fp32",
    )
    assert full >= 4 * 100e6  # the ratio is about a model of some size: > 100M parameters
    for rank, r in enumerate(results):
        assert r["full_fp32_bytes"] == full
        assert r["local_numel"] == 0, f"rank {rank} holds full parameters after building"
        assert r["peak_delta_bytes"] >= r["shard_bytes"] > 0  # the measurement sees the shards
        ratio = full / r["peak_delta_bytes"]
        assert ratio >= 4, (
            f"rank {rank}: peak resident growth while building {r['peak_delta_bytes'] / 2**20:.0f} MiB, "
            f"model {full / 2**20:.0f} MiB fp32 (ratio {ratio:.2f} < 4)"
        )
