"""No collective in flight beside another communicator's (issue 49 item 5): every collective and
point-to-point call of every thread of 8 real gloo ranks (2 nodes x 2 GPUs x 2 GCDs), recorded
through a real DeepSpeed engine's training steps (forward with a statistic all-reduced inside the
model, a loss all-reduced for logging after the forward and after the step, backward, the
optimizer step with DeepSpeed's gradient-norm all-reduce), an evaluation and a checkpoint save,
in every issue mode a GPU runs; the pure checker (tests/dist/overlaps.py) finds no two
communicators in flight at once. The control run switches the runtime's drain before a foreign
collective off ([Note: foreign collectives] in zeropp_hier/comm/foreign.py), in the rank
processes only: then the all-reduce inside the forward overlaps DeepSpeed's prefetched gathers.
What this shows is the order of calls on the host with gloo on the CPU; it does not prove what
NCCL or RCCL kernels do concurrently on a GPU."""

import pytest

from zeropp_hier.app.model.gpt import GPTConfig
from zeropp_hier.app.spec import ds_config

from . import ranks_overlap

# DeepSpeed's prefetch with the parameters released after each use: gathers of later layers are
# on the lane while the training thread runs earlier ones
PREFETCH = {"stage3_prefetch_bucket_size": 10**7, "stage3_max_live_parameters": 10**7, "stage3_max_reuse_distance": 0}
MODEL = GPTConfig(n_layers=4, tie_embeddings=False)
# the issue modes a GPU runs ([Note: one issuing thread on GPUs] in zeropp_hier/comm/issue.py) and
# what each resolves to on gloo: "gpu" is ticks for frontier (every hop in one tier) and one
# lane for zeropp (flat hops)
MODES = {
    "frontier/ticks": "ticks",
    "frontier/one_lane": "one_lane",
    "frontier/serial": "one_lane/serial",
    "frontier/gpu": "ticks",
    "zeropp/gpu": "one_lane",
}


def _configs(names) -> dict:
    out = {}
    for name in names:
        preset, mode = name.split("/")
        cfg = ds_config(preset, clip=1.0)  # clipping: DeepSpeed's gradient-norm all-reduce every step
        cfg["zeropp_hier"]["overlap"] = mode
        cfg["zero_optimization"].update(PREFETCH)
        out[name] = cfg
    return out


@pytest.fixture(scope="module")
def recorded(world8, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("overlap"))
    return world8.run(ranks_overlap.overlap_run, _configs(MODES), root, True, MODEL, True)


@pytest.mark.parametrize("name", list(MODES))
def test_no_collective_is_in_flight_beside_another_communicators(recorded, name):
    drained = 0
    for rank, res in enumerate(recorded):
        got = res[name]
        what = f"rank {rank} {name}"
        assert got["mode"] == MODES[name], (what, got["mode"])
        assert got["refused"] is None, (what, got["refused"])  # every call seen to complete
        assert got["n_conflicts"] == 0, (what, got["conflicts"])
        lane = {k.split(" ", 1)[1]: n for k, n in got["calls"].items() if k.startswith("lane ")}
        training = {k.split(" ", 1)[1]: n for k, n in got["calls"].items() if k.startswith("training ")}
        # the hop transfers all came from one lane thread: the tick group alone in the tick mode
        assert len(got["threads"]) == 1, (what, got["threads"])
        if MODES[name] == "ticks":
            assert set(lane) == {"tick"}, (what, lane)
        else:
            assert lane and all(c.startswith("hop:") for c in lane), (what, lane)
        # the training thread's own: 2 steps x (inside, after forward, after step) + 2 evaluations
        # x (inside, the loss) = 10 all-reduces at least, besides DeepSpeed's
        assert training.get("world", 0) >= 10, (what, training)
        assert ("all_reduce", "world") in {tuple(op) for op in got["ops"]}, what
        drained += got["foreign_drains"]["collectives"]
    # the drain is what kept them apart: some all-reduce found prefetched gathers in flight
    assert drained > 0, name


@pytest.fixture(scope="module")
def undrained(world8, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("overlap_control"))
    return world8.run(
        ranks_overlap.overlap_run, _configs(["frontier/ticks", "frontier/one_lane"]), root, False, MODEL, True
    )


@pytest.mark.parametrize("name", ["frontier/ticks", "frontier/one_lane"])
def test_without_the_drain_the_all_reduce_inside_the_forward_overlaps_the_prefetch(undrained, name):
    found = [res[name] for res in undrained]
    assert all(r["foreign_drains"]["collectives"] == 0 for r in found)  # the switch is off
    assert any(r["n_conflicts"] > 0 for r in found), [r["n_conflicts"] for r in found]
    lane_op = "batch_isend_irecv on 'tick'" if name.endswith("ticks") else "on 'hop:"
    for r in found:
        for text in r["conflicts"]:
            assert "all_reduce on 'world' from 'MainThread'" in text and lane_op in text, text
