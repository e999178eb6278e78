"""A checkpoint's manifest in pieces: each rank records its own files, rank 0 only their sums
([Note: a manifest in pieces]). Pure but for reading and writing one piece; no torch.distributed.

[Note: a manifest in pieces]
A manifest that lists every file of a tag (two per rank under ZeRO-3) makes rank 0 receive,
merge and write about 2 x world entries at each save, and read them and deal them out again at
each load: at 75,264 ranks, 150,000 entries and a scatter of 75,264 payloads on one rank. So a
save of ``zeropp_hier-checkpoint/2`` writes its manifest in pieces:

* every rank but rank 0 writes ``zeropp_hier_manifest.d/rank_<r>.json`` in the temporary tag
  directory: its own files' sizes and sha256 (the ones it hashed), its rank, the format;
* each rank's piece is summed as ``[pieces, files, bytes, digest_hi, digest_lo]`` (the digest is
  60 bits of the sha256 of the piece's bytes, in two 30-bit halves so that 75,264 of them sum in
  an int64), and one all-reduce (SUM) hands rank 0 the totals, one MAX the largest rank's bytes;
* rank 0's top manifest lists its own files (and any file no rank hashed) as before, and under
  ``ranks`` the totals: the count of pieces, of their files and bytes, the largest rank's bytes,
  and the digest sum.

A load deals the pieces (rank ``r`` reads the pieces ``p`` with ``p % world == r``: its own when
the world is the saved one), each rank checks its piece's files in its own view of the directory
(size, sha256, pickled types: [Note: checks in shares]) and sums the pieces it read; one
all-reduce gives every rank the totals, which must equal the ones rank 0 broadcast from the top
manifest: a piece missing, unreadable or naming another rank is named by the rank that reads it,
a piece altered after the save (its files then changed to match) by the digest sum, and a file
in the tag that no piece lists by the file count against rank 0's one walk of the tag (only then,
a failure, does rank 0 read every piece to name the file). No rank receives, merges or sends more
than its own piece and a few numbers, whatever the world. A manifest of format ``/1`` (every file
in one list: older saves and the universal conversions) is checked as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from .names import name_problem

PIECES_DIR = "zeropp_hier_manifest.d"
PIECE_FORMAT = "zeropp_hier-checkpoint-piece/1"
_PIECE_NAME = re.compile(r"rank_(0|[1-9][0-9]*)\.json")
_HALF = 30
SUM_FIELDS = ("pieces", "files", "bytes", "digest_hi", "digest_lo")
ZERO = [0] * len(SUM_FIELDS)


def piece_rel(rank: int) -> str:
    """The piece of ``rank``, relative to the tag directory."""
    return f"{PIECES_DIR}/rank_{rank}.json"


def piece_rank(rel: str) -> int | None:
    """The rank whose piece ``rel`` (relative to the tag directory) is; None if it is no piece's name."""
    head, _, name = rel.partition("/")
    m = _PIECE_NAME.fullmatch(name) if head == PIECES_DIR and "/" not in name else None
    return int(m.group(1)) if m else None


def piece_bytes(rank: int, files: dict) -> bytes:
    """The piece of ``rank`` recording ``files`` ({name: {"bytes", "sha256"}}), as written."""
    return json.dumps({"format": PIECE_FORMAT, "rank": rank, "files": files}, sort_keys=True).encode()


def piece_sums(data: bytes, files: dict) -> list[int]:
    """What one piece adds to the totals (SUM_FIELDS)."""
    d = int(hashlib.sha256(data).hexdigest()[:15], 16)  # 60 bits
    mask = (1 << _HALF) - 1
    return [1, len(files), sum(int(e["bytes"]) for e in files.values()), d >> _HALF, d & mask]


def name_sums(names) -> list[int]:
    """[hi, lo]: the sums of the halves of each name's 60-bit digest (the walk of the tag against
    the pieces' names: equal multisets give equal sums)."""
    mask = (1 << _HALF) - 1
    hi = lo = 0
    for n in names:
        d = int(hashlib.sha256(n.encode()).hexdigest()[:15], 16)
        hi, lo = hi + (d >> _HALF), lo + (d & mask)
    return [hi, lo]


def add(a: list[int], b: list[int]) -> list[int]:
    return [x + y for x, y in zip(a, b)]


def parse_piece(data: bytes, rank: int) -> dict:
    """The files a piece of ``rank`` records; ``ValueError`` naming what is wrong with it."""
    try:
        p = json.loads(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError and JSON errors
        raise ValueError(f"not a JSON piece ({e})") from None
    if not isinstance(p, dict) or p.get("format") != PIECE_FORMAT:
        raise ValueError(f"format {p.get('format') if isinstance(p, dict) else None!r}, not {PIECE_FORMAT!r}")
    if p.get("rank") != rank:
        raise ValueError(f"it records rank {p.get('rank')!r}, but its name is rank {rank}'s")
    files = p.get("files")
    if not isinstance(files, dict):
        raise ValueError("'files' is not a mapping")
    for rel, entry in files.items():
        why = name_problem(rel)
        if why is not None or rel.split("/")[0] == PIECES_DIR:
            raise ValueError(f"entry {rel!r} is not a plain relative name: it has {why or 'the pieces directory'}")
        ok = isinstance(entry, dict) and isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str)
        if not ok:
            raise ValueError(f"bad entry for {rel!r}")
    return files


def read_piece(tag_dir: str, rank: int) -> tuple[bytes, dict]:
    """(bytes, files) of the piece of ``rank``; ``OSError`` or ``ValueError``."""
    with open(os.path.join(tag_dir, piece_rel(rank)), "rb") as f:
        data = f.read()
    return data, parse_piece(data, rank)


def write_piece(tmp_dir: str, rank: int, files: dict) -> bytes:
    """Write (and fsync) the piece of ``rank`` into ``tmp_dir``; its bytes. Rank 0 made the directory."""
    data = piece_bytes(rank, files)
    with open(os.path.join(tmp_dir, piece_rel(rank)), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return data


def my_pieces(count_below: int, rank: int, world: int) -> range:
    """The pieces rank ``rank`` of ``world`` reads at a load: ``p % world == rank``, among ranks
    1..count_below-1 (rank 0 has no piece: its files are in the top manifest). Pure; at most
    ceil(count_below / world) pieces."""
    first = rank if rank >= 1 else world
    return range(first, count_below, world)


def totals_record(sums: list[int], largest: int) -> dict:
    """The top manifest's ``ranks`` section from the all-reduced sums and the largest rank's bytes."""
    return {**dict(zip(SUM_FIELDS, (int(x) for x in sums))), "largest_bytes": int(largest)}


def check_record(ranks: Any) -> str | None:
    """Why the top manifest's ``ranks`` section is malformed (None if it is well formed)."""
    if not isinstance(ranks, dict):
        return "'ranks' is not a mapping"
    for k in (*SUM_FIELDS, "largest_bytes"):
        if not isinstance(ranks.get(k), int) or ranks[k] < 0:
            return f"'ranks.{k}' is {ranks.get(k)!r}, not a count"
    return None


def sums_problem(found: list[int], ranks: dict) -> str | None:
    """Why the pieces' all-reduced sums ``found`` disagree with the top manifest's ``ranks`` (None
    if they agree): pieces missing or extra first, then files, then the digest."""
    want = [ranks[k] for k in SUM_FIELDS]
    if found[0] != want[0]:
        return f"{found[0]} pieces were read, but the save recorded {want[0]} ('ranks.pieces'): pieces are missing"
    if found[1:3] != want[1:3]:
        return (
            f"the pieces list {found[1]} files of {found[2]} bytes, but the save recorded {want[1]} of "
            f"{want[2]} ('ranks.files', 'ranks.bytes'): a piece was changed after the save"
        )
    if found[3:] != want[3:]:
        return "the pieces' digest differs from the one recorded at save ('ranks.digest_*'): a piece was changed"
    return None
