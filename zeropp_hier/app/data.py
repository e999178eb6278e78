"""Real data for the job: ``zeropp-hier data prepare`` tokenizes local text into memory-mapped token
files, and ``Loader`` serves every data-parallel rank its own samples from them.

[Note: token files]
A prepared directory holds ``train.bin`` and ``val.bin`` (nanoGPT's layout: each a flat array of
token ids, ``uint16`` when the vocabulary fits, else ``uint32``, documents concatenated) and
``index.json`` with what the loader needs: the dtype, each split's token count, the tokenizer
(``{"kind": "byte", "vocab_size": 256}``: a document's UTF-8 bytes, one token each, no download
and nothing to train), the number of documents and a SHA-256 of the token files. Every 20th
input file goes to ``val`` (``zeropp_hier.app.text.HELD_OUT_EVERY``, as the convergence
benchmark holds out its corpus), each document ends with a newline.

[Note: sample order]
A sample is ``seq_len + 1`` consecutive tokens starting at a multiple of ``seq_len`` (inputs and
next-token targets overlap by one token), so a split of n tokens has (n - 1) // seq_len samples.
Global sample position g (counted from the start of training over all ranks) is sample
``perm_e[g mod S]`` of epoch e = g // S, where ``perm_e`` is a permutation seeded by
(seed, e). Micro-batch i of rank r takes positions (i * world + r) * micro + j, j < micro:
ranks never share a position, a position is a pure function of (seed, i, r), and the data state
of a run is one number, the next position (``Loader.state``), from which a resumed run continues
at the exact sample.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from ..core.errors import HierConfigError

FORMAT = "zeropp-hier-tokens"
VERSION = 1
SPLITS = ("train", "val")


def byte_tokens(text: bytes) -> np.ndarray:
    """The byte-level tokenizer: one token per byte (vocabulary 256)."""
    return np.frombuffer(text, dtype=np.uint8).astype(np.uint16)


def _input_files(inputs: Sequence[str], pattern: str) -> list[Path]:
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files += sorted((f for f in p.rglob(pattern) if f.is_file()), key=lambda f: f.relative_to(p).as_posix())
        elif p.is_file():
            files.append(p)
        else:
            raise HierConfigError("data prepare input", item, "name an existing file or directory")
    return files


def prepare(files: Iterable[Path], out_dir: str, source: str = "") -> dict:
    """Tokenize ``files`` (byte level) into ``out_dir`` ([Note: token files]); returns the index."""
    from .text import HELD_OUT_EVERY

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = dict.fromkeys(SPLITS, 0)
    docs = dict.fromkeys(SPLITS, 0)
    text_bytes = 0  # of the training split, without the newlines that end documents
    digest = hashlib.sha256()
    tmp = {s: out / f"{s}.bin.tmp" for s in SPLITS}
    handles = {s: open(tmp[s], "wb") for s in SPLITS}
    try:
        for i, path in enumerate(files):
            split = "val" if i % HELD_OUT_EVERY == 0 else "train"
            raw = path.read_bytes()
            text_bytes += len(raw) if split == "train" else 0
            toks = byte_tokens(raw + b"\n")
            handles[split].write(toks.tobytes())
            counts[split] += int(toks.size)
            docs[split] += 1
    finally:
        for h in handles.values():
            h.close()
    if text_bytes == 0:
        for t in tmp.values():
            t.unlink()
        raise HierConfigError("data prepare input", source or "(files)", "no text found: name files or directories")
    for s in SPLITS:
        digest.update(tmp[s].read_bytes())
        os.replace(tmp[s], out / f"{s}.bin")  # whole files only: a reader never sees half of one
    index = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": "uint16",
        "tokenizer": {"kind": "byte", "vocab_size": 256},
        "tokens": counts,
        "documents": docs,
        "sha256": digest.hexdigest(),
        "source": source,
    }
    tmp_index = out / "index.json.tmp"
    tmp_index.write_text(json.dumps(index, indent=1) + "\n")
    os.replace(tmp_index, out / "index.json")  # last: a directory with an index is complete
    return index


class TokenData:
    """One split of a prepared directory, memory-mapped (nothing is read until used)."""

    def __init__(self, path: str, split: str = "train"):
        index_path = Path(path) / "index.json"
        if not index_path.is_file():
            raise HierConfigError(
                "data.path", path, "no index.json there: prepare it with `zeropp-hier data prepare --out DIR ...`"
            )
        self.index = json.loads(index_path.read_text())
        if self.index.get("format") != FORMAT or self.index.get("version") != VERSION:
            raise HierConfigError(
                "data.path", path, f"index.json is not {FORMAT} version {VERSION}: prepare it again with this version"
            )
        if split not in SPLITS:
            raise HierConfigError("data split", split, f"use one of {list(SPLITS)}")
        self.vocab_size = int(self.index["tokenizer"]["vocab_size"])
        self.count = int(self.index["tokens"][split])
        file = Path(path) / f"{split}.bin"
        dtype = np.dtype(self.index["dtype"])
        if file.stat().st_size != self.count * dtype.itemsize:
            raise HierConfigError(
                "data.path",
                str(file),
                f"holds {file.stat().st_size} bytes, index.json says {self.count} tokens: prepare again",
            )
        self.tokens = np.memmap(file, dtype=dtype, mode="r", shape=(self.count,)) if self.count else np.zeros(0, dtype)

    def samples(self, seq_len: int) -> int:
        return max(0, (self.count - 1) // seq_len)

    def sample(self, k: int, seq_len: int) -> np.ndarray:
        start = k * seq_len
        return np.asarray(self.tokens[start : start + seq_len + 1], dtype=np.int64)


class Loader:
    """This rank's micro-batches ([Note: sample order]): ``batch(i)`` is micro-batch ``i``
    (i = step * accumulation + micro), a pure function of (seed, i, rank)."""

    def __init__(self, data: TokenData, seq_len: int, micro_batch: int, rank: int, world: int, seed: int = 0):
        self.data, self.seq_len, self.micro, self.rank, self.world, self.seed = (
            data,
            seq_len,
            micro_batch,
            rank,
            world,
            seed,
        )
        self.n = data.samples(seq_len)
        if self.n < 1:
            raise HierConfigError(
                "data.path",
                f"{data.count} tokens",
                f"fewer than one sample of seq_len + 1 = {seq_len + 1} tokens: use more text or a shorter seq_len",
            )
        self._perm: tuple[int, torch.Tensor] | None = None

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = (epoch, torch.randperm(self.n, generator=g))
        return self._perm[1]

    def positions(self, i: int) -> list[int]:
        first = (i * self.world + self.rank) * self.micro
        return list(range(first, first + self.micro))

    def sample_ids(self, i: int) -> list[int]:
        return [int(self._permutation(g // self.n)[g % self.n]) for g in self.positions(i)]

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.from_numpy(np.stack([self.data.sample(k, self.seq_len) for k in self.sample_ids(i)]))
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def state(self, next_i: int) -> dict:
        """The data position before micro-batch ``next_i``: the next global sample position."""
        return {"sample": next_i * self.world * self.micro, "seed": self.seed}

    def index_of(self, state: dict) -> int:
        """The micro-batch index to continue from ``state`` (refused where this world and
        micro-batch cannot start exactly at that sample)."""
        s = int(state["sample"])
        per = self.world * self.micro
        if s % per or int(state.get("seed", self.seed)) != self.seed:
            raise HierConfigError(
                "resume data position",
                state,
                f"this run takes {per} samples per micro-batch (world {self.world} x micro_batch {self.micro}) "
                f"with seed {self.seed}: resume with the world, micro_batch and seed of the saved run",
            )
        return s // per


# -- zeropp-hier data ------------------------------------------------------------------------


def main(argv: list[str] | None = None, prog: str = "zeropp-hier data") -> int:
    ap = argparse.ArgumentParser(prog=prog, description="Prepare token files for the job (byte-level tokenizer).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="tokenize local text into DIR/{train,val}.bin + DIR/index.json")
    p.add_argument("inputs", nargs="*", help="text files or directories (read recursively, see --glob)")
    p.add_argument("--stdlib", action="store_true", help="the Python standard library's own sources (no download)")
    p.add_argument("--glob", default="*.txt", help="file pattern inside directories (default *.txt)")
    p.add_argument("--out", required=True, help="output directory")
    a = ap.parse_args(argv)
    if a.stdlib == bool(a.inputs):
        ap.error("name input files/directories or --stdlib (one of them)")
    if a.stdlib:
        from .text import stdlib_files

        files, source = stdlib_files(), "python standard library"
    else:
        files, source = _input_files(a.inputs, a.glob), " ".join(a.inputs)
    index = prepare(files, a.out, source)
    print(
        f"{a.out}: {index['tokens']['train']} train + {index['tokens']['val']} val tokens from "
        f"{sum(index['documents'].values())} documents (byte-level, vocab 256)"
    )
    return 0
