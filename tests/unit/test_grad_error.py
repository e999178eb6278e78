"""The gradient-error benchmark's pipelines (benchmarks/cpu/grad_error): that they reproduce the
engine's stage math and known cases. Small synthetic gradients; no model, no data."""

from __future__ import annotations

import torch

from benchmarks.cpu.grad_error import qgz
from benchmarks.cpu.grad_error.metrics import Window, flat, relative_error
from benchmarks.cpu.grad_error.pipelines import Reducer, modify, plan_stages, row_pad
from benchmarks.cpu.grad_error.rows import rows
from zeropp_hier.comm.collectives import HierCollectives
from zeropp_hier.comm.stats import CommStats
from zeropp_hier.core import layout
from zeropp_hier.core.plan import Hop
from zeropp_hier.core.topology import Topology

TOPO = Topology(2, 2, 2)  # 8 ranks, every tier present
SHAPES = [(24, 40), (40,), (16, 16)]  # sizes not multiples of the world, a bias, a square


def _grads(seed: int = 0, world: int = 8) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    # a shared signal plus per-rank noise, with one large tensor and one small (mixed scales)
    common = [torch.randn(s, generator=g) for s in SHAPES]
    return [
        [c + 0.5 * torch.randn(c.shape, generator=g) * (1.0 if i else 0.01) for i, c in enumerate(common)]
        for _ in range(world)
    ]


def _mean(grads) -> list[torch.Tensor]:
    return [torch.stack([g[t] for g in grads]).to(torch.float64).mean(0).reshape(-1) for t in range(len(grads[0]))]


def _err(reducer: Reducer, name: str, grads) -> float:
    return relative_error(flat(reducer.reduce(grads)[name]), flat(_mean(grads)))


def test_exact_pipelines_give_the_mean_within_fp32_rounding():
    grads = _grads()
    pipes = {p: plan_stages(p, "none", TOPO) for p in ("zero3", "zeropp", "frontier")}
    got = Reducer(TOPO, pipes).reduce(grads)
    for p in pipes:
        assert _err_of(got[p], grads) < 1e-6, p


def _err_of(got, grads) -> float:
    return relative_error(flat(got), flat(_mean(grads)))


def _engine_stage(bufs: list[torch.Tensor], hop: Hop) -> list[torch.Tensor]:
    """The engine's own stage (``HierCollectives.reduce_stage_steps``, the generator each rank
    runs) for every rank, its all-to-all done by hand: rank r gets row ``me`` of each peer's
    send rows, in peer order."""
    world = TOPO.world_size
    coll = HierCollectives(TOPO, {hop.axes: None}, CommStats(TOPO, 0))  # type: ignore[dict-item]
    gens = [coll.reduce_stage_steps(bufs[r], hop, hop.block_size, torch.float32) for r in range(world)]
    sends = [next(g).send for g in gens]
    out = []
    for r, g in enumerate(gens):
        peers = TOPO.peers(r, hop.axes)
        me = peers.index(r)
        try:
            g.send(torch.stack([sends[p][me] for p in peers]))
        except StopIteration as done:
            out.append(done.value)
    return out


def test_every_stage_is_the_engines_stage_bit_for_bit():
    """frontier's three stages with int4, int8 and exact fp32 (and zeropp's two-axis stage):
    the benchmark's stage and the engine's give the same bits on every rank."""
    grads = _grads(1)
    world = TOPO.world_size
    for stages in (
        plan_stages(
            "frontier", {"gradients": {"gcd": "int8", "gpu": "int4", "node": "none"}, "error_feedback": False}, TOPO
        ),
        plan_stages("zeropp", None, TOPO),
    ):
        pad = row_pad(stages)
        ours = [
            p.rows.view(*TOPO.dims, -1)
            for p in (layout.pack_grad_rows(g, world, pad, 1.0 / world, True) for g in grads)
        ]
        engine = list(ours)
        red = Reducer(TOPO, {"p": stages})
        for s, stage in enumerate(stages):
            ours = red._stage(s, stage, ours, None)
            engine = _engine_stage(engine, stage.hop)
            for r in range(world):
                assert torch.equal(ours[r], engine[r]), (stage.hop, r)


def test_int8_is_more_accurate_than_int4_on_the_same_data():
    grads = _grads(2)
    int8 = plan_stages("frontier", {"gradients": "int8", "error_feedback": False}, TOPO)
    int4 = plan_stages("frontier", {"gradients": "int4", "error_feedback": False}, TOPO)
    got = Reducer(TOPO, {"int8": int8, "int4": int4}).reduce(grads)
    e8, e4 = _err_of(got["int8"], grads), _err_of(got["int4"], grads)
    assert 0 < e8 < e4 / 4, (e8, e4)


def _bias_over_constant_stream(stages, steps: int = 12) -> float:
    grads = _grads(3)
    red = Reducer(TOPO, {"p": stages})
    w = Window(["p"])
    for _ in range(steps):
        w.add(_mean(grads), red.reduce(grads))
    return w.accumulated_bias("p")


def test_feedback_reduces_the_accumulated_bias_on_a_constant_stream():
    plain = plan_stages(
        "frontier", {"gradients": {"gcd": "none", "gpu": "none", "node": "int4"}, "error_feedback": False}, TOPO
    )
    package = modify(plain, "node", feedback="package")
    loco = modify(plain, "node", feedback="loco", beta=0.5)
    b_plain = _bias_over_constant_stream(plain)
    b_package = _bias_over_constant_stream(package)
    b_loco = _bias_over_constant_stream(loco)
    # the same input every step: without feedback the error repeats, with it it is sent later
    assert b_package < b_plain / 3, (b_package, b_plain)
    assert b_loco < b_plain / 3, (b_loco, b_plain)


def test_rotation_lowers_int4_error_on_blocks_with_outliers():
    """A block whose scale is set by one large element rounds the rest to few levels; the
    Hadamard rotation spreads that element over the block (the reason to rotate)."""
    g = torch.Generator().manual_seed(4)
    grads = []
    for _ in range(TOPO.world_size):
        x = torch.randn(64, 64, generator=g)
        x.view(-1)[::128] *= 40.0  # one outlier per 128 elements
        grads.append([x])
    plain = plan_stages(
        "frontier", {"gradients": {"gcd": "none", "gpu": "none", "node": "int4"}, "error_feedback": False}, TOPO
    )
    rot = modify(plain, "node", rotate=128)
    got = Reducer(TOPO, {"plain": plain, "rot": rot}).reduce(grads)
    e_plain, e_rot = _err_of(got["plain"], grads), _err_of(got["rot"], grads)
    assert 0 < e_rot < e_plain / 2, (e_rot, e_plain)


def test_qgz_reimplementation_known_cases():
    grads = _grads(5, world=8)
    got, scale = qgz.reduce(grads, nodes=2, devices=4)
    exact = _mean(grads)
    # (40,) is 1-D: DeepSpeed reduces it unquantized, so only fp16's rounding remains
    assert relative_error(got[1].to(torch.float64), exact[1]) < 1e-3
    # the 2-D tensors go through int4 twice: an int4-sized error
    e = relative_error(got[0].to(torch.float64), exact[0])
    assert 0.01 < e < 0.5, e
    assert scale == 2.0 ** int(
        torch.log2(torch.tensor(65504.0 / (8 * max(float(t.abs().max()) for g in grads for t in g)))).floor()
    )


def test_qgz_int4_clips_the_positive_absmax_to_seven_eighths():
    x = torch.tensor([[1.0, -1.0, 0.5, 0.0]], dtype=torch.float16)
    y = qgz.fake_quant(x, 4)
    assert y.tolist() == [[0.875, -1.0, 0.5, 0.0]]


def test_every_row_builds_on_both_shapes():
    for shape in ((2, 4, 2), (8, 1, 2)):
        topo = Topology(*shape)
        r = rows(topo, [32, 128], 0.9)
        assert any("gpu stage alone" in n for n in r) == (shape[1] > 1)
        Reducer(topo, {n: c for n, c in r.items() if not isinstance(c, str)})
