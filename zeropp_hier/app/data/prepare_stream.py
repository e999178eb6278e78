"""``zeropp-hier data prepare`` for the user's corpus: JSON lines or text, with an existing Hugging
Face ``tokenizer.json`` (or byte level), on several processes, in bounded memory.

[Note: streaming prepare]
The output is the prepared directory the job already reads ([Note: token files] in tokens.py):
``train.bin``, ``val.bin``, ``index.json``, and ``tokenizer.json`` (a copy of the one given).
Documents (one per JSON line, one per ``.txt`` file: documents.py) are numbered across the
inputs in order; every 20th (``HELD_OUT_EVERY``, number 0, 20, 40, ...) goes to ``val``, as
today's files do. A document's tokens are the tokenizer's ids of its text
(``add_special_tokens=False``) followed by the end-of-sequence id, so documents are separated
by EOS in the stream as in GPT-NeoX's ``preprocess_data.py --append-eod``. The EOS token is
``--eos``, else ``eos_token`` of a ``tokenizer_config.json`` beside the file, else the first of
``<|endoftext|>`` (GPT-NeoX-20B's, id 0), ``</s>``, ``<|end_of_text|>``, ``<eos>`` in the
vocabulary. The byte-level tokenizer ends a document with a newline instead, exactly as
today's ``prepare``: a ``.txt`` corpus gives the same files either way.

Work: the main process reads the inputs (hashing each as it reads it: ``index.json`` lists
every input's size and SHA-256) and cuts them into tasks of about ``TASK_BYTES`` of text;
``workers`` processes (``spawn``: a forked Rust tokenizer may deadlock) tokenize them; results
are written in task order, so the files do not depend on the number of workers. At most
``2 x workers`` tasks are in flight, so memory does not grow with the corpus: each process
holds its tokenizer, one task's text and its ids (measured in tests/system/test_prepare_memory.py).
The token files are hashed after writing, reading them in blocks.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ...core.errors import HierConfigError
from .documents import Piece, Reader, single_text
from .token_format import FORMAT, HELD_OUT_EVERY, SPLITS, TOKENIZER_FILE, VERSION, hash_file

TASK_BYTES = 1 << 20  # text per task: large enough to amortise a task's round trip
TASK_PIECES = 4096
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


# -- tokenizers (the worker side) ------------------------------------------------------------------

_TOK = None  # this process's tokenizer: None for byte level, else (tokenizers.Tokenizer, eos id)


def _init_worker(tokenizer_file: str | None, eos_id: int | None, single_threaded: bool) -> None:
    global _TOK
    if single_threaded:  # one Rust thread per worker: the processes are the parallelism
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if tokenizer_file is None:
        _TOK = None
        return
    from tokenizers import Tokenizer

    _TOK = (Tokenizer.from_file(tokenizer_file), eos_id)


def _encode(task: list[tuple[bytes, bool, int]], dtype: str, vocab: int) -> dict[int, tuple[bytes, int]]:
    """Token bytes of a task's pieces, per split (0 train, 1 val), in order, and how many
    documents each split ended."""
    parts: dict[int, list[np.ndarray]] = {0: [], 1: []}
    ended = {0: 0, 1: 0}
    if _TOK is None:
        for data, last, split in task:
            parts[split].append(np.frombuffer(data + (b"\n" if last else b""), dtype=np.uint8).astype(dtype))
            ended[split] += last
    else:
        tok, eos = _TOK
        texts = [data.decode("utf-8", errors="replace") for data, _, _ in task]
        for (_, last, split), enc in zip(task, tok.encode_batch(texts, add_special_tokens=False)):
            ids = np.asarray(enc.ids + [eos] if last else enc.ids, dtype=np.int64)
            if ids.size and int(ids.max()) >= vocab:  # never silently wrapped into the token dtype
                raise HierConfigError(
                    "--tokenizer", "tokenizer.json", f"it gave id {int(ids.max())}, above its vocabulary {vocab}"
                )
            parts[split].append(ids.astype(dtype))
            ended[split] += last
    return {s: (np.concatenate(p).tobytes() if p else b"", ended[s]) for s, p in parts.items()}


# -- the tokenizer file ----------------------------------------------------------------------------


def eos_of(tokenizer_file: str, eos: str | None = None) -> tuple[str, int]:
    """(token, id) that ends each document ([Note: streaming prepare])."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    candidates: list[str] = [eos] if eos else []
    where = "--eos"
    if not eos:
        config = Path(tokenizer_file).with_name("tokenizer_config.json")
        if config.is_file():
            named = json.loads(config.read_text()).get("eos_token")
            named = named.get("content") if isinstance(named, dict) else named
            if isinstance(named, str):
                candidates.append(named)
        candidates += EOS_NAMES
    for name in candidates:
        tid = tok.token_to_id(name)
        if tid is not None:
            return name, int(tid)
        if eos:
            break
    raise HierConfigError(
        where,
        eos,
        f"{tokenizer_file} has no {'such token' if eos else 'end-of-sequence token among ' + str(list(EOS_NAMES))}: "
        "name the token that separates documents with --eos TOKEN",
    )


def load_tokenizer_file(path: str):
    if not os.path.isfile(path):
        raise HierConfigError(
            "--tokenizer", path, "no such file: give byte, bpe, or the path of a Hugging Face tokenizer.json"
        )
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the library raises a plain Exception for a malformed file
        raise HierConfigError(
            "--tokenizer", path, f"not a tokenizer.json the tokenizers library reads ({e})"
        ) from None


# -- the main side ---------------------------------------------------------------------------------


def _tasks(readers: list[Reader], held_out_every: int) -> Iterator[list[tuple[bytes, bool, int]]]:
    doc, task, size = 0, [], 0
    # one .txt file alone is two documents, train then val ([Note: single text file] in documents.py)
    cut = len(readers) == 1 and readers[0].split_at is not None
    for reader in readers:
        piece: Piece
        for piece in reader:
            held_out = doc == 1 if cut else doc % held_out_every == 0
            task.append((piece.data, piece.last, 1 if held_out else 0))
            size += len(piece.data)
            doc += piece.last
            if size >= TASK_BYTES or len(task) >= TASK_PIECES:
                yield task
                task, size = [], 0
    if task:
        yield task


def prepare(
    files: Iterable[Path],
    out_dir: str,
    source: str = "",
    tokenizer: str = "byte",
    workers: int = 1,
    text_field: str = "text",
    eos: str | None = None,
) -> dict:
    """Tokenize ``files`` (.txt, .jsonl plain or compressed, parquet, Arrow: documents.py) into
    ``out_dir`` with ``tokenizer`` ("byte" or the path of a ``tokenizer.json``) on ``workers``
    processes ([Note: streaming prepare]); returns the index."""
    if not isinstance(workers, int) or not 1 <= workers <= 1024:
        raise HierConfigError("--workers", workers, "give a number of processes from 1 to 1024")
    files = list(files)
    cut = single_text(files)
    readers = [Reader(f, text_field, cut) for f in files]  # refuses unreadable kinds before any work
    out = Path(out_dir)
    info: dict
    if tokenizer == "byte":
        if eos is not None:
            raise HierConfigError(
                "--eos", eos, "the byte tokenizer ends each document with a newline: --eos goes with a tokenizer.json"
            )
        tok_file, eos_id, vocab = None, None, 256
        info = {"kind": "byte", "vocab_size": 256}
    else:
        tok = load_tokenizer_file(tokenizer)
        eos_name, eos_id = eos_of(tokenizer, eos)
        tok_file, vocab = tokenizer, int(tok.get_vocab_size(with_added_tokens=True))
        info = {
            "kind": "file",
            "vocab_size": vocab,
            "file": TOKENIZER_FILE,
            "sha256": None,
            "library": "tokenizers",
            "eos": {"token": eos_name, "id": eos_id},
            "source": os.path.abspath(tokenizer),
        }
    dtype = "uint16" if vocab <= 2**16 else "uint32"
    out.mkdir(parents=True, exist_ok=True)
    tmp = {s: out / f"{s}.bin.tmp" for s in SPLITS}
    handles = {s: open(tmp[s], "wb") for s in SPLITS}
    counts = dict.fromkeys(SPLITS, 0)
    docs = dict.fromkeys(SPLITS, 0)
    itemsize = np.dtype(dtype).itemsize

    def write(result: dict[int, tuple[bytes, int]]) -> None:
        for s, name in ((0, "train"), (1, "val")):
            data, ended = result[s]
            handles[name].write(data)
            counts[name] += len(data) // itemsize
            docs[name] += ended

    pool = None
    done = False
    try:
        tasks = _tasks(readers, HELD_OUT_EVERY)
        if workers == 1:
            _init_worker(tok_file, eos_id, single_threaded=False)
            for task in tasks:
                write(_encode(task, dtype, vocab))
        else:
            import multiprocessing

            pool = multiprocessing.get_context("spawn").Pool(workers, _init_worker, (tok_file, eos_id, True))
            pending: collections.deque = collections.deque()
            for task in tasks:
                pending.append(pool.apply_async(_encode, (task, dtype, vocab)))
                if len(pending) >= 2 * workers:  # bounded: the reader waits for the oldest task
                    write(pending.popleft().get())
            while pending:
                write(pending.popleft().get())
        done = True
    finally:
        for h in handles.values():
            h.close()
        if pool is not None:
            pool.terminate()
            pool.join()
        if not done:  # a refused input or a failed worker leaves no half-written files
            for t in tmp.values():
                t.unlink(missing_ok=True)
    if counts["train"] == 0:
        for t in tmp.values():
            t.unlink()
        raise HierConfigError("data prepare input", source or "(files)", "no text found: name files or directories")
    digest = hashlib.sha256()
    if tok_file is not None:
        tmp_tok = out / (TOKENIZER_FILE + ".tmp")
        shutil.copyfile(tok_file, tmp_tok)
        tok_digest = hashlib.sha256()
        hash_file(tok_digest, tmp_tok)
        hash_file(digest, tmp_tok)  # the token ids mean nothing without it
        info["sha256"] = tok_digest.hexdigest()
        os.replace(tmp_tok, out / TOKENIZER_FILE)
    for s in SPLITS:
        hash_file(digest, tmp[s])
        os.replace(tmp[s], out / f"{s}.bin")  # whole files only: a reader never sees half of one
    index = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": dtype,
        "tokenizer": info,
        "tokens": counts,
        "documents": docs,
        "sha256": digest.hexdigest(),
        "source": source,
        "inputs": [{"path": str(r.path), "bytes": r.bytes, "sha256": r.sha256} for r in readers],
    }
    tmp_index = out / "index.json.tmp"
    tmp_index.write_text(json.dumps(index, indent=1) + "\n")
    os.replace(tmp_index, out / "index.json")  # last: a directory with an index is complete
    return index
