"""The tick mode ([Note: ticks] in comm/tick/plan.py) on 8 real gloo ranks (2 nodes x 2 GPUs x 2
GCDs, a permuted rank map) without DeepSpeed: every preset and compression, unchunked and in
chunks, gives bit for bit the values, kept copies and per-tier bytes of today's hop-by-hop
gathers and reduce-scatters (the project's executor on its lanes, the hop groups' own
collectives), while every transfer goes through one process group in one grouped call per tick,
issued from one host thread, with no hop collective at all; each rank's transfers are the
schedule's (tick, peer, bytes), and the schedule is agreed at start-up. Hops run both ways,
every member at once ("direct") and in log steps ("log": [Note: log-step hops] in
comm/tick/plan.py), on the 2 x 2 x 2 shape (where zero3's and zeropp's world hops are groups of
8) and on 8 nodes x 1 GPU x 1 GCD and 8 x 1 x 2 (16 ranks; a node group of 8, frontier's shape
beyond two nodes)."""

from zeropp_hier.launch.world import SharedWorld

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
STEPS = ("direct", "log")


def _check_parity(results, chunk_counts):
    for rank, r in enumerate(results):
        assert r["deepspeed_loaded"] == [], f"rank {rank}: the drivers must not need DeepSpeed"
        assert r["agreed"], f"rank {rank}: no schedule digest"
        for name, per_chunks in r["cases"].items():
            assert sorted(per_chunks) == sorted((s, c) for s in STEPS for c in chunk_counts), name
            for (steps, chunks), c in per_chunks.items():
                what = f"rank {rank} {name} steps={steps} chunks={chunks}"
                for part in ("forward", "backward", "reduce"):
                    assert c[part]["values"], f"{what}: {part} values differ from hop by hop"
                    assert c[part]["bytes"] == c[part]["ref_bytes"], (
                        what,
                        part,
                        c[part]["bytes"],
                        c[part]["ref_bytes"],
                    )
                    if c[part]["sub_hops"]:  # zeropp's backward at 8 x 1 x 1 has no hop
                        assert any(c[part]["bytes"].values()), f"{what}: {part} moved nothing"
                    sent, counted = sum(c[part]["sent"].values()), sum(c[part]["bytes"].values())
                    if steps == "log" and part == "reduce":
                        # a log-step all-to-all forwards blocks: more on the wire, never less
                        assert sent >= counted, (what, c[part]["sent"], c[part]["bytes"])
                    elif steps == "log" and not name.startswith("frontier"):
                        # a log-step gather over a group spanning tiers (zero3's and zeropp's world
                        # hop) sends the same bytes, but its ring of offsets wraps across tiers:
                        # the same total, not the same per tier ([Note: log-step hops])
                        assert sent == counted, (what, part, c[part]["sent"], c[part]["bytes"])
                    else:
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
                # a tick is one grouped call at this size, within the bound ([Note: bounded calls])
                assert c["calls"]["batches"] == c["calls"]["ticks"], (what, c["calls"])
                assert 0 < c["calls"]["most_ops"] <= 64, (what, c["calls"])
                if chunks > 1:
                    # several hops (or log steps) of different chunks in one tick share a call
                    if c["calls"]["sub_hops"] > 1:
                        assert c["calls"]["most_hops_in_a_tick"] > 1, (what, c["calls"])


def test_ticks_are_bit_identical_to_hop_by_hop_on_one_group_and_one_thread(bare8):
    _check_parity(bare8.run(ranks_ticks.parity_run, CASES, ranks_ticks.RANK_MAP, (1, 3, 8), STEPS), (1, 3, 8))


def test_log_step_and_direct_hops_on_a_node_group_of_8(bare8):
    """8 nodes x 1 GPU x 1 GCD: frontier's node hop and zeropp's world hop over 8 members, log
    steps (3 per hop) against direct against hop by hop, bit for bit."""
    cases = {k: CASES[k] for k in ("zeropp/int8", "frontier/default", "frontier/int4-node", "frontier/none")}
    results = bare8.run(ranks_ticks.parity_run, cases, ranks_ticks.RANK_MAP, (1, 3, 8), STEPS, (1, 1))
    _check_parity(results, (1, 3, 8))


def test_pieces_submitted_together_run_as_one_tick_stream_bit_for_bit(bare8):
    """[Note: one tick stream per call] in comm/tick/executor.py: three gathers inside ``fused()`` run as
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
        # the rank whose inputs differ from the majority's, and only it ([Note: tick agreement])
        assert r["failed"] == [odd], (rank, r["failed"])


def test_log_step_and_direct_hops_on_8_nodes_of_2_gcds():
    """8 nodes x 1 GPU x 2 GCDs, 16 gloo ranks under a permuted rank map: frontier's node hop
    over 8 members beside its gcd hop, and zeropp's world hop of 16, in log steps and direct,
    bit for bit the hop-by-hop values, kept copies and bytes."""
    cases = {k: CASES[k] for k in ("zeropp/int8", "frontier/default", "frontier/none")}
    rank_map = [(5 * r + 3) % 16 for r in range(16)]
    world = SharedWorld(16, timeout=900, with_deepspeed=False)
    try:
        results = world.run(ranks_ticks.parity_run, cases, rank_map, (1, 3, 8), STEPS, (1, 2))
    finally:
        world.close()
    assert len(results) == 16
    _check_parity(results, (1, 3, 8))
