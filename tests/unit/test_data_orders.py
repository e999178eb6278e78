"""The data orders' cache (zeropp_hier.app.data.order_cache, .orders): the cached shuffle and
blend order give today's samples in today's order (compared with the loader without a cache and
with the rule written out here), a rank reads only the entries of its own samples, a stale key
names another file, a foreign, truncated or corrupt file is refused naming it (or rebuilt by the
builder), and the costs at 300B tokens on 75,264 ranks, by arithmetic."""

import numpy as np
import pytest
import torch

from zeropp_hier.app.data import blend, indexed, order_cache, orders
from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import Loader, open_tokens
from zeropp_hier.core.errors import HierConfigError


def _pair(prefix, n_docs, length, first):
    """Documents whose tokens count up from ``first``: a sample's first token names where it starts."""
    docs = [list(range(first + k * length, first + (k + 1) * length)) for k in range(n_docs)]
    indexed.write(str(prefix), docs, np.int32)
    return str(prefix)


def _ids(loader, batches):
    return [[int(t) for t in loader.batch(i)[0][:, 0]] for i in batches]


def _started(path, seq, micro, world, seed, first, last, cache, split=None):
    """Every rank's loader on the cache: rank 0 builds, the others only open (as after the
    job's broadcast)."""
    out = []
    for r in range(world):
        ld = Loader(open_tokens(path, "train", split, seed), seq, micro, r, world, seed)
        if r == 0:
            orders.start(ld, first, last, str(cache), 0)
        else:
            orders.attach(ld, first, last, order_cache.opener(cache, builder=False))
        out.append(ld)
    return out


def test_the_cached_shuffle_is_todays_order_across_epochs_and_a_resume(tmp_path):
    path = _pair(tmp_path / "a", n_docs=30, length=17, first=0)  # 510 tokens: 63 samples of 8
    seq, micro, world, seed = 8, 3, 4, 5
    n = (510 - 1) // seq
    batches = range(12)  # 12 x 4 x 3 = 144 positions: three epochs
    cached = _started(path, seq, micro, world, seed, 0, 144, tmp_path / "cache")
    for r in range(world):
        plain = Loader(open_tokens(path), seq, micro, r, world, seed)  # today's loader: no cache
        assert _ids(cached[r], batches) == _ids(plain, batches)
        # and the rule itself: epoch e is torch.randperm(n) seeded seed * 1_000_003 + e
        perms = [torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + e)) for e in range(3)]
        want = [[int(perms[g // n][g % n]) * seq for g in plain.positions(i)] for i in batches]
        assert _ids(cached[r], batches) == want
        assert cached[r]._perm is None and sorted(cached[r].cached) == [0, 1, 2]  # nothing built on the rank
    assert len(list((tmp_path / "cache").glob("shuffle-*.order"))) == 3
    # a resume at another world and micro-batch: its positions' epochs, from the same files
    state = cached[0].state(5)
    after = _started(path, seq, 2, 3, seed, state["sample"], state["sample"] + 8 * 3 * 2, tmp_path / "cache")
    for r in range(3):
        plain = Loader(open_tokens(path), seq, 2, r, 3, seed)
        plain.resume_at(state, 5)
        after[r].resume_at(state, 5)
        assert _ids(after[r], range(5, 13)) == _ids(plain, range(5, 13))
        assert after[r]._perm is None


def test_the_cached_blend_is_todays_order_over_passes_and_pair_epochs(tmp_path):
    a = _pair(tmp_path / "a", n_docs=40, length=11, first=0)
    b = _pair(tmp_path / "b", n_docs=25, length=9, first=100_000)
    path, split, seq, micro, world, seed = f"0.6 {a} 0.4 {b}", "90,10,0", 6, 2, 3, 7
    total = open_tokens(path, "train", split).samples(seq)
    last = 2 * total + 30  # past two passes over the blended order: both pairs read again
    batches = range(-(-last // (micro * world)))
    cached = _started(path, seq, micro, world, seed, 0, last, tmp_path / "c", split)
    for r in range(world):
        plain = Loader(open_tokens(path, "train", split, seed), seq, micro, r, world, seed)
        assert _ids(cached[r], batches) == _ids(plain, batches)
        assert not cached[r].data._perms  # every pair's shuffle from the cache
    # the order is Megatron's largest-deficit rule, written out in test_blend: the same array
    order = np.asarray(cached[1].data._build(seq)[1])
    assert order.tolist() == blend.blending_indices(cached[1].data.weights, total).tolist()
    assert not cached[1].data._build(seq)[1].flags.owndata  # mapped from the file, not a copy


class _Seen:
    """An array that records which of its bytes are read (as pages of the mapped file)."""

    def __init__(self, arr):
        self.arr, self.pages = arr, set()
        self.row = arr.itemsize * (arr.shape[1] if arr.ndim == 2 else 1)

    def _note(self, first, stop, col=0):
        for b in range(first * self.row + col * self.arr.itemsize, max(stop * self.row, first * self.row + 1)):
            self.pages.add(b // orders.PAGE)

    def __getitem__(self, i):
        if isinstance(i, tuple):  # (row, column)
            self._note(int(i[0]), int(i[0]) + 1, int(i[1]))
        elif isinstance(i, slice):
            start, stop, _ = i.indices(len(self.arr))
            self._note(start, stop)
        else:
            self._note(int(i) % len(self.arr), int(i) % len(self.arr) + 1)
        return self.arr[i]

    def __len__(self):
        return len(self.arr)


def test_a_rank_reads_only_its_own_samples_entries(tmp_path):
    """Big enough that an order spans many pages: a rank's reads per micro-batch stay within
    what rank_costs counts, and the shuffle entries it reads are exactly its positions'."""
    a = _pair(tmp_path / "a", n_docs=400, length=50, first=0)
    b = _pair(tmp_path / "b", n_docs=300, length=50, first=100_000)
    seq, micro, world, seed = 4, 2, 8, 1
    path = f"0.5 {a} 0.5 {b}"
    total = open_tokens(path).samples(seq)
    plain_world = _started(a, seq, micro, world, seed, 0, 4096, tmp_path / "c")
    ld = plain_world[3]
    shuffle = _Seen(ld.cached[0])
    ld.cached[0] = shuffle
    for i in range(0, 40, 7):
        before = set(shuffle.pages)
        ld.batch(i)
        assert (
            len(shuffle.pages - before) * orders.PAGE
            <= orders.rank_costs(10**9, seq, world, micro, 1)["read_bytes_per_micro_batch"]
        )
    mine = {g for i in range(0, 40, 7) for g in ld.positions(i)}
    assert shuffle.pages == {g * 4 // orders.PAGE for g in mine}  # uint32 entries: its own, nothing else
    blended = _started(path, seq, micro, world, seed, 0, total, tmp_path / "c")[5]
    _, order, marks, sizes = blended.data._build(seq)
    seen = {"order": _Seen(order), "marks": _Seen(marks)}
    blended.data._built = (seq, seen["order"], seen["marks"], sizes)
    perms = {k: _Seen(v) for k, v in blended.data._cached_perms.items()}
    blended.data._cached_perms = perms
    bound = orders.rank_costs(10**9, seq, world, micro, 1, [0.5, 0.5])["read_bytes_per_micro_batch"]
    for i in (0, 9, total // (micro * world) - 1):
        before = {k: set(s.pages) for k, s in [*seen.items(), *perms.items()]}
        blended.batch(i)
        new = sum(len(s.pages - before[k]) for k, s in [*seen.items(), *perms.items()])
        assert new * orders.PAGE <= bound  # pages read before are not read again
    assert seen["order"].pages and seen["marks"].pages and any(p.pages for p in perms.values())
    all_pages = sum(-(-len(p.arr) * 4 // orders.PAGE) for p in perms.values())
    assert sum(len(p.pages) for p in perms.values()) <= 3 * micro < all_pages  # its own entries' pages only


def test_the_key_is_what_determines_the_order_and_a_stale_file_is_never_picked(tmp_path):
    w = orders.shuffle_want(100, 7)
    assert w.name == orders.shuffle_want(100, 7).name  # the same numbers: the same file
    for other in (orders.shuffle_want(101, 7), orders.shuffle_want(100, 8)):  # another n (data, seq, split), seed
        assert other.name != w.name
    o1, _ = blend.blend_wants([0.5, 0.5], [10, 20])
    assert {
        blend.blend_wants([0.6, 0.4], [10, 20])[0].name,
        blend.blend_wants([0.5, 0.5], [10, 21])[0].name,
    }.isdisjoint({o1.name})
    # the job's positions at seq_len 8 and 6 read different files
    path = _pair(tmp_path / "a", n_docs=10, length=13, first=0)
    for seq in (8, 6):
        orders.start(Loader(open_tokens(path), seq, 1, 0, 1, 0), 0, 5, str(tmp_path / "c"), 0)
    heads = [order_cache.read_header(f)[0] for f in sorted((tmp_path / "c").glob("*.order"))]
    assert sorted(h["key"]["n"] for h in heads) == sorted([(130 - 1) // 8, (130 - 1) // 6])


def test_foreign_truncated_or_corrupt_files_are_refused_naming_them_or_rebuilt(tmp_path, capsys):
    cache = tmp_path / "c"
    w, other = orders.shuffle_want(5000, 1), orders.shuffle_want(5000, 2)
    good = np.asarray(order_cache.ensure(cache, w)).copy()
    order_cache.ensure(cache, other)
    path = cache / w.name
    assert path.read_bytes()[:8] == order_cache.MAGIC
    meta, offset = order_cache.read_header(path)  # JSON: nothing is unpickled
    assert meta["key"] == w.key and offset % 4096 == 0
    # foreign: another key's file under this name
    (cache / other.name).replace(path)
    with pytest.raises(HierConfigError, match=f"{path}.*foreign.*delete"):
        order_cache.open_array(path, w)
    assert np.array_equal(order_cache.ensure(cache, w), good)  # the builder replaces it
    assert "building it again" in capsys.readouterr().err
    # truncated
    raw = path.read_bytes()
    path.write_bytes(raw[:-4])
    with pytest.raises(HierConfigError, match=f"{path}.*truncated.*delete"):
        order_cache.open_array(path, w)
    # corrupt body, right size: the builder finds it by the body's hash and rebuilds it
    body = bytearray(raw)
    body[offset + 40] ^= 0xFF
    path.write_bytes(bytes(body))
    assert not order_cache.body_ok(path)
    assert np.array_equal(order_cache.ensure(cache, w), good)
    assert "corrupt" in capsys.readouterr().err
    # not a cache file at all
    path.write_bytes(b"\x80\x04pickle" + bytes(100))
    with pytest.raises(HierConfigError, match=f"{path}.*not .*ZPHORDER"):
        order_cache.open_array(path, w)
    with pytest.raises(HierConfigError, match=r"'data cache file'.*missing.*every node sees"):
        order_cache.open_array(cache / "nothing.order", w)


def test_unwritable_cache_names_data_cache_dir_and_the_default_is_beside_the_data(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"line {k} of the corpus\n" for k in range(400)))
    data.prepare([text], str(tmp_path / "prep"), "test")
    ld = Loader(open_tokens(str(tmp_path / "prep")), 16, 2, 0, 1, 0)
    orders.start(ld, 0, 50, None, 0)
    assert list((tmp_path / "prep" / order_cache.CACHE_DIR_NAME).glob("shuffle-*.order"))
    blocked = tmp_path / "file"
    blocked.write_text("")
    ld = Loader(open_tokens(str(tmp_path / "prep")), 16, 2, 0, 1, 0)
    with pytest.raises(HierConfigError, match=r"'data.cache_dir'.*set data.cache_dir to a writable"):
        orders.start(ld, 0, 50, str(blocked / "sub"), 0)


def test_opening_a_pair_reads_no_fingerprint_until_asked(tmp_path, monkeypatch):
    path = _pair(tmp_path / "a", n_docs=10, length=13, first=0)
    calls = []
    real = indexed.fingerprint
    monkeypatch.setattr(indexed, "fingerprint", lambda p: calls.append(p) or real(p))
    t = open_tokens(f"1 {path} 1 {path}", "train", None)
    Loader(t, 8, 1, 0, 1, 0).batch(0)
    assert calls == []  # every rank opens and reads without it
    assert len(t.index["sha256"]) == 64 and len(calls) == 2  # rank 0, once per pair


@pytest.mark.parametrize("weights", [None, [0.5, 0.3, 0.2]])
def test_per_rank_costs_do_not_grow_with_the_world_or_the_tokens(weights):
    """300B tokens at 2,048 a sample on 9,408 nodes x 4 x 2 = 75,264 ranks, by arithmetic:
    another rank opens a few files and reads a few pages a micro-batch, the same as at 8 ranks
    and 3B tokens; the builder's memory and the files grow with the tokens only."""
    big = orders.rank_costs(300 * 10**9, 2048, 75_264, 4, 1, weights)
    small = orders.rank_costs(3 * 10**9, 2048, 8, 4, 1, weights)
    assert big["read_bytes_per_micro_batch"] == small["read_bytes_per_micro_batch"] <= 4 * 4 * orders.PAGE
    assert big["files_opened_per_rank"] <= 2 + 2 * (len(weights) if weights else 1)
    assert big["samples"] == (300 * 10**9 - 1) // 2048  # 146,484,374
    assert big["builder_peak_bytes"] < 2 * 1024**3  # rank 0's int64 permutation of the largest
    per_sample = 4 if weights is None else 4 + 1  # uint32 shuffle entry (+ one order byte)
    assert big["cache_bytes"] == pytest.approx(per_sample * big["samples"], rel=0.02)
    with_steps = orders.rank_costs(300 * 10**9, 2048, 75_264, 4, 500, weights)  # ~1 epoch of positions
    assert with_steps["read_bytes_per_micro_batch"] == big["read_bytes_per_micro_batch"]
