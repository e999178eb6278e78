"""The dry run's SPMD mirror, one collective kind at a time ([Note: the SPMD mirror] in
zeropp_hier/dryrun/mirror.py): rank 3 of 8 on PyTorch's fake process group, every answer checked
against what a real job returns when every rank holds what rank 3 holds. In a fresh interpreter
(``init_process_group`` once per process, as in a job)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json
import torch
import torch.distributed as dist
from zeropp_hier.dryrun.meters import Meters
from zeropp_hier.dryrun.mirror import Mirror
from zeropp_hier.dryrun.world import DryWorld, init_fake_world

W, ME = 8, 3
init_fake_world(DryWorld(nodes=1, rank=ME, gpus=4, gcds=2))
meters = Meters(trace_memory=False)
Mirror(meters).install()
out = {}
x = torch.arange(4.0) + 1  # [1, 2, 3, 4]
with meters:
    meters.begin("t")
    y = x.clone(); dist.all_reduce(y); out["all_reduce_sum"] = y.tolist()
    y = x.clone(); dist.all_reduce(y, op=dist.ReduceOp.MAX); out["all_reduce_max"] = y.tolist()
    y = x.clone(); dist.all_reduce(y, op=dist.ReduceOp.AVG); out["all_reduce_avg"] = y.tolist()
    y = torch.tensor([2.0]); dist.all_reduce(y, op=dist.ReduceOp.PRODUCT); out["all_reduce_product"] = y.tolist()
    y = torch.tensor([5]); dist.all_reduce(y, op=dist.ReduceOp.BXOR); out["all_reduce_bxor"] = y.tolist()
    y = x.clone(); dist.reduce(y, dst=0); out["reduce_not_dst"] = y.tolist()
    y = x.clone(); dist.reduce(y, dst=ME); out["reduce_dst"] = y.tolist()
    o = torch.zeros(32); dist.all_gather_into_tensor(o, x); out["all_gather_into_tensor"] = o.tolist()
    o = torch.zeros(32); dist.all_gather_single(o, x); out["all_gather_single"] = o.tolist()  # torch 2.13's name
    outs = [torch.zeros(4) for _ in range(W)]; dist.all_gather(outs, x); out["all_gather"] = torch.stack(outs).tolist()
    o = torch.zeros(4); dist.reduce_scatter_tensor(o, torch.arange(32.0)); out["reduce_scatter_tensor"] = o.tolist()
    o = torch.zeros(2); dist.reduce_scatter(o, [torch.full((2,), float(k)) for k in range(W)])
    out["reduce_scatter"] = o.tolist()
    o = torch.zeros(8); dist.all_to_all_single(o, torch.arange(8.0)); out["all_to_all_single"] = o.tolist()
    outs = [torch.zeros(1) for _ in range(W)]
    dist.all_to_all(outs, [torch.full((1,), float(k)) for k in range(W)]); out["all_to_all"] = torch.cat(outs).tolist()
    y = x.clone(); dist.broadcast(y, src=0); out["broadcast"] = y.tolist()
    g = dist.new_group([2, 3, 4, 5])
    y = x.clone(); dist.all_reduce(y, group=g); out["group_all_reduce_sum"] = y.tolist()
    o = torch.zeros(2); dist.reduce_scatter_tensor(o, torch.arange(8.0), group=g)
    out["group_reduce_scatter"] = o.tolist()
    objs = [None] * W; dist.all_gather_object(objs, {"rank": ME}); out["all_gather_object"] = objs
    box = [{"mine": 1}]; dist.broadcast_object_list(box, src=ME); out["broadcast_object_mine"] = box
    box = [None]; dist.broadcast_object_list(box, src=0); out["broadcast_object_other"] = box
    send, got, other = torch.tensor([7.0]), torch.zeros(1), torch.zeros(2)
    ops = [dist.P2POp(dist.isend, send, 4), dist.P2POp(dist.irecv, got, 4), dist.P2POp(dist.irecv, other, 5)]
    works = dist.batch_isend_irecv(ops)
    out["p2p"] = got.tolist(); out["p2p_unmatched"] = other.tolist()
    out["p2p_completed"] = all(w.is_completed() and w.wait() for w in works)
    w = dist.all_reduce(x.clone(), async_op=True); out["async_completed"] = w.is_completed()
    dist.barrier()
meters.end()
p = meters.phases["t"].as_dict()
keys = ("collectives", "largest_payload_bytes", "largest_payload_kind", "object_collectives",
        "object_buffer_bytes", "unmatched_receives", "foreign_object_broadcasts")
out["meters"] = {k: p[k] for k in keys}
print(json.dumps(out))
"""


def _run() -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_each_collective_answers_as_if_every_peer_sent_this_ranks_data():
    out = _run()
    w, me = 8, 3
    x = [1.0, 2.0, 3.0, 4.0]
    # reductions over 8 ranks that all hold x
    assert out["all_reduce_sum"] == [v * w for v in x]
    assert out["all_reduce_max"] == x and out["all_reduce_avg"] == x
    assert out["all_reduce_product"] == [2.0**w]
    assert out["all_reduce_bxor"] == [0]  # an even number of equal values
    assert out["reduce_not_dst"] == x and out["reduce_dst"] == [v * w for v in x]
    # gathers: x in every slot
    assert out["all_gather_into_tensor"] == x * w and out["all_gather_single"] == x * w
    assert out["all_gather"] == [x] * w
    # reduce-scatter: this rank's chunk of its own input, summed over 8
    assert out["reduce_scatter_tensor"] == [float(v) * w for v in range(4 * me, 4 * me + 4)]
    assert out["reduce_scatter"] == [float(me) * w] * 2
    # all-to-all: what each peer sends this rank is its chunk for rank 3, which equals ours
    assert out["all_to_all_single"] == [float(me)] * w
    assert out["all_to_all"] == [float(me)] * w
    assert out["broadcast"] == x  # this rank's own tensor
    # a group of 4 (this rank is its member 1)
    assert out["group_all_reduce_sum"] == [v * 4 for v in x]
    assert out["group_reduce_scatter"] == [2.0 * 4, 3.0 * 4]
    # objects
    assert out["all_gather_object"] == [{"rank": me}] * w
    assert out["broadcast_object_mine"] == [{"mine": 1}]
    assert out["broadcast_object_other"] == [None]  # another rank's object: not mirrored, counted
    # point to point: the receive from peer 4 gets what this rank sends peer 4; one from 5 has no send
    assert out["p2p"] == [7.0] and out["p2p_unmatched"] == [0.0, 0.0]
    assert out["p2p_completed"] and out["async_completed"]
    m = out["meters"]
    assert m["collectives"]["all_reduce"] == 7  # five ops above, the group's and the async one
    assert m["collectives"]["reduce"] == 2
    assert m["collectives"]["p2p"] == 1 and m["collectives"]["barrier"] == 1
    assert m["collectives"]["all_gather"] == 3  # into a tensor, its 2.13 name, into a list
    assert m["largest_payload_bytes"] == 32 * 4 and m["largest_payload_kind"] in ("all_gather", "reduce_scatter")
    assert m["object_collectives"] == {"all_gather_object": 1, "broadcast_object_list": 2}
    assert m["unmatched_receives"] == 1 and m["foreign_object_broadcasts"] == 1
    # the buffer torch would allocate for the object all-gather: 8 x the pickled object
    assert m["object_buffer_bytes"] > 8 * 10


def test_a_cpu_dry_run_flushes_subnormals_in_its_threads_and_restores_them():
    """[Note: subnormals in a CPU dry run]: flushed on this thread and on the threads started
    after (the engine's communication lanes), kept again afterwards, so that a test or job run
    later in the same process computes with subnormals as torch does by default."""
    import threading

    import torch

    from zeropp_hier.app import launch
    from zeropp_hier.dryrun.world import flush_subnormals, keep_subnormals

    tiny = torch.full((4,), 1e-39)  # subnormal in fp32
    assert (tiny * 0.5)[0].item() > 0  # torch's default: kept
    if launch.visible_gpus():  # the engine would be on the GPU: nothing is flushed
        assert flush_subnormals() is False and (tiny * 0.5)[0].item() > 0
        return
    assert flush_subnormals() is True
    try:
        assert (tiny * 0.5)[0].item() == 0.0
        seen = []
        t = threading.Thread(target=lambda: seen.append((tiny * 0.5)[0].item()))
        t.start()
        t.join()
        assert seen == [0.0]
    finally:
        keep_subnormals()
    assert (tiny * 0.5)[0].item() > 0
