"""Data as users have it (zeropp_hier.app.data.documents, data._input_files): the same documents as
plain JSON lines, ``.jsonl.zst``, ``.jsonl.gz``, parquet and a Hugging Face ``save_to_disk``
Arrow file give identical token files; a directory's default glob reads them and names what it
skipped; one ``.txt`` file alone is split into train and val."""

import gzip

import numpy as np
import pytest

from zeropp_hier.app.data import documents, prepare_stream
from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import HELD_OUT_EVERY
from zeropp_hier.core.errors import HierConfigError

from .test_prepare_stream import _docs, make_tokenizer, write_jsonl

pa = pytest.importorskip("pyarrow", reason="the data extra's pyarrow reads parquet / Arrow")
zstd = pytest.importorskip("zstandard", reason="the data extra's zstandard reads .jsonl.zst")
import pyarrow.parquet as pq  # noqa: E402


def write_formats(tmp_path, docs):
    """The same documents as .jsonl, .jsonl.zst (two frames, as pzstd writes), .jsonl.gz,
    parquet (small row groups) and an Arrow IPC stream (what ``save_to_disk`` writes)."""
    plain = write_jsonl(tmp_path / "c.jsonl", docs)
    raw = plain.read_bytes()
    half = raw.index(b"\n", len(raw) // 2) + 1
    c = zstd.ZstdCompressor(level=3)
    (tmp_path / "c.jsonl.zst").write_bytes(c.compress(raw[:half]) + c.compress(raw[half:]))
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(raw))
    table = pa.table({"meta": [str(i) for i in range(len(docs))], "text": docs})
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=7)
    with pa.OSFile(str(tmp_path / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as w:
            for batch in table.to_batches(max_chunksize=5):
                w.write_batch(batch)
    return {
        "jsonl": plain,
        "zst": tmp_path / "c.jsonl.zst",
        "gz": tmp_path / "c.jsonl.gz",
        "parquet": tmp_path / "c.parquet",
        "arrow": tmp_path / "data-00000-of-00001.arrow",
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_every_format_gives_the_same_tokens(tmp_path, workers):
    docs = _docs(n=61, seed=5)
    tok_file = make_tokenizer(tmp_path / "tokenizer.json", docs)
    files = write_formats(tmp_path, docs)
    out = {}
    for name, path in files.items():
        index = prepare_stream.prepare([path], str(tmp_path / name), tokenizer=tok_file, workers=workers)
        out[name] = {s: (tmp_path / name / f"{s}.bin").read_bytes() for s in ("train", "val")}
        assert index["documents"] == {"train": 61 - 4, "val": 4}  # docs 0, 20, 40, 60 held out
        assert index["inputs"][0]["bytes"] == path.stat().st_size  # the file as stored, hashed whole
    assert all(out[name] == out["jsonl"] for name in files), {n: len(o["train"]) for n, o in out.items()}
    assert len(out["jsonl"]["train"]) > 0
    # byte level too, and the comparison can fail: a changed document changes the tokens
    ref = prepare_stream.prepare([files["jsonl"]], str(tmp_path / "b_jsonl"))
    assert prepare_stream.prepare([files["zst"]], str(tmp_path / "b_zst"))["sha256"] == ref["sha256"]
    (tmp_path / "other").mkdir()
    other = write_formats(tmp_path / "other", docs[:-1] + ["x"])
    assert prepare_stream.prepare([other["parquet"]], str(tmp_path / "b_other"))["sha256"] != ref["sha256"]


def test_a_directory_reads_every_format_by_default_and_names_what_it_skipped(tmp_path, capsys):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    files = write_formats(d / "sub", _docs(n=10))
    (d / "sub" / "state.json").write_text("{}")  # save_to_disk's bookkeeping, not a corpus
    (d / "notes.md").write_text("not read")
    found = data._input_files([str(d)], None)
    assert sorted(f.name for f in found) == sorted(p.name for p in files.values())
    err = capsys.readouterr().err
    assert "skipped 2 file(s)" in err and "notes.md" in err and "sub/state.json" in err and "--glob" in err
    assert [f.name for f in data._input_files([str(d)], "*.md")] == ["notes.md"]
    assert "skipped" in capsys.readouterr().err  # the rest, named again


def test_refusals_name_the_file_and_the_fix(tmp_path):
    files = write_formats(tmp_path, _docs(n=5))
    with pytest.raises(HierConfigError, match="'--text-field'.*c.parquet has no column 'body'.*'meta', 'text'"):
        prepare_stream.prepare([files["parquet"]], str(tmp_path / "o"), text_field="body")
    with pytest.raises(HierConfigError, match="'--text-field'.*string column"):
        t = pa.table({"text": [1, 2]})
        pq.write_table(t, tmp_path / "ints.parquet")
        prepare_stream.prepare([tmp_path / "ints.parquet"], str(tmp_path / "o"))
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"text": "ok"}\n{"text": \n'))
    with pytest.raises(HierConfigError, match="bad.jsonl.gz:2.*not a JSON line"):
        prepare_stream.prepare([bad], str(tmp_path / "o"))
    assert not (tmp_path / "o" / "train.bin.tmp").exists()


def _lines(n, seed=0):
    rng = np.random.default_rng(seed)
    return "".join(f"line {i} " + "é" * int(rng.integers(0, 9)) + "\n" for i in range(n))


@pytest.mark.parametrize("tokenizer", ["byte", "bpe", "file"])
def test_one_text_file_is_split_into_train_and_val(tmp_path, tokenizer):
    text = _lines(400)
    f = tmp_path / "book.txt"
    f.write_text(text)
    raw = text.encode()
    cut = documents.text_cut(f)
    assert raw[cut - 1 : cut] == b"\n"  # at a line end
    assert len(raw) // HELD_OUT_EVERY <= len(raw) - cut < len(raw) // HELD_OUT_EVERY + 40  # about 1/20 held out
    if tokenizer == "bpe":
        index = data.prepare([f], str(tmp_path / "o"), tokenizer="bpe", vocab_size=300)
    elif tokenizer == "byte":
        index = data.prepare([f], str(tmp_path / "o"))
        streamed = prepare_stream.prepare([f], str(tmp_path / "s"), workers=2)
        assert streamed["sha256"] == index["sha256"]  # both paths cut the same
        assert (tmp_path / "o" / "train.bin").read_bytes() == np.frombuffer(raw[:cut] + b"\n", np.uint8).astype(
            np.uint16
        ).tobytes()
    else:
        tok = make_tokenizer(tmp_path / "tokenizer.json", text.splitlines())
        index = prepare_stream.prepare([f], str(tmp_path / "o"), tokenizer=tok)
    assert index["documents"] == {"train": 1, "val": 1}
    assert index["tokens"]["train"] > 10 * index["tokens"]["val"] > 0


def test_a_text_file_without_line_ends_is_cut_at_a_character(tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("é" * 1001)  # 2002 bytes, no newline: the cut may not split a character
    cut = documents.text_cut(f)
    assert cut % 2 == 0 and 1800 < cut < 2002
    (tmp_path / "two.txt").write_text("x")
    assert data._input_files([str(f), str(tmp_path / "two.txt")], None) and documents.single_text([f, f]) is None
