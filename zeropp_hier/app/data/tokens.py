"""Real data for the job: ``zeropp-hier data prepare`` tokenizes local text into memory-mapped token
files, and ``Loader`` serves every data-parallel rank its own samples from them.

[Note: token files]
A prepared directory holds ``train.bin`` and ``val.bin`` (nanoGPT's layout: each a flat array of
token ids, ``uint16`` when the vocabulary fits, else ``uint32``, documents concatenated) and
``index.json`` with what the loader needs: the dtype, each split's token count, the tokenizer
(``{"kind": "byte", "vocab_size": 256}``: a document's bytes, one token each, no download and
nothing to train; ``{"kind": "bpe", "vocab_size": V, "file": "tokenizer.json", ...}``; or
``{"kind": "file", ..., "eos": {...}}`` for a given Hugging Face ``tokenizer.json``, [Note:
streaming prepare] in prepare_stream.py, which also lists each input's SHA-256), the
number of documents and a SHA-256 of the token files (and of ``tokenizer.json``). Every 20th
input file goes to ``val`` (``HELD_OUT_EVERY``, as the convergence
benchmark holds out its corpus), each document ends with a newline. The job takes the model's
vocabulary from ``vocab_size`` (``ModelSpec.vocab_size`` null) or refuses a model whose
vocabulary is smaller.

[Note: BPE tokenizer]
``--tokenizer bpe --vocab-size N`` trains a byte-level BPE tokenizer with Hugging Face's
``tokenizers`` library (installed with ``transformers``; nothing is downloaded) on the training
split only, in input order: the byte alphabet (256 tokens, so any text encodes and nothing is
unknown) plus merges seen at least twice, up to N tokens in all (fewer when the text has no
more such pairs: ``vocab_size`` records what was trained, ``requested_vocab_size`` what was
asked). No special tokens: documents are separated by the newline each ends with, as in the
byte-level files. BPE works on text, so input bytes that are not UTF-8 become U+FFFD; decoding
the ids of a document gives its text back. ``tokenizer.json`` is saved beside the token files,
a JSON file that ``Tokenizer.from_file`` reads back without running any code.

[Note: sample order]
A sample is ``seq_len + 1`` consecutive tokens starting at a multiple of ``seq_len`` (inputs and
next-token targets overlap by one token), so a split of n tokens has (n - 1) // seq_len samples.
Global sample position g (counted from the start of training over all ranks) is sample
``perm_e[g mod S]`` of epoch e = g // S, where ``perm_e`` is a permutation seeded by
(seed, e). Micro-batch i of rank r takes positions (i * world + r) * micro + j, j < micro:
ranks never share a position, a position is a pure function of (seed, i, r), and the data state
of a run is one number, the next position (``Loader.state``). A resumed run continues at that
exact position whatever its world and micro-batch (``Loader.resume_at``): its micro-batch i takes
positions s + ((i - i0) * world + r) * micro + j, s the saved position and i0 its first
micro-batch, so the positions seen before and after the resume are 0, 1, 2, ... without a gap or
a repeat. The job does not draw ``perm_e`` on every rank: rank 0 writes it once to a cache file
that every rank memory-maps ([Note: data order caches] in order_cache.py), the same numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Protocol, Sequence

import numpy as np
import torch

from ...core.errors import HierConfigError
from .token_format import FORMAT, HELD_OUT_EVERY, SPLITS, TOKENIZER_FILE, VERSION, hash_file

if TYPE_CHECKING:
    from .blend import BlendedTokens
    from .indexed import IndexedTokens

# the standard library's sources without its test suites and installed packages
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def byte_tokens(text: bytes) -> np.ndarray:
    """The byte-level tokenizer: one token per byte (vocabulary 256)."""
    return np.frombuffer(text, dtype=np.uint8).astype(np.uint16)


def _input_files(inputs: Sequence[str], pattern: str | None) -> list[Path]:
    """The files named, a directory's read recursively: those matching ``pattern``, else
    ``DEFAULT_GLOBS`` (text, JSON lines plain or compressed, parquet, Arrow); what a directory
    holds besides is named on stderr, never skipped silently."""
    from .documents import DEFAULT_GLOBS

    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            globs = [pattern] if pattern else list(DEFAULT_GLOBS)
            chosen = {f for pat in globs for f in p.rglob(pat) if f.is_file()}
            files += sorted(chosen, key=lambda f: f.relative_to(p).as_posix())
            skipped = sorted(f.relative_to(p).as_posix() for f in p.rglob("*") if f.is_file() and f not in chosen)
            if skipped:
                shown = ", ".join(skipped[:10]) + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
                print(
                    f"data prepare: {item}: skipped {len(skipped)} file(s) not matching {globs}: {shown} "
                    "(--glob PATTERN reads others)",
                    file=sys.stderr,
                )
        elif p.is_file():
            files.append(p)
        else:
            raise HierConfigError("data prepare input", item, "name an existing file or directory")
    return files


TOKENIZERS = ("byte", "bpe")
BYTE_VOCAB = 256


def train_bpe(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``texts`` with the ``tokenizers`` library, locally
    ([Note: BPE tokenizer]). Deterministic: the same texts in the same order give the same
    tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: no unknown token
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _text(raw: bytes) -> str:
    # BPE works on text: bytes that are not UTF-8 become U+FFFD (the byte tokenizer keeps them)
    return raw.decode("utf-8", errors="replace")


def prepare(
    files: Iterable[Path], out_dir: str, source: str = "", tokenizer: str = "byte", vocab_size: int | None = None
) -> dict:
    """Tokenize ``files`` into ``out_dir`` ([Note: token files]) with the byte-level tokenizer
    or a BPE tokenizer of ``vocab_size`` trained on the training split ([Note: BPE
    tokenizer]); returns the index."""

    if tokenizer not in TOKENIZERS:
        raise HierConfigError("--tokenizer", tokenizer, f"use one of {list(TOKENIZERS)}")
    if tokenizer == "bpe":
        if not isinstance(vocab_size, int) or not BYTE_VOCAB <= vocab_size <= 2**32 - 1:
            raise HierConfigError(
                "--vocab-size",
                vocab_size,
                f"give the BPE vocabulary size: at least {BYTE_VOCAB} (its byte alphabet), e.g. 4096",
            )
    elif vocab_size not in (None, BYTE_VOCAB):
        raise HierConfigError("--vocab-size", vocab_size, "the byte tokenizer has 256 tokens: add --tokenizer bpe")
    files = list(files)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from .documents import single_text

    cut = single_text(files)  # one .txt file alone: cut in a train and a val document
    split_of = ["val" if i % HELD_OUT_EVERY == 0 else "train" for i in range(len(files))]
    if cut is not None:
        split_of = ["train", "val"]

    def documents() -> Iterable[tuple[bytes, str]]:
        if cut is None:
            return ((f.read_bytes(), sp) for f, sp in zip(files, split_of))
        raw = files[0].read_bytes()
        return iter([(raw[:cut], "train"), (raw[cut:], "val")])

    tok = None
    if tokenizer == "bpe":  # trained on the training split only: the held-out text stays unseen
        train_docs = (_text(raw) + "\n" for raw, sp in documents() if sp == "train")
        tok = train_bpe(train_docs, vocab_size)  # type: ignore[arg-type]
    vocab = BYTE_VOCAB if tok is None else tok.get_vocab_size()
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    counts = dict.fromkeys(SPLITS, 0)
    docs = dict.fromkeys(SPLITS, 0)
    text_bytes = 0  # of the training split, without the newlines that end documents
    digest = hashlib.sha256()
    tmp = {s: out / f"{s}.bin.tmp" for s in SPLITS}
    handles = {s: open(tmp[s], "wb") for s in SPLITS}
    try:
        for raw, split in documents():
            text_bytes += len(raw) if split == "train" else 0
            if tok is None:
                toks = byte_tokens(raw + b"\n")
            else:
                toks = np.asarray(tok.encode(_text(raw) + "\n").ids, dtype=dtype)
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
    info: dict = {"kind": "byte", "vocab_size": BYTE_VOCAB}
    if tok is not None:
        tmp_tok = out / (TOKENIZER_FILE + ".tmp")
        tok.save(str(tmp_tok))
        hash_file(digest, tmp_tok)  # the token ids mean nothing without it
        info = {
            "kind": "bpe",
            "vocab_size": vocab,
            "requested_vocab_size": vocab_size,
            "file": TOKENIZER_FILE,
            "sha256": hashlib.sha256(tmp_tok.read_bytes()).hexdigest(),
            "library": "tokenizers",
        }
        os.replace(tmp_tok, out / TOKENIZER_FILE)
    for s in SPLITS:
        hash_file(digest, tmp[s])  # in blocks: a token file may be larger than memory
        os.replace(tmp[s], out / f"{s}.bin")  # whole files only: a reader never sees half of one
    index = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": np.dtype(dtype).name,
        "tokenizer": info,
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
                "data.path",
                path,
                "no index.json there (and no PREFIX.bin + PREFIX.idx pair): prepare it with "
                "`zeropp-hier data prepare --out DIR ...`, or name a Megatron pair's prefix",
            )
        self.path, self.split = str(path), split
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


def open_tokens(path: str, split: str = "train", data_split: str | None = None, seed: int = 0):
    """The token source at ``path``: a prepared directory (``TokenData``), a Megatron / GPT-NeoX
    ``PREFIX.bin`` + ``PREFIX.idx`` pair, read in place ([Note: indexed dataset format] in
    indexed.py), or a blend of pairs, ``W1 PREFIX1 W2 PREFIX2 ...``; ``data_split``: Megatron's
    ``--split`` of the pairs ([Note: blends and splits] in blend.py)."""
    from .blend import BlendedTokens, is_blend
    from .indexed import IndexedTokens, prefix_of

    if is_blend(path):
        return BlendedTokens(path, split, data_split, seed)
    if not Path(path).is_dir() and prefix_of(path) is not None:
        return IndexedTokens(path, split, data_split)
    if data_split is not None:
        raise HierConfigError(
            "data.split",
            data_split,
            f"{path} is a prepared directory, already split (every {HELD_OUT_EVERY}th document is val): "
            "set data.split=null, or name Megatron pairs",
        )
    return TokenData(path, split)


class Loader:
    """This rank's micro-batches ([Note: sample order]): ``batch(i)`` is micro-batch ``i``
    (i = step * accumulation + micro), a pure function of (seed, i, rank)."""

    def __init__(
        self,
        data: TokenData | IndexedTokens | BlendedTokens,
        seq_len: int,
        micro_batch: int,
        rank: int,
        world: int,
        seed: int = 0,
    ):
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
        # epochs' shuffles from the cache ([Note: data order caches] in order_cache.py; orders.py)
        self.cached: dict[int, np.ndarray] = {}
        self.start_seconds = 0.0  # this rank's time to check or build (rank 0) and open them
        # micro-batch base_index starts at global position base_sample (0, 0 for a fresh run;
        # resume_at moves them)
        self.base_sample, self.base_index = 0, 0

    def epoch_seed(self, epoch: int) -> int:
        """The generator seed of epoch ``epoch``'s shuffle."""
        return self.seed * 1_000_003 + epoch

    def _permutation(self, epoch: int) -> torch.Tensor | np.ndarray:
        if epoch in self.cached:  # memory-mapped: only the pages read are loaded
            return self.cached[epoch]
        if self._perm is None or self._perm[0] != epoch:  # no cache: built here, as a loader alone does
            g = torch.Generator().manual_seed(self.epoch_seed(epoch))
            self._perm = (epoch, torch.randperm(self.n, generator=g))
        return self._perm[1]

    def positions(self, i: int) -> list[int]:
        first = self.base_sample + ((i - self.base_index) * self.world + self.rank) * self.micro
        return list(range(first, first + self.micro))

    def sample_ids(self, i: int) -> list[int]:
        if getattr(self.data, "shuffles_itself", False):  # a blend orders its own samples
            return self.positions(i)
        return [int(self._permutation(g // self.n)[g % self.n]) for g in self.positions(i)]

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.from_numpy(np.stack([self.data.sample(k, self.seq_len) for k in self.sample_ids(i)]))
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def state(self, next_i: int) -> dict:
        """The data position before micro-batch ``next_i``: the next global sample position."""
        return {"sample": self.base_sample + (next_i - self.base_index) * self.world * self.micro, "seed": self.seed}

    def resume_at(self, state: dict, i: int) -> None:
        """Continue from ``state`` (another run's ``state``, of any world and micro-batch):
        micro-batch ``i`` starts at its global sample position (refused for another seed,
        whose order differs)."""
        if int(state.get("seed", self.seed)) != self.seed:
            raise HierConfigError(
                "seed",
                self.seed,
                f"the saved data position {state} is in the order of seed {state.get('seed')}: resume with that seed",
            )
        self.base_sample, self.base_index = int(state["sample"]), i


# -- zeropp-hier data ------------------------------------------------------------------------


def main(argv: list[str] | None = None, prog: str = "zeropp-hier data") -> int:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Prepare token files for the job from text, JSON-lines (also .jsonl.zst / .jsonl.gz), parquet "
        "or Arrow files: byte level, a BPE tokenizer trained here, or an existing Hugging Face tokenizer.json.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="tokenize local text or JSON lines into DIR/{train,val}.bin + DIR/index.json")
    p.add_argument("inputs", nargs="*", help="text files or directories (read recursively, see --glob)")
    p.add_argument("--stdlib", action="store_true", help="the Python standard library's own sources (no download)")
    p.add_argument(
        "--glob",
        default=None,
        help="file pattern inside directories (default: .txt, .jsonl[.zst|.gz], .parquet, .arrow)",
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--tokenizer",
        default="byte",
        help="byte (one token per byte, vocab 256; default), bpe (trained here on the training split), "
        "or PATH/tokenizer.json (an existing Hugging Face tokenizer, e.g. GPT-NeoX-20B's)",
    )
    p.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary size (with --tokenizer bpe)")
    p.add_argument("--text-field", default="text", help="the field of a JSON line that holds its text (default text)")
    p.add_argument("--eos", default=None, help="the token that ends each document (default: the tokenizer's)")
    p.add_argument("--workers", type=int, default=1, help="tokenizing processes (default 1)")
    a = ap.parse_args(argv)
    if a.stdlib == bool(a.inputs):
        ap.error("name input files/directories or --stdlib (one of them)")
    from .documents import kind_of

    if a.stdlib:
        files, source = stdlib_files(), "python standard library"
    else:
        files, source = _input_files(a.inputs, a.glob), " ".join(a.inputs)
    if a.tokenizer == "bpe" and a.vocab_size is None:
        ap.error("--tokenizer bpe needs --vocab-size N (e.g. 4096)")
    # today's path: byte level or a BPE trained here, on .txt files, in this process; anything
    # else (a tokenizer.json, JSON lines, several processes) streams ([Note: streaming prepare])
    if a.tokenizer == "bpe" or (a.tokenizer == "byte" and a.workers == 1 and all(kind_of(f) == "txt" for f in files)):
        for flag, value, default in (("--eos", a.eos, None), ("--text-field", a.text_field, "text")):
            if value != default:
                ap.error(
                    f"{flag} applies to JSON lines or a tokenizer.json, not --tokenizer {a.tokenizer} on .txt files"
                )
        index = prepare(files, a.out, source, a.tokenizer, a.vocab_size)
    else:
        from . import prepare_stream

        if a.vocab_size is not None:
            ap.error("--vocab-size applies to --tokenizer bpe only (a tokenizer.json has its own vocabulary)")
        index = prepare_stream.prepare(files, a.out, source, a.tokenizer, a.workers, a.text_field, a.eos)
    t = index["tokenizer"]
    kind = {"byte": "byte-level", "bpe": f"BPE, {t.get('file')}"}.get(
        t["kind"], f"{t.get('source')}, EOS {t.get('eos')}"
    )
    print(
        f"{a.out}: {index['tokens']['train']} train + {index['tokens']['val']} val tokens from "
        f"{sum(index['documents'].values())} documents ({kind}, vocab {t['vocab_size']})"
    )
    return 0


# -- offline text and synthetic batches ------------------------------------------------------------


def stdlib_files(root: str | None = None) -> list[Path]:
    """Real text that needs no download: the Python standard library's own ``.py`` sources (every
    installation ships them), in sorted path order, the test suites and ``site-packages`` left
    out, so the corpus is the same for a given Python version."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    files = [p for p in base.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(base).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(base).as_posix())


class SequenceShape(Protocol):
    """What a synthetic batch needs of a model's config (``GPTConfig`` and ``ModelSpec`` as the
    job's models carry it)."""

    vocab_size: int
    seq_len: int


def synthetic_batch(c: SequenceShape, batch: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token batch for (step, rank): a noisy periodic sequence the model can learn."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    start = torch.randint(0, c.vocab_size, (batch, 1), generator=g)
    stride = torch.randint(1, 7, (batch, 1), generator=g)
    pos = torch.arange(c.seq_len + 1).view(1, -1)
    seq = (start + stride * pos) % c.vocab_size
    noise = torch.rand(seq.shape, generator=g) < 0.05
    seq = torch.where(noise, torch.randint(0, c.vocab_size, seq.shape, generator=g), seq)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
