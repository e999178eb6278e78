"""``auto``'s host probe, its tick pieces ([Note: host probe] in zeropp_hier/deepspeed/auto_host.py)
on 8 real ranks (2 nodes x 2 packages x 2 GCDs, gloo over loopback): the pieces are the runtime's
own jobs, so they post exactly the transfers the tick schedule gives a forward gather and a
gradient reduce of that plan, move bytes in both phases, and agree on every rank. On ``world8``:
the probe is part of ``zeropp_hier.deepspeed``, which imports DeepSpeed (``bare8`` never does)."""

TOPO = (2, 2, 2)


def probe_pieces() -> dict:
    import torch
    import torch.distributed as dist

    from zeropp_hier.comm.tick import plan as tick_plan
    from zeropp_hier.core.config import parse_section
    from zeropp_hier.core.plan import make_plan
    from zeropp_hier.core.topology import Topology
    from zeropp_hier.deepspeed.auto_host import TICK_CHUNKS, probe_plan, tick_probe

    rank = dist.get_rank()
    topo = Topology(*TOPO)
    plan = make_plan("frontier", parse_section({"enabled": True, "preset": "frontier"}).compression, topo)
    got = tick_probe(topo, rank, torch.device("cpu"), False, plan)
    cut = probe_plan(plan)

    def ops(axes, kind, chunks):
        return sum((x.send > 0) + (x.recv > 0) for x in tick_plan.rank_sequence(topo, rank, axes, kind, chunks))

    fwd = ops([h.axes for h in cut.forward], tick_plan.GATHER, TICK_CHUNKS)
    # the reduce's column chunks are the runtime's (1 or TICK_CHUNKS for a bucket this small)
    red = {c: ops([h.axes for h in cut.reduce], tick_plan.EXCHANGE, c) for c in (1, TICK_CHUNKS)}
    return {"probe": got._asdict(), "fwd": fwd, "red": red}


def test_the_tick_pieces_run_the_schedules_transfers_with_their_local_work(world8):
    res = world8.run(probe_pieces)
    for rank, r in enumerate(res):
        p = r["probe"]
        want = {p["pieces"] * (r["fwd"] + red) for red in r["red"].values()}
        assert p["ops"] in want, (rank, p["ops"], want)
        # the jobs' own accounting saw both phases move bytes (a real gather and a real reduce)
        assert p["phase_bytes"].get("forward_gather", 0) > 0 and p["phase_bytes"].get("grad_reduce", 0) > 0, p
        assert p["op_s"] > 0
    # every rank ran as many pieces (the probe is collective)
    assert len({r["probe"]["pieces"] for r in res}) == 1


def local_pieces() -> dict:
    import torch
    import torch.distributed as dist

    from zeropp_hier.core.config import parse_section
    from zeropp_hier.core.topology import Topology
    from zeropp_hier.deepspeed.auto_host import local_widths, piece_elements, tick_local

    topo = Topology(*TOPO)
    comp = parse_section({"enabled": True, "preset": "frontier"}).compression
    sent = []
    real = dist.batch_isend_irecv
    dist.batch_isend_irecv = lambda ops: sent.append(len(ops)) or real(ops)
    try:
        got = tick_local(topo, dist.get_rank(), torch.device("cpu"), False, comp, 1e8)
    finally:
        dist.batch_isend_irecv = real
    want = [piece_elements(topo, comp, w) for w in local_widths(topo.world_size)]
    return {"local": got._asdict(), "sent": sent, "want": want}


def test_the_local_pieces_run_the_tick_work_and_send_nothing(world8):
    # [Note: host probe], 4.: the tick piece through the stand-in transport, at two sizes; every
    # grouped call of the tick schedule reached the stand-in and none reached the network
    res = world8.run(local_pieces)
    for rank, r in enumerate(res):
        loc = r["local"]
        assert r["sent"] == [] and loc["calls"] > 0, (rank, r["sent"], loc["calls"])
        # divided by the planner's own counts of the two pieces ([Note: host term])
        assert [list(loc["touched"]), list(loc["quant"])] == [[w[0] for w in r["want"]], [w[1] for w in r["want"]]]
        assert loc["touched"][1] > loc["touched"][0] > 0
        assert loc["elem_s"] >= 0 and all(s > 0 for s in loc["seconds"])
