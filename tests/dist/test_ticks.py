"""The tick mode ([Note: ticks] in comm/tick_plan.py) on 8 real gloo ranks (2 nodes x 2 GPUs x 2
GCDs, a permuted rank map) without DeepSpeed: every preset and compression, unchunked and in
chunks, gives bit for bit the values, kept copies and per-tier bytes of today's hop-by-hop
gathers and reduce-scatters (the project's executor on its lanes, the hop groups' own
collectives), while every transfer goes through one process group in one grouped call per tick,
issued from one host thread, with no hop collective at all; each rank's transfers are the
schedule's (tick, peer, bytes), and the schedule is agreed at start-up."""

from . import ranks_ticks

CASES = {
    "zero3/none": ("zero3", "none"),
    "zeropp/none": ("zeropp", "none"),
    "zeropp/int8": ("zeropp", "int8"),
    "frontier/none": ("frontier", "none"),
    "frontier/int8": ("frontier", "int8"),
    "frontier/default": ("frontier", None),  # the preset's own per-tier compression
    "frontier/int4-node": ("frontier", {"weights": {"node": "int4"}, "gradients": {"node": "int4"}, "block_size": 64}),
}
CHUNKS = (1, 3)


def test_ticks_are_bit_identical_to_hop_by_hop_on_one_group_and_one_thread(bare8):
    results = bare8.run(ranks_ticks.parity_run, CASES, ranks_ticks.RANK_MAP, CHUNKS)
    for rank, r in enumerate(results):
        assert r["deepspeed_loaded"] == [], f"rank {rank}: the drivers must not need DeepSpeed"
        assert r["agreed"], f"rank {rank}: no schedule digest"
        for name, per_chunks in r["cases"].items():
            for chunks, c in per_chunks.items():
                what = f"rank {rank} {name} chunks={chunks}"
                for part in ("forward", "backward", "reduce"):
                    assert c[part]["values"], f"{what}: {part} values differ from hop by hop"
                    assert c[part]["bytes"] == c[part]["ref_bytes"], (
                        what,
                        part,
                        c[part]["bytes"],
                        c[part]["ref_bytes"],
                    )
                    assert any(c[part]["bytes"].values()), f"{what}: {part} moved nothing"
                    # every byte the tick transport sent is one the stats counted, tier by tier
                    assert c[part]["sent"] == c[part]["bytes"], (what, part, c[part]["sent"])
                    # and the link view counts those messages as sent ([Note: bytes per link])
                    assert c[part]["link_bytes"] == c[part]["sent"], (what, part, c[part]["link_bytes"])
                    # the (tick, peer) sequence is the pure schedule's
                    assert c[part]["sequence_ok"], (what, part, c[part]["sequence"][:6])
                assert c["forward"]["kept"], f"{what}: kept copies differ"
                # one grouped call per tick, on the tick group only, from one thread; no hop collective
                assert c["calls"]["groups"] == ["tick"], (what, c["calls"])
                assert c["calls"]["threads"] == 1, (what, c["calls"])
                assert c["calls"]["hop_collectives"] == 0, (what, c["calls"])
                assert c["calls"]["pending_at_issue"] == 0, (what, c["calls"])
                assert c["calls"]["batches"] == c["calls"]["ticks"], (what, c["calls"])
                if chunks > 1 and name.startswith("frontier"):
                    # several hops of different chunks in one tick: the tiers share a call
                    assert c["calls"]["most_hops_in_a_tick"] > 1, (what, c["calls"])


def test_pieces_submitted_together_run_as_one_tick_stream_bit_for_bit(bare8):
    """[Note: one tick stream per call] in comm/ticks.py: three gathers inside ``fused()`` run as
    one stream of ``3 C + H - 1`` ticks (not ``3 (C + H - 1)``), each gather's values and kept
    copies bit for bit the hop-by-hop ones, its future settled as its last chunk ends (before the
    stream's end), the (tick, peer) sequence the pure schedule's over all the chunks; gathers of
    other hops start a stream of their own."""
    count = 3
    cases = {k: CASES[k] for k in ("zeropp/int8", "frontier/default", "frontier/none")}
    results = bare8.run(ranks_ticks.stream_run, cases, ranks_ticks.RANK_MAP, CHUNKS, count)
    for rank, r in enumerate(results):
        for name, per_chunks in r.items():
            for chunks, c in per_chunks.items():
                what = f"rank {rank} {name} chunks={chunks}"
                assert c["held"], f"{what}: a piece ran before the context ended"
                assert c["streams"] == 1, (what, c["streams"])
                assert c["ticks"] == c["want_ticks"], (what, c["ticks"], c["want_ticks"])
                assert c["settled"] == c["want_settled"], (what, c["settled"], c["want_settled"])
                assert c["values"] and c["kept"], f"{what}: values or kept copies differ from hop by hop"
                assert c["sequence_ok"], what
                assert c["bytes"] == c["ref_bytes"] and any(c["bytes"].values()), (what, c["bytes"], c["ref_bytes"])
                if name.startswith("frontier"):  # the pieces' hops share ticks even unchunked
                    assert c["most_hops_in_a_tick"] > 1, (what, c["most_hops_in_a_tick"])
                # a different hop sequence starts a second stream (same values)
                assert c["split_values"], what
                assert c["split_streams"] == (1 if c["split_hops"][0] == c["split_hops"][1] else 2), (what, c)


def test_a_rank_with_another_tick_schedule_stops_every_rank_at_start_up(bare8):
    odd = 2
    results = bare8.run(ranks_ticks.disagree_run, ranks_ticks.RANK_MAP, odd)
    assert len({r["digest"] for r in results}) == 1  # the same schedule: one digest everywhere
    for rank, r in enumerate(results):
        # every rank stops, those that never exchange with the odd rank too
        assert r["error"] == "HierRankError", (rank, r)
        assert "tick schedule" in r["text"] and "pipeline.chunks" in r["text"], r["text"]
        # the ranks that found the difference: the odd rank and the members of its hop groups
        assert odd in r["failed"] and len(r["failed"]) > 1, (rank, r["failed"])
        assert set(r["failed"]) <= set(range(8)) and len(r["failed"]) < 8, (rank, r["failed"])
