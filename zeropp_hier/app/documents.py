"""The user's corpus as a stream of documents: ``.txt`` files (one document each) and JSON-lines
files (one document per line, its text in a field: ``text`` in the Pile's layout), read in
bounded pieces and hashed as they are read ([Note: streaming prepare] in prepare_stream.py).

Nothing here holds a whole file: a JSON line is one document (so one line is the most held), a
``.txt`` file is read ``TXT_PIECE`` bytes at a time, cut after its last newline.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator, NamedTuple

from ..core.errors import HierConfigError

TXT_PIECE = 8 << 20  # bytes of a .txt document tokenized at once (cut at a newline)
# what a corpus often comes as, and how to make it readable here (no dependency is added for them)
UNREADABLE = {
    ".parquet": "reading parquet needs pyarrow, which is not installed: convert it to jsonl, or "
    "`pip install pyarrow` and export the text column to jsonl",
    ".zst": "decompress it first (`zstd -d FILE`: the Pile ships as .jsonl.zst)",
    ".gz": "decompress it first (`gunzip -k FILE`)",
}


class Piece(NamedTuple):
    """Bytes of one document (all of it, or one cut of a long ``.txt``); ``last``: the
    document ends with this piece."""

    data: bytes
    last: bool


def kind_of(path: Path) -> str:
    """``jsonl`` by suffix (``.jsonl``, ``.json``, ``.ndjson``: read as JSON lines), a compressed
    or columnar file is refused naming the fix, anything else is text (``--glob '*.md'``, the
    standard library's ``.py`` sources), as in today's prepare."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in UNREADABLE:
        raise HierConfigError("data prepare input", str(path), UNREADABLE[suffix])
    return "txt"


class Reader:
    """The pieces of one input file, hashing its bytes as they are read: ``sha256`` and
    ``bytes`` are the whole file's once the iteration ends."""

    def __init__(self, path: Path, text_field: str = "text"):
        self.path, self.field, self.kind = path, text_field, kind_of(path)
        self._hash = hashlib.sha256()
        self.bytes = 0

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def __iter__(self) -> Iterator[Piece]:
        return self._jsonl() if self.kind == "jsonl" else self._txt()

    def _txt(self) -> Iterator[Piece]:
        carry = b""
        with open(self.path, "rb") as f:
            while True:
                block = f.read(TXT_PIECE)
                self._hash.update(block)
                self.bytes += len(block)
                if not block:
                    break
                data = carry + block
                cut = data.rfind(b"\n") + 1 if len(data) >= TXT_PIECE else 0
                if cut:  # a long document: tokenized in pieces that end at a line end
                    carry = data[cut:]
                    yield Piece(data[:cut], False)
                else:
                    carry = data
        yield Piece(carry, True)

    def _jsonl(self) -> Iterator[Piece]:
        with open(self.path, "rb") as f:
            for lineno, line in enumerate(f, start=1):
                self._hash.update(line)
                self.bytes += len(line)
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError as e:
                    raise HierConfigError(
                        "data prepare input",
                        f"{self.path}:{lineno}",
                        f"not a JSON line ({e}): fix or remove that line",
                    ) from None
                text = doc.get(self.field) if isinstance(doc, dict) else None
                if not isinstance(text, str):
                    keys = sorted(doc)[:8] if isinstance(doc, dict) else type(doc).__name__
                    raise HierConfigError(
                        "--text-field",
                        self.field,
                        f"{self.path}:{lineno} has no string under {self.field!r} (it has {keys}): name the field "
                        "that holds the text",
                    )
                # lone surrogates (legal in JSON, not in UTF-8) become U+FFFD, as undecodable bytes do
                yield Piece(text.encode("utf-8", errors="replace"), True)
