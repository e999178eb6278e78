"""The user's data trains the quickstart's model exactly as today's path does: the same token
ids, read from a JSON-lines corpus prepared with a tokenizer.json (workers 2), from a
Megatron ``.bin``/``.idx`` pair, and from a prepared directory written directly in today's
format, give the same losses in a real 4-rank job (``zeropp_hier.app.run.rank_main``)."""

import json

import numpy as np
import pytest

from zeropp_hier.app import data, indexed, prepare_stream
from zeropp_hier.app.data import HELD_OUT_EVERY
from zeropp_hier.app.models import ModelSpec
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
