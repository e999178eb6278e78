"""The prepared-data directory's format, named once: what ``data prepare`` writes (app/data/tokens.py for
one process, app/data/prepare_stream.py for several) and what the loader reads ([Note: token files]
in app/data/tokens.py)."""

from __future__ import annotations

from pathlib import Path

FORMAT = "zeropp-hier-tokens"
VERSION = 1
SPLITS = ("train", "val")
HELD_OUT_EVERY = 20  # input file i goes to val when i % 20 == 0
TOKENIZER_FILE = "tokenizer.json"


def hash_file(digest, path: Path) -> None:
    """Feed the file to ``digest`` a MiB at a time: never the whole file in memory."""
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
