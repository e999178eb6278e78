"""What a checkpoint's file I/O cost, as lines for the job's log: each save's bytes per rank,
seconds and rate, and a universal conversion's bytes and seconds. Pure: sizes and seconds in,
text out (the job measures them, app/run.py and app/longrun/resume.py)."""

from __future__ import annotations

import re
from typing import Mapping

GB = 1e9
# DeepSpeed's ZeRO-3 files name the data-parallel rank that wrote them
_RANK_FILE = re.compile(r"(?:^|/)(?:bf16_)?zero_pp_rank_(\d+)_")


def bytes_by_rank(sizes: Mapping[str, int]) -> dict[int, int]:
    """Bytes each rank wrote, from a tag's file sizes (relative path -> bytes). A file that names
    no rank (DeepSpeed's recovery script, the model states of a non-ZeRO-3 save) is rank 0's."""
    out: dict[int, int] = {}
    for rel, size in sizes.items():
        m = _RANK_FILE.search(rel)
        rank = int(m.group(1)) if m else 0
        out[rank] = out.get(rank, 0) + int(size)
    return out


def rate_gbps(nbytes: float, seconds: float) -> float:
    """GB/s (10^9 bytes); 0 for a duration of 0 (nothing measurable)."""
    return nbytes / GB / seconds if seconds > 0 else 0.0


def save_line(tag: str, where: str, sizes: Mapping[str, int], seconds: float) -> str:
    """One save's cost: the largest rank's bytes (the one the save waits for), the total over
    the ranks, the seconds, and the rate in all and per rank."""
    per_rank = bytes_by_rank(sizes)
    return totals_line(tag, where, max(per_rank.values(), default=0), sum(per_rank.values()), len(per_rank), seconds)


def totals_line(tag: str, where: str, top: int, total: int, ranks: int, seconds: float) -> str:
    """``save_line`` from the totals (the largest rank's bytes, the bytes in all, the ranks)."""
    return (
        f"checkpoint {tag} saved in {where}: {top / GB:.3g} GB per rank (the largest of {ranks}), "
        f"{total / GB:.3g} GB in all, in {seconds:.2f} s: {rate_gbps(total, seconds):.3g} GB/s in all, "
        f"{rate_gbps(top, seconds):.3g} GB/s per rank"
    )


def conversion_line(tag: str, source_world: int, world: int, read: int, written: int, seconds: float) -> str:
    """One universal conversion's cost ([Note: a conversion in shares] in deepspeed/checkpoint/universal.py)."""
    return (
        f"converted checkpoint {tag} ({source_world} ranks -> {world}) to the universal format in {seconds:.2f} s, "
        f"each of the {world} ranks its share: read {read / GB:.3g} GB, wrote {written / GB:.3g} GB "
        f"({rate_gbps(read + written, seconds):.3g} GB/s read and written in all)"
    )
