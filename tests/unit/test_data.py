"""Token files and the loader (zeropp_hier.app.data): disjoint across ranks, identical across
runs, resuming at the exact sample; refusals name the field."""

import json

import numpy as np
import pytest

from zeropp_hier.app import data
from zeropp_hier.app.text import HELD_OUT_EVERY, stdlib_files


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
    assert on_disk == index and index["dtype"] == "uint16" and index["tokenizer"]["vocab_size"] == 256
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
    i = fresh[2].index_of(json.loads(json.dumps(state)))
    assert i == 5 and fresh[2].positions(i)[0] == 5 * 4 * 3 + 2 * 3
    assert (fresh[2].batch(i)[0] == loaders[2].batch(5)[0]).all()
    with pytest.raises(ValueError, match="resume data position"):
        _loaders(prepared[0], 8)[0].index_of({"sample": 12, "seed": 0})


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
