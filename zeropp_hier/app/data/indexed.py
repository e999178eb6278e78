"""Megatron / GPT-NeoX indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``), read in place.

[Note: indexed dataset format]
The "mmap" format that Megatron-LM's and GPT-NeoX's ``tools/preprocess_data.py`` write through
``MMapIndexedDatasetBuilder`` (defined in ``megatron/data/indexed_dataset.py`` of
bigscience-workshop/Megatron-DeepSpeed and EleutherAI/gpt-neox, and in
``megatron/core/datasets/indexed_dataset.py`` of NVIDIA/Megatron-LM; this module implements it
from that definition). ``PREFIX.bin`` is the token ids of every sequence, back to back, in one
integer dtype. ``PREFIX.idx``, little-endian:

    9 bytes  magic b"MMIDIDX\\x00\\x00"
    u64      version, 1
    u8       dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16
             (6 and 7 are floating point: never token ids, refused here)
    u64      S, the number of sequences
    u64      D, the number of entries of the document index
    int32[S] each sequence's length in tokens
    int64[S] each sequence's byte offset in PREFIX.bin
    int64[D] the document index: document k is sequences doc[k] .. doc[k+1]-1 (doc[0] = 0,
             doc[D-1] = S; Megatron-LM >= 0.5 may append a one-byte mode per sequence after it,
             for multimodal data, which a token reader does not need)

The job reads ``PREFIX.bin`` as the flat token stream it already reads from ``train.bin``
([Note: token files] in tokens.py): every sequence in file order, so samples cross document
boundaries exactly as in Megatron's GPT dataset when the corpus was prepared with
``--append-eod`` (the end-of-document token separates documents in the stream). Nothing is
converted or copied: both files are memory-mapped, and opening one reads only the header and
the last sequence's pointer, so a 300-billion-token Pile opens in milliseconds on every rank.
The pair has no vocabulary size (set ``model.vocab_size``, e.g. 50432 for GPT-NeoX-20B's
tokenizer) and no held-out split of its own: ``data.split`` cuts it by document as Megatron's
``--split`` does, and ``data.path`` may blend several pairs by weight ([Note: blends and splits]
in blend.py); each batch is checked against the vocabulary
(``limit_vocab``), so an id the model cannot embed stops the job naming the file instead of
failing inside the embedding.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from ...core.errors import HierConfigError
from .split import SPLIT_NAMES, parse_split, split_bounds

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPES: dict[int, type] = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document index entries
_FINGERPRINT_BYTES = 1 << 20  # of each file's start and end: see fingerprint()


def prefix_of(path: str) -> str | None:
    """The dataset prefix ``path`` names (``PREFIX``, ``PREFIX.bin`` or ``PREFIX.idx``) when both
    files exist, else None."""
    p = str(path)
    for suffix in (".bin", ".idx"):
        if p.endswith(suffix):
            p = p[: -len(suffix)]
            break
    return p if os.path.isfile(p + ".bin") and os.path.isfile(p + ".idx") else None


def write(prefix: str, documents: Sequence[Sequence[int]], dtype=np.uint16) -> None:
    """Write ``documents`` (each a list of token ids, one sequence per document) as a
    ``PREFIX.bin`` / ``PREFIX.idx`` pair in the format above (the tests' writer; a corpus
    prepared by Megatron or GPT-NeoX is read as it is)."""
    code = next((c for c, t in DTYPES.items() if np.dtype(t) == np.dtype(dtype)), None)
    if code is None:
        raise ValueError(f"dtype {np.dtype(dtype)} has no code in the indexed format")
    item = np.dtype(dtype).itemsize
    sizes = np.array([len(d) for d in documents], dtype=np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes):
        pointers[1:] = np.cumsum(sizes[:-1], dtype=np.int64) * item
    with open(prefix + ".bin", "wb") as f:
        for d in documents:
            f.write(np.asarray(d, dtype=dtype).tobytes())
    doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(_HEADER.pack(MAGIC, VERSION, code, len(sizes), len(doc_idx)))
        f.write(sizes.tobytes() + pointers.tobytes() + doc_idx.tobytes())


class IndexedTokens:
    """A Megatron pair as the job's token source: the interface of ``data.TokenData`` (``count``,
    ``vocab_size``, ``index``, ``samples``, ``sample``) over ``PREFIX.bin``, memory-mapped."""

    def __init__(self, path: str, split: str = "train", data_split: str | None = None):
        prefix = prefix_of(path)
        if prefix is None:
            raise HierConfigError(
                "data.path", path, "no PREFIX.bin + PREFIX.idx pair there: name the prefix preprocess_data.py wrote"
            )
        if split not in SPLIT_NAMES:
            raise HierConfigError("data split", split, f"use one of {list(SPLIT_NAMES)}")
        if split != "train" and data_split is None:
            raise HierConfigError(
                "data.split",
                None,
                f"{prefix}.bin/.idx has no held-out documents without a split: set data.split=969,30,1 "
                "(Megatron's --split: train,val,test parts, by document) to evaluate on its val part",
            )
        parts = parse_split(data_split) if data_split is not None else None
        self.prefix, self.split = prefix, split
        idx, binf = Path(prefix + ".idx"), Path(prefix + ".bin")
        with open(idx, "rb") as f:
            head = f.read(_HEADER.size)
        if len(head) < _HEADER.size or head[:9] != MAGIC:
            raise HierConfigError(
                "data.path",
                str(idx),
                f"not a Megatron mmap index (its first bytes are {head[:9]!r}, expected {MAGIC!r}): give a pair "
                "written with --dataset-impl mmap",
            )
        _, version, code, n_seq, n_doc = _HEADER.unpack(head)
        if version != VERSION:
            raise HierConfigError("data.path", str(idx), f"index version {version}; this reader knows version 1")
        if code not in DTYPES:
            raise HierConfigError(
                "data.path", str(idx), f"dtype code {code} is not an integer token dtype (known: {sorted(DTYPES)})"
            )
        self.dtype = np.dtype(DTYPES[code])
        self.sequences, self.documents = int(n_seq), max(0, int(n_doc) - 1)
        need = _HEADER.size + n_seq * (4 + 8) + n_doc * 8
        if idx.stat().st_size < need:
            raise HierConfigError(
                "data.path", str(idx), f"{idx.stat().st_size} bytes, its header needs {need}: the file is truncated"
            )
        table = np.memmap(idx, dtype=np.uint8, mode="r")
        sizes = np.frombuffer(table, dtype=np.int32, count=n_seq, offset=_HEADER.size)
        pointers = np.frombuffer(table, dtype=np.int64, count=n_seq, offset=_HEADER.size + 4 * n_seq)
        # sequences lie back to back (the writer's layout): the stream is the whole .bin, and the
        # last sequence's end must be the file's end (a truncated or padded .bin is refused)
        end = int(pointers[-1]) + int(sizes[-1]) * self.dtype.itemsize if n_seq else 0
        if end != binf.stat().st_size or (n_seq and int(pointers[0]) != 0):
            raise HierConfigError(
                "data.path",
                str(binf),
                f"holds {binf.stat().st_size} bytes, its index ends the last sequence at byte {end}: "
                "the pair does not match (copy both files again)",
            )
        first, stop = 0, end // self.dtype.itemsize  # the split's sequences, as one token range
        if parts is not None:
            bounds = split_bounds(parts, int(n_seq))
            a, b = bounds[SPLIT_NAMES.index(split)], bounds[SPLIT_NAMES.index(split) + 1]
            first = int(pointers[a]) // self.dtype.itemsize if a < n_seq else stop
            stop = int(pointers[b]) // self.dtype.itemsize if b < n_seq else stop
            self.sequences_range = (a, b)
        self.count = stop - first
        tokens = np.memmap(binf, dtype=self.dtype, mode="r", shape=(end // self.dtype.itemsize,)) if end else None
        self.tokens = tokens[first:stop] if tokens is not None else np.zeros(0, self.dtype)
        self.vocab_size: int | None = None  # not recorded in the pair: the model's (limit_vocab)
        self._limit: int | None = None
        self._index: dict = {
            "format": "megatron-mmap",
            "prefix": prefix,
            "dtype": self.dtype.name,
            "tokens": {split: self.count},
            "sequences": self.sequences,
            "documents": {"train": self.documents},
            "split": data_split,
        }

    @property
    def index(self) -> dict:
        """What the pair is; its ``sha256`` (``fingerprint``: reads up to 4 MiB) only when first
        asked: the job asks on rank 0 alone ([Note: data order caches] in order_cache.py)."""
        if "sha256" not in self._index:
            digest, data_split = fingerprint(self.prefix), self._index["split"]
            self._index["sha256"] = digest if data_split is None else _with_split(digest, data_split)
        return self._index

    def limit_vocab(self, vocab: int) -> None:
        """Refuse, per sample, ids the model's ``vocab`` cannot embed (the pair does not say its
        tokenizer's size)."""
        self._limit = int(vocab)

    def samples(self, seq_len: int) -> int:
        return max(0, (self.count - 1) // seq_len)

    def sample(self, k: int, seq_len: int) -> np.ndarray:
        start = k * seq_len
        out = np.asarray(self.tokens[start : start + seq_len + 1], dtype=np.int64)
        if self._limit is not None and out.size and (int(out.max()) >= self._limit or int(out.min()) < 0):
            bad = int(out.max()) if int(out.max()) >= self._limit else int(out.min())
            raise HierConfigError(
                "model.vocab_size",
                self._limit,
                f"{self.prefix}.bin holds token id {bad} (near token {start}): set model.vocab_size to the "
                "tokenizer's size (50432 for GPT-NeoX-20B's)",
            )
        return out


def _with_split(digest: str, data_split: str) -> str:
    # another split trains on other documents: a resume must see the difference
    return hashlib.sha256(f"{digest}:split:{data_split}".encode()).hexdigest()


def fingerprint(prefix: str) -> str:
    """SHA-256 over both files' sizes and their first and last MiB: what a resume compares to
    know it reads the same data (hashing a Pile-sized .bin on every start would take minutes;
    a re-tokenized corpus differs in its sizes or at its ends)."""
    h = hashlib.sha256(b"megatron-mmap\0")
    for suffix in (".idx", ".bin"):
        path = prefix + suffix
        size = os.path.getsize(path)
        h.update(f"{suffix}:{size}\0".encode())
        with open(path, "rb") as f:
            h.update(f.read(_FINGERPRINT_BYTES))
            if size > _FINGERPRINT_BYTES:
                f.seek(max(_FINGERPRINT_BYTES, size - _FINGERPRINT_BYTES))
                h.update(f.read(_FINGERPRINT_BYTES))
    return h.hexdigest()
