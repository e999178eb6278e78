"""``zeropp-hier data prepare`` on the user's corpus (zeropp_hier.app.data.prepare_stream, documents):
JSON lines tokenized with a given tokenizer.json, EOS between documents, the held-out split,
byte level identical to today's path, streaming hashes, and refusals that name the input."""

import hashlib
import json

import numpy as np
import pytest

from zeropp_hier.app.data import documents, prepare_stream
from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import HELD_OUT_EVERY, stdlib_files
from zeropp_hier.core.errors import HierConfigError

WORDS = ["alpha", "beta", "gamma", "frontier", "node", "gcd", "über", "é", "zero", "stage", "the", "of"]


def _docs(n=45, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 40)))) for _ in range(n)]


def make_tokenizer(path, docs, specials=("<|endoftext|>",)):
    """A small byte-level BPE tokenizer, built with the tokenizers library and saved as
    tokenizer.json (GPT-NeoX-20B's file has the same structure: nothing is downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    tok.save(str(path))
    return str(path)


def write_jsonl(path, docs, field="text"):
    with open(path, "w") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({field: d, "meta": {"pile_set_name": "test", "i": i}}) + "\n")
            if i == 3:
                f.write("\n")  # blank lines are skipped, not documents
    return path


@pytest.fixture
def corpus(tmp_path):
    docs = _docs()
    return docs, make_tokenizer(tmp_path / "tokenizer.json", docs), write_jsonl(tmp_path / "c.jsonl", docs)


def test_jsonl_with_a_tokenizer_file_gives_each_document_then_eos(corpus, tmp_path):
    from tokenizers import Tokenizer

    docs, tok_file, jsonl = corpus
    index = prepare_stream.prepare([jsonl], str(tmp_path / "out"), tokenizer=tok_file)
    tok = Tokenizer.from_file(tok_file)
    eos = tok.token_to_id("<|endoftext|>")
    ref = {"train": [], "val": []}
    for i, d in enumerate(docs):
        ref["val" if i % HELD_OUT_EVERY == 0 else "train"] += tok.encode(d, add_special_tokens=False).ids + [eos]
    for split in ("train", "val"):
        got = np.fromfile(tmp_path / "out" / f"{split}.bin", dtype=np.uint16)
        assert got.tolist() == ref[split]
    assert index["documents"] == {"train": len(docs) - 3, "val": 3}
    assert index["tokenizer"]["eos"] == {"token": "<|endoftext|>", "id": eos}
    assert index["tokenizer"]["vocab_size"] == tok.get_vocab_size(with_added_tokens=True)
    assert index["inputs"][0]["sha256"] == hashlib.sha256(jsonl.read_bytes()).hexdigest()
    # the job reads it as today's prepared directory, and decodes with the copied tokenizer
    td = data.TokenData(str(tmp_path / "out"))
    assert td.count == len(ref["train"]) and td.vocab_size == index["tokenizer"]["vocab_size"]
    first = ref["train"][: ref["train"].index(eos)]
    copied = Tokenizer.from_file(str(tmp_path / "out" / index["tokenizer"]["file"]))
    assert copied.decode(first, skip_special_tokens=False) == docs[1]


def test_byte_level_on_txt_files_equals_todays_prepare(tmp_path, monkeypatch):
    files = stdlib_files()[:41]
    old = data.prepare(files, str(tmp_path / "old"), "s")
    monkeypatch.setattr(documents, "TXT_PIECE", 4096)  # long files are read in many pieces
    monkeypatch.setattr(prepare_stream, "TASK_BYTES", 10_000)
    new = prepare_stream.prepare(files, str(tmp_path / "new"), "s")
    for split in ("train", "val"):
        assert (tmp_path / "old" / f"{split}.bin").read_bytes() == (tmp_path / "new" / f"{split}.bin").read_bytes()
    assert new["sha256"] == old["sha256"] and new["tokens"] == old["tokens"] and new["documents"] == old["documents"]
    assert [i["sha256"] for i in new["inputs"]] == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]


def test_text_field_and_eos_options(tmp_path):
    docs = _docs(5)
    tok_file = make_tokenizer(tmp_path / "tokenizer.json", docs, specials=("</s>", "<sep>"))
    jsonl = write_jsonl(tmp_path / "c.jsonl", docs, field="content")
    with pytest.raises(HierConfigError, match="--text-field.*c.jsonl:1 has no string under 'text'.*content"):
        prepare_stream.prepare([jsonl], str(tmp_path / "o"), tokenizer=tok_file)
    assert not list((tmp_path / "o").glob("*.tmp"))  # a refusal leaves no half-written files
    index = prepare_stream.prepare([jsonl], str(tmp_path / "o"), tokenizer=tok_file, text_field="content")
    assert index["tokenizer"]["eos"]["token"] == "</s>"  # found among the usual names
    index = prepare_stream.prepare([jsonl], str(tmp_path / "o"), tokenizer=tok_file, text_field="content", eos="<sep>")
    assert index["tokenizer"]["eos"]["token"] == "<sep>"
    with pytest.raises(HierConfigError, match="'--eos'.*<nope>.*no such token"):
        prepare_stream.prepare([jsonl], str(tmp_path / "o"), tokenizer=tok_file, text_field="content", eos="<nope>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<sep>"}}))
    assert prepare_stream.eos_of(tok_file) == ("<sep>", index["tokenizer"]["eos"]["id"])


def test_refusals_name_the_input_and_the_fix(tmp_path, corpus):
    _, tok_file, jsonl = corpus
    bare = make_tokenizer(tmp_path / "bare.json", ["a b c"], specials=())
    with pytest.raises(HierConfigError, match="'--eos'.*no end-of-sequence token.*--eos TOKEN"):
        prepare_stream.prepare([jsonl], str(tmp_path / "o"), tokenizer=bare)
    pq = tmp_path / "x.parquet"
    pq.write_bytes(b"PAR1")
    with pytest.raises(HierConfigError, match="x.parquet.*not a parquet file"):
        prepare_stream.prepare([jsonl, pq], str(tmp_path / "o"), tokenizer=tok_file)
    with pytest.raises(HierConfigError, match="p.jsonl.bz2.*bunzip2"):
        prepare_stream.prepare([tmp_path / "p.jsonl.bz2"], str(tmp_path / "o"))
    with pytest.raises(HierConfigError, match="p.zst.*NAME.jsonl.zst"):
        prepare_stream.prepare([tmp_path / "p.zst"], str(tmp_path / "o"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(HierConfigError, match="bad.jsonl:2.*not a JSON line"):
        prepare_stream.prepare([bad], str(tmp_path / "o"))
    with pytest.raises(HierConfigError, match="--tokenizer.*no such file"):
        prepare_stream.prepare([jsonl], str(tmp_path / "o"), tokenizer=str(tmp_path / "none.json"))
    with pytest.raises(HierConfigError, match="'--eos'.*newline"):
        prepare_stream.prepare([jsonl], str(tmp_path / "o"), eos="</s>")
    with pytest.raises(HierConfigError, match="--workers"):
        prepare_stream.prepare([jsonl], str(tmp_path / "o"), workers=0)


def test_cli_prepares_a_directory_of_jsonl(corpus, tmp_path, capsys):
    docs, tok_file, jsonl = corpus
    out = tmp_path / "cli"
    assert data.main(["prepare", str(tmp_path), "--glob", "*.jsonl", "--tokenizer", tok_file, "--out", str(out)]) == 0
    index = json.loads((out / "index.json").read_text())
    assert index["tokenizer"]["kind"] == "file" and sum(index["documents"].values()) == len(docs)
    assert "EOS" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        data.main(["prepare", str(jsonl), "--tokenizer", tok_file, "--vocab-size", "300", "--out", str(out)])
