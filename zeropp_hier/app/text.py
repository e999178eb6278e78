"""Real text that needs no download: the Python standard library's own ``.py`` sources, as bytes.

Every Python installation ships them, so a byte-level model (vocab 256) can be trained on real,
structured text anywhere, offline. The corpus is deterministic for a given Python version: files
in sorted path order, the test suites and ``site-packages`` left out; every 20th file is held
out for evaluation. Batches are random windows drawn from a generator seeded by (seed, step,
micro-batch, rank), so every configuration of a comparison sees the same data in the same order.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from pathlib import Path
from typing import NamedTuple

import torch

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
HELD_OUT_EVERY = 20  # file i is held out when i % 20 == 0


class Corpus(NamedTuple):
    train: torch.Tensor  # uint8 [n]
    held_out: torch.Tensor  # uint8 [m]
    files: int
    sha256: str  # of train + held_out, to tell corpora of different Python versions apart
    python: str


def stdlib_files(root: str | None = None) -> list[Path]:
    base = Path(root or sysconfig.get_paths()["stdlib"])
    files = [p for p in base.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(base).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(base).as_posix())


def stdlib_corpus(max_bytes: int | None = None, root: str | None = None) -> Corpus:
    """The standard library's sources; ``max_bytes`` caps the training part (whole files)."""
    train, held = bytearray(), bytearray()
    files = stdlib_files(root)
    for i, path in enumerate(files):
        data = path.read_bytes() + b"\n"
        if i % HELD_OUT_EVERY == 0:
            held += data
        elif max_bytes is None or len(train) < max_bytes:
            train += data
    if not train or not held:
        raise RuntimeError(f"no Python sources found under {root or sysconfig.get_paths()['stdlib']}")
    digest = hashlib.sha256(bytes(train) + bytes(held)).hexdigest()
    as_tensor = lambda b: torch.frombuffer(b, dtype=torch.uint8).clone()  # noqa: E731
    return Corpus(as_tensor(train), as_tensor(held), len(files), digest, sys.version.split()[0])


def windows(data: torch.Tensor, batch: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows of seq_len+1 bytes: inputs [batch, seq_len] and next-byte
    targets [batch, seq_len], both int64."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=g)
    idx = starts.view(-1, 1) + torch.arange(seq_len + 1).view(1, -1)
    seq = data[idx].long()
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def batch_seed(seed: int, index: int, rank: int) -> int:
    """Seed of the ``index``-th micro-batch of ``rank`` (index = step * accumulation + micro)."""
    return (seed * 1_000_003 + index) * 65_537 + rank
