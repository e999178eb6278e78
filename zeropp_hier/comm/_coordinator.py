"""Fixed-size exchanges with one coordinator (rank 0 of a group), as PyTorch DCP's save and load.

[Note: a coordinator, not a world gather]
``all_gather_object`` hands every rank every rank's object, each padded to the largest: at
75,264 ranks a 7.6 MB listing per rank is a 570 GB buffer on every rank. The checkpoint path and
the start-up agreements use these exchanges instead, none of which hands a rank more than a
constant unless it is the coordinator:

* ``any_rank``: a flag all-reduced (MAX), 8 bytes per rank whatever the world (``sums`` and
  ``maxima``: a few counts, likewise);
* ``same_everywhere``: a 60-bit digest all-reduced as ``[d, -d]`` with MAX (agreed when
  ``max(d) == -max(-d)``, as [Note: tick agreement]);
* ``gather_to_root``: each rank's bytes to rank 0 only (one length all-reduce, then one tensor
  ``gather`` padded to the longest): rank 0 receives ``world x longest``, the others nothing;
* ``scatter_from_root``: rank 0's bytes for each rank, each rank receiving only its own;
* ``broadcast_from_root``: one small payload from rank 0 to every rank.

Payloads are JSON (never pickles: nothing a peer sends can run code here). A failure path may
cost more (``failures_everywhere`` gathers the failures to rank 0 only once a flag says some rank
failed, and rank 0 sends the first one and the failed ranks back), never the path every job takes.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

DIGEST_BITS = 60  # fits an int64 with room for its negation
_LEN = 8  # bytes of the length prefix of each padded payload


def _device(group: dist.ProcessGroup | None) -> torch.device:
    # NCCL/RCCL collectives take device tensors; gloo (and the fake backend) host ones
    if dist.get_backend(group) == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _group_rank(group: dist.ProcessGroup | None) -> int:
    return dist.get_rank(group)


def _max(values: list[int], group: dist.ProcessGroup | None) -> list[int]:
    t = torch.tensor(values, dtype=torch.int64, device=_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [int(x) for x in t.tolist()]


def sums(values: list[int], group: dist.ProcessGroup | None = None) -> list[int]:
    """Collective: the element-wise sum of every rank's ``values`` (int64), on every rank."""
    t = torch.tensor(values, dtype=torch.int64, device=_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return [int(x) for x in t.tolist()]


def maxima(values: list[int], group: dist.ProcessGroup | None = None) -> list[int]:
    """Collective: the element-wise maximum of every rank's ``values`` (int64), on every rank."""
    return _max(values, group)


def any_rank(flag: bool, group: dist.ProcessGroup | None = None) -> bool:
    """Collective: True on every rank when ``flag`` is set on any rank."""
    return bool(_max([int(bool(flag))], group)[0])


def digest_int(text: str) -> int:
    import hashlib

    return int(hashlib.sha256(text.encode()).hexdigest()[: DIGEST_BITS // 4], 16)


def same_everywhere(value: Any, group: dist.ProcessGroup | None = None) -> bool:
    """Collective: whether every rank passed an equal JSON-like ``value`` (by digest)."""
    d = digest_int(json.dumps(value, sort_keys=True, default=repr))
    hi, neg_lo = _max([d, -d], group)
    return hi == -neg_lo


def _encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=repr).encode()


def _pad_rows(blobs: list[bytes], width: int, device: torch.device) -> torch.Tensor:
    """Every blob framed (its length, then its bytes, zero-padded to ``width``) as the rows of
    one tensor: one buffer for a coordinator's world of payloads, not a tensor (and its
    storage) per rank."""
    stride = width + _LEN
    rows = bytearray(len(blobs) * stride)
    for r, blob in enumerate(blobs):
        at = r * stride
        rows[at : at + _LEN] = len(blob).to_bytes(_LEN, "little")
        rows[at + _LEN : at + _LEN + len(blob)] = blob
    flat = torch.frombuffer(rows, dtype=torch.uint8) if rows else torch.empty(0, dtype=torch.uint8)
    return flat.view(len(blobs), stride).to(device)


def _unpad_rows(rows: torch.Tensor) -> list:
    """The objects framed in the rows of ``rows`` (an empty row is None), parsed as one JSON
    array (one parse for a coordinator's world of payloads, not one per rank)."""
    raw = rows.cpu().numpy().tobytes()
    parts = []
    for at in range(0, len(raw), rows.shape[1]):
        n = int.from_bytes(raw[at : at + _LEN], "little")
        parts.append(raw[at + _LEN : at + _LEN + n] if n else b"null")
    return json.loads(b"[" + b",".join(parts) + b"]")


def _pad(blob: bytes, width: int, device: torch.device) -> torch.Tensor:
    return _pad_rows([blob], width, device)[0]


def _unpad(t: torch.Tensor) -> Any:
    return _unpad_rows(t.view(1, -1))[0]


def gather_to_root(obj: Any, group: dist.ProcessGroup | None = None) -> list | None:
    """Collective: every rank's JSON-like ``obj`` to the group's rank 0 (a list in group-rank
    order there; None on the other ranks). A rank receives nothing unless it is rank 0, which
    receives into the rows of one buffer."""
    blob = _encode(obj)
    (width,) = _max([len(blob)], group)
    dev = _device(group)
    mine = _pad(blob, width, dev)
    if _group_rank(group) != 0:
        dist.gather(mine, None, group=group, group_dst=0)
        return None
    rows = torch.empty((dist.get_world_size(group), width + _LEN), dtype=torch.uint8, device=dev)
    dist.gather(mine, list(rows.unbind(0)), group=group, group_dst=0)
    return _unpad_rows(rows)


def scatter_from_root(objs: list | None, group: dist.ProcessGroup | None = None) -> Any:
    """Collective: rank 0 passes one JSON-like object per group rank (the others None); each
    rank returns its own. A rank receives only its own object; rank 0 sends the rows of one
    buffer."""
    root = _group_rank(group) == 0
    blobs = [_encode(o) for o in objs] if root and objs is not None else []
    (width,) = _max([max((len(b) for b in blobs), default=0)], group)
    dev = _device(group)
    mine = torch.zeros(width + _LEN, dtype=torch.uint8, device=dev)
    parts = list(_pad_rows(blobs, width, dev).unbind(0)) if root else None
    dist.scatter(mine, parts, group=group, group_src=0)
    if root:  # some backends (the fake one) leave the root's own slot unfilled
        return objs[0] if objs else None
    return _unpad(mine)


def broadcast_from_root(obj: Any, group: dist.ProcessGroup | None = None) -> Any:
    """Collective: rank 0's JSON-like ``obj`` on every rank (keep it small: every rank gets it)."""
    root = _group_rank(group) == 0
    blob = _encode(obj) if root else b""
    (width,) = _max([len(blob)], group)
    dev = _device(group)
    t = _pad(blob, width, dev) if root else torch.zeros(width + _LEN, dtype=torch.uint8, device=dev)
    dist.broadcast(t, group=group, group_src=0)
    return obj if root else _unpad(t)


def failures_everywhere(failure: Any, group: dist.ProcessGroup | None = None) -> tuple[Any, list[int]] | None:
    """Collective: None on every rank when no rank passed a failure (one flag all-reduce);
    otherwise, on every rank, ``(first failure, the other failed group ranks)``, the first being
    the lowest group rank's ([Note: a coordinator, not a world gather])."""
    if not any_rank(failure is not None, group):
        return None
    parts = gather_to_root(failure, group)
    summary = None
    if parts is not None:
        failed = [(r, f) for r, f in enumerate(parts) if f is not None]
        summary = [failed[0][1], [r for r, _ in failed[1:]]]
    first, others = broadcast_from_root(summary, group)
    return first, others
