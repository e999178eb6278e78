"""Output files written whole or not at all: one helper for every file the package writes that
a later step reads (``summary.json``, ``probe --out``, sweep reports, benchmark results).

[Note: atomic output files]
A process killed while writing a file in place (Ctrl-C, the job's time limit, the OOM killer)
leaves it truncated, and the next reader fails on it (``report`` cannot parse a half
``summary.json``). ``write_atomic`` writes into a new file in the same directory, flushes it to
disk (fsync), renames it over the target (``os.replace``: atomic within a file system, so a
reader sees the old file or the new one, never a mix) and fsyncs the directory so that the
rename itself survives a crash. The temporary file gets the mode an ordinary ``open(path,
"w")`` would (the process's umask applies) and is removed if anything fails before the rename.
Append-only logs (``metrics.jsonl``) are not rewritten: each line is written and flushed whole,
so a crash loses at most the line being written.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from typing import Any, BinaryIO


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` when the block ends without an exception
    ([Note: atomic output files]); for files too large to hold in memory, written piece by piece
    (seek and rewrite allowed, as for a header filled in last)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Replace ``path`` by ``data`` atomically ([Note: atomic output files])."""
    with atomic_writer(path) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def write_json_atomic(path: str | os.PathLike, obj: Any, **dump_kwargs: Any) -> None:
    """``json.dumps(obj, **dump_kwargs)`` (and a final newline) written by ``write_atomic``; the
    text is made before the file is touched, so an object that cannot be encoded leaves the old
    file as it was."""
    write_atomic(path, json.dumps(obj, **dump_kwargs) + "\n")


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # a platform or file system without directory handles: the rename is done
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
