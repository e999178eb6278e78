"""The user's data trains the quickstart's model exactly as today's path does: the same token
ids, read from a JSON-lines corpus prepared with a tokenizer.json (workers 2), plain, as
``.jsonl.zst`` or parquet, from a Megatron ``.bin``/``.idx`` pair or a two-pair blend with a
split, and from a prepared directory written directly in today's format, give the same losses
in a real 4-rank job (``zeropp_hier.app.run.rank_main``)."""

import json

import numpy as np
import pytest

from zeropp_hier.app.data import indexed, prepare_stream
from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import HELD_OUT_EVERY
from zeropp_hier.app.model.models import ModelSpec
from zeropp_hier.app.run import rank_main
from zeropp_hier.app.spec import JobSpec

from ..unit.test_prepare_stream import _docs, make_tokenizer, write_jsonl

STEPS, VOCAB = 3, 512


def _todays_dir(out, train, val, vocab):
    """A prepared directory in today's format ([Note: token files]), written from token ids."""
    out.mkdir()
    np.asarray(train, np.uint16).tofile(out / "train.bin")
    np.asarray(val, np.uint16).tofile(out / "val.bin")
    index = {
        "format": data.FORMAT,
        "version": data.VERSION,
        "dtype": "uint16",
        "tokenizer": {"kind": "byte", "vocab_size": vocab},  # only its size is read by the job
        "tokens": {"train": len(train), "val": len(val)},
        "documents": {"train": 1, "val": 1},
        "sha256": "reference",
        "source": "test",
    }
    (out / "index.json").write_text(json.dumps(index))
    return str(out)


def test_jsonl_and_megatron_pairs_train_like_todays_path(world4, tmp_path):
    from tokenizers import Tokenizer

    docs = _docs(n=200, seed=3)
    tok_file = make_tokenizer(tmp_path / "tokenizer.json", docs)
    jsonl = write_jsonl(tmp_path / "corpus.jsonl", docs)
    # the reference encoding, computed here document by document
    tok = Tokenizer.from_file(tok_file)
    eos = tok.token_to_id("<|endoftext|>")
    encoded = [tok.encode(d, add_special_tokens=False).ids + [eos] for d in docs]
    train_docs = [e for i, e in enumerate(encoded) if i % HELD_OUT_EVERY]
    train = [t for e in train_docs for t in e]
    val = [t for i, e in enumerate(encoded) if i % HELD_OUT_EVERY == 0 for t in e]

    prepare_stream.prepare([jsonl], str(tmp_path / "jsonl"), tokenizer=tok_file, workers=2)
    assert np.fromfile(tmp_path / "jsonl" / "train.bin", np.uint16).tolist() == train  # the same tokens
    indexed.write(str(tmp_path / "pile_text_document"), train_docs, np.uint16)
    sources = {
        "today": _todays_dir(tmp_path / "today", train, val, tok.get_vocab_size()),
        "jsonl": str(tmp_path / "jsonl"),
        "megatron": str(tmp_path / "pile_text_document"),
    }
    losses = {}
    for name, path in sources.items():
        spec = JobSpec(
            steps=STEPS,
            micro_batch=2,
            model=ModelSpec(seq_len=32, vocab_size=VOCAB),
            data_path=path,
            progress="off",
            out_dir=str(tmp_path / f"run_{name}"),
        )
        losses[name] = world4.run(rank_main, spec)[0]["losses"]
    print(losses)
    assert len(losses["today"]) == STEPS and np.log(VOCAB) - 1 < losses["today"][0] < np.log(VOCAB) + 1
    assert losses["today"][-1] < losses["today"][0]  # it trains
    assert losses["jsonl"] == pytest.approx(losses["today"], rel=1e-6, abs=1e-7)
    assert losses["megatron"] == pytest.approx(losses["today"], rel=1e-6, abs=1e-7)
    # and the comparison can fail: other tokens give other losses
    shifted = [(t + 1) % tok.get_vocab_size() for t in train]
    spec = JobSpec(
        steps=1,
        micro_batch=2,
        model=ModelSpec(seq_len=32, vocab_size=VOCAB),
        data_path=_todays_dir(tmp_path / "shifted", shifted, val, tok.get_vocab_size()),
        progress="off",
    )
    assert world4.run(rank_main, spec)[0]["losses"][0] != pytest.approx(losses["today"][0], rel=1e-6)


def _job(tmp_path, name, path, steps=STEPS, **kw):
    return JobSpec(
        steps=steps,
        micro_batch=2,
        model=ModelSpec(seq_len=32, vocab_size=VOCAB),
        data_path=path,
        progress="off",
        out_dir=str(tmp_path / f"run_{name}"),
        **kw,
    )


def test_compressed_and_parquet_files_train_like_plain_jsonl(world4, tmp_path):
    pytest.importorskip("pyarrow", reason="the data extra's pyarrow reads parquet")
    pytest.importorskip("zstandard", reason="the data extra's zstandard reads .jsonl.zst")
    from ..unit.test_data_formats import write_formats

    docs = _docs(n=200, seed=4)
    tok_file = make_tokenizer(tmp_path / "tokenizer.json", docs)
    files = write_formats(tmp_path, docs)
    losses, streams = {}, {}
    for name in ("jsonl", "zst", "parquet"):
        prepare_stream.prepare([files[name]], str(tmp_path / name), tokenizer=tok_file, workers=2)
        streams[name] = (tmp_path / name / "train.bin").read_bytes()
        losses[name] = world4.run(rank_main, _job(tmp_path, name, str(tmp_path / name)))[0]["losses"]
    print(losses)
    assert streams["zst"] == streams["jsonl"] and streams["parquet"] == streams["jsonl"]  # identical tokens
    assert len(losses["jsonl"]) == STEPS and losses["jsonl"][-1] < losses["jsonl"][0]
    assert losses["zst"] == pytest.approx(losses["jsonl"], rel=1e-6, abs=1e-7)
    assert losses["parquet"] == pytest.approx(losses["jsonl"], rel=1e-6, abs=1e-7)


def test_a_two_pair_megatron_blend_with_a_split_trains_like_todays_path(world4, tmp_path):
    """Every pair's document is ``seq_len`` tokens starting with id 0, so every sample starts
    and ends with 0 and any order of samples can be laid out as one of today's token files: the
    reference puts the blend's sample for position g at the slot today's loader reads for g."""
    seq, world, micro = 32, 4, 2
    rng = np.random.default_rng(7)

    def pair(name, n_docs, low):
        docs = [[0, *rng.integers(low, low + 200, size=seq - 1).tolist()] for _ in range(n_docs)]
        indexed.write(str(tmp_path / name), docs, np.uint16)
        return str(tmp_path / name)

    a, b = pair("pile_text_document", 60, 1), pair("code_text_document", 30, 300)
    path, split = f"0.6 {a} 0.4 {b}", "80,20,0"
    blended = data.open_tokens(path, "train", split)
    used = STEPS * world * micro  # positions the job reads (grad_accum 1)
    windows = [blended.sample(g, seq) for g in range(used)]
    assert all(w[0] == 0 and w[-1] == 0 for w in windows)
    from_b = sum(int(w[1] >= 300) for w in windows)
    assert 0 < from_b < used  # both pairs feed the job
    import torch

    perm = torch.randperm(used, generator=torch.Generator().manual_seed(0)).tolist()  # today's order, seed 0
    stream = np.zeros(used * seq + 1, np.int64)
    for g, w in enumerate(windows):
        stream[perm[g] * seq : perm[g] * seq + seq + 1] = w
    val = [t for g in range(3) for t in data.open_tokens(path, "val", split).sample(g, seq).tolist()]
    ref = _todays_dir(tmp_path / "today", stream.tolist(), val, VOCAB)
    blend_run = world4.run(rank_main, _job(tmp_path, "blend", path, data_split=split, eval_every=STEPS))[0]
    today = world4.run(rank_main, _job(tmp_path, "today", ref))[0]["losses"]
    print(blend_run["losses"], today, blend_run["val_losses"])
    assert len(today) == STEPS and today[-1] < today[0]
    assert blend_run["losses"] == pytest.approx(today, rel=1e-6, abs=1e-7)
    evaluated = list(blend_run["val_losses"].values())  # the val part of both pairs, once
    assert len(evaluated) == 1 and np.isfinite(evaluated[0])
