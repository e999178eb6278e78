"""The data orders' cache files: one array per file (a shuffle, a blend's order or its counts),
built once, memory-mapped by every rank ([Note: data order caches]).

[Note: data order caches]
What the loader orders its samples by is a pure function of a few numbers: an epoch's shuffle
of n samples is ``torch.randperm(n)`` from one seed ([Note: sample order] in tokens.py), a
blend's order is the largest-deficit rule over the weights and each pair's sample count, its
counts every ``_CHECKPOINT`` samples follow from that order, and a pair's shuffle is again a
randperm ([Note: blends and splits] in blend.py). Each cache file is keyed by exactly those
inputs (``Want.key``: the rule and its version, n or the pairs' sample counts, the weights, the
seed value, torch's version for randperm), so a file is right for every data set, sequence
length, split and seed that give the same numbers, and a change of any of them (another
tokenization changes n; another seq_len or split changes n; another seed changes the seed
value) names another file: a stale file cannot be picked. The file's name is a digest of its
key and the full key is in its header, so a file copied under another's name (foreign) is
refused by every rank.

Layout (little-endian): ``ZPHORDER`` (8 bytes), u32 version 1, u32 header length h, h bytes of
JSON (key, dtype, shape, the body's SHA-256, the builder's description), zeros to the next 4 KiB,
then the array, C order. A file is written under a temporary name and renamed, so no rank sees
half of one. Loading reads the JSON and maps the rest (no pickle: nothing in a file runs),
advised as random access: a rank maps the page of each entry it reads, not the kernel's
read-ahead window around it (measured, 100 micro-batches of a 146M-sample shuffle with this
machine's 8 MiB read-ahead: 106 MiB more resident unadvised, 0.7 MiB advised). A file whose
pages are already cached in large folios (just written) is still mapped a folio at a time
(121 MiB more file-mapped for a blend's fresh files): page cache, shared by a node's ranks and
reclaimable; the rank's private memory grew 0.1 MiB in both (benchmarks/cpu/data_orders.py). Every opening
checks magic, version, key, dtype, shape and the file's size (a truncated or foreign file is
refused naming it and the fix); the builder (rank 0) also hashes the body of every file it
uses at each start and rebuilds a corrupt one (said on stderr): one read of the files on one
rank, while every other rank reads only the pages its own samples touch.

Who builds: the job's data start (``orders.start``, from ``run.open_data`` and after a resume's
load) is one object broadcast: rank 0 checks or builds the files the job's positions need, then
every rank maps them (rank 0's error is raised on every rank). The files live beside the data
(``zeropp-order-cache/`` in a prepared directory, or beside a pair: a blend's first) or in
``data.cache_dir`` (read-only data), which every node must see. A loader used alone (tests,
benchmarks) builds its orders in memory when first used, as before.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ...core.errors import HierConfigError
from ...files import atomic_writer

MAGIC = b"ZPHORDER"
VERSION = 1
_PREFIX = struct.Struct("<8sII")  # magic, version, header length
_ALIGN = 4096
DTYPES = ("uint8", "int16", "uint32", "int64")
SUFFIX = ".order"
CACHE_DIR_NAME = "zeropp-order-cache"  # beside the data unless data.cache_dir names another


@dataclass(frozen=True)
class Want:
    """One array the loader needs: ``key`` determines it entirely (JSON values only); ``build``
    yields it in C-order pieces of ``dtype`` that fill ``shape``; ``about``: for a reader of the
    header (which data asked for it), not part of the key."""

    key: dict
    dtype: str
    shape: tuple[int, ...]
    build: Callable[[], Iterable[np.ndarray]]
    about: str = ""

    @property
    def name(self) -> str:
        text = json.dumps(self.key, sort_keys=True, separators=(",", ":"))
        return f"{self.key['kind']}-{hashlib.sha256(text.encode()).hexdigest()[:32]}{SUFFIX}"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _header(want: Want, body_sha: str) -> bytes:
    meta = {
        "key": want.key,
        "dtype": want.dtype,
        "shape": list(want.shape),
        "body_sha256": body_sha,
        "about": want.about,
    }
    text = json.dumps(meta, sort_keys=True).encode()
    size = -(-(_PREFIX.size + len(text)) // _ALIGN) * _ALIGN
    return (_PREFIX.pack(MAGIC, VERSION, len(text)) + text).ljust(size, b"\0")


def write(path: Path, want: Want) -> None:
    """Build ``want`` into ``path`` (files.atomic_writer: a temporary name, fsynced, renamed): the body is written and
    hashed piece by piece (only the builder's pieces are in memory), the header last."""
    head_len = len(_header(want, "0" * 64))
    digest, written = hashlib.sha256(), 0
    with atomic_writer(path) as f:
        f.seek(head_len)
        for piece in want.build():
            data = np.ascontiguousarray(piece, dtype=want.dtype).tobytes()
            digest.update(data)
            f.write(data)
            written += len(data)
        if written != want.nbytes:
            raise RuntimeError(f"{want.name}: built {written} bytes, its shape needs {want.nbytes}")
        f.seek(0)
        f.write(_header(want, digest.hexdigest()))


def _fix(path: Path) -> str:
    return (
        f"delete {path} (rank 0 builds it again at the next start), or set data.cache_dir to a directory "
        "every node sees and only this data's jobs write"
    )


def read_header(path: Path) -> tuple[dict, int]:
    """The header's JSON and the body's offset; refuses what is not a cache file, naming it."""
    with open(path, "rb") as f:
        head = f.read(_PREFIX.size)
        if len(head) < _PREFIX.size:
            raise HierConfigError(
                "data cache file", str(path), f"{len(head)} bytes, not a data order cache: " + _fix(path)
            )
        magic, version, length = _PREFIX.unpack(head)
        if magic != MAGIC or version != VERSION:
            raise HierConfigError(
                "data cache file",
                str(path),
                f"starts {magic!r} version {version}, not {MAGIC!r} version {VERSION}: " + _fix(path),
            )
        text = f.read(length)
    try:
        meta = json.loads(text)  # JSON: reading it runs nothing
    except ValueError as e:
        raise HierConfigError("data cache file", str(path), f"its header is not JSON ({e}): " + _fix(path)) from None
    offset = -(-(_PREFIX.size + length) // _ALIGN) * _ALIGN
    return meta, offset


def open_array(path: Path, want: Want) -> np.ndarray:
    """``path`` memory-mapped, after checking it holds ``want`` (key, dtype, shape, size): nothing
    of the body is read here."""
    if not path.is_file():
        raise HierConfigError(
            "data cache file",
            str(path),
            "missing: rank 0 builds it before the other ranks open it; data.cache_dir (or the data's directory) "
            "must be one every node sees",
        )
    meta, offset = read_header(path)
    if meta.get("key") != want.key:
        raise HierConfigError(
            "data cache file",
            str(path),
            f"holds {meta.get('key')}, this job needs {want.key} (a foreign file under this name): " + _fix(path),
        )
    if (
        meta.get("dtype") != want.dtype
        or meta.get("dtype") not in DTYPES
        or list(meta.get("shape", [])) != list(want.shape)
    ):
        raise HierConfigError(
            "data cache file",
            str(path),
            f"holds {meta.get('dtype')} {meta.get('shape')}, expected {want.dtype} {list(want.shape)}: " + _fix(path),
        )
    size = path.stat().st_size
    if size != offset + want.nbytes:
        raise HierConfigError(
            "data cache file",
            str(path),
            f"{size} bytes, its header says {offset + want.nbytes} (truncated or appended to): " + _fix(path),
        )
    if want.nbytes == 0:
        return np.zeros(want.shape, dtype=want.dtype)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_RANDOM"):
        # a rank reads a few scattered entries: without this the kernel's read-ahead (8 MiB on
        # this machine's disk) maps megabytes around each one into the rank's memory
        mapped.madvise(mmap.MADV_RANDOM)
    count = int(np.prod(want.shape, dtype=np.int64))
    return np.frombuffer(mapped, dtype=want.dtype, count=count, offset=offset).reshape(want.shape)


def body_ok(path: Path) -> bool:
    """The body hashes to its header's SHA-256 (read in MiB blocks)."""
    meta, offset = read_header(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest() == meta.get("body_sha256")


def ensure(cache_dir: Path, want: Want) -> np.ndarray:
    """The builder's side: ``want``'s file checked in full (key, size, body hash) or built, then
    memory-mapped. A file that fails a check is rebuilt, and said so on stderr."""
    path = cache_dir / want.name
    if path.is_file():
        try:
            if body_ok(path):
                return open_array(path, want)
            why = "its body does not match its SHA-256 (corrupt)"
        except HierConfigError as e:
            why = str(e)
        print(f"data cache: {path}: {why}; building it again", file=sys.stderr)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        write(path, want)
    except OSError as e:
        raise HierConfigError(
            "data.cache_dir",
            str(cache_dir),
            f"cannot write the data order cache there ({e.strerror or e}): set data.cache_dir to a writable "
            "directory every node sees (the data's own directory is the default; read-only data needs one)",
        ) from None
    return open_array(path, want)


def opener(cache_dir: Path, builder: bool) -> Callable[[Want], np.ndarray]:
    """How a rank gets each array: the builder checks or builds, the others only open."""
    if builder:
        return lambda want: ensure(cache_dir, want)
    return lambda want: open_array(cache_dir / want.name, want)
