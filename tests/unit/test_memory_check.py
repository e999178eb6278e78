"""The job's memory check (app/memory_check.py): the planner's table before the model is built,
and a refusal naming the field, the predicted GB, the budget and the fix. No ranks start."""

from dataclasses import replace

import pytest

from zeropp_hier import planner
from zeropp_hier.app import launch, memory_check
from zeropp_hier.app.spec import MODELS, JobSpec
from zeropp_hier.core.errors import HierConfigError


def test_too_big_a_model_is_refused_before_any_rank_starts(monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("the job went on to build a model")

    # launch() must refuse before it spawns ranks or builds an engine
    monkeypatch.setattr("zeropp_hier.app.launch.LocalWorld", must_not_run)
    monkeypatch.setattr("zeropp_hier.app.run.build_engine", must_not_run)
    for key in ("RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    spec = JobSpec(model=MODELS["neox_20b"], local_world=8, memory_gb=16.0)
    with pytest.raises(HierConfigError) as e:
        launch.launch(spec)
    assert e.value.field == "model"
    msg = str(e.value)
    assert "16 GB budget" in msg and "memory_gb=16" in msg
    needed = float(msg.split("needs ")[1].split(" GB")[0])
    assert needed > 16


def test_predicted_gb_equals_the_planner_memory():
    spec = JobSpec(
        model=MODELS["neox_1_4b"], micro_batch=1, dtype="bf16", activation_checkpointing="torch", memory_gb=100.0
    )
    lines = memory_check.check(spec, 8, 8, None)
    m = MODELS["neox_1_4b"]
    from zeropp_hier.app.spec import n_params

    wl = planner.gpt_workload(float(n_params(m)), m.layers, m.hidden, m.seq_len, 1, weight_bytes=2, vocab=m.vocab_size)
    cluster = planner.emulated(nodes=2, gpus_per_node=2, gcds_per_gpu=2)
    cand = planner.Candidate("frontier", False, "frontier", planner.compression_for("frontier"))
    # on the GPUs frontier runs in ticks of DEFAULT_TICK_CHUNKS chunks: their staging counts
    from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS

    assert planner.issue_mode_of(cand, replace(cluster, library="rccl")) == "ticks"
    total = planner.memory(cand, cluster, wl, chunks=DEFAULT_TICK_CHUNKS).total / 1e9
    row = next(line for line in lines if line.startswith("| frontier |"))
    assert float(row.split("|")[-3]) == pytest.approx(total, rel=1e-2)
    assert "pipeline staging" in lines[1]


def test_a_preset_that_fits_is_named_as_the_fix():
    spec = JobSpec(
        model=MODELS["neox_1_4b"], micro_batch=1, dtype="bf16", activation_checkpointing="torch", memory_gb=9.6
    )
    with pytest.raises(HierConfigError) as e:
        memory_check.check(spec, 8, 8, None)
    assert e.value.field == "preset" and e.value.value == "frontier"
    assert "preset zeropp fits" in str(e.value) and "9.6 GB budget" in str(e.value)


def test_a_fitting_spec_passes_and_prints_the_table():
    lines = memory_check.check(JobSpec(memory_gb=1.0), 8, 8, None)
    assert "budget 1 GB (memory_gb=1)" in lines[0] and "2x2x2" in lines[0]
    row = next(line for line in lines if line.startswith("| frontier |"))
    assert row.rstrip().endswith("| yes |")


def test_device_budgets():
    assert memory_check.device_budget("AMD Instinct MI250X", 8)[0] == 64e9
    assert memory_check.device_budget("NVIDIA H100 80GB HBM3", 4)[0] == 80e9
    assert memory_check.device_budget("NVIDIA A100-SXM4-40GB", 4, 40e9)[0] == 40e9
    cpu8, cpu1 = memory_check.device_budget(None, 8)[0], memory_check.device_budget(None, 1)[0]
    assert cpu8 == pytest.approx(cpu1 / 8)


def test_memory_gb_is_checked():
    with pytest.raises(HierConfigError) as e:
        JobSpec(memory_gb=-1).check()
    assert e.value.field == "memory_gb"


def test_whole_nodes_or_a_clear_error():
    with pytest.raises(HierConfigError) as e:
        memory_check.check(JobSpec(memory_gb=1.0), 6, 6, None)
    assert e.value.field == "topology"


def test_the_frontier_20b_run_fits_with_auto_topology():
    """docs/frontier.md's 20B run (topology=auto, fp32 default, activation checkpointing) on
    384 MI250X GCDs: auto is modelled as Frontier's 4 packages of 2 GCDs, and both presets fit."""
    for preset in ("frontier", "zeropp"):
        spec = JobSpec(
            model=MODELS["neox_20b"], preset=preset, topology={"mode": "auto"}, activation_checkpointing="torch"
        )
        lines = memory_check.check(spec, 384, 8, "AMD Instinct MI250X")
        assert "48x4x2" in lines[0] and "budget 64 GB" in lines[0]
        assert lines[-1].startswith(f"| {preset} |") and lines[-1].endswith("| yes |")


@pytest.mark.parametrize("preset", ["stock", "zero3", "frontier", "auto"])
def test_need_bytes_is_what_the_check_compares_with_the_budget(preset):
    """``need_bytes`` (what benchmarks/gpu/job.py sizes its model by) is the check's own figure:
    a budget just above it passes the check, one just below it is refused."""
    spec = JobSpec(
        preset=preset, model=MODELS["neox_1_4b"], micro_batch=1, dtype="bf16", activation_checkpointing="torch"
    )
    need = memory_check.need_bytes(spec, 8, 8, None)
    assert need > 0
    memory_check.check(replace(spec, memory_gb=1.001 * need / 1e9), 8, 8, None)
    with pytest.raises(HierConfigError):
        memory_check.check(replace(spec, memory_gb=0.999 * need / 1e9), 8, 8, None)


def test_parts_are_the_printed_table_as_data():
    """``parts`` (the dry run reports it beside what the engine holds) gives the rows ``check``
    prints: each part and the total, per layout."""
    spec = JobSpec(model=MODELS["neox_1_4b"], micro_batch=1, dtype="bf16", memory_gb=100.0)
    table = memory_check.parts(spec, 8, 8, None)
    lines = memory_check.check(spec, 8, 8, None)
    header = [c.strip() for c in lines[1].strip("|").split("|")]
    for layout, row in table.items():
        assert row["total"] == pytest.approx(sum(v for k, v in row.items() if k != "total"))
        printed = next(line for line in lines if line.startswith(f"| {layout} |"))
        cells = [c.strip() for c in printed.strip("|").split("|")]
        for part, value in row.items():
            name = "total GB" if part == "total" else part
            assert float(cells[header.index(name)]) == pytest.approx(value / 1e9, rel=1e-2), part
