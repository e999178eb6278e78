"""Functions the checkpoint-trust tests run on every rank: real saves of every preset, loads of
crafted or damaged checkpoints, a directory that not every rank sees. They return plain data;
the tests assert. Fault injection (an I/O error while hashing) happens in the rank's own
process; nothing else is replaced."""

from __future__ import annotations

import errno
import os

import torch
import torch.distributed as dist

from zeropp_hier.app import run as app_run


def save_and_reload(cases: dict, root: str) -> dict:
    """For each case: train 2 steps, save tag "t" under ``<root>/<case>``, load it into a fresh
    engine with the default (tensors-only) rule. Rank 0 lists, per file, the pickled globals
    torch's own tensors-only set does not allow (the survey behind the allowlist)."""
    out = {}
    for name, cfg in cases.items():
        engine = app_run.build_engine(cfg)
        app_run.train_steps(engine, 2)
        engine.save_checkpoint(os.path.join(root, name), tag="t")
        saved = app_run.gathered_state(engine)
        app_run.release(engine)
        fresh = app_run.build_engine(cfg, seed=123)
        path, _ = fresh.load_checkpoint(os.path.join(root, name))
        loaded = app_run.gathered_state(fresh)
        app_run.release(fresh)
        globals_found = {}
        if dist.get_rank() == 0:
            tag_dir = os.path.join(root, name, "t")
            for f in sorted(os.listdir(tag_dir)):
                if f.endswith(".pt"):
                    globals_found[f] = torch.serialization.get_unsafe_globals_in_checkpoint(os.path.join(tag_dir, f))
        out[name] = {
            "path": path,
            "max_diff": max(float((loaded[n] - saved[n]).abs().max()) for n in saved),
            "saved": saved,
            "globals": globals_found,
        }
    return out


def two_versions(config: dict, first: str, second: str) -> dict:
    """Tag "t" after 2 steps in ``first``, and "t" again after 3 steps in ``second``."""
    engine = app_run.build_engine(config)
    app_run.train_steps(engine, 2)
    engine.save_checkpoint(first, tag="t")
    v1 = app_run.gathered_state(engine)
    app_run.train_steps(engine, 1, start=2)
    engine.save_checkpoint(second, tag="t")
    v2 = app_run.gathered_state(engine)
    app_run.release(engine)
    return {"v1": v1, "v2": v2}


def load_each(config: dict, roots: dict, **load_kwargs) -> dict:
    """Load ``<root>`` (tag from ``latest``) for each named root into one engine: the weights
    loaded, or the error every rank raised (``{"type", "path", "message"}``)."""
    import zeropp_hier

    engine = app_run.build_engine(config, seed=123)
    out = {}
    for name, root in roots.items():
        try:
            path, _ = engine.load_checkpoint(root, **load_kwargs)
            out[name] = {"path": path, "state": app_run.gathered_state(engine)}
        except zeropp_hier.HierCheckpointError as e:
            out[name] = {"type": type(e).__name__, "path": e.path, "message": str(e)}
    app_run.release(engine)
    return out


def save_load_in_own_dirs(config: dict, dirs: dict, shared: str) -> dict:
    """Each rank saves into ``dirs[rank]`` (as if each node had its own NVMe), then loads from
    it after a proper save into ``shared`` was copied there with a file missing on rank 1."""
    import shutil

    import zeropp_hier

    rank = dist.get_rank()
    engine = app_run.build_engine(config)
    app_run.train_steps(engine, 1)
    out = {}
    try:
        engine.save_checkpoint(dirs[rank], tag="t")
        out["save"] = None
    except zeropp_hier.HierCheckpointError as e:
        out["save"] = {"path": e.path, "message": str(e)}
    engine.save_checkpoint(shared, tag="t")
    if rank == 1:  # this node's copy lacks a file of this rank's share (its own: its piece's)
        shutil.rmtree(dirs[rank], ignore_errors=True)
        shutil.copytree(shared, dirs[rank])
        os.remove(os.path.join(dirs[rank], "t", "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    dist.barrier()
    fresh = app_run.build_engine(config, seed=123)
    try:
        fresh.load_checkpoint(dirs[rank] if rank == 1 else shared)
        out["load"] = None
    except zeropp_hier.HierCheckpointError as e:
        out["load"] = {"path": e.path, "message": str(e)}
    fresh.load_checkpoint(shared)  # and the world is still usable
    out["loss_after"] = app_run.train_steps(fresh, 1, start=fresh.global_steps)[0]
    app_run.release(fresh)
    app_run.release(engine)
    return out


def hash_error_on_one_rank(config: dict, root: str, victim: int) -> dict:
    """On ``victim``, reading any file of the checkpoint for its hash fails with EIO (a Lustre
    I/O error): at save, then at load. Every rank must raise, naming the victim and the file."""
    import zeropp_hier
    from zeropp_hier.deepspeed import checkpoint
    from zeropp_hier.deepspeed.checkpoint import atomic, files

    rank = dist.get_rank()
    engine = app_run.build_engine(config)
    app_run.train_steps(engine, 1)
    engine.save_checkpoint(root, tag="good")
    real = files.file_digest
    modules = (atomic, files)  # the save hashes in one, the checks of a load in the other

    def failing(path, sync=False):
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    out = {}
    if rank == victim:
        for m in modules:
            m.file_digest = failing
    try:
        for what, call in (
            ("save", lambda: engine.save_checkpoint(root, tag="bad")),
            ("load", lambda: engine.load_checkpoint(root, tag="good")),
        ):
            try:
                call()
                out[what] = None
            except zeropp_hier.HierCheckpointError as e:
                out[what] = {"path": e.path, "message": str(e)}
    finally:
        for m in modules:
            m.file_digest = real
    out["latest"] = open(os.path.join(root, "latest")).read()
    out["tags"] = checkpoint.complete_tags(root)
    app_run.release(engine)
    return out
