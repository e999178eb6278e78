"""Token files and the loader (zeropp_hier.app.data.tokens): disjoint across ranks, identical across
runs, resuming at the exact sample; refusals name the field."""

import json

import numpy as np
import pytest

from zeropp_hier.app.data import tokens as data
from zeropp_hier.app.data.tokens import HELD_OUT_EVERY, stdlib_files


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A small real corpus: the first 41 standard-library sources."""
    out = tmp_path_factory.mktemp("tokens")
    files = stdlib_files()[:41]
    index = data.prepare(files, str(out), "stdlib[:41]")
    return out, files, index


def test_prepare_writes_flat_tokens_and_an_index(prepared):
    out, files, index = prepared
    on_disk = json.loads((out / "index.json").read_text())
    assert (
        on_disk == index and index["dtype"] == "uint16" and index["tokenizer"] == {"kind": "byte", "vocab_size": 256}
    )
    assert not (out / "tokenizer.json").exists()
    val_files = [f for i, f in enumerate(files) if i % HELD_OUT_EVERY == 0]
    train_bytes = b"".join(f.read_bytes() + b"\n" for i, f in enumerate(files) if i % HELD_OUT_EVERY)
    assert index["documents"] == {"train": len(files) - len(val_files), "val": len(val_files)}
    tokens = np.fromfile(out / "train.bin", dtype=np.uint16)
    assert tokens.size == index["tokens"]["train"] == len(train_bytes)
    assert tokens.tobytes() == np.frombuffer(train_bytes, np.uint8).astype(np.uint16).tobytes()
    assert not list(out.glob("*.tmp"))


def _loaders(out, world, micro=3, seq=32, seed=0):
    td = data.TokenData(str(out))
    return [data.Loader(td, seq, micro, r, world, seed) for r in range(world)]


def test_ranks_get_disjoint_samples(prepared):
    loaders = _loaders(prepared[0], world=8)
    seen = [k for i in range(20) for ld in loaders for k in ld.sample_ids(i)]
    assert len(seen) == 20 * 8 * 3 and len(set(seen)) == len(seen)  # within an epoch: no repeats
    x, y = loaders[0].batch(0)
    assert x.shape == (3, 32) and (x[:, 1:] == y[:, :-1]).all()  # targets are the next tokens


def test_two_runs_see_identical_batches_and_seeds_differ(prepared):
    a, b = _loaders(prepared[0], 4), _loaders(prepared[0], 4)
    for i in (0, 1, 7):
        for r in range(4):
            assert (a[r].batch(i)[0] == b[r].batch(i)[0]).all()
    other = _loaders(prepared[0], 4, seed=1)
    assert other[0].sample_ids(0) != a[0].sample_ids(0)


def test_resume_continues_at_the_exact_sample(prepared):
    loaders = _loaders(prepared[0], 4)
    state = loaders[2].state(5)  # saved before micro-batch 5
    assert state["sample"] == 5 * 4 * 3
    fresh = _loaders(prepared[0], 4)
    fresh[2].resume_at(json.loads(json.dumps(state)), 5)
    assert fresh[2].positions(5)[0] == 5 * 4 * 3 + 2 * 3
    assert (fresh[2].batch(5)[0] == loaders[2].batch(5)[0]).all()
    with pytest.raises(ValueError, match="'seed'.*resume with that seed"):
        _loaders(prepared[0], 8)[0].resume_at({"sample": 12, "seed": 1}, 1)


@pytest.mark.parametrize("before,after", [((8, 2), (4, 4)), ((4, 4), (8, 2)), ((8, 3), (4, 5)), ((3, 1), (8, 2))])
def test_resume_at_another_world_and_micro_batch_continues_at_the_exact_sample(prepared, before, after):
    """ "Exact": the global sample positions consumed before the save and after the resume are
    0, 1, 2, ... without a gap or a repeat, whatever the worlds and micro-batches; with the same
    global batch, every step after the resume takes the same samples as a run at the new world
    from the start (only which rank reads which sample differs)."""
    (w0, m0), (w1, m1) = before, after
    steps_before, steps_after = 3, 4
    old = _loaders(prepared[0], w0, micro=m0)
    seen = [g for i in range(steps_before) for ld in old for g in ld.positions(i)]
    state = old[0].state(steps_before)
    assert state["sample"] == len(seen) == steps_before * w0 * m0
    new = _loaders(prepared[0], w1, micro=m1)
    for ld in new:
        ld.resume_at(state, steps_before)
    after_pos = [[g for ld in new for g in ld.positions(steps_before + i)] for i in range(steps_after)]
    seen += [g for step in after_pos for g in step]
    assert sorted(seen) == list(range(len(seen)))
    assert new[0].state(steps_before + steps_after)["sample"] == len(seen)
    if w0 * m0 == w1 * m1:  # same global batch: the same samples per step as a run at w1 throughout
        straight = _loaders(prepared[0], w1, micro=m1)
        for i in range(steps_after):
            want = sorted(k for ld in straight for k in ld.sample_ids(steps_before + i))
            assert sorted(k for ld in new for k in ld.sample_ids(steps_before + i)) == want


def test_epochs_wrap_with_a_new_order(prepared):
    ld = _loaders(prepared[0], 1, micro=1)[0]
    n = ld.n
    first = [ld.sample_ids(i)[0] for i in range(n)]
    second = [ld.sample_ids(n + i)[0] for i in range(n)]
    assert sorted(first) == sorted(second) == list(range(n)) and first != second


def test_refusals_name_the_field(tmp_path, prepared):
    with pytest.raises(ValueError, match="'data.path'.*data prepare"):
        data.TokenData(str(tmp_path))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="no text found"):
        data.prepare([tmp_path / "empty.txt"] * 3, str(tmp_path / "o"))
    with pytest.raises(ValueError, match="seq_len"):
        data.Loader(data.TokenData(str(prepared[0]), "val"), 10**9, 1, 0, 1)


def test_cli_prepares_a_directory_of_text(tmp_path, capsys):
    from zeropp_hier.__main__ import main

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"doc{i}.txt").write_text(f"document {i} " * 50)
    assert main(["data", "prepare", str(src), "--out", str(tmp_path / "out")]) == 0
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["documents"] == {"train": 2, "val": 1}
    assert "train" in capsys.readouterr().out


# -- BPE ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A BPE tokenizer of 1024 tokens trained on the same 41 standard-library sources."""
    out = tmp_path_factory.mktemp("bpe")
    files = stdlib_files()[:41]
    return out, files, data.prepare(files, str(out), "stdlib[:41]", "bpe", 1024)


def test_bpe_is_trained_here_saved_beside_the_tokens_and_indexed(bpe):
    out, files, index = bpe
    t = index["tokenizer"]
    assert t["kind"] == "bpe" and t["file"] == "tokenizer.json" and t["requested_vocab_size"] == 1024
    assert t["vocab_size"] == 1024  # 41 files have far more than 768 pairs seen twice
    assert json.loads((out / "index.json").read_text()) == index
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / t["file"]))
    assert tok.get_vocab_size() == t["vocab_size"]
    for split in ("train", "val"):
        ids = np.fromfile(out / f"{split}.bin", dtype=index["dtype"])
        assert ids.size == index["tokens"][split] and int(ids.max()) < t["vocab_size"]
    # BPE compresses: fewer tokens than bytes (the byte-level files hold one per byte)
    train_bytes = sum(f.stat().st_size + 1 for i, f in enumerate(files) if i % HELD_OUT_EVERY)
    assert index["tokens"]["train"] < 0.6 * train_bytes


def test_bpe_round_trip_decodes_every_document(bpe):
    """The token files decode to the documents, the held-out ones (text the tokenizer never
    saw) included."""
    out, files, index = bpe
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / index["tokenizer"]["file"]))
    for split in ("train", "val"):
        text = "".join(
            f.read_bytes().decode("utf-8") + "\n"
            for i, f in enumerate(files)
            if (i % HELD_OUT_EVERY == 0) == (split == "val")
        )
        ids = np.fromfile(out / f"{split}.bin", dtype=index["dtype"])
        assert tok.decode(ids.tolist(), skip_special_tokens=False) == text
    odd = "naïve café ∑ 🙂 \x00 tabs\tand\r\nlines"  # characters the corpus may not hold: bytes cover them
    assert tok.decode(tok.encode(odd).ids, skip_special_tokens=False) == odd


def test_bpe_is_deterministic(bpe, tmp_path):
    out, files, index = bpe
    again = data.prepare(files, str(tmp_path), "stdlib[:41]", "bpe", 1024)
    assert again == index
    for name in ("tokenizer.json", "train.bin", "val.bin"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name
    other = data.prepare(files, str(tmp_path / "small"), "stdlib[:41]", "bpe", 300)
    assert other["tokenizer"]["vocab_size"] == 300 and other["sha256"] != index["sha256"]


def test_bpe_data_feeds_the_loader_unchanged(bpe):
    out, _, index = bpe
    td = data.TokenData(str(out))
    assert td.vocab_size == index["tokenizer"]["vocab_size"]
    loaders = [data.Loader(td, 32, 3, r, 4) for r in range(4)]
    seen = [k for i in range(5) for ld in loaders for k in ld.sample_ids(i)]
    assert len(set(seen)) == len(seen)
    x, y = loaders[1].batch(2)
    assert x.shape == (3, 32) and (x[:, 1:] == y[:, :-1]).all() and int(x.max()) < td.vocab_size


def test_bpe_refusals_name_the_field(tmp_path):
    files = stdlib_files()[:3]
    with pytest.raises(ValueError, match="'--vocab-size'.*at least 256"):
        data.prepare(files, str(tmp_path), tokenizer="bpe", vocab_size=100)
    with pytest.raises(ValueError, match="'--vocab-size'.*--tokenizer bpe"):
        data.prepare(files, str(tmp_path), vocab_size=1000)
    with pytest.raises(ValueError, match="'--tokenizer'"):
        data.prepare(files, str(tmp_path), tokenizer="wordpiece")


def test_cli_prepares_bpe(tmp_path, capsys):
    from zeropp_hier.__main__ import main

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"doc{i}.txt").write_text(f"document {i} says hello world " * 50)
    assert (
        main(
            ["data", "prepare", str(src), "--out", str(tmp_path / "out"), "--tokenizer", "bpe", "--vocab-size", "300"]
        )
        == 0
    )
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["tokenizer"]["kind"] == "bpe" and (tmp_path / "out" / "tokenizer.json").is_file()
    assert "BPE" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["data", "prepare", str(src), "--out", str(tmp_path / "o2"), "--tokenizer", "bpe"])


def test_the_job_takes_the_models_vocabulary_from_the_data(bpe, prepared):
    from zeropp_hier.app.job_vocab import with_data_vocab
    from zeropp_hier.app.spec import MODELS, JobSpec, ModelSpec

    out, _, index = bpe
    v = index["tokenizer"]["vocab_size"]
    assert with_data_vocab(JobSpec(data_path=str(out))).model.vocab_size == v  # tiny: null, follows
    assert with_data_vocab(JobSpec(data_path=str(prepared[0]))).model.vocab_size == 256
    assert with_data_vocab(JobSpec()).model.vocab_size == 256  # synthetic batches
    # synthetic batches draw from the model's own vocabulary, whatever its size
    assert with_data_vocab(JobSpec(model=ModelSpec(vocab_size=128))).model.vocab_size == 128
    assert with_data_vocab(JobSpec(data_path=str(out), model=MODELS["small"])).model.vocab_size == 50304
    with pytest.raises(ValueError, match=f"'model.vocab_size'.*has {v} tokens"):
        with_data_vocab(JobSpec(data_path=str(out), model=ModelSpec(vocab_size=256)))
