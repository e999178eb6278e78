"""DeepSpeed's own file writes during a save: a failure on one rank is held, not raised.

[Note: a rank that cannot write]
DeepSpeed's ``save_checkpoint`` interleaves file writes with collectives: a barrier after rank 0
creates the directory, an all-reduce of the tag's hash, each rank's ``torch.save`` of its files
(through the checkpoint engine's ``save``), rank 0's copy of the recovery scripts, and a closing
barrier. If one rank's write raises (disk full, quota, a directory that vanished, a write the
kernel refuses), that rank leaves ``save_checkpoint`` early and skips the collectives after it;
the others wait in the closing barrier and end, a timeout later or when the failed rank exits,
blaming a peer ("a peer closed its connection") instead of the file and its cause.

So during a save each of DeepSpeed's file operations on this rank runs through ``held_writes``:
an exception from it is recorded (rank, file, cause) and the call returns as if it had written,
and this rank writes nothing more in that save (the save fails anyway). The writes are local
I/O with no collective inside, so DeepSpeed's collectives still run on every rank in the same
order and the save returns everywhere. Then the recorded failures are gathered
(``checkpoint.save``) and every rank raises the same ``HierCheckpointError`` naming the rank,
the file and the cause, before anything is committed: ``latest`` and the previous tag stay as
they were. The files held are the checkpoint engine's ``save`` and ``makedirs`` (every rank)
and ``_copy_recovery_script`` (rank 0). torch's zip writer reports a refused write as a
``RuntimeError`` ("unexpected pos ..."), not an ``OSError``, so every ``Exception`` is held.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

from .files import _rank_error

_MISSING = object()
# what torch's own writer says about a write the file system refused is cryptic: the likely causes
WRITE_HINT = "the file system refused a write on this rank (full, over quota, or the directory is gone)"
WRITE_FIX = (
    "free space (or quota) on that rank's file system and check that the checkpoint directory exists "
    "and is shared by every rank, then save again; the previous checkpoint is unchanged"
)


def write_error(rank: int, path: str, err: BaseException) -> tuple[int, str, str]:
    """(rank, path, cause) for a write that raised."""
    if isinstance(err, OSError):
        return _rank_error(rank, path, err)
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return (rank, path, f"{type(err).__name__}: {text} ({WRITE_HINT})")


def _path_arg(index: int, name: str, suffix: str = "") -> Callable[[tuple, dict], str]:
    def path(args: tuple, kwargs: dict) -> str:
        p = kwargs.get(name, args[index] if len(args) > index else "?")
        return os.path.join(str(p), suffix) if suffix else str(p)

    return path


@contextlib.contextmanager
def _held(
    obj: Any,
    name: str,
    rank: int,
    failures: list,
    where: Callable[[tuple, dict], str],
    written: list | None = None,
) -> Iterator[None]:
    """``obj.name`` records its exception in ``failures`` instead of raising, and does nothing once
    a write failed; with ``written``, the path of each call that returned is appended to it; the
    instance's own attribute (if any) is put back afterwards."""
    own = obj.__dict__.get(name, _MISSING)
    real = getattr(obj, name)

    def held(*args, **kwargs):
        if failures:
            return None
        try:
            out = real(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - every local write failure is gathered, none raised alone
            failures.append(write_error(rank, where(args, kwargs), e))
            return None
        if written is not None:
            written.append(where(args, kwargs))
        return out

    setattr(obj, name, held)
    try:
        yield
    finally:
        if own is _MISSING:
            delattr(obj, name)
        else:
            setattr(obj, name, own)


@contextlib.contextmanager
def held_writes(engine: Any, rank: int, written: list | None = None) -> Iterator[list]:
    """Inside: DeepSpeed's file writes on this rank record their failures in the list it yields
    ([Note: a rank that cannot write]); with ``written``, the path of each file this rank's
    checkpoint engine saved is appended to it (the files this rank hashes: [Note: atomic
    checkpoint])."""
    failures: list = []
    ce = engine.checkpoint_engine
    with contextlib.ExitStack() as stack:
        stack.enter_context(_held(ce, "save", rank, failures, _path_arg(1, "path"), written))
        stack.enter_context(_held(ce, "makedirs", rank, failures, _path_arg(0, "path")))
        if hasattr(engine, "_copy_recovery_script"):
            stack.enter_context(
                _held(engine, "_copy_recovery_script", rank, failures, _path_arg(0, "save_path", "zero_to_fp32.py"))
            )
        yield failures
