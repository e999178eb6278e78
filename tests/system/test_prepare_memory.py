"""``zeropp-hier data prepare`` holds bounded memory whatever the corpus size ([Note: streaming
prepare]): a generated 48 MB JSON-lines corpus, plain and as ``.jsonl.zst`` (decompressed as
it is read: [Note: compressed and columnar input]), tokenized with a tokenizer.json on 2 worker
processes, keeps every process (the reader and each worker) under ``BOUND_MIB`` of resident
memory, measured with ``getrusage`` of the command's process tree."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ..unit.test_prepare_stream import WORDS, make_tokenizer

CORPUS_MB = 48
# per process: Python with torch and numpy imported (~200 MiB on this machine), the tokenizer,
# and 2 x workers tasks of 1 MiB of text with their ids; none of it grows with the corpus
BOUND_MIB = 512


def _corpus(path, megabytes):
    """Pile-like JSON lines of ``megabytes`` MB (uncompressed), zstd-compressed for a ``.zst`` path."""
    rng = np.random.default_rng(0)
    written = 0
    with open(path, "wb") as raw:
        f = raw
        if str(path).endswith(".zst"):
            import zstandard

            f = zstandard.ZstdCompressor(level=3).stream_writer(raw)
        while written < megabytes * 1_000_000:  # Pile-like: documents of a few KB
            text = " ".join(rng.choice(WORDS, size=700))
            line = (json.dumps({"text": text, "meta": {"pile_set_name": "generated"}}) + "\n").encode()
            f.write(line)
            written += len(line)
        if f is not raw:
            f.close()


@pytest.mark.parametrize("name", ["big.jsonl", "big.jsonl.zst"])
def test_a_large_corpus_prepares_in_bounded_memory(tmp_path, name):
    if name.endswith(".zst"):
        pytest.importorskip("zstandard", reason="the data extra's zstandard reads .jsonl.zst")
    tok_file = make_tokenizer(tmp_path / "tokenizer.json", [" ".join(WORDS)] * 50)
    corpus = tmp_path / name
    _corpus(corpus, CORPUS_MB)
    out = tmp_path / "out"
    # the measuring process runs the command as its child: RUSAGE_CHILDREN is then the largest
    # resident set among the command and the workers it waited for, and nothing else
    probe = textwrap.dedent(
        f"""
        import resource, subprocess, sys
        subprocess.run([sys.executable, "-m", "zeropp_hier", "data", "prepare", {str(corpus)!r},
                        "--tokenizer", {tok_file!r}, "--workers", "2", "--out", {str(out)!r}], check=True)
        print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    peak_mib = int(done.stdout.strip().splitlines()[-1]) / 1024
    index = json.loads((out / "index.json").read_text())
    size_mib = corpus.stat().st_size / 2**20
    print(f"prepared {size_mib:.0f} MiB of {name} ({index['tokens']}) with peak RSS {peak_mib:.0f} MiB per process")
    assert index["inputs"][0]["bytes"] == corpus.stat().st_size and index["tokens"]["train"] > 0
    assert peak_mib < BOUND_MIB, f"peak resident memory {peak_mib:.0f} MiB per process, bound {BOUND_MIB} MiB"
