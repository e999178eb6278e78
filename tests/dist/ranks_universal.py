"""Functions the shared-conversion tests run on every rank ([Note: a conversion in shares] in
zeropp_hier/deepspeed/checkpoint/universal.py). They return plain data; the tests assert."""

from __future__ import annotations

from dataclasses import asdict

from zeropp_hier.app import run as app_run
from zeropp_hier.deepspeed.checkpoint import universal as universal_shared


def train_and_save(config: dict, root: str, tag: str, steps: int) -> None:
    """A real checkpoint of this world: ``steps`` steps (Adam moments that are not zero), saved."""
    engine = app_run.build_engine(config)
    app_run.train_steps(engine, steps)
    engine.save_checkpoint(root, tag=tag)
    app_run.release(engine)


def convert(src_dir: str, out_dir: str, tag: str) -> dict:
    return asdict(universal_shared.convert(src_dir, out_dir, tag))
