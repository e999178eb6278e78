"""Atomic, verified checkpoints in DeepSpeed's own format.

[Note: atomic checkpoint]
DeepSpeed's ``save_checkpoint`` writes ``<dir>/<tag>/`` file by file, then rank 0 writes
``<dir>/latest`` *before* the closing barrier, without waiting for the other ranks: a rank killed
while writing leaves ``latest`` naming a tag with a truncated file. The next job then fails on
one rank while the others wait in a collective, or, if the damage is inside tensor data, loads
it silently. Here a save is a transaction:

1. every rank writes DeepSpeed's files into ``<dir>/.tmp-<tag>/`` (DeepSpeed's own save, with
   ``save_latest=False``);
2. rank 0 lists the files; each rank fsyncs and hashes its share (size, sha256);
3. the hashes are gathered; rank 0 writes ``MANIFEST`` inside the temporary directory, renames
   it to ``<dir>/<tag>`` (a directory rename: atomic on POSIX file systems, Lustre included),
   fsyncs ``<dir>``, and only then replaces ``latest`` (temporary file, fsync, ``os.replace``);
4. a closing barrier: ``save_checkpoint`` returns on any rank only once the tag is committed.

A crash before the rename in step 3 leaves the previous tag and ``latest`` as they were; the
leftover ``.tmp-<tag>`` is never loaded and is removed by the next save of that tag.
``load_checkpoint`` reads the manifest, each rank checks its share of the files, the findings
are gathered, and *every* rank raises the same ``HierCheckpointError`` (naming the file) before
DeepSpeed reads anything, so no rank is left waiting for one that could not load.

The files are DeepSpeed's, so DeepSpeed's tools read them: ``zero_to_fp32`` (consolidated fp32
weights) and ``ds_to_universal`` (``to_universal`` below wraps it, for loading on another
number of ranks). Checkpoints must live on a file system every rank sees (DeepSpeed's
``use_node_local_storage`` and decoupled/async checkpoint engines are refused).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from typing import Any, Callable, Iterable

import torch.distributed as dist

MANIFEST = "zeropp_hier_manifest.json"
MANIFEST_FORMAT = "zeropp_hier-checkpoint/1"
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
_CHUNK = 8 << 20


class HierCheckpointError(RuntimeError):
    """A checkpoint cannot be saved or loaded safely. Names the file, the problem and the fix."""

    def __init__(self, path: str, problem: str, fix: str):
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"zeropp_hier checkpoint error at '{path}': {problem}; {fix}")

    def __reduce__(self):  # picklable across processes, like the other errors
        return (type(self), (self.path, self.problem, self.fix))


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


def list_files(root: str) -> list[str]:
    """Every regular file under ``root`` (relative paths, sorted), the manifest excluded."""
    out = []
    for d, _, names in os.walk(root):
        for n in names:
            rel = os.path.relpath(os.path.join(d, n), root)
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def complete_tags(root: str) -> list[str]:
    """Tags under ``root`` that have a manifest (committed saves), oldest first."""
    if not os.path.isdir(root):
        return []
    tags = [t for t in os.listdir(root) if not t.startswith(".") and os.path.isfile(os.path.join(root, t, MANIFEST))]
    return sorted(tags, key=lambda t: os.path.getmtime(os.path.join(root, t, MANIFEST)))


def check_files(tag_dir: str, manifest: dict, names: Iterable[str]) -> list[tuple[str, str]]:
    """(path, problem) for each of ``names`` that does not match the manifest."""
    problems = []
    for rel in names:
        path = os.path.join(tag_dir, rel)
        want = manifest["files"][rel]
        if not os.path.isfile(path):
            problems.append((path, "missing (listed in the manifest written at save)"))
            continue
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
        with open(path) as f:
            m = json.load(f)
        if m.get("format") != MANIFEST_FORMAT or not isinstance(m.get("files"), dict):
            raise ValueError(f"format {m.get('format')!r}")
        for rel, e in m["files"].items():
            if not (isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)):
                raise ValueError(f"bad entry for {rel!r}")
    except (OSError, ValueError, AttributeError) as e:
        return None, (path, f"unreadable manifest ({e})")
    return m, None


def _fix_text(root: str, tag: str | None) -> str:
    tags = [t for t in complete_tags(root) if t != tag]
    hint = f"complete tags in '{root}': {tags}" if tags else f"no other complete tag in '{root}'"
    return (
        f"load another tag with engine.load_checkpoint(dir, tag=...) ({hint}), or pass "
        "verify=False to load it unchecked at your own risk"
    )


def verify_tag(root: str, tag: str, rank: int = 0, world: int = 1) -> list[tuple[str, str]]:
    """This rank's share of the checks of ``<root>/<tag>`` (all of them with the defaults)."""
    tag_dir = os.path.join(root, tag)
    manifest, problem = read_manifest(tag_dir)
    if problem is not None:
        return [problem]
    names = sorted(manifest["files"])
    return check_files(tag_dir, manifest, names[rank::world])


def resolve_tag(root: str, tag: Any, latest_name: str = "latest") -> str | None:
    if tag is not None:
        return str(tag)
    path = os.path.join(root, latest_name)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip()


def commit(
    root: str, tmp_dir: str, tag: str, files: dict, meta: dict, save_latest: bool, latest_name: str = "latest"
) -> None:
    """Rank 0's part of a save: manifest into ``tmp_dir`` (a directory on the same file system),
    rename it to ``<root>/<tag>``, then ``latest`` (in that order)."""
    final = os.path.join(root, tag)
    manifest = {"format": MANIFEST_FORMAT, "tag": tag, **meta, "files": files}
    write_atomic(os.path.join(tmp_dir, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True).encode())
    old = None
    if os.path.exists(final):  # saving a tag again: keep the old copy until the new one is in place
        old = os.path.join(root, OLD_PREFIX + tag)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp_dir, final)
    fsync_dir(root)
    if save_latest:
        write_atomic(os.path.join(root, latest_name), tag.encode())
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_tag_name(tag: str) -> None:
    if (
        not tag
        or tag.startswith(".")
        or os.sep in tag
        or (os.altsep and os.altsep in tag)
        or tag in ("latest", "latest_universal")
    ):
        raise HierCheckpointError(
            tag,
            "not a valid checkpoint tag",
            "use a plain directory name that does not start with '.' and is not 'latest' (default: global_step<N>)",
        )


# -- the engine's save and load ------------------------------------------------------------------


def _dp_group(engine):
    return getattr(engine.optimizer, "dp_process_group", None)


def _guard(engine, phase: str):
    from ..comm.failures import world_guard

    rt = engine.hier_runtime
    # these collectives run on DeepSpeed's data-parallel group: report the timeout it runs with
    return world_guard(rt.topo, rt.rank, phase, getattr(engine, "ds_group_timeout_s", None))


def save(
    engine,
    ds_save: Callable,
    save_dir: str,
    tag: Any = None,
    client_state: dict | None = None,
    save_latest: bool = True,
    exclude_frozen_parameters: bool = False,
) -> bool:
    """``engine.save_checkpoint`` as a transaction ([Note: atomic checkpoint])."""
    if not save_dir:
        raise HierCheckpointError(str(save_dir), "empty save_dir", "give the checkpoint directory")
    if engine.use_node_local_storage():
        raise HierCheckpointError(
            save_dir,
            "checkpoint.use_node_local_storage is set",
            "remove it: atomic checkpoints need a file system every rank sees",
        )
    if engine.checkpoint_engine.is_decoupled():
        raise HierCheckpointError(
            save_dir,
            f"{type(engine.checkpoint_engine).__name__} writes asynchronously",
            "use DeepSpeed's default (torch) checkpoint engine",
        )
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    check_tag_name(tag)
    rank, world, group = dist.get_rank(), dist.get_world_size(), _dp_group(engine)
    tmp_tag = TMP_PREFIX + tag
    with _guard(engine, "checkpoint save"):
        if rank == 0:
            os.makedirs(save_dir, exist_ok=True)
            shutil.rmtree(os.path.join(save_dir, tmp_tag), ignore_errors=True)  # an earlier crash's
        dist.barrier(group=group)
        ds_save(
            save_dir,
            tmp_tag,
            client_state=client_state if client_state is not None else {},
            save_latest=False,
            exclude_frozen_parameters=exclude_frozen_parameters,
        )
        tmp_dir = os.path.join(save_dir, tmp_tag)
        listing = [list_files(tmp_dir) if rank == 0 else None]
        dist.broadcast_object_list(listing, src=0, group=group)
        names = listing[0]
        mine = {rel: file_digest(os.path.join(tmp_dir, rel), sync=True) for rel in names[rank::world]}
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine, group=group)
        if rank == 0:
            files = {k: v for part in gathered for k, v in part.items()}
            rt = engine.hier_runtime
            meta = {
                "world_size": world,
                "preset": rt.cfg.preset,
                "topology": list(rt.topo.dims),
                "global_steps": int(engine.global_steps),
            }
            commit(save_dir, tmp_dir, tag, files, meta, save_latest)
        dist.barrier(group=group)  # nobody returns before the tag is committed
    return True


def verify_for_load(engine, load_dir: str, tag: Any) -> str | None:
    """Check ``<load_dir>/<tag>`` (or the tag ``latest`` names) on every rank, each rank hashing
    its share of the files; raise the same ``HierCheckpointError`` everywhere on any mismatch.
    Returns the tag to load (None when there is no ``latest`` and no tag: DeepSpeed then loads
    nothing, as it always has)."""
    latest_name = "latest_universal" if engine.load_universal_checkpoint() else "latest"
    rank, world, group = dist.get_rank(), dist.get_world_size(), _dp_group(engine)
    tag = resolve_tag(load_dir, tag, latest_name)
    gathered: list = [None] * world
    with _guard(engine, "checkpoint load"):
        mine = [] if tag is None else verify_tag(load_dir, tag, rank, world)
        dist.all_gather_object(gathered, mine, group=group)
    problems = sorted({p for part in gathered for p in part})
    if problems:
        path, problem = problems[0]
        more = f" (and {len(problems) - 1} more: {[p for p, _ in problems[1:4]]})" if len(problems) > 1 else ""
        raise HierCheckpointError(path, problem + more, _fix_text(load_dir, tag))
    return tag


# -- resharding ----------------------------------------------------------------------------------


def to_universal(src_dir: str, out_dir: str, tag: Any = None, workers: int = 1) -> str:
    """Convert ``<src_dir>/<tag>`` (default: ``latest``) into DeepSpeed's universal format in
    ``<out_dir>/<tag>``, for loading on another number of ranks or another preset/topology
    with ``"checkpoint": {"load_universal": true}``. Weights and Adam states (exp_avg,
    exp_avg_sq, step) carry over. The source is verified first and the result is committed
    like a save (manifest, rename, then ``latest_universal``). Run it in one process."""
    from deepspeed.checkpoint import ds_to_universal

    tag = resolve_tag(src_dir, tag)
    if tag is None:
        raise HierCheckpointError(os.path.join(src_dir, "latest"), "missing", "pass the tag to convert")
    problems = verify_tag(src_dir, tag)
    if problems:
        raise HierCheckpointError(problems[0][0], problems[0][1], _fix_text(src_dir, tag))
    check_tag_name(tag)
    os.makedirs(out_dir, exist_ok=True)
    scratch = os.path.join(out_dir, TMP_PREFIX + tag)  # ds_to_universal also writes beside its output
    shutil.rmtree(scratch, ignore_errors=True)
    args = argparse.Namespace(
        input_folder=os.path.join(src_dir, tag),
        output_folder=os.path.join(scratch, tag),
        num_extract_workers=workers,
        num_merge_workers=workers,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=False,
    )
    ds_to_universal.main(args)
    converted = os.path.join(scratch, tag)
    files = {rel: file_digest(os.path.join(converted, rel), sync=True) for rel in list_files(converted)}
    with open(os.path.join(src_dir, tag, MANIFEST)) as f:
        source = json.load(f)
    meta = {k: source.get(k) for k in ("world_size", "preset", "topology", "global_steps")}
    meta["universal_from"] = os.path.abspath(os.path.join(src_dir, tag))
    commit(out_dir, converted, tag, files, meta, True, latest_name="latest_universal")
    shutil.rmtree(scratch, ignore_errors=True)
    return os.path.join(out_dir, tag)


def main(argv=None, prog: str = "python -m zeropp_hier.deepspeed.checkpoint") -> int:
    """``zeropp-hier checkpoint verify DIR [--tag T]`` / ``to-universal SRC OUT [--tag T]``
    (``universal`` is the same as ``to-universal``)."""
    ap = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="check every file of a tag against its manifest")
    v.add_argument("dir")
    v.add_argument("--tag", default=None)
    u = sub.add_parser(
        "to-universal", aliases=["universal"], help="convert a tag for loading on another number of ranks"
    )
    u.add_argument("src")
    u.add_argument("out")
    u.add_argument("--tag", default=None)
    a = ap.parse_args(argv)
    if a.cmd == "verify":
        tag = resolve_tag(a.dir, a.tag)
        problems = verify_tag(a.dir, tag) if tag else [(os.path.join(a.dir, "latest"), "missing")]
        for path, problem in problems:
            print(f"BAD {path}: {problem}")
        if not problems:
            print(f"OK {os.path.join(a.dir, tag)}")
        return 1 if problems else 0
    print(to_universal(a.src, a.out, a.tag))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
