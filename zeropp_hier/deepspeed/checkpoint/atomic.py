"""Atomic, verified checkpoints in DeepSpeed's own format.

[Note: atomic checkpoint]
DeepSpeed's ``save_checkpoint`` writes ``<dir>/<tag>/`` file by file, then rank 0 writes
``<dir>/latest`` *before* the closing barrier, without waiting for the other ranks: a rank killed
while writing leaves ``latest`` naming a tag with a truncated file. The next job then fails on
one rank while the others wait in a collective, or, if the damage is inside tensor data, loads
it silently. Here a save is a transaction:

1. every rank writes DeepSpeed's files into ``<dir>/.tmp-<tag>/`` (DeepSpeed's own save, with
   ``save_latest=False``); a write that fails on one rank is held until DeepSpeed's save returns
   on every rank, the failures are gathered, and every rank raises the same error naming the
   rank, the file and the cause ([Note: a rank that cannot write] in ``checkpoint/writes.py``);
2. each rank fsyncs and hashes the files its own checkpoint engine wrote (size, sha256), and
   only those (two files a rank under ZeRO-3); an ``OSError`` while hashing is agreed by one
   flag all-reduce, so every rank raises the same error naming the rank, the file and the cause;
3. each rank but rank 0 records its digests in its own piece of the manifest, and rank 0
   receives only their sums (one SUM and one MAX all-reduce: [Note: a manifest in pieces] in
   ``checkpoint/pieces.py``); rank 0 lists the directory once: when the other files there do not
   match the pieces' count and names (a file a rank wrote that rank 0 does not see: the directory
   is not shared, named with the rank; or a file nobody hashed, which rank 0 hashes), rank 0
   reads the pieces to name them;
4. rank 0 writes ``MANIFEST`` (its own files and the pieces' sums) inside the temporary
   directory and commits (``commit``): when the tag exists already it is first renamed to
   ``.old-<tag>``; then ``.tmp-<tag>`` is renamed to ``<tag>`` (a directory rename: atomic on
   POSIX file systems, Lustre included), ``<dir>`` is fsynced, ``latest`` is replaced
   (temporary file, fsync, ``os.replace``), and ``.old-<tag>`` is removed;
5. rank 0's outcome is broadcast: ``save_checkpoint`` returns on any rank only once the tag is
   committed, and raises on every rank if the commit failed.

A crash before the rename of ``.tmp-<tag>`` leaves the previous tag and ``latest`` as they were.
A crash between the two renames of a re-save leaves ``.old-<tag>`` (complete, with its manifest)
and no ``<tag>``: the next load or save of that tag renames it back (``recover``), so the previous
state loads. ``.tmp-*`` and ``.old-*`` leftovers are removed by the next save (of that tag; and
``.old-*`` of any tag that is complete) and listed by ``checkpoint verify``.

``load_checkpoint`` agrees first on what every rank sees (the tag, from ``latest`` or given, by
one digest all-reduce: a rank that sees another tag is named, with the fix that the checkpoint
directory must be shared), then rank 0 reads the manifest and each rank checks its share of the
files in its own view of the directory ([Note: checks in shares] in checkpoint/shares.py: a rank
lacking a file of its share is named), and *every* rank raises the same ``HierCheckpointError``
(naming the file) before DeepSpeed reads anything, so no rank is left waiting for one that could
not load. The manifest
covers every file under the tag: a file it does not list, a symbolic link, or a listed name that
is not a plain relative name (``..``, an absolute path, glob characters) is refused, and so are
tags that are not plain names, whether given or read from ``latest``. Files are loaded
tensors-only ([Note: tensors-only loading] in ``checkpoint/safe_load.py``).

The files are DeepSpeed's, so DeepSpeed's tools read them: ``zero_to_fp32`` (consolidated fp32
weights; ``to_fp32`` below runs it tensors-only) and ``ds_to_universal`` (``to_universal`` below
wraps it, for loading on another number of ranks). Checkpoints must live on a file system every
rank sees (DeepSpeed's ``use_node_local_storage`` and decoupled/async checkpoint engines are
refused).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from typing import Any, Callable, Mapping

import torch.distributed as dist

from ...comm import _coordinator as coordinator
from ...core.errors import HierCheckpointError
from . import pieces
from .files import (
    MANIFEST,
    OLD_PREFIX,
    SHARED_FIX,
    TMP_PREFIX,
    _rank_error,
    check_tag_name,
    clean_leftovers,
    commit,
    file_digest,
    fsync_dir,
    leftovers,
    list_files,
    missing_latest_error,
    raise_problems,
    raise_rank_errors,
    recover,
    resolve_tag,
    write_atomic,
)
from .shares import verify_across, verify_tag
from .writes import WRITE_FIX, held_writes

# -- the engine's save and load ------------------------------------------------------------------


def _dp_group(engine):
    return getattr(engine.optimizer, "dp_process_group", None)


def _guard(engine, phase: str):
    from ...comm.failures import world_guard

    rt = engine.hier_runtime
    # these collectives run on DeepSpeed's data-parallel group: report the timeout it runs with
    return world_guard(rt.topo, rt.rank, phase, getattr(engine, "ds_group_timeout_s", None))


def _agreed_errors(error: tuple | None, group) -> list:
    """Every rank's local failure (rank, path, cause), agreed with one flag all-reduce; only when
    some rank failed, the first failure and the other failed ranks reach every rank
    ([Note: a coordinator, not a world gather] in comm/_coordinator.py)."""
    found = coordinator.failures_everywhere(list(error) if error is not None else None, group)
    if found is None:
        return []
    first, others = found
    return [tuple(first), *[(r, "", "") for r in others]]


def own_files(written: list[str], tmp_dir: str) -> list[str]:
    """The names (relative to ``tmp_dir``) of the files this rank's checkpoint engine saved there,
    each once, sorted: the files this rank hashes (pure)."""
    root = os.path.abspath(tmp_dir)
    out = set()
    for path in written:
        rel = os.path.relpath(os.path.abspath(path), root)
        if not rel.startswith(".."):
            out.add(rel)
    return sorted(out)


def coordinate_files(tmp_dir: str, parts: list, listed: list[str]) -> tuple[dict, tuple | None, list[str]]:
    """Rank 0's part, pure but for reading: the gathered ``parts`` (each rank's {name: digest})
    against rank 0's one listing of ``tmp_dir``. Returns (files of the manifest so far, the first
    rank error (a file a rank wrote that rank 0 does not see), the listed names nobody hashed)."""
    files: dict = {}
    owner: dict = {}
    for rank, part in enumerate(parts):
        for rel, d in (part or {}).items():
            files[rel] = d
            owner.setdefault(rel, rank)
    seen = set(listed)
    for rel in sorted(files):
        if rel not in seen:
            r = owner[rel]
            return (
                files,
                (r, os.path.join(tmp_dir, rel), f"rank {r} wrote it, but rank 0 does not see it: {SHARED_FIX}"),
                [],
            )
    return files, None, [rel for rel in listed if rel not in files]


def own_and_rest(
    tmp_dir: str, mine: dict, total: list[int], listed: list[str], world: int
) -> tuple[dict, tuple | None, list[str]]:
    """Rank 0's part of a save ([Note: a manifest in pieces]), pure but for reading: its own
    files ``mine``, the all-reduced ``total`` of the other ranks' pieces (SUM_FIELDS, then the
    names' sums) and its one listing of ``tmp_dir``. Returns (the top manifest's files so far,
    the first rank error, the listed names nobody hashed). When the listing's other files match
    the pieces' count and names' sums, nothing else is read; otherwise (a failure, or files
    written outside DeepSpeed's checkpoint engine) rank 0 reads every piece to name them."""
    in_pieces = [rel for rel in listed if rel.split("/")[0] == pieces.PIECES_DIR]
    others = [rel for rel in listed if rel not in mine and rel.split("/")[0] != pieces.PIECES_DIR]
    n = len(pieces.SUM_FIELDS)
    if len(in_pieces) == total[0] and [len(others), *pieces.name_sums(others)] == [total[1], *total[n:]]:
        return dict(mine), None, []
    parts: list = [mine]
    for r in range(1, world):
        try:
            parts.append(pieces.read_piece(tmp_dir, r)[1])
        except (OSError, ValueError) as e:
            path = os.path.join(tmp_dir, pieces.piece_rel(r))
            return dict(mine), (r, path, f"rank {r} wrote it, but rank 0 cannot read it ({e}): {SHARED_FIX}"), []
    skip = set(in_pieces)
    files, error, rest = coordinate_files(tmp_dir, parts, [rel for rel in listed if rel not in skip])
    return {k: files[k] for k in mine}, error, rest


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
    tag = check_tag_name(str(tag) if tag is not None else f"global_step{engine.global_steps}")
    rank, world, group = dist.get_rank(), dist.get_world_size(), _dp_group(engine)
    tmp_tag = TMP_PREFIX + tag
    tmp_dir = os.path.join(save_dir, tmp_tag)
    lead = dist.get_rank(group) == 0  # the coordinator ([Note: atomic checkpoint])
    with _guard(engine, "checkpoint save"):
        # rank 0 prepares the directory and leaves a probe in it; every rank must see the probe
        # before anyone writes: else the directory is not shared, and every rank says so
        prepared, nonce = None, os.urandom(8).hex()
        probe = os.path.join(save_dir, f"{TMP_PREFIX}{tag}.probe")
        if lead:
            try:
                os.makedirs(save_dir, exist_ok=True)
                clean_leftovers(save_dir, tag)  # an earlier crash's
                os.makedirs(os.path.join(tmp_dir, pieces.PIECES_DIR))  # each rank's piece goes there
                write_atomic(probe, nonce.encode())
            except OSError as e:
                prepared = _rank_error(0, save_dir, e)
        prepared, nonce = coordinator.broadcast_from_root([prepared, nonce], group)
        raise_rank_errors([tuple(prepared) if prepared else None], "preparing the checkpoint directory")
        try:
            with open(probe, "rb") as f:
                seen = f.read().decode(errors="replace") == nonce
        except OSError:
            seen = False
        unseen = None
        if not seen:
            unseen = (
                rank,
                save_dir,
                f"rank {rank} does not see the file rank 0 just wrote there ({probe}): {SHARED_FIX}",
            )
        raise_rank_errors(_agreed_errors(unseen, group), "checking the checkpoint directory")
        if lead:
            with contextlib.suppress(OSError):
                os.remove(probe)
        # a write that fails on one rank is held until every rank has run DeepSpeed's
        # collectives, then named on every rank ([Note: a rank that cannot write])
        written: list[str] = []
        with held_writes(engine, rank, written) as write_failures:
            ds_save(
                save_dir,
                tmp_tag,
                client_state=client_state if client_state is not None else {},
                save_latest=False,
                exclude_frozen_parameters=exclude_frozen_parameters,
            )
        failed = _agreed_errors(write_failures[0] if write_failures else None, group)
        if lead and failed:
            shutil.rmtree(tmp_dir, ignore_errors=True)  # nothing of it is committed: give the space back
        raise_rank_errors(failed, "writing the checkpoint files (nothing committed, 'latest' unchanged)", WRITE_FIX)
        if lead:  # DeepSpeed's copies load pickles: the tensors-only ones replace them
            from .recovery_script import replace_scripts

            replace_scripts(save_dir)
        # each rank fsyncs and hashes the files it wrote itself, and only those
        mine: dict = {}
        failure = None
        for rel in own_files(written, tmp_dir):
            try:
                mine[rel] = file_digest(os.path.join(tmp_dir, rel), sync=True)
            except OSError as e:
                failure = _rank_error(rank, os.path.join(tmp_dir, rel), e)
                break
        # each rank but rank 0 records them in its piece of the manifest; rank 0 gets the sums
        # ([Note: a manifest in pieces])
        grank = dist.get_rank(group)
        sums = pieces.ZERO + [0, 0]
        if failure is None and not lead:
            try:
                data = pieces.write_piece(tmp_dir, grank, mine)
                sums = pieces.piece_sums(data, mine) + pieces.name_sums(mine)
            except OSError as e:
                failure = _rank_error(rank, os.path.join(tmp_dir, pieces.piece_rel(grank)), e)
        raise_rank_errors(_agreed_errors(failure, group), "hashing and recording the saved files")
        total = coordinator.sums(sums, group)
        (largest,) = coordinator.maxima([sum(int(d["bytes"]) for d in mine.values())], group)
        outcome: tuple[int, str, str] | None = None
        if lead:
            try:
                # one listing, on rank 0: a file a rank wrote that rank 0 does not see means the
                # directory is not shared; a file nobody hashed (written outside DeepSpeed's
                # checkpoint engine) is hashed here and listed in the top manifest
                files, outcome, rest = own_and_rest(
                    tmp_dir, mine, total, list_files(tmp_dir), dist.get_world_size(group)
                )
                if outcome is None:
                    for rel in rest:
                        files[rel] = file_digest(os.path.join(tmp_dir, rel), sync=True)
                    fsync_dir(os.path.join(tmp_dir, pieces.PIECES_DIR))  # the pieces' names
                    rt = engine.hier_runtime
                    meta = {
                        "world_size": world,
                        "preset": rt.cfg.preset,
                        "topology": list(rt.topo.dims),
                        "global_steps": int(engine.global_steps),
                        "ranks": pieces.totals_record(total[: len(pieces.SUM_FIELDS)], largest),
                    }
                    commit(save_dir, tmp_dir, tag, files, meta, save_latest)
            except OSError as e:
                outcome = _rank_error(0, os.path.join(save_dir, tag), e)
        # nobody returns before the commit
        shared = coordinator.broadcast_from_root(list(outcome) if outcome else None, group)
    outcome = tuple(shared) if shared else None
    raise_rank_errors([outcome], "committing the checkpoint")
    return True


def _view(root: str, tag: Any, latest_name: str, lead: bool) -> dict:
    """What this rank sees of the checkpoint to load: the tag (given, or read from ``latest``),
    or the error it met (as (path, problem, fix)). The coordinator first restores an interrupted
    re-save. No rank but the coordinator reads the manifest ([Note: checks in shares])."""
    try:
        resolved = resolve_tag(root, tag, latest_name)
    except HierCheckpointError as e:
        return {"tag": None, "error": (e.path, e.problem, e.fix)}
    if resolved is not None and lead:
        try:
            recover(root, resolved)
        except OSError as e:
            return {"tag": resolved, "error": (root, f"cannot restore '{OLD_PREFIX}{resolved}': {e}", SHARED_FIX)}
    return {"tag": resolved, "error": None}


def _agree_view(view: dict, root: str, group) -> str | None:
    """The same error on every rank if a rank met one or the ranks do not see the same tag; else
    the tag. One flag and one digest all-reduce; a second round only on a difference."""
    rank = dist.get_rank()
    err = [rank, *view["error"]] if view["error"] is not None else None
    found = coordinator.failures_everywhere(err, group)
    if found is not None:
        (r, path, problem, fix), _ = found
        raise HierCheckpointError(path, f"{problem} (seen by rank {r})", fix)
    if not coordinator.same_everywhere(view["tag"], group):
        tags = coordinator.gather_to_root([rank, view["tag"]], group)
        odd = None
        if tags is not None:
            odd = next([r, t, tags[0][1]] for r, t in tags if t != tags[0][1])
        r, theirs, ref = coordinator.broadcast_from_root(odd, group)
        raise HierCheckpointError(root, f"rank {r} sees tag {theirs!r}, rank 0 sees tag {ref!r}", SHARED_FIX)
    return view["tag"]


def verify_for_load(
    engine, load_dir: str, tag: Any, *, check: bool = True, trust_pickles: bool = False, missing_ok: bool = False
) -> str | None:
    """Agree on the tag (given, or what ``latest`` names) across ranks, then check
    ``<load_dir>/<tag>``, each rank its share of the files ([Note: checks in shares]): against
    the manifest when ``check``, the pickles unless ``trust_pickles``; raise the same
    ``HierCheckpointError`` everywhere on any problem. Returns the tag to load. No ``latest``
    and no tag is an error, unless ``missing_ok`` (then None: DeepSpeed loads nothing)."""
    latest_name = "latest_universal" if engine.load_universal_checkpoint() else "latest"
    group = _dp_group(engine)
    lead = dist.get_rank(group) == 0
    with _guard(engine, "checkpoint load"):
        resolved = _agree_view(_view(load_dir, tag, latest_name, lead), load_dir, group)
        if resolved is None:
            if missing_ok:
                return None
            raise missing_latest_error(load_dir, latest_name)
        if check or not trust_pickles:  # unverified, but still never a pickle that could run code
            verify_across(load_dir, resolved, group, check=check, trust_pickles=trust_pickles)
    return resolved


# -- conversions -----------------------------------------------------------------------------------


def _verified_source(src_dir: str, tag: Any, trust_pickles: bool) -> str:
    tag = resolve_tag(src_dir, tag)
    if tag is None:
        raise missing_latest_error(src_dir)
    raise_problems(verify_tag(src_dir, tag, trust_pickles=trust_pickles), src_dir, tag)
    return tag


def _inside(a: str, b: str) -> bool:
    a, b = os.path.realpath(a), os.path.realpath(b)
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep)


def to_universal(src_dir: str, out_dir: str, tag: Any = None, workers: int = 1, trust_pickles: bool = False) -> str:
    """Convert ``<src_dir>/<tag>`` (default: ``latest``) into DeepSpeed's universal format in
    ``<out_dir>/<tag>``, for loading on another number of ranks or another preset/topology
    with ``"checkpoint": {"load_universal": true}``. Weights and Adam states (exp_avg,
    exp_avg_sq, step) carry over. The source is verified first, read tensors-only, and the
    result is committed like a save (manifest, rename, then ``latest_universal``). The output
    never replaces anything: ``out_dir`` must not be the source directory, and
    ``<out_dir>/<tag>`` must not exist. Run it in one process."""
    import multiprocessing

    from deepspeed.checkpoint import ds_to_universal

    from . import safe_load

    tag = _verified_source(src_dir, tag, trust_pickles)
    final = os.path.join(out_dir, tag)
    if _inside(out_dir, src_dir) or _inside(src_dir, out_dir):
        raise HierCheckpointError(
            out_dir,
            f"the output directory overlaps the source '{src_dir}': the conversion would replace "
            "the checkpoint it reads",
            "give another output directory (e.g. <src>_universal)",
        )
    if os.path.lexists(final):
        raise HierCheckpointError(
            final,
            "exists already: a conversion never replaces a checkpoint",
            "give another output directory, or remove it yourself",
        )
    if workers > 1 and multiprocessing.get_start_method() != "fork":
        # the tensors-only rule lives in this process; forked workers inherit it, others would not
        raise HierCheckpointError(
            src_dir, f"workers={workers} with the '{multiprocessing.get_start_method()}' start method", "use workers=1"
        )
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
    with safe_load.tensors_only(trust_pickles):
        ds_to_universal.main(args)
    converted = os.path.join(scratch, tag)
    files = {rel: file_digest(os.path.join(converted, rel), sync=True) for rel in list_files(converted)}
    with open(os.path.join(src_dir, tag, MANIFEST)) as f:
        source = json.load(f)
    meta = {k: source.get(k) for k in ("world_size", "preset", "topology", "global_steps")}
    meta["universal_from"] = os.path.abspath(os.path.join(src_dir, tag))
    # which save this is a conversion of (a tag name can be saved again): the job's resume checks it
    meta["source_manifest_sha256"] = file_digest(os.path.join(src_dir, tag, MANIFEST))["sha256"]
    commit(out_dir, converted, tag, files, meta, True, latest_name="latest_universal")
    shutil.rmtree(scratch, ignore_errors=True)
    return final


def to_fp32(src_dir: str, tag: Any = None, trust_pickles: bool = False) -> dict:
    """DeepSpeed's ``zero_to_fp32`` consolidation (the full fp32 state dict) of a verified tag,
    read tensors-only."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from . import safe_load

    tag = _verified_source(src_dir, tag, trust_pickles)
    with safe_load.tensors_only(trust_pickles):
        return get_fp32_state_dict_from_zero_checkpoint(src_dir, tag=tag)


def add_trust_pickles(parser: argparse.ArgumentParser) -> None:
    """The one opt-in to unpickling, worded alike in every command that loads a checkpoint
    ([Note: tensors-only loading] in checkpoint/safe_load.py)."""
    parser.add_argument(
        "--trust-pickles",
        action="store_true",
        help="load any pickled type (runs code the files name): only for checkpoints whose writer you trust",
    )


def main(
    argv=None, prog: str = "python -m zeropp_hier.deepspeed.checkpoint", others: Mapping[str, str] | None = None
) -> int:
    """``zeropp-hier checkpoint verify DIR [--tag T]`` / ``to-universal SRC OUT [--tag T]``
    (``universal`` is the same as ``to-universal``). Checkpoint files are read tensors-only
    unless ``--trust-pickles``."""
    ap = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    # commands of a higher layer (the command line runs them before this parser: export-hf needs
    # the app's model classes), listed here so that --help names every checkpoint command
    for name, text in (others or {}).items():
        sub.add_parser(name, help=text, add_help=False)
    v = sub.add_parser("verify", help="check every file of a tag against its manifest; list unfinished saves")
    v.add_argument("dir")
    v.add_argument("--tag", default=None)
    u = sub.add_parser(
        "to-universal", aliases=["universal"], help="convert a tag for loading on another number of ranks"
    )
    u.add_argument("src")
    u.add_argument("out")
    u.add_argument("--tag", default=None)
    for p in (v, u):
        add_trust_pickles(p)
    a = ap.parse_args(argv)
    if a.cmd in (others or {}):
        print(f"{prog} {a.cmd}: run it as zeropp-hier checkpoint {a.cmd}", file=sys.stderr)
        return 2
    try:
        if a.cmd == "verify":
            for path, what in leftovers(a.dir):
                print(f"LEFTOVER {path}: {what}")
            tag = resolve_tag(a.dir, a.tag)
            if tag is None:
                raise missing_latest_error(a.dir)
            problems = verify_tag(a.dir, tag, trust_pickles=a.trust_pickles)
            for path, problem in problems:
                print(f"BAD {path}: {problem}")
            if not problems:
                print(f"OK {os.path.join(a.dir, tag)}")
            return 1 if problems else 0
        print(to_universal(a.src, a.out, a.tag, trust_pickles=a.trust_pickles))
    except HierCheckpointError as e:
        print(f"error: {e}")
        return 1
    return 0
