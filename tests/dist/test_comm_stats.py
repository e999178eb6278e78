"""Bytes per tier from ``comm_stats`` on 2x2x2: where the frontier preset's traffic goes."""

import pytest

from zeropp_hier.app.spec import ds_config
from zeropp_hier.core.layout import aligned

from . import ranks_training

STEPS = 3
N, B = 2, 256  # nodes, default block size


@pytest.fixture(scope="module")
def frontier_run(world8):
    cfgs = {
        "frontier": ds_config("frontier"),
        "frontier_fp32": ds_config("frontier", compression="none"),
        "zero3": ds_config("zero3"),
    }
    res = world8.run(ranks_training.run_configs, cfgs, STEPS)
    sizes = world8.run(ranks_training.partition_sizes, ds_config("frontier"))[0]["partition_sizes"]
    return res, sizes


def test_backward_gather_never_leaves_the_node(frontier_run):
    res, _ = frontier_run
    for r in res:
        b, c = r["frontier"]["stats"]["bytes"], r["frontier"]["stats"]["calls"]
        assert c["backward_gather"]["gcd"] > 0, "no backward gather happened: the test proves nothing"
        assert b["backward_gather"]["node"] == 0
        assert b["backward_gather"]["gpu"] == 0
        assert b["backward_gather"]["gcd"] > 0


def test_forward_node_bytes_at_most_int8_share(frontier_run):
    res, sizes = frontier_run
    share = sum(sizes)  # elements of this rank's primary shard, whole model
    for r in res:
        st = r["frontier"]["stats"]
        calls = st["calls"]["forward_gather"]["node"]
        assert calls > 0
        # each gather sends the int8 payload of its bucket to the N-1 peers on other nodes, once
        # per step: every partition in a slot of whole blocks (blocks never straddle tensors),
        # one fp32 scale per block; the slot's padding stays off the wire ([Note: padding stays
        # off the wire]): one byte per element that holds a value
        per_step = sum(sizes) + 4 * sum(aligned(n, B) for n in sizes) / B
        assert st["bytes"]["forward_gather"]["node"] == STEPS * (N - 1) * per_step
        # the uncompressed run sends fp32
        exact = r["frontier_fp32"]["stats"]["bytes"]["forward_gather"]["node"]
        assert exact == STEPS * (N - 1) * share * 4
        # less than fp32, though not by 4x: in this tiny model most tensors are smaller than a
        # block per rank, and each takes a whole one (a large model's padding is negligible)
        assert st["bytes"]["forward_gather"]["node"] < exact


def test_later_gather_hops_carry_the_int8_rows(frontier_run):
    """[Note: quantize once per gather]: the gpu and gcd hops of the forward gather, and the
    backward's gcd hop, move the node hop's int8 rows (not decoded bf16/fp32 values), and the
    kept copies are those rows."""
    res, sizes = frontier_run
    P = G = 2
    for r in res:
        b = r["frontier"]["stats"]["bytes"]
        node = b["forward_gather"]["node"]
        assert node > 0
        row = node / (N - 1)  # this rank's encoded rows per run (one per gather)
        # after the node hop a rank holds N rows and sends them to its P-1 package peers; after
        # the gpu hop N*P rows to its G-1 package partner
        assert b["forward_gather"]["gpu"] == row * N * (P - 1)
        # (at least: a weight used twice in one forward, the tied embedding, is gathered again
        # from its kept copy, a gcd hop of its own)
        assert b["forward_gather"]["gcd"] >= row * N * P * (G - 1)
        # decoded, the same rows would be 4 bytes per element (fp32 training) instead of 1 + 4/B
        decoded = row / (1 + 4 / B) * 4
        assert b["forward_gather"]["gcd"] < decoded * N * P * (G - 1)
        # the backward sends this rank's kept copies, int8 rows, to its package partner: the
        # bytes the copies hold (the copies of the whole model, each gathered once), less their
        # slots' padding, which stays off the wire (N * P rows of one byte per padded element)
        kept = r["frontier"]["stats"]["kept_bytes_peak"]
        padding = N * P * sum(aligned(n, B) - n for n in sizes)
        # (against the fp32 run's unpadded copies: this tiny model's tensors are mostly smaller
        # than a block per rank, so padding eats most of int8's 4x here)
        assert 0 < kept < r["frontier_fp32"]["stats"]["kept_bytes_peak"] / 1.5
        assert padding > 0 and b["backward_gather"]["gcd"] == STEPS * (kept - padding)


def test_gradient_node_bytes_at_most_int8(frontier_run):
    res, sizes = frontier_run
    for r in res:
        st = r["frontier"]["stats"]
        calls = st["calls"]["grad_reduce"]["node"]
        assert calls > 0
        width = sum(aligned(n, B) for n in sizes)  # row width per step: chunks in whole blocks
        bound = STEPS * (N - 1) * (width + 4 * width / B)  # int8 rows and one fp32 scale per block
        assert 0 < st["bytes"]["grad_reduce"]["node"] <= bound
        exact = r["frontier_fp32"]["stats"]["bytes"]["grad_reduce"]["node"]
        # int8 against fp32: 4x fewer bits, less the whole-block slots of this tiny model's
        # small tensors (see above)
        assert st["bytes"]["grad_reduce"]["node"] < exact / 2


def test_frontier_moves_traffic_off_the_network(frontier_run):
    res, _ = frontier_run
    for r in res:
        z = r["zero3"]["stats"]["bytes"]
        f = r["frontier_fp32"]["stats"]["bytes"]
        total = lambda s, tier: sum(s[p][tier] for p in s)  # noqa: E731
        # hop by hop, the node tier carries 1/4 of what a flat 8-rank gather puts on it
        assert total(f, "node") * 3 < total(z, "node")


def test_link_view_counts_the_flat_gather_as_gloos_ring(frontier_run):
    """[Note: bytes per link]: zero3's flat gather over 8 ranks is gloo's ring in rank order, so
    only ranks 3 and 7 (whose next rank is on the other node) put it on a node link, each all
    7 shards it forwards; the payload view counts 4 shards per rank there. frontier's hops span
    two ranks each, where a ring and a direct exchange send the same."""
    res, _ = frontier_run
    for rank, r in enumerate(res):
        z = r["zero3"]["stats"]
        payload, link = z["bytes"]["forward_gather"], z["link_bytes"]["forward_gather"]
        assert payload["node"] > 0 and payload["node"] % 4 == 0
        shard = payload["node"] // 4
        crosses = rank in (3, 7)
        assert link["node"] == (7 * shard if crosses else 0), rank
        assert link["gpu"] == (0 if crosses or rank % 2 == 0 else 7 * shard), rank
        assert link["gcd"] == (7 * shard if rank % 2 == 0 else 0), rank
        f = r["frontier"]["stats"]
        assert f["link_bytes"] == f["bytes"], rank
