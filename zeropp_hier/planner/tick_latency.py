"""A hop's cost in the tick mode from how the library runs a grouped point-to-point call, and
its log-step sub-hops ([Note: log-step hops] in comm/tick/plan.py). Pure arithmetic.

[Note: grouped-call rounds]
A tick is one grouped call per 64 ops ([Note: bounded calls] in comm/tick/plan.py). The library
does not run a call's peers all at once: NCCL spreads a grouped call's peers over its p2p
channels and runs them in rounds (``ncclP2pChannelBaseForRound`` and ``ncclP2pChannelForPart``
place each round's peer on channels: both in RCCL's src/include/device.h, quoted in
ROCm/rocm-systems#3000 and #8087), a channel's device work holding at most
``NCCL_MAX_DEV_WORK_P2P_PER_BATCH`` p2p items: 8 in NCCL, 1 in RCCL (ROCm/rccl#1760, which
quotes both headers). RCCL batches several p2p items per channel only with
``RCCL_P2P_BATCH_ENABLE``, auto-enabled on gfx950 alone (ROCm/rocm-systems#3000, #6364), so
on Frontier's MI250X (gfx90a) each channel runs one peer after another. The model: a hop whose
tick talks to ``p`` peers pays its tier's ``alpha`` once per round, ``ceil(p / (channels x
per_batch))`` rounds, plus one more per extra grouped call; 8 p2p channels on MI250X is
what issue 49 reports RCCL logging (not confirmed here; RCCL picks the count at start-up), so a direct node hop
at 48 nodes (47 peers) is 6 rounds and at 9,408 nodes 1,176. A log-step hop is ``ceil(log2
N)`` sub-hops of one or two peers: one round each, each in its own tick, moving the blocks the
step moves (``step_shares``). gloo runs every op of a call at once on the host: one round.
These are modelled from the libraries' sources, not measured on a GPU.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..comm.tick import plan as tick_plan

P2P_CHANNELS = 8  # p2p channels RCCL logs on MI250X (issue 49)
P2P_PER_BATCH = {"nccl": 8, "rccl": 1}  # NCCL_MAX_DEV_WORK_P2P_PER_BATCH (ROCm/rccl#1760)


def rounds(peers: int, library: str, channels: int = P2P_CHANNELS) -> int:
    """Rounds of a grouped call with ``peers`` peers ([Note: grouped-call rounds])."""
    if peers <= 0:
        return 0
    if library not in P2P_PER_BATCH:  # gloo: every op of the call at once
        return 1
    return math.ceil(peers / (channels * P2P_PER_BATCH[library]))


class SubHop(NamedTuple):
    """One tick's share of a hop: ``share`` of the hop's link time (its blocks over a direct
    hop's ``N - 1``), ``alphas`` tier latencies, ``peers`` it talks to, ``ops`` it posts."""

    share: float
    alphas: int
    peers: int
    ops: int


def sub_hops(members: int, kind: str, library: str, steps: str = tick_plan.AUTO) -> list[SubHop]:
    """A hop over ``members`` in ticks, as the runtime lays it out (``tick_plan.step_mode``)."""
    mode = tick_plan.step_mode(members, steps, kind)
    out = []
    for s in range(tick_plan.step_count(members, mode)):
        units = tick_plan.step_units(members, 0, kind, mode, s)
        rows = sum(r for u in units for _, _, r in u)
        ops = [tick_plan.unit_ops(u) for u in units]
        calls = max(tick_plan.pack_calls(ops), default=-1) + 1
        peers = len({j for u in units for j, _, _ in u})
        share = rows / (members - 1) if members > 1 else 0.0
        out.append(SubHop(share, rounds(peers, library) + max(0, calls - 1), peers, sum(ops)))
    return out


def sends(sub: SubHop) -> int:
    """Messages a rank sends in a sub-hop: half its ops (every send of the tick's exchange
    patterns has its receive), the count ``comm_stats`` keeps for a tick's transfers."""
    return sub.ops // 2


def exchange_factor(members: int, steps: str = tick_plan.AUTO) -> float:
    """Blocks a rank receives in an all-to-all in ticks over those of a direct one (1 direct;
    about ``(N/2) log2 N / (N - 1)`` in log steps)."""
    if members < 2:
        return 1.0
    return sum(h.share for h in sub_hops(members, tick_plan.EXCHANGE, "gloo", steps))
