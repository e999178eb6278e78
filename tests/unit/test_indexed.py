"""Megatron / GPT-NeoX indexed datasets read in place (zeropp_hier.app.data.indexed): a pair written
in the format is the same token stream as a prepared directory; damaged or foreign pairs are
refused naming the file."""

import struct

import numpy as np
import pytest

from zeropp_hier.app.data import indexed
from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.job_vocab import with_data_vocab
from zeropp_hier.app.spec import JobSpec, ModelSpec
from zeropp_hier.core.errors import HierConfigError


def _docs(n=30, vocab=500, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(1, 80))).tolist() for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_a_written_pair_reads_back_as_one_stream(tmp_path, dtype):
    docs = _docs()
    prefix = str(tmp_path / "pile_text_document")
    indexed.write(prefix, docs, dtype)
    # the header, as Megatron's reader parses it
    head = (tmp_path / "pile_text_document.idx").read_bytes()[:34]
    magic, version, code, n_seq, n_doc = struct.unpack("<9sQBQQ", head)
    assert (magic, version, n_seq, n_doc) == (b"MMIDIDX\x00\x00", 1, len(docs), len(docs) + 1)
    assert code == {np.uint16: 8, np.int32: 4}[dtype]
    flat = [t for d in docs for t in d]
    for name in (prefix, prefix + ".bin", prefix + ".idx"):
        tokens = data.open_tokens(name)
        assert isinstance(tokens, indexed.IndexedTokens) and tokens.count == len(flat)
    assert tokens.documents == len(docs) and tokens.sequences == len(docs) and tokens.vocab_size is None
    assert tokens.samples(16) == (len(flat) - 1) // 16
    assert tokens.sample(3, 16).tolist() == flat[48:65]
    loader = data.Loader(tokens, 16, 2, rank=1, world=2)
    x, y = loader.batch(0)
    k = loader.sample_ids(0)[0]
    assert x[0].tolist() == flat[k * 16 : k * 16 + 16] and y[0].tolist() == flat[k * 16 + 1 : k * 16 + 17]
    # a fingerprint that changes with the data
    other = str(tmp_path / "other")
    indexed.write(other, _docs(seed=1), dtype)
    assert tokens.index["sha256"] != indexed.IndexedTokens(other).index["sha256"]


def test_damaged_or_foreign_pairs_are_refused(tmp_path):
    prefix = str(tmp_path / "d")
    indexed.write(prefix, _docs(), np.uint16)
    binf, idx = tmp_path / "d.bin", tmp_path / "d.idx"
    whole = binf.read_bytes()
    binf.write_bytes(whole[:-2])
    with pytest.raises(HierConfigError, match="d.bin.*the pair does not match"):
        indexed.IndexedTokens(prefix)
    binf.write_bytes(whole)
    head = bytearray(idx.read_bytes())
    idx.write_bytes(b"TNTIDX\x00\x00\x00" + bytes(head[9:]))
    with pytest.raises(HierConfigError, match="not a Megatron mmap index"):
        indexed.IndexedTokens(prefix)
    head[17] = 7  # float64 in Megatron-LM's codes
    idx.write_bytes(bytes(head))
    with pytest.raises(HierConfigError, match="dtype code 7"):
        indexed.IndexedTokens(prefix)
    head[17] = 8
    idx.write_bytes(bytes(head[:40]))
    with pytest.raises(HierConfigError, match="truncated"):
        indexed.IndexedTokens(prefix)
    idx.write_bytes(bytes(head))
    with pytest.raises(HierConfigError, match="'data.split'.*no held-out documents.*set data.split=969,30,1"):
        indexed.IndexedTokens(prefix, "val")
    with pytest.raises(HierConfigError, match="no index.json there.*Megatron"):
        data.open_tokens(str(tmp_path / "missing"))


def test_ids_the_model_cannot_embed_stop_the_job_named(tmp_path):
    prefix = str(tmp_path / "d")
    indexed.write(prefix, [[1, 2, 3, 700, 4, 5, 6, 7, 8]], np.uint16)
    tokens = indexed.IndexedTokens(prefix)
    tokens.limit_vocab(512)
    with pytest.raises(HierConfigError, match="'model.vocab_size'.*d.bin holds token id 700"):
        tokens.sample(0, 4)


def test_the_job_takes_the_vocabulary_from_the_model_for_a_pair(tmp_path):
    prefix = str(tmp_path / "d")
    indexed.write(prefix, _docs(), np.uint16)
    with pytest.raises(HierConfigError, match="'model.vocab_size'.*does not record its vocabulary"):
        with_data_vocab(JobSpec(data_path=prefix))
    spec = with_data_vocab(JobSpec(data_path=prefix, model=ModelSpec(vocab_size=512)))
    assert spec.model.vocab_size == 512
