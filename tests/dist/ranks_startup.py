"""Rank functions of tests/dist/test_tick_startup.py: the tick mode's connection warm-up
([Note: connections before the first step] in comm/tick/connect.py) on real gloo ranks."""

from __future__ import annotations

import os
import signal
import time

import torch.distributed as dist

RANK_MAP = [5, 0, 7, 2, 1, 4, 3, 6]


def _frontier(rank_map):
    from zeropp_hier.comm import gather
    from zeropp_hier.comm.tick import plan_pieces
    from zeropp_hier.core.config import parse_section
    from zeropp_hier.core.plan import make_plan
    from zeropp_hier.core.topology import Topology

    topo = Topology.for_world(dist.get_world_size(), 2, 2, rank_map)
    plan = make_plan("frontier", parse_section({"enabled": True, "preset": "frontier"}).compression, topo)
    return topo, plan_pieces(plan, gather.backward_hops(plan, all_levels=False))


def agree_and_connect(rank_map: list, per_call: int) -> dict:
    """A healthy world: the schedule agreed, then each rank exchanges with each of its tick peers
    in grouped calls of at most ``per_call`` peers; records each grouped call's ops (the real
    ``batch_isend_irecv`` runs underneath)."""
    from zeropp_hier.comm.groups import build_tick_group
    from zeropp_hier.comm.tick.agree import agree_schedule
    from zeropp_hier.comm.tick.connect import connect_peers

    rank = dist.get_rank()
    topo, pieces = _frontier(rank_map)
    group = build_tick_group(topo, 30.0)
    posted: list[list[tuple[str, int]]] = []
    real = dist.batch_isend_irecv

    def batch(ops):
        posted.append([(op.op.__name__, op.peer) for op in ops])  # in posting order
        return real(ops)

    agreed = agree_schedule(topo, rank, pieces, 3)
    dist.batch_isend_irecv = batch
    try:
        calls = connect_peers(group, rank, topo, agreed.peers, 30.0, per_call=per_call)
    finally:
        dist.batch_isend_irecv = real
    return {"digest": agreed.digest, "peers": list(agreed.peers), "calls": calls, "ops": posted}


def warmup_fails(config: dict, victim: int, how: str) -> str:
    """Build a DeepSpeed engine in the tick mode; on ``victim`` the connection warm-up is
    replaced by a stop (``how`` = "stall": the process sleeps, its sockets open) or by a death
    ("die": SIGKILL); the other ranks run the real warm-up."""
    from zeropp_hier.app import run as training
    from zeropp_hier.comm.tick import connect as tick_connect

    if dist.get_rank() == victim:

        def stop(*args, **kwargs):
            if how == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)

        tick_connect.connect_peers = stop
    training.build_engine(config)
    return "built"  # a rank that does not peer with the victim gets here, or fails later
