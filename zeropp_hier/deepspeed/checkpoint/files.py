"""The files of a checkpoint directory, without torch.distributed: plain names, the manifest,
the checks of a tag, and rank 0's commit and recovery ([Note: atomic checkpoint] in
``atomic.py``, which runs them across ranks)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
from typing import Any, Iterable

from ...core.errors import HierCheckpointError
from .names import name_problem

MANIFEST = "zeropp_hier_manifest.json"
MANIFEST_FORMAT = "zeropp_hier-checkpoint/1"  # every file in one list (older saves, conversions)
MANIFEST_FORMAT_2 = "zeropp_hier-checkpoint/2"  # in pieces ([Note: a manifest in pieces] in pieces.py)
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
POINTERS = ("latest", "latest_universal")
_CHUNK = 8 << 20
# Fault injection for the tests: the saving process SIGKILLs itself right after the named step
# of ``commit`` (one of COMMIT_STEPS). Unset in any real job.
CRASH_ENV = "ZEROPP_HIER_CHECKPOINT_CRASH_AT"
COMMIT_STEPS = ("manifest_written", "old_moved_away", "new_moved_in", "latest_written", "old_removed")
SHARED_FIX = (
    "the checkpoint directory must be on a file system every rank sees (on Frontier: Orion, e.g. under "
    "$PROJWORK or $MEMBERWORK; node-local NVMe such as /mnt/bb/$USER is seen by one node only)"
)


# -- names -----------------------------------------------------------------------------------------


def check_tag_name(tag: Any, source: str | None = None) -> str:
    """``tag`` if it is a plain directory name; else a ``HierCheckpointError`` at ``source``
    (where the tag came from: ``latest``, or the argument)."""
    problem = name_problem(tag)
    if problem is None:
        if "/" in tag:
            problem = "a path separator"
        elif tag.startswith("."):
            problem = "a leading '.' (reserved for unfinished saves)"
        elif tag in POINTERS:
            problem = "the name of a pointer file"
    if problem is not None:
        raise HierCheckpointError(
            source or str(tag),
            f"{tag!r} is not a valid checkpoint tag: it has {problem}",
            "use a plain directory name without '/', '..', glob characters or a leading '.', and not "
            "'latest' (default: global_step<N>)",
        )
    return tag


# -- pure file helpers (no torch.distributed) ----------------------------------------------------


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Readers see the old content or the new one, never a partial file."""
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def file_digest(path: str, sync: bool = False) -> dict:
    """{"bytes": size, "sha256": hex}; with ``sync`` the file is fsynced first (any descriptor
    of a file flushes its pages, so the rank hashing it need not be the one that wrote it)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


def tag_entries(root: str) -> tuple[list[str], list[str]]:
    """(files, links) under ``root``, relative and sorted, the manifest excluded: every regular
    file, and every symbolic link (to a file or a directory; links are not followed)."""
    files, links = [], []
    for d, dirs, names in os.walk(root):
        for n in dirs + names:
            rel = os.path.relpath(os.path.join(d, n), root)
            if os.path.islink(os.path.join(d, n)):
                links.append(rel)
            elif n in names and rel != MANIFEST:
                files.append(rel)
    return sorted(files), sorted(links)


def list_files(root: str) -> list[str]:
    """Every regular file under ``root`` (relative paths, sorted), the manifest excluded."""
    return tag_entries(root)[0]


def complete_tags(root: str) -> list[str]:
    """Tags under ``root`` that have a manifest (committed saves), oldest first."""
    if not os.path.isdir(root):
        return []
    tags = [t for t in os.listdir(root) if not t.startswith(".") and os.path.isfile(os.path.join(root, t, MANIFEST))]
    return sorted(tags, key=lambda t: os.path.getmtime(os.path.join(root, t, MANIFEST)))


def leftovers(root: str) -> list[tuple[str, str]]:
    """(path, what) for each unfinished-save directory under ``root``."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.startswith(TMP_PREFIX) and os.path.isdir(path):
            out.append((path, "an interrupted save (never committed; removed by the next save of that tag)"))
        elif name.startswith(OLD_PREFIX) and os.path.isdir(path):
            tag = name[len(OLD_PREFIX) :]
            if os.path.isdir(os.path.join(root, tag)):
                out.append((path, f"the copy of '{tag}' a re-save replaced (removed by the next save)"))
            else:
                out.append(
                    (
                        path,
                        f"the previous '{tag}', left by an interrupted re-save "
                        f"(the next load or save of '{tag}' restores it)",
                    )
                )
    return out


def check_files(tag_dir: str, manifest: dict, names: Iterable[str], rank: int = 0) -> list[tuple[str, str]]:
    """(path, problem) for each of ``names`` that does not match the manifest."""
    problems = []
    for rel in names:
        path = os.path.join(tag_dir, rel)
        want = manifest["files"][rel]
        if os.path.islink(path):
            problems.append((path, "a symbolic link: a checkpoint holds plain files only (a link can point anywhere)"))
            continue
        if not os.path.isfile(path):
            problems.append((path, f"missing on rank {rank} (listed in the manifest written at save); {SHARED_FIX}"))
            continue
        try:
            size = os.path.getsize(path)
            if size != want["bytes"]:
                problems.append(
                    (
                        path,
                        f"{size} bytes, but {want['bytes']} were written at save: the file "
                        "is truncated or was overwritten",
                    )
                )
                continue
            if file_digest(path)["sha256"] != want["sha256"]:
                problems.append((path, "contents differ from the sha256 recorded at save: the file is corrupted"))
        except OSError as e:
            problems.append((path, f"cannot be read on rank {rank}: {e.strerror or e}"))
    return problems


def read_manifest(tag_dir: str) -> tuple[dict | None, tuple[str, str] | None]:
    """(manifest, None) or (None, (path, problem))."""
    path = os.path.join(tag_dir, MANIFEST)
    if not os.path.isdir(tag_dir):
        return None, (tag_dir, "no such checkpoint directory")
    if not os.path.isfile(path):
        return None, (
            path,
            "missing: this tag was not committed by zeropp_hier (its save was "
            "interrupted, or it was written by stock DeepSpeed)",
        )
    try:
        with open(path, "rb") as f:
            m = json.loads(f.read().decode("utf-8"))
        if m.get("format") not in (MANIFEST_FORMAT, MANIFEST_FORMAT_2) or not isinstance(m.get("files"), dict):
            raise ValueError(f"format {m.get('format')!r}")
        if m["format"] == MANIFEST_FORMAT_2:
            from .pieces import check_record

            why = check_record(m.get("ranks"))
            if why is not None or not isinstance(m.get("world_size"), int):
                raise ValueError(why or f"'world_size' is {m.get('world_size')!r}")
        for rel, e in m["files"].items():
            if name_problem(rel) is not None:
                raise ValueError(f"entry {rel!r} is not a plain relative name: it has {name_problem(rel)}")
            if not (isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)):
                raise ValueError(f"bad entry for {rel!r}")
        if not m["files"]:
            raise ValueError("it lists no files")
    except (OSError, ValueError, AttributeError) as e:  # UnicodeDecodeError and JSON errors are ValueErrors
        return None, (path, f"unreadable manifest ({e})")
    return m, None


def _fix_text(root: str, tag: str | None) -> str:
    tags = [t for t in complete_tags(root) if t != tag]
    hint = f"complete tags in '{root}': {tags}" if tags else f"no other complete tag in '{root}'"
    return (
        f"load another tag with engine.load_checkpoint(dir, tag=...) ({hint}), or pass "
        "verify=False to load it unchecked at your own risk"
    )


def unlisted_problems(tag_dir: str, manifest: dict) -> list[tuple[str, str]]:
    """The coordinator's part of a tag's checks (one walk of the tag directory): each symbolic
    link, and each file the manifest does not list."""
    files, links = tag_entries(tag_dir)
    problems = [
        (
            os.path.join(tag_dir, rel),
            "a symbolic link: a checkpoint holds plain files only (a link can point anywhere)",
        )
        for rel in links
    ]
    for rel in sorted(set(files) - set(manifest["files"])):
        problems.append(
            (
                os.path.join(tag_dir, rel),
                "not listed in the manifest written at save: it was added afterwards, and DeepSpeed "
                "would load it (remove it)",
            )
        )
    return problems


def share_of(names: Iterable[str], rank: int, world: int) -> list[str]:
    """The names rank ``rank`` of ``world`` checks (pure: each rank's share is its own, sorted
    names dealt round-robin, so no rank checks more than ceil(len / world))."""
    return sorted(names)[rank::world]


def check_share(
    tag_dir: str, entries: dict, rank: int = 0, trust_pickles: bool = False, scan_only: bool = False
) -> list[tuple[str, str]]:
    """(path, problem) for each of this rank's files: ``entries`` maps a name to its manifest
    entry ({"bytes", "sha256"}); each is checked against it (unless ``scan_only``) and, unless
    ``trust_pickles``, for the types its pickle names ([Note: tensors-only loading])."""
    problems = [] if scan_only else check_files(tag_dir, {"files": entries}, sorted(entries), rank)
    if not trust_pickles:
        from . import safe_load  # torch and DeepSpeed: only when pickles are checked

        bad = {p for p, _ in problems}
        for rel in sorted(entries):
            path = os.path.join(tag_dir, rel)
            if rel.endswith(".pt") and path not in bad:
                found = safe_load.scan(path)
                if found:
                    problems.append((path, safe_load.untrusted_problem(found)))
    return problems


def first_problem(problems: list[tuple[str, str]]) -> tuple[str, str]:
    """The problem to report first (pickles that could run code before damage), with a count of
    the others."""
    from . import safe_load  # torch and DeepSpeed: only when pickles are checked

    ordered = sorted(set(problems), key=lambda p: (not safe_load.is_untrusted(p[1]), p))
    path, problem = ordered[0]
    if len(ordered) > 1:
        problem += f" (and {len(ordered) - 1} more: {[p for p, _ in ordered[1:4]]})"
    return path, problem


def raise_problems(problems: list[tuple[str, str]], root: str, tag: str | None) -> None:
    from . import safe_load  # torch and DeepSpeed: only when pickles are checked

    if not problems:
        return
    path, problem = first_problem(problems)
    if safe_load.is_untrusted(problem):
        raise safe_load.UntrustedCheckpointError(path, problem)
    raise HierCheckpointError(path, problem, _fix_text(root, tag))


def resolve_tag(root: str, tag: Any, latest_name: str = "latest") -> str | None:
    """The tag to load: ``tag`` if given, else what ``<root>/<latest_name>`` names (None when
    that file does not exist); either must be a plain tag name."""
    if tag is not None:
        return check_tag_name(str(tag), f"tag={tag!r}")
    path = os.path.join(root, latest_name)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise HierCheckpointError(path, f"cannot be read ({e.strerror or e})", _fix_text(root, None)) from None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise HierCheckpointError(
            path,
            "not UTF-8 text: it should hold the name of a tag",
            f"write the tag to load into it; {_fix_text(root, None)}",
        ) from None
    return check_tag_name(text, path)


def missing_latest_error(root: str, latest_name: str = "latest") -> HierCheckpointError:
    where = os.path.join(root, latest_name)
    if not os.path.isdir(root):
        problem = f"missing: the checkpoint directory '{root}' does not exist"
    else:
        problem = "missing: nothing says which tag to resume from"
    return HierCheckpointError(
        where,
        problem,
        f"pass the tag (engine.load_checkpoint(dir, tag=...); complete tags: {complete_tags(root)}), "
        "or missing_ok=True to start from scratch when there is nothing to resume",
    )


def _crash_point(step: str) -> None:
    if os.environ.get(CRASH_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def recover(root: str, tag: str) -> bool:
    """Undo a re-save of ``tag`` interrupted between its two renames: ``<tag>`` absent and
    ``.old-<tag>`` complete -> rename it back. True if it did. (Rank 0 only.)"""
    final, old = os.path.join(root, tag), os.path.join(root, OLD_PREFIX + tag)
    if os.path.lexists(final) or not os.path.isfile(os.path.join(old, MANIFEST)):
        return False
    os.rename(old, final)
    fsync_dir(root)
    return True


def clean_leftovers(root: str, tag: str) -> None:
    """Before a save of ``tag`` (rank 0): restore an interrupted re-save of it, remove its
    uncommitted ``.tmp-<tag>``, and every ``.old-<t>`` whose ``<t>`` is complete."""
    recover(root, tag)
    shutil.rmtree(os.path.join(root, TMP_PREFIX + tag), ignore_errors=True)
    for name in os.listdir(root):
        if name.startswith(OLD_PREFIX) and os.path.isfile(os.path.join(root, name[len(OLD_PREFIX) :], MANIFEST)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def commit(
    root: str, tmp_dir: str, tag: str, files: dict, meta: dict, save_latest: bool, latest_name: str = "latest"
) -> None:
    """Rank 0's part of a save: manifest into ``tmp_dir`` (a directory on the same file system),
    rename it to ``<root>/<tag>``, then ``latest`` (in that order). A crash at any point leaves
    a loadable state ([Note: atomic checkpoint])."""
    final = os.path.join(root, tag)
    # the other ranks' pieces summed in ``ranks``: a manifest in pieces ([Note: a manifest in pieces])
    fmt = MANIFEST_FORMAT_2 if "ranks" in meta else MANIFEST_FORMAT
    manifest = {"format": fmt, "tag": tag, **meta, "files": files}
    write_atomic(os.path.join(tmp_dir, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True).encode())
    _crash_point("manifest_written")
    old = None
    if os.path.exists(final):  # saving a tag again: keep the old copy until the new one is in place
        old = os.path.join(root, OLD_PREFIX + tag)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        _crash_point("old_moved_away")
    os.rename(tmp_dir, final)
    fsync_dir(root)
    _crash_point("new_moved_in")
    if save_latest:
        write_atomic(os.path.join(root, latest_name), tag.encode())
        _crash_point("latest_written")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
        _crash_point("old_removed")


def _rank_error(rank: int, path: str, err: OSError | str) -> tuple[int, str, str]:
    """(rank, path, cause) of a local failure, with the shared-directory hint when a file that
    another rank wrote or listed is absent here."""
    if isinstance(err, OSError):
        cause = f"{type(err).__name__}: {err.strerror or err}"
        if err.errno == errno.ENOENT:
            cause += f"; {SHARED_FIX}"
    else:
        cause = err
    return (rank, path, cause)


def raise_rank_errors(errors: list, phase: str, fix: str | None = None) -> None:
    """Every rank raises the same error for the local failures of all ranks (gathered)."""
    errors = sorted(e for e in errors if e is not None)
    if not errors:
        return
    rank, path, cause = errors[0]
    more = f" (and {len(errors) - 1} more on ranks {sorted({r for r, _, _ in errors[1:]})})" if len(errors) > 1 else ""
    raise HierCheckpointError(
        path,
        f"{phase} failed on rank {rank}: {cause}{more}",
        fix or "fix that rank's access to the checkpoint directory (every rank must see the same one), then retry",
    )
