"""The user's corpus as a stream of documents: ``.txt`` files (one document each), JSON-lines
files (one document per line, its text in a field: ``text`` in the Pile's layout), plain or
compressed (``.jsonl.zst``, ``.jsonl.gz``), and columnar files (parquet; ``.arrow``, what Hugging
Face ``datasets``' ``save_to_disk`` writes), read in bounded pieces and hashed as they are read
([Note: streaming prepare] in prepare_stream.py).

Nothing here holds a whole file: a JSON line is one document (so one line is the most held), a
``.txt`` file is read ``TXT_PIECE`` bytes at a time, cut after its last newline, a columnar file
one record batch (``COLUMN_BATCH`` rows, within one row group) at a time.

[Note: compressed and columnar input]
The readers are zstandard (the Pile's ``.jsonl.zst``), the standard library's gzip and pyarrow
(parquet, Arrow IPC streams), each streaming: a compressed file is decompressed through a
reader, line by line, never to disk. Hugging Face ``datasets`` is not used: ``load_dataset``
converts a corpus into an Arrow cache beside it (a second copy of the Pile on disk) unless it
streams, and it reads these formats through the same zstandard and pyarrow underneath; a
``save_to_disk`` directory is Arrow IPC stream files (``data-*.arrow``), which pyarrow reads
directly. The digest in ``index.json`` is of the file as stored (compressed).

[Note: single text file]
Documents are held out by number (every 20th, starting with the first), so a corpus of one
``.txt`` file would be all validation. One ``.txt`` file alone is therefore cut in two
documents at a line end: the first part (about 19/20 of its bytes) is train, the rest val;
each ends with the newline (or EOS) every document ends with.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

from ...core.errors import HierConfigError
from .token_format import HELD_OUT_EVERY

TXT_PIECE = 8 << 20  # bytes of a .txt document tokenized at once (cut at a newline)
COLUMN_BATCH = 1024  # rows of a parquet / Arrow file read at once
_CUT_WINDOW = 1 << 20  # bytes searched back for a line end at a single text file's cut
# read by default in a directory (`--glob` replaces these); anything else there is named as skipped
DEFAULT_GLOBS = ("*.txt", "*.jsonl", "*.jsonl.zst", "*.jsonl.gz", "*.parquet", "*.arrow")
_COMPRESSED = {".zst": "zstd", ".gz": "gzip"}
_JSONL = (".jsonl", ".json", ".ndjson")
# what a corpus sometimes comes as, and how to make it readable here
UNREADABLE = {
    ".bz2": "decompress it first (`bunzip2 -k FILE`), or recompress it with zstd",
    ".xz": "decompress it first (`xz -dk FILE`), or recompress it with zstd",
    ".zip": "unzip it first",
}
_MISSING = {
    "zstandard": "reading .zst needs the zstandard package: `pip install 'zeropp-hier[data]'`",
    "pyarrow": "reading parquet / Arrow needs pyarrow: `pip install 'zeropp-hier[data]'`",
}


class Piece(NamedTuple):
    """Bytes of one document (all of it, or one cut of a long ``.txt``); ``last``: the
    document ends with this piece."""

    data: bytes
    last: bool


def kind_of(path: Path) -> str:
    """How ``path`` is read, by its suffixes: ``jsonl`` (``.jsonl``, ``.json``, ``.ndjson``,
    optionally then ``.zst`` / ``.gz``), ``parquet``, ``arrow``; an archive this reader does not
    open is refused naming the fix; anything else is text (``--glob '*.md'``, the standard
    library's ``.py`` sources), as in today's prepare."""
    suffixes = [s.lower() for s in path.suffixes]
    last = suffixes[-1] if suffixes else ""
    if last in _COMPRESSED:
        if len(suffixes) >= 2 and suffixes[-2] in _JSONL:
            return "jsonl"
        raise HierConfigError(
            "data prepare input",
            str(path),
            f"a {_COMPRESSED[last]} file is read as compressed JSON lines (NAME.jsonl{last}): rename it so, "
            "or decompress it if it is not JSON lines",
        )
    if last in _JSONL:
        return "jsonl"
    if last == ".parquet":
        return "parquet"
    if last == ".arrow":
        return "arrow"
    if last in UNREADABLE:
        raise HierConfigError("data prepare input", str(path), UNREADABLE[last])
    return "txt"


def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise HierConfigError("data prepare input", module, _MISSING[module]) from None


def text_cut(path: Path) -> int:
    """Where one ``.txt`` file alone is cut into train and val ([Note: single text file]): after
    the last newline before 19/20 of its bytes (searched back at most ``_CUT_WINDOW`` bytes),
    else at that byte, moved back to the start of a UTF-8 character."""
    size = path.stat().st_size
    target = size - size // HELD_OUT_EVERY
    if target >= size or target <= 0:
        return size
    start = max(0, target - _CUT_WINDOW)
    with open(path, "rb") as f:
        f.seek(start)
        window = f.read(target - start)
    nl = window.rfind(b"\n")
    if nl >= 0:
        return start + nl + 1
    k = len(window)
    while k > 0 and (window[k - 1] & 0xC0) == 0x80:  # a continuation byte: cut before its character
        k -= 1
    if k > 0 and window[k - 1] >= 0xC0:
        k -= 1
    return start + k if k > 0 else target


def single_text(files: Sequence[Path]) -> int | None:
    """The cut of a corpus that is one ``.txt`` file ([Note: single text file]), else None."""
    return text_cut(files[0]) if len(files) == 1 and kind_of(files[0]) == "txt" else None


class _Hashed:
    """A binary file whose bytes are hashed and counted as a decompressor reads them."""

    def __init__(self, f, reader: Reader):
        self.f, self.reader = f, reader

    def read(self, n: int = -1) -> bytes:
        block = self.f.read(n)
        self.reader._hash.update(block)
        self.reader.bytes += len(block)
        return block

    def readable(self) -> bool:
        return True


class Reader:
    """The pieces of one input file, hashing its bytes as they are read: ``sha256`` and
    ``bytes`` are the whole file's once the iteration ends. ``split_at``: the byte where a
    single ``.txt`` file is cut in two documents ([Note: single text file])."""

    def __init__(self, path: Path, text_field: str = "text", split_at: int | None = None):
        self.path, self.field, self.kind, self.split_at = path, text_field, kind_of(path), split_at
        if self.kind in ("parquet", "arrow"):
            _need("pyarrow")
        elif self.path.suffix.lower() == ".zst":
            _need("zstandard")
        self._hash = hashlib.sha256()
        self.bytes = 0

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def __iter__(self) -> Iterator[Piece]:
        return {"jsonl": self._jsonl, "txt": self._txt}.get(self.kind, self._columns)()

    def _txt(self) -> Iterator[Piece]:
        size = os.path.getsize(self.path)
        ends = [self.split_at, size] if self.split_at is not None and 0 < self.split_at < size else [size]
        with open(self.path, "rb") as f:
            pos = 0
            for end in ends:  # one document per range
                carry = b""
                while pos < end:
                    block = f.read(min(TXT_PIECE, end - pos))
                    if not block:  # the file shrank while read
                        break
                    pos += len(block)
                    self._hash.update(block)
                    self.bytes += len(block)
                    data = carry + block
                    cut = data.rfind(b"\n") + 1 if len(data) >= TXT_PIECE else 0
                    if cut:  # a long document: tokenized in pieces that end at a line end
                        carry = data[cut:]
                        yield Piece(data[:cut], False)
                    else:
                        carry = data
                yield Piece(carry, True)
            while block := f.read(TXT_PIECE):  # the file grew while read: hashed, as stat did not see it
                self._hash.update(block)
                self.bytes += len(block)

    def _lines(self, f) -> Iterator[bytes]:
        suffix = self.path.suffix.lower()
        if suffix == ".zst":
            import io

            zstd = _need("zstandard")
            # read_across_frames: a .zst may hold several frames (pzstd / zstdmt write them)
            raw = zstd.ZstdDecompressor().stream_reader(_Hashed(f, self), read_across_frames=True)
            return iter(io.BufferedReader(raw, 1 << 20))
        if suffix == ".gz":
            return iter(gzip.GzipFile(fileobj=_Hashed(f, self), mode="rb"))  # type: ignore[call-overload]
        return (self._count(line) for line in f)

    def _count(self, line: bytes) -> bytes:
        self._hash.update(line)
        self.bytes += len(line)
        return line

    def _jsonl(self) -> Iterator[Piece]:
        with open(self.path, "rb") as f:
            for lineno, line in enumerate(self._lines(f), start=1):
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
                yield self._piece(text)
            while block := f.read(1 << 20):  # what a decompressor left unread: the digest is of the whole file
                self._hash.update(block)
                self.bytes += len(block)

    @staticmethod
    def _piece(text: str) -> Piece:
        # lone surrogates (legal in JSON, not in UTF-8) become U+FFFD, as undecodable bytes do
        return Piece(text.encode("utf-8", errors="replace"), True)

    def _columns(self) -> Iterator[Piece]:
        pa = _need("pyarrow")
        with open(self.path, "rb") as f:  # the file as stored, hashed in blocks
            while block := f.read(1 << 20):
                self._hash.update(block)
                self.bytes += len(block)
        try:
            if self.kind == "parquet":
                import pyarrow.parquet as pq

                pf = pq.ParquetFile(self.path)
                names = pf.schema_arrow.names
                batches = pf.iter_batches(batch_size=COLUMN_BATCH, columns=[self.field]) if self.field in names else ()
            else:
                stream = pa.ipc.open_stream(pa.memory_map(str(self.path)))  # save_to_disk's files
                names, batches = stream.schema.names, stream
        except pa.ArrowInvalid as e:
            raise HierConfigError("data prepare input", str(self.path), f"not a {self.kind} file ({e})") from None
        if self.field not in names:
            raise HierConfigError(
                "--text-field",
                self.field,
                f"{self.path} has no column {self.field!r} (it has {sorted(names)[:8]}): name the column that "
                "holds the text",
            )
        row = 0
        for batch in batches:
            for text in batch.column(batch.schema.get_field_index(self.field)).to_pylist():
                row += 1
                if not isinstance(text, str):
                    raise HierConfigError(
                        "--text-field",
                        self.field,
                        f"{self.path} row {row} has {type(text).__name__} under {self.field!r}: name a string column",
                    )
                yield self._piece(text)
