"""Megatron / GPT-NeoX blends and splits of ``.bin``/``.idx`` pairs (zeropp_hier.app.data.blend and
.split): the split boundaries, the largest-deficit blending order (checked against a plain
transcription of Megatron's rule written here), each pair read in its split and its own shuffled
order, and refusals that name the field."""

import numpy as np
import pytest

from zeropp_hier.app.data import blend, indexed, split
from zeropp_hier.app.data.tokens import Loader, open_tokens
from zeropp_hier.core.errors import HierConfigError


def _pair(prefix, n_docs, length, first_id):
    """n_docs documents of ``length`` tokens; document k's tokens are all ``first_id + k`` so a
    sample names the document it came from."""
    docs = [[first_id + k] * length for k in range(n_docs)]
    indexed.write(str(prefix), docs, np.uint16)
    return str(prefix)


def test_split_bounds_follow_megatrons_rounding():
    assert split.parse_split("969,30,1") == pytest.approx([0.969, 0.030, 0.001])
    assert split.parse_split("8/2") == pytest.approx([0.8, 0.2, 0.0])
    assert split.split_bounds(split.parse_split("969,30,1"), 1000) == [0, 969, 999, 1000]
    # 37 documents at 949,50,1: round(35.11) = 35, round(1.85) = 2, round(0.037) = 0
    assert split.split_bounds(split.parse_split("949,50,1"), 37) == [0, 35, 37, 37]
    # rounding up in every part: the excess moves every boundary back so the last is n
    assert split.split_bounds(split.parse_split("1,1,1"), 8) == [0, 2, 5, 8]
    for bad in ("a,b", "1,-1,0", "0,0,0", "1,2,3,4"):
        with pytest.raises(HierConfigError, match="'data.split'.*969,30,1"):
            split.parse_split(bad)


def _megatron_rule(weights, size):
    # a plain transcription of helpers.cpp's build_blending_indices, for comparison
    taken, out = [0] * len(weights), []
    for i in range(size):
        errors = [w * max(i, 1) - t for w, t in zip(weights, taken)]
        d = errors.index(max(errors))
        out.append(d)
        taken[d] += 1
    return out


@pytest.mark.parametrize("weights", [[0.7, 0.3], [0.2, 0.5, 0.3], [1 / 3, 2 / 3]])
def test_blending_order_is_megatrons_and_every_prefix_keeps_the_weights(weights):
    order = blend.blending_indices(weights, 1000)
    assert order.tolist() == _megatron_rule(weights, 1000)
    counts = np.cumsum(np.eye(len(weights), dtype=int)[order], axis=0)
    share = np.arange(1, 1001)[:, None] * np.asarray(weights)[None, :]
    assert np.abs(counts - share).max() <= 1.0 + 1e-9  # within one sample at every prefix


def test_parse_blend_normalises_and_refuses_with_the_form():
    assert blend.parse_blend("7 /a 3 /b") == [(0.7, "/a"), (0.3, "/b")]
    assert blend.parse_blend("/a") == [(1.0, "/a")]
    for bad in ("/a /b", "0.5 /a 0.5", "0 /a 0 /b", "-1 /a 2 /b"):
        with pytest.raises(HierConfigError, match="'data.path'.*weights and Megatron prefixes alternating"):
            blend.parse_blend(bad)


def test_a_split_pair_reads_its_documents_only(tmp_path):
    prefix = _pair(tmp_path / "a", n_docs=100, length=9, first_id=1)
    parts = {s: open_tokens(prefix, s, "90,8,2") for s in ("train", "val", "test")}
    assert {s: p.count for s, p in parts.items()} == {"train": 810, "val": 72, "test": 18}
    assert sorted(set(np.asarray(parts["val"].tokens).tolist())) == list(range(91, 99))  # documents 90..97
    assert sorted(set(np.asarray(parts["train"].tokens).tolist())) == list(range(1, 91))
    assert open_tokens(prefix).count == 900  # no split: all of it, as before
    with pytest.raises(HierConfigError, match="'data.split'.*set data.split=969,30,1"):
        open_tokens(prefix, "val")
    assert open_tokens(prefix, "train", "90,8,2").index["sha256"] != open_tokens(prefix).index["sha256"]


def test_a_blend_serves_samples_in_megatrons_order_from_each_pairs_split(tmp_path):
    a = _pair(tmp_path / "a", n_docs=60, length=8, first_id=1)  # ids 1..60
    b = _pair(tmp_path / "b", n_docs=40, length=8, first_id=1001)  # ids 1001..1040
    seq, seed = 8, 3
    data = open_tokens(f"0.7 {a} 0.3 {b}", "train", "80,20,0", seed=seed)
    n = [a_n := (48 * 8 - 1) // seq, (32 * 8 - 1) // seq]  # train: 48 and 32 documents
    assert data.samples(seq) == sum(n)
    loader = Loader(data, seq, micro_batch=4, rank=0, world=1, seed=seed)
    order = _megatron_rule([0.7, 0.3], sum(n))
    taken = [0, 0]
    seen = {0: [], 1: []}
    for i in range(sum(n) // 4):
        x, _ = loader.batch(i)
        for row, g in zip(x.tolist(), loader.positions(i)):
            d = 0 if row[0] < 1000 else 1
            assert d == order[g]  # the pair Megatron's rule names
            seen[d].append(data.source(g, seq)[1])
            taken[d] += 1
    assert taken[0] / sum(taken) == pytest.approx(0.7, abs=0.02)
    # each pair's samples in its own permutation: no repeats within a pass, not in file order
    assert len(set(seen[1])) == len(seen[1]) and seen[1] != sorted(seen[1])
    assert len(seen[0]) > a_n  # the 0.7 pair is read again, in a new order
    assert max(r for row in [data.sample(g, seq).tolist() for g in range(sum(n))] for r in row if r < 1000) <= 48
    val = open_tokens(f"0.7 {a} 0.3 {b}", "val", "80,20,0", seed=seed)
    ids = {t for g in range(val.samples(seq)) for t in val.sample(g, seq).tolist()}
    assert ids <= set(range(49, 61)) | set(range(1033, 1041))  # only the val documents


def test_a_pair_too_small_for_its_share_is_refused_by_name(tmp_path):
    a = _pair(tmp_path / "a", n_docs=50, length=8, first_id=1)
    b = _pair(tmp_path / "tiny", n_docs=1, length=4, first_id=1)
    data = open_tokens(f"0.5 {a} 0.5 {b}", "train", None)
    with pytest.raises(HierConfigError, match="tiny.*fewer than one sample.*weight 0"):
        data.samples(8)
    for weights in ("0 {b} 1 {a}", "1 {a} 0 {b}"):  # weight 0: never read, wherever it stands
        only_a = open_tokens(weights.format(a=a, b=b), "train", None)
        assert only_a.samples(8) == open_tokens(a).samples(8)
        assert all(
            only_a.sample(g, 8).tolist() == only_a.parts[0].sample(only_a.source(g, 8)[1], 8).tolist()
            for g in range(5)
        )


def test_the_command_line_takes_a_blend_and_a_split(tmp_path, monkeypatch):
    from zeropp_hier.app.train import spec_from_overrides

    monkeypatch.chdir(tmp_path)
    a, b = _pair(tmp_path / "a", 20, 8, 1), _pair(tmp_path / "b", 20, 8, 100)
    spec = spec_from_overrides(["data=tokens", "data.path='2 a 1 b'", "data.split=969/30/1"])
    assert spec.data_path == f"2 {a} 1 {b}" and spec.data_split == "969/30/1"  # prefixes made absolute
    quoted = spec_from_overrides(["data=tokens", "data.path=a", "data.split='969,30,1'"])
    assert quoted.data_path == a and quoted.data_split == "969,30,1"
    with pytest.raises(HierConfigError, match="'data.path'.*alternating"):
        spec_from_overrides(["data=tokens", "data.path='a b'"])
    with pytest.raises(HierConfigError, match="'data.split'.*prepared directory"):
        open_tokens(str(tmp_path), "train", "969,30,1")
