"""The loader's sample orders from the cache: which arrays the loader positions a job reads
need, built (or checked) by rank 0, memory-mapped by every rank ([Note: data order caches] in
order_cache.py). ``start`` is the job's one collective for it; a loader never started this way
builds its orders in memory when first used, as before (tests, benchmarks)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist

from .order_cache import CACHE_DIR_NAME, Want, opener

_PIECE = 1 << 22  # shuffle entries converted and written at once by the builder
_NOT_TOLD = "not told"  # what a rank holds when the broadcast did not reach it (the dry run's mirror)


def shuffle_want(n: int, seed_value: int, about: str = "") -> Want:
    """An epoch's shuffle of ``n`` samples: ``torch.randperm(n)`` from ``seed_value`` (what the
    loader draws without the cache), 4 bytes a sample below 2**32 samples."""
    key = {
        "kind": "shuffle",
        "rule": "torch.randperm/v1",
        "torch": torch.__version__.split("+")[0],
        "n": n,
        "seed": seed_value,
    }

    def build() -> Iterator[np.ndarray]:
        g = torch.Generator().manual_seed(seed_value)
        for piece in torch.randperm(n, generator=g).split(_PIECE):
            yield piece.numpy()

    return Want(key, "uint32" if n <= 2**32 else "int64", (n,), build, about)


def default_cache_dir(data) -> Path:
    """Beside the data: in a prepared directory, or beside a pair (a blend's first pair)."""
    if hasattr(data, "parts"):
        data = data.parts[0]
    if hasattr(data, "prefix"):
        return Path(data.prefix).parent / CACHE_DIR_NAME
    return Path(data.path) / CACHE_DIR_NAME


def attach(loader, first: int, last: int, get: Callable[[Want], np.ndarray]) -> None:
    """Give ``loader`` the cached arrays its positions ``first`` .. ``last - 1`` read."""
    data, n = loader.data, loader.n
    if getattr(data, "shuffles_itself", False):
        data.attach(loader.seq_len, first, last, get, shuffle_want)
        return
    if last <= first:
        return
    name = getattr(data, "prefix", None) or getattr(data, "path", "")
    for epoch in range(first // n, (last - 1) // n + 1):
        about = f"{name} ({getattr(data, 'split', '')}), epoch {epoch}"
        loader.cached[epoch] = get(shuffle_want(n, loader.epoch_seed(epoch), about))


def start(loader, first: int, last: int, cache_dir: str | None, rank: int) -> float:
    """Collective when torch.distributed is initialised (one object broadcast from rank 0):
    rank 0 checks or builds the cache files for positions ``first`` .. ``last - 1``, then every
    rank memory-maps them; an error on rank 0 is raised on every rank. Returns this rank's
    seconds."""
    t0 = time.perf_counter()
    where = Path(cache_dir) if cache_dir else default_cache_dir(loader.data)
    told: list = [_NOT_TOLD]
    if rank == 0:
        try:
            attach(loader, first, last, opener(where, builder=True))
            told[0] = None
        except (ValueError, RuntimeError, OSError) as e:  # HierConfigError among them
            told[0] = e
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(told, src=0)
    if isinstance(told[0], BaseException):
        raise told[0]
    if rank != 0:  # not told: a dry run of this rank alone (the mirror), where no rank 0 built them
        attach(loader, first, last, opener(where, builder=told[0] == _NOT_TOLD))
    return time.perf_counter() - t0


PAGE = 4096  # bytes a memory-mapped read brings in at least


def rank_costs(
    tokens: int, seq_len: int, world: int, micro: int, steps: int, weights: list[float] | None = None
) -> dict:
    """What the data orders cost, by the layouts above (arithmetic: nothing is built): the cache
    files and the builder's (rank 0's) peak memory, and what any other rank opens and reads.
    ``weights``: a blend whose pairs hold ``tokens`` in those shares; ``steps`` micro-batches
    of ``micro`` samples on each of ``world`` ranks."""
    from .blend import _CHECKPOINT, blend_wants, pair_seed

    samples = (tokens - 1) // seq_len
    positions = steps * world * micro
    if weights is None:
        epochs = -(-positions // samples)
        files = [shuffle_want(samples, e) for e in range(epochs)]
        builder = 8 * samples + 8 * _PIECE  # torch's int64 permutation, one piece converted
        # a sample reads one shuffle entry: at worst a page each
        read = micro * PAGE
    else:
        sizes = [max(1, int(samples * w)) for w in weights]
        order, marks_of = blend_wants(weights, sizes)
        files = [order, marks_of(np.zeros(0, dtype=np.uint8))]
        for d, (w, n) in enumerate(zip(weights, sizes)):  # the passes over each pair the positions take
            files += [shuffle_want(n, pair_seed(0, d, e)) for e in range(-(-int(positions * w + 2) // n))]
        builder = max(8 * max(sizes) + 8 * _PIECE, (1 << 20) * 2 + 8 * len(sizes) * 1024)
        # a sample reads its pair's shuffle entry (a page), the order since its checkpoint
        # (_CHECKPOINT entries: at most two pages) and one row of counts (a page)
        read = micro * (PAGE + (-(-_CHECKPOINT * np.dtype(order.dtype).itemsize // PAGE) + 1) * PAGE + PAGE)
    return {
        "samples": samples,
        "cache_files": len(files),
        "cache_bytes": sum(f.nbytes for f in files),
        "builder_peak_bytes": builder,
        "files_opened_per_rank": len(files),
        "read_bytes_per_micro_batch": read,
    }
