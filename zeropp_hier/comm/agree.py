"""Every rank learns every rank's local error before a collective that depends on it.

[Note: agreed local checks]
A check that can fail on one rank only (an environment variable, a file that one node cannot
read, hardware one node reports differently) must not raise before the next collective: the
rank that raised leaves, the others wait in that collective and end, a timeout later, blaming
a peer ("a peer closed its connection") instead of the cause. So such checks run inside
``agree_local``: each rank runs its check, catches what it raises, and every rank exchanges its
outcome in one ``all_gather_object``; if any rank failed, every rank raises the same
``HierRankError`` naming each failed rank and its error. Topology detection was the first user
of this (``detect.probe.detect``); the launch environment, the auto preset's probe file (read by
rank 0 and broadcast) and the plan every rank chose go through it too.

``agree_same`` is the other half: each rank describes what it decided (the plan: preset,
compression, topology, hops), a digest is all-gathered, and a difference is an error on every
rank naming which ranks decided what, before any collective of that plan is issued.
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Mapping, TypeVar

import torch.distributed as dist

T = TypeVar("T")


class HierRankError(RuntimeError):
    """A local check failed on some ranks; raised on every rank alike. ``failed`` maps each
    failed rank to its error's text."""

    def __init__(self, message: str, failed: Mapping[int, str] | None = None):
        self.failed = dict(failed or {})
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.failed))


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def agree_local(what: str, check: Callable[[], T], group: dist.ProcessGroup | None = None) -> T:
    """Run ``check`` on this rank; collective: every rank of ``group`` (default: the world) must
    call it with the same ``what``. Returns this rank's result when every rank's check passed;
    when every rank failed with the same error, each raises its own (type and text unchanged);
    otherwise every rank raises ``HierRankError`` naming the failed ranks ([Note: agreed local
    checks])."""
    error: Exception | None = None
    try:
        mine: tuple = ("ok", None)
        result = check()
    except Exception as e:  # noqa: BLE001 - every local failure is sent, none raised alone
        mine, result, error = ("error", _describe(e)), None, e
    outcomes: list = [mine]
    if dist.is_available() and dist.is_initialized():
        outcomes = [None] * dist.get_world_size(group)
        dist.all_gather_object(outcomes, mine, group=group)
    ranks = dist.get_process_group_ranks(group) if group is not None else range(len(outcomes))
    failed = {r: o[1] for r, o in zip(ranks, outcomes) if o is not None and o[0] == "error"}
    if error is not None and len(failed) == len(outcomes) and len(set(failed.values())) == 1:
        raise error  # every rank failed alike (one bad config everywhere): its own error, unchanged
    if failed:
        lines = "; ".join(f"rank {r}: {text}" for r, text in failed.items())
        raise HierRankError(
            f"zeropp_hier: {what} failed on rank{'s' if len(failed) > 1 else ''} {sorted(failed)} "
            f"(every rank stops here, before any collective that depends on it): {lines}",
            failed,
        )
    return result  # type: ignore[return-value]


def digest(summary: object) -> str:
    return hashlib.sha256(json.dumps(summary, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def agree_same(what: str, summary: Mapping[str, object], group: dist.ProcessGroup | None = None) -> None:
    """Collective: raise ``HierRankError`` on every rank unless every rank passed an equal
    ``summary`` (JSON-like; compared by digest, described by its differing keys)."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    mine = (digest(summary), summary)
    outcomes: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(outcomes, mine, group=group)
    by_digest: dict[str, list[int]] = {}
    for r, (d, _) in enumerate(outcomes):
        by_digest.setdefault(d, []).append(r)
    if len(by_digest) == 1:
        return
    first = {d: outcomes[ranks[0]][1] for d, ranks in by_digest.items()}
    keys = sorted({k for s in first.values() for k in s if len({repr(s.get(k)) for s in first.values()}) > 1})
    parts = [
        f"ranks {ranks}: " + ", ".join(f"{k}={first[d].get(k)!r}" for k in keys) for d, ranks in by_digest.items()
    ]
    raise HierRankError(
        f"zeropp_hier: the ranks did not reach the same {what}; they differ in {keys}: "
        + "; ".join(parts)
        + ". Every rank must run the same zeropp_hier config and code on the same inputs (a config "
        "file that differs between nodes, a different package version); nothing was run with it.",
        {r: f"{what} {d}" for d, ranks in by_digest.items() for r in ranks},
    )
