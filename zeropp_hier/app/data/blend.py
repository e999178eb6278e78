"""Megatron / GPT-NeoX blends and splits of ``PREFIX.bin`` / ``PREFIX.idx`` pairs, as their
``--data-path W1 PREFIX1 W2 PREFIX2 ...`` and ``--split 969,30,1`` define them.

[Note: blends and splits]
Followed from Megatron-LM (``megatron/core/datasets``: ``utils.get_blend_from_list``,
``blended_megatron_dataset_config.parse_and_normalize_split``, the builder's
``_get_split_indices``, ``helpers.cpp``'s ``build_blending_indices``; GPT-NeoX's
``gpt_dataset`` / ``blendable_dataset`` use the same rules), implemented here from them:

- ``data.path`` is one prefix, or weights and prefixes alternating; the weights are
  normalised to sum 1 (``0.7 A 0.3 B`` and ``7 A 3 B`` are the same blend).
- ``data.split`` ``"969,30,1"`` (commas or slashes; missing parts are 0) is normalised; each
  pair is split *by sequence* (one per document as ``preprocess_data.py`` writes them) into
  consecutive ranges: boundary k+1 = boundary k + round(part_k x sequences), then every
  boundary is moved by the rounding excess so the last is the number of sequences.
  ``train`` is the first range, ``val`` the second (Megatron's ``valid``), ``test`` the third
  (held out; the job never reads it). Without a split a pair is all train, as before.
- A blend interleaves its pairs by the largest deficit: blended sample i comes from the pair d
  with the largest ``w_d x max(i, 1) - taken_d`` (the first on ties), whose next sample it is,
  so every prefix of the blended order holds each pair within one sample of its share.
- Each pair's samples are its own ``seq_len + 1`` windows over its split's tokens ([Note: sample
  order] in tokens.py), taken in a permutation of that pair seeded by (seed, pair, pass over the
  pair), as Megatron's per-dataset shuffle index; a pair whose share exceeds its samples is
  read again in a new order (Megatron's epochs of a dataset). The blended order is not shuffled
  again, as in Megatron: the loader's position g is blended sample ``g mod S``, S the sum of the
  pairs' samples (Megatron builds the blend to the requested size instead; here the greedy
  order restarts after S samples, which keeps every prefix within one sample of the weights).

Memory: the blended order is one byte per blended sample (two above 255 pairs) plus the
pairs' counts every ``_CHECKPOINT`` samples, built in Python (measured 0.45 s per million
blended samples with 3 pairs on this repository's shared CPU: about a minute for a 300B-token
blend at 2,048 tokens per sample). The job builds it once, on rank 0, into cache files that
every other rank memory-maps, with each pair's shuffles ([Note: data order caches] in
order_cache.py; orders.py); a rank then reads only the pages its own samples touch. Without the
cache (a loader used alone: tests, benchmarks) it is built in memory when first used, as are
the pairs' permutations (8 bytes per sample of a pair).
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch

from ...core.errors import HierConfigError
from .indexed import IndexedTokens
from .order_cache import Want

_CHECKPOINT = 4096  # blended samples between stored per-pair counts


def parse_blend(path: str) -> list[tuple[float, str]]:
    """``[(weight, prefix), ...]`` normalised, for ``W1 P1 W2 P2 ...``; ``[(1.0, path)]`` for one
    prefix."""
    parts = path.split()
    if len(parts) == 1:
        return [(1.0, parts[0])]
    weights, prefixes = parts[0::2], parts[1::2]
    try:
        values = [float(w) for w in weights]
    except ValueError:
        values = []
    if len(parts) % 2 or not values or any(not np.isfinite(w) or w < 0 for w in values) or sum(values) <= 0:
        raise HierConfigError(
            "data.path",
            path,
            "a blend is weights and Megatron prefixes alternating, weights >= 0 and not all 0: "
            "'0.7 /data/pile_text_document 0.3 /data/code_text_document'",
        )
    total = sum(values)
    return [(w / total, p) for w, p in zip(values, prefixes)]


def is_blend(path: str | None) -> bool:
    return path is not None and len(path.split()) > 1


def order_dtype(pairs: int) -> str:
    return "uint8" if pairs <= 256 else "int16"


def blending_pieces(weights: list[float], size: int, piece: int = 1 << 20) -> Iterator[np.ndarray]:
    """``blending_indices`` in pieces of ``piece`` samples (the cache's builder holds one piece)."""
    taken = [0] * len(weights)
    for lo in range(0, size, piece):
        out = np.empty(min(piece, size - lo), dtype=order_dtype(len(weights)))
        for i in range(lo, lo + len(out)):
            scale = float(max(i, 1))
            best, best_err = 0, weights[0] * scale - taken[0]
            for d in range(1, len(weights)):
                err = weights[d] * scale - taken[d]
                if err > best_err:
                    best, best_err = d, err
            out[i - lo] = best
            taken[best] += 1
        yield out


def blending_indices(weights: list[float], size: int) -> np.ndarray:
    """Which pair each of ``size`` blended samples comes from: the largest deficit rule."""
    return np.concatenate([np.empty(0, dtype=order_dtype(len(weights))), *blending_pieces(weights, size)])


def mark_pieces(order: np.ndarray, pairs: int) -> Iterator[np.ndarray]:
    """Each pair's count before every ``_CHECKPOINT``-th blended sample (one row per checkpoint,
    ``len(order) // _CHECKPOINT + 1`` rows), in pieces."""
    counts = np.zeros(pairs, dtype=np.int64)
    rows = len(order) // _CHECKPOINT + 1
    yield counts[None, :].copy()
    for lo in range(1, rows, 1024):
        hi = min(rows, lo + 1024)
        out = np.empty((hi - lo, pairs), dtype=np.int64)
        for b in range(lo, hi):
            counts += np.bincount(order[(b - 1) * _CHECKPOINT : b * _CHECKPOINT], minlength=pairs)
            out[b - lo] = counts
        yield out


def blend_key(weights: list[float], sizes: list[int]) -> dict:
    return {"kind": "blend-order", "rule": "largest-deficit/v1", "weights": list(weights), "sizes": list(sizes)}


def blend_wants(weights: list[float], sizes: list[int], about: str = "") -> tuple[Want, Callable[[np.ndarray], Want]]:
    """The blend order's cache file and (given the order) its counts' (nothing built here)."""
    key, pairs, total = blend_key(weights, sizes), len(sizes), sum(sizes)
    order = Want(key, order_dtype(pairs), (total,), lambda: blending_pieces(weights, total), about)
    marks_key = key | {"kind": "blend-marks", "every": _CHECKPOINT}
    rows = total // _CHECKPOINT + 1
    return order, lambda o: Want(marks_key, "int64", (rows, pairs), lambda: mark_pieces(o, pairs), about)


def pair_seed(seed: int, d: int, epoch: int) -> int:
    """The generator seed of pair ``d``'s shuffle in its pass ``epoch``."""
    return (seed * 1_000_003 + d) * 1_000_003 + epoch


class BlendedTokens:
    """Pairs blended by weight, each read in its split ([Note: blends and splits]); the interface
    the loader reads (``samples``, ``sample``, ``count``, ``index``) with ``shuffles_itself``:
    the loader's position is passed through as the blended sample."""

    shuffles_itself = True

    def __init__(self, path: str, split: str, data_split: str | None, seed: int = 0):
        # a pair of weight 0 is left out: the largest-deficit rule could pick it on a tie at 0
        self.blend = [(w, prefix) for w, prefix in parse_blend(path) if w > 0]
        self.parts = [IndexedTokens(prefix, split, data_split) for _, prefix in self.blend]
        self.weights = [w for w, _ in self.blend]
        self.seed = seed
        self.count = sum(p.count for p in self.parts)
        self.vocab_size: int | None = None
        self._index: dict = {
            "format": "megatron-blend",
            "blend": [(w, p.prefix) for w, p in zip(self.weights, self.parts)],
            "split": data_split,
            "tokens": {split: self.count},
        }
        self._built: tuple[int, np.ndarray, np.ndarray, list[int]] | None = None
        self._perms: dict[int, tuple[int, torch.Tensor]] = {}
        self._cached_perms: dict[tuple[int, int], np.ndarray] = {}  # (pair, pass): from the cache

    def sizes(self, seq_len: int) -> list[int]:
        """Each pair's samples (a pair of weight > 0 too small for one is refused by name)."""
        sizes = [p.samples(seq_len) for p in self.parts]
        for (w, p), n in zip(zip(self.weights, self.parts), sizes):
            if w > 0 and n < 1:
                raise HierConfigError(
                    "data.path",
                    p.prefix,
                    f"its {p.split} split holds {p.count} tokens, fewer than one sample of seq_len + 1 = "
                    f"{seq_len + 1}: give it weight 0, more data, or a larger share in data.split",
                )
        return sizes

    @property
    def index(self) -> dict:
        """What the blend is; its ``sha256`` (each pair's fingerprint) only when first asked."""
        if "sha256" not in self._index:
            digests = [str(p.index["sha256"]) for p in self.parts]
            self._index["sha256"] = _combined(digests, self.weights, self._index["split"])
        return self._index

    def limit_vocab(self, vocab: int) -> None:
        for p in self.parts:
            p.limit_vocab(vocab)

    def _build(self, seq_len: int) -> tuple[int, np.ndarray, np.ndarray, list[int]]:
        if self._built is None or self._built[0] != seq_len:  # no cache attached: built here, in memory
            sizes = self.sizes(seq_len)
            order = blending_indices(self.weights, sum(sizes))
            self._use(seq_len, order, np.concatenate(list(mark_pieces(order, len(sizes)))), sizes)
        assert self._built is not None
        return self._built

    def _use(self, seq_len: int, order: np.ndarray, marks: np.ndarray, sizes: list[int]) -> None:
        tail = order[(len(marks) - 1) * _CHECKPOINT :]  # fewer than _CHECKPOINT samples
        self._per_pass = marks[-1] + np.bincount(tail, minlength=len(sizes))
        self._built = (seq_len, order, marks, sizes)

    def samples(self, seq_len: int) -> int:
        return sum(self.sizes(seq_len))  # a pair too small refused when the loader opens

    def order_wants(self, seq_len: int) -> tuple[Want, Callable[[np.ndarray], Want]]:
        """The cache's blend order and (given the order) its counts ([Note: data order caches])."""
        about = f"blend of {[p.prefix for p in self.parts]}, split {self._index['split']}"
        return blend_wants(list(self.weights), self.sizes(seq_len), about)

    def attach(self, seq_len: int, first: int, last: int, get: Callable[[Want], np.ndarray], shuffle) -> None:
        """Use cached arrays (``get``) for the order and for every pair's shuffles that loader
        positions ``first`` .. ``last - 1`` read; ``shuffle(n, seed_value, about)``: a shuffle's
        Want."""
        order_want, marks_want = self.order_wants(seq_len)
        order = get(order_want)
        self._use(seq_len, order, get(marks_want(order)), self.sizes(seq_len))
        lo, hi = self.taken_before(first, seq_len), self.taken_before(max(first, last), seq_len)
        for d, n in enumerate(self._built[3] if self._built else []):
            if hi[d] == lo[d]:
                continue  # these positions take nothing of this pair
            for epoch in range(int(lo[d]) // n, -(-int(hi[d]) // n)):
                about = f"{self.parts[d].prefix} ({self.parts[d].split}), pass {epoch}"
                self._cached_perms[(d, epoch)] = get(shuffle(n, pair_seed(self.seed, d, epoch), about))

    def taken_before(self, g: int, seq_len: int) -> np.ndarray:
        """How many samples of each pair the loader positions before ``g`` take."""
        _, order, marks, _ = self._build(seq_len)
        k = g % len(order)
        start = (k // _CHECKPOINT) * _CHECKPOINT
        here = np.bincount(order[start:k], minlength=len(self.parts))
        return marks[k // _CHECKPOINT] + here + (g // len(order)) * self._per_pass

    def source(self, g: int, seq_len: int) -> tuple[int, int]:
        """(pair, that pair's sample) of loader position ``g``."""
        _, order, marks, sizes = self._build(seq_len)
        k = g % len(order)
        d = int(order[k])
        start = (k // _CHECKPOINT) * _CHECKPOINT
        j = int(marks[k // _CHECKPOINT, d]) + int(np.count_nonzero(order[start:k] == d))
        n = sizes[d]
        j += (g // len(order)) * int(self._per_pass[d])  # earlier passes over the blended order
        epoch = j // n
        from_cache = self._cached_perms.get((d, epoch))
        if from_cache is not None:
            return d, int(from_cache[j % n])
        cached = self._perms.get(d)
        if cached is None or cached[0] != epoch:
            gen = torch.Generator().manual_seed(pair_seed(self.seed, d, epoch))
            cached = (epoch, torch.randperm(n, generator=gen))
            self._perms[d] = cached
        return d, int(cached[1][j % n])

    def sample(self, g: int, seq_len: int) -> np.ndarray:
        d, j = self.source(g, seq_len)
        return self.parts[d].sample(j, seq_len)


def _combined(digests: list[str], weights: list[float], data_split: str | None) -> str:
    import hashlib

    h = hashlib.sha256(b"megatron-blend\0")
    for w, d in zip(weights, digests):
        h.update(f"{w!r}:{d}\0".encode())
    h.update(f"split:{data_split}".encode())
    return h.hexdigest()
