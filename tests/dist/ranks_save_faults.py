"""Functions the save-fault tests run on every rank: one rank's write refused inside DeepSpeed's
own save. They return plain data; the tests assert.

Fault injection happens in the victim's own process. ``fsize``: the kernel refuses the write
(``RLIMIT_FSIZE`` lowered on that rank only, around the save: torch's file writer gets EFBIG,
the way it gets ENOSPC on a full disk or EDQUOT over quota). ``enospc``: the checkpoint
engine's ``save`` of one file raises ``OSError(ENOSPC)`` on that rank. DeepSpeed, its
collectives and the file writes of every other rank are real.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import time

import torch
import torch.distributed as dist

from zeropp_hier.app import run as app_run
from zeropp_hier.deepspeed import checkpoint


@contextlib.contextmanager
def _kernel_refuses_writes(limit_bytes: int = 1024):
    """Writes past ``limit_bytes`` in any file fail with EFBIG in this process (SIGXFSZ ignored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@contextlib.contextmanager
def _engine_save_raises(engine, marker: str):
    """The checkpoint engine's save of a file whose name contains ``marker`` raises ENOSPC."""
    real = engine.checkpoint_engine.save

    def save(state_dict, path):
        if marker in os.path.basename(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(state_dict, path)

    engine.checkpoint_engine.save = save
    try:
        yield
    finally:
        del engine.checkpoint_engine.save


def _digests(root: str, tag: str) -> dict:
    tag_dir = os.path.join(root, tag)
    return {rel: checkpoint.file_digest(os.path.join(tag_dir, rel)) for rel in checkpoint.list_files(tag_dir)}


def save_with_a_write_refused(config: dict, root: str, steps_good: int, cases: list) -> dict:
    """Save tag "good", train a step on, then for each (kind, victim) in ``cases`` try to save
    tag "bad_<kind>" with ``victim``'s write refused; every attempt's error on this rank, and how
    long it took. Then a fresh engine loads whatever ``latest`` names: its weights against the
    ones saved as "good", bit for bit."""
    import zeropp_hier

    rank = dist.get_rank()
    engine = app_run.build_engine(config)
    app_run.train_steps(engine, steps_good)
    engine.save_checkpoint(root, tag="good")
    good_state = app_run.gathered_state(engine)
    good_files = _digests(root, "good") if rank == 0 else None
    app_run.train_steps(engine, 1, start=steps_good)
    errors = {}
    for kind, victim in cases:
        fault = contextlib.nullcontext()
        if rank == victim:
            fault = _kernel_refuses_writes() if kind == "fsize" else _engine_save_raises(engine, "model_states")
        t0 = time.monotonic()
        try:
            with fault:
                engine.save_checkpoint(root, tag=f"bad_{kind}")
            errors[kind] = None
        except zeropp_hier.HierCheckpointError as e:
            errors[kind] = {"path": e.path, "problem": e.problem, "fix": e.fix, "seconds": time.monotonic() - t0}
    # the world is still in step: the ranks that could write did not wait for the one that could not
    after_losses = app_run.train_steps(engine, 1, start=steps_good + 1)
    app_run.release(engine)

    fresh = app_run.build_engine(config, seed=123)  # another init: the load must overwrite it
    path, _ = fresh.load_checkpoint(root)
    loaded = app_run.gathered_state(fresh)
    app_run.release(fresh)
    return {
        "errors": errors,
        "after_losses": after_losses,
        "loaded_path": path,
        "bit_equal": sorted(n for n in good_state if torch.equal(loaded[n], good_state[n])),
        "names": sorted(good_state),
        "good_files_before": good_files,
        "good_files_after": _digests(root, "good") if rank == 0 else None,
    }
