"""Every rank learns every rank's local error before a collective that depends on it.

[Note: agreed local checks]
A check that can fail on one rank only (an environment variable, a file that one node cannot
read, hardware one node reports differently) must not raise before the next collective: the
rank that raised leaves, the others wait in that collective and end, a timeout later, blaming
a peer ("a peer closed its connection") instead of the cause. So such checks run inside
``agree_local``: each rank runs its check, catches what it raises, and every rank exchanges its
outcome: one flag all-reduce says whether any rank failed, and only then are the failures
gathered to rank 0, which sends every rank the same summary ([Note: a coordinator, not a world
gather] in comm/_coordinator.py); if any rank failed, every rank raises the same ``HierRankError``
naming the failed ranks (the first and last ten of a long list) and their errors. Topology detection was the first user
of this (``detect.probe.detect``); the launch environment, the auto preset's probe file (read by
rank 0 and broadcast) and the plan every rank chose go through it too.

``agree_same`` is the other half: each rank describes what it decided (the plan: preset,
compression, topology, hops), its digest is agreed in one fixed-size all-reduce (as [Note: tick
agreement]), and a difference is an error on every rank naming which ranks decided what, before
any collective of that plan is issued. The summaries themselves (the plan's holds the rank map,
world-sized) never travel: on a difference a second round gathers each rank's digest of each key
to rank 0, and rank 0 names the differing keys and the ranks of each version.
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


def _trimmed(ranks: list[int]) -> list[int]:
    """The first and last ten of a long list of ranks (an error text stays short at any world)."""
    return ranks if len(ranks) <= 20 else [*ranks[:10], *ranks[-10:]]


def _world(group: dist.ProcessGroup | None) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def agree_local(what: str, check: Callable[[], T], group: dist.ProcessGroup | None = None) -> T:
    """Run ``check`` on this rank; collective: every rank of ``group`` (default: the world) must
    call it with the same ``what``. Returns this rank's result when every rank's check passed;
    when every rank failed with the same error, each raises its own (type and text unchanged);
    otherwise every rank raises ``HierRankError`` naming the failed ranks ([Note: agreed local
    checks])."""
    from . import _coordinator as coordinator

    error: Exception | None = None
    text: str | None = None
    try:
        result = check()
    except Exception as e:  # noqa: BLE001 - every local failure is sent, none raised alone
        result, error, text = None, e, _describe(e)
    if not _world(group):
        if error is not None:
            raise error
        return result  # type: ignore[return-value]
    if not coordinator.any_rank(text is not None, group):
        return result  # type: ignore[return-value]
    # the failure path only: the texts to rank 0, its summary to every rank
    ranks = dist.get_process_group_ranks(group) if group is not None else None
    texts = coordinator.gather_to_root(text, group)
    summary = None
    if texts is not None:
        failed = [(ranks[i] if ranks else i, t) for i, t in enumerate(texts) if t is not None]
        alike = len(failed) == len(texts) and len({t for _, t in failed}) == 1
        shown = set(_trimmed([r for r, _ in failed]))
        summary = [alike, len(failed), [[r, t] for r, t in failed if r in shown]]
    alike, count, shown_failed = coordinator.broadcast_from_root(summary, group)
    if error is not None and alike:
        raise error  # every rank failed alike (one bad config everywhere): its own error, unchanged
    failed_map = {int(r): t for r, t in shown_failed}
    lines = "; ".join(f"rank {r}: {t}" for r, t in failed_map.items())
    more = f" ({count} ranks failed; the first and last ten are named)" if count > len(failed_map) else ""
    raise HierRankError(
        f"zeropp_hier: {what} failed on rank{'s' if count > 1 else ''} {sorted(failed_map)}{more} "
        f"(every rank stops here, before any collective that depends on it): {lines}",
        failed_map,
    )


def digest(summary: object) -> str:
    return hashlib.sha256(json.dumps(summary, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def agree_same(what: str, summary: Mapping[str, object], group: dist.ProcessGroup | None = None) -> None:
    """Collective: raise ``HierRankError`` on every rank unless every rank passed an equal
    ``summary`` (JSON-like; compared by digest in one all-reduce, described by its differing
    keys in a second round only when they differ)."""
    from . import _coordinator as coordinator

    if not _world(group):
        return
    mine = digest(summary)
    if coordinator.same_everywhere(mine, group):
        return
    keys = {k: digest(v) for k, v in summary.items()}
    parts = coordinator.gather_to_root([mine, keys], group)
    ranks = dist.get_process_group_ranks(group) if group is not None else None
    found = None
    if parts is not None:
        by_digest: dict[str, list[int]] = {}
        for i, (d, _) in enumerate(parts):
            by_digest.setdefault(d, []).append(ranks[i] if ranks else i)
        first = {d: parts[(ranks.index(rs[0]) if ranks else rs[0])][1] for d, rs in by_digest.items()}
        differ = sorted({k for ks in first.values() for k in ks if len({ks2.get(k) for ks2 in first.values()}) > 1})
        found = [differ, [[d, rs[0], _trimmed(rs)] for d, rs in by_digest.items()]]
    differ, groups = coordinator.broadcast_from_root(found, group)
    # the values of the differing keys, from the first rank of each version (a few, each shortened)
    me = dist.get_rank()
    reps = {int(rep) for _, rep, _ in groups}
    shown = {k: repr(summary.get(k))[:200] for k in differ} if me in reps else None
    values = coordinator.gather_to_root(shown, group)
    told = None
    if values is not None:
        by_rank = {(ranks[i] if ranks else i): v for i, v in enumerate(values) if v is not None}
        told = {str(rep): by_rank.get(int(rep), {}) for _, rep, _ in groups}
    told = coordinator.broadcast_from_root(told, group)
    parts_text = [f"ranks {rs}: " + ", ".join(f"{k}={told[str(rep)].get(k)}" for k in differ) for _, rep, rs in groups]
    raise HierRankError(
        f"zeropp_hier: the ranks did not reach the same {what}; they differ in {differ}: "
        + "; ".join(parts_text)
        + ". Every rank must run the same zeropp_hier config and code on the same inputs (a config "
        "file that differs between nodes, a different package version); nothing was run with it.",
        {r: f"{what} {d}" for d, _, rs in groups for r in rs},
    )
