"""The tick communicator's connections, opened at start-up under their own bound.

[Note: connections before the first step]
NCCL and RCCL open a point-to-point connection (its connectors, per channel and per peer) the
first time a rank sends to or receives from that peer, inside that call. In the tick mode the
first node-hop tick would open every network peer's connections at once, in the middle of the
first training step and against the collective timeout; at scale this is where connection
setup fails (all-to-all at 256 GPUs, NVIDIA/nccl-tests#78; ``ibv_create_cq`` ENOMEM at 700
nodes, NVIDIA/nccl#1191; port exhaustion at 64+ MI200 nodes, ROCm/rccl#577). So at start-up,
right after the schedule is agreed ([Note: tick agreement] in comm/tick/agree.py),
each rank exchanges one small message with each distinct peer of its tick sequences, on the
tick group itself (the connections the ticks will use), and fails with an error that names the
peers that did not answer.

The order: every pair of ranks ``{a, b}`` gets one key, the same at both ends: (ring distance
``min(|a - b|, W - |a - b|)``, lower rank, higher rank). Each rank sorts its peers by that key
and exchanges with them in grouped calls of at most ``PEERS_PER_CALL`` peers (two ops each:
far under the 256 ops at which NCCL's grouped calls start to split into several kernel plans
and can hang, pytorch/pytorch#174288), waiting for each call before posting the next. No cycle
of waits can form: the pending pair with the smallest key has both ends past every smaller key
(those are complete), so both ends have it in the call they are waiting in, and it completes.

The bound: the whole warm-up waits at most ``timeout_s`` (the tick group's
``collective_timeout_s``), polled on the host, so a peer that never posts its side (a stuck
process, a node cut off) is named when the bound ends; a peer whose process died is named at
once (its connection closed). On gloo each transfer has its own work, so the error names
exactly the peers whose message did not arrive; on NCCL/RCCL one grouped call is one work, so
it names the peers of the call that did not complete (at most ``PEERS_PER_CALL``). The ranks
that did not peer with the silent rank pass; they learn of the failure at their next
collective, when the ranks that raised here exit ([Note: failure detection] in
comm/failures.py).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from ...core.ranks_text import ranks_text
from ...core.topology import Topology
from ..failures import classify
from ..issue import backend_for

PEERS_PER_CALL = 16  # peers per grouped call of the warm-up: 32 ops
POLL_S = 0.001  # how often the host looks at the pending transfers (device backends)
MIN_WAIT_S = 0.01  # past the bound, a transfer that has arrived is still taken


class TickConnectError(RuntimeError):
    """Some tick peers of a rank did not answer the start-up exchange ([Note: connections
    before the first step]). ``silent``: peers that sent nothing within the bound; ``lost``:
    peers whose connection closed; ``tiers``: each named peer's tier from this rank."""

    def __init__(
        self,
        *,
        rank: int,
        silent: Sequence[int],
        lost: Sequence[int],
        tiers: dict[int, str],
        timeout_s: float | None,
        cause: str = "",
    ):
        self.rank, self.silent, self.lost = rank, tuple(silent), tuple(lost)
        self.tiers, self.timeout_s, self.cause = dict(tiers), timeout_s, cause
        parts = []
        if self.silent:
            bound = f"within collective_timeout_s = {timeout_s:g} s" if timeout_s is not None else "(no bound set)"
            parts.append(f"peer ranks {ranks_text(self.silent)} did not answer {bound}")
        if self.lost:
            parts.append(f"peer ranks {ranks_text(self.lost)} closed their connection (their process died or exited)")
        by_tier = ", ".join(
            f"{t}: {[p for p in (*self.silent, *self.lost) if tiers.get(p) == t]}" for t in _tiers(tiers)
        )
        first = cause.strip().splitlines()[0] if cause.strip() else ""
        super().__init__(
            f'zeropp_hier: rank {rank} could not connect to its tick peers (overlap "ticks") before the first '
            f"step: {'; '.join(parts)} (by tier: {by_tier}). Check the network and the named peers' nodes "
            "(is each rank's process alive and past its start-up? is the node's network interface up?), "
            f"then relaunch; no tick was issued.{' Cause: ' + first if first else ''}"
        )

    def __reduce__(self):
        fields = {
            "rank": self.rank,
            "silent": self.silent,
            "lost": self.lost,
            "tiers": self.tiers,
            "timeout_s": self.timeout_s,
            "cause": self.cause,
        }
        return (_rebuild, (type(self), fields))


def _rebuild(cls, fields: dict) -> TickConnectError:
    return cls(**fields)


def _tiers(tiers: dict[int, str]) -> list[str]:
    return [t for t in ("node", "gpu", "gcd") if t in tiers.values()]


def pair_key(a: int, b: int, world: int) -> tuple[int, int, int]:
    """The key of the pair {a, b}, the same at both ends (pure)."""
    d = abs(a - b)
    return (min(d, world - d), min(a, b), max(a, b))


def warmup_calls(rank: int, peers: Sequence[int], world: int, per_call: int = PEERS_PER_CALL) -> list[list[int]]:
    """This rank's peers in the order of the warm-up, cut into grouped calls of at most
    ``per_call`` peers ([Note: connections before the first step]; pure)."""
    if per_call < 1:
        raise ValueError(f"zeropp_hier internal: per_call = {per_call}")
    order = sorted((p for p in set(peers) if p != rank), key=lambda p: pair_key(rank, p, world))
    return [order[i : i + per_call] for i in range(0, len(order), per_call)]


def connect_peers(
    group: dist.ProcessGroup | None,
    rank: int,
    topo: Topology,
    peers: Sequence[int],
    timeout_s: float | None,
    device: torch.device | str = "cpu",
    per_call: int = PEERS_PER_CALL,
) -> int:
    """Exchange this rank's number with each of ``peers`` on ``group``, in bounded grouped calls
    in the pairs' one order, all within ``timeout_s``; raise ``TickConnectError`` naming the
    peers that did not answer. Returns the number of grouped calls. Every rank with a peer in
    ``peers`` must call it with this rank among its own peers (the agreed schedule is
    symmetric: comm/tick/agree.py)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    calls = warmup_calls(rank, peers, topo.world_size, per_call)
    mine = torch.tensor([rank], dtype=torch.int64, device=device)
    on_host = backend_for(dist.get_backend(group), mine.device.type) == "gloo"
    for batch in calls:
        got = {p: torch.full((1,), -1, dtype=torch.int64, device=device) for p in batch}
        ops = []
        for p in batch:
            ops.append(dist.P2POp(dist.isend, mine, p, group))
            ops.append(dist.P2POp(dist.irecv, got[p], p, group))
        works = dist.batch_isend_irecv(ops)
        # gloo: a work per op (send, receive of each peer in turn); NCCL/RCCL: one for the call
        owners = [[batch[i // 2]] for i in range(len(ops))] if len(works) == len(ops) else [batch] * len(works)
        silent, lost, cause = _settle(works, owners, deadline, on_host)
        if silent or lost:
            tiers = {p: topo.tier_between(rank, p) or "gcd" for p in (*silent, *lost)}
            raise TickConnectError(rank=rank, silent=silent, lost=lost, tiers=tiers, timeout_s=timeout_s, cause=cause)
        wrong = {p: int(t.item()) for p, t in got.items() if int(t.item()) != p}
        # a dry run's mirror hands back this rank's own number (every peer sends what this rank
        # sends: [Note: the SPMD mirror] in dryrun/mirror.py); a peer's number cannot be mirrored
        if wrong and not getattr(dist.batch_isend_irecv, "zeropp_mirror", False):
            raise RuntimeError(
                f"zeropp_hier internal: rank {rank}'s tick warm-up received another rank's number from "
                f"{wrong} (peer: what it sent): the tick group's transport paired messages wrongly"
            )
    return len(calls)


def _settle(
    works: Sequence[dist.Work], owners: Sequence[Sequence[int]], deadline: float | None, on_host: bool
) -> tuple[list[int], list[int], str]:
    """Wait for ``works`` until ``deadline``: (peers silent at the deadline, peers whose
    connection closed, the first cause). On the host (gloo) a work completes only inside its
    ``wait``, which takes the time left; on a device ``is_completed`` is polled, since ``wait``
    only makes the stream wait."""
    silent: list[int] = []
    lost: list[int] = []
    cause = ""
    if not on_host:
        pending = list(range(len(works)))
        while pending and (deadline is None or time.monotonic() < deadline):
            pending = [i for i in pending if not works[i].is_completed()]
            if pending:
                time.sleep(POLL_S)
        silent = sorted({p for i in pending for p in owners[i]})
    for i, w in enumerate(works):
        if not on_host and any(p in silent for p in owners[i]):
            continue
        try:
            if on_host and deadline is not None:  # what has arrived returns at once, even late
                w.wait(timedelta(seconds=max(deadline - time.monotonic(), MIN_WAIT_S)))
            else:
                w.wait()
        except RuntimeError as e:  # the block is transfers only: any error is the transfer's
            # gloo closes a pair whose wait timed out, and says so to the pair's later waits
            timed_out = classify(e) == "timeout" or "timeout" in str(e).lower()
            named = silent if timed_out else lost
            named += [p for p in owners[i] if p not in named]
            cause = cause or str(e)
    return sorted(set(silent) - set(lost)), sorted(lost), cause


__all__ = ["PEERS_PER_CALL", "TickConnectError", "connect_peers", "pair_key", "warmup_calls"]
