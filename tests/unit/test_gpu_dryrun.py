"""benchmarks/gpu/dryrun.py's plan of runs (pure): which dry runs it starts, longest first, with
the overrides the CPU benchmarks use for the same jobs, and what it records of a failed run."""

from benchmarks.cpu import dryrun_20b, dryrun_presets
from benchmarks.gpu import dryrun


def test_runs_are_named_by_job_and_size_the_20b_first():
    todo = dryrun.commands(["presets", "neox20b_4", "neox20b"], [48, 9408])
    names = list(todo)
    assert names[:4] == ["neox20b_48", "neox20b_9408", "neox20b_4_48", "neox20b_4_9408"]
    assert sorted(names[4:]) == sorted(f"{p}_{n}" for p in dryrun_presets.PRESETS for n in (48, 9408))
    # the presets' runs are the CPU table's commands; the 20B's the recipe's, 2 steps
    assert todo["zeropp_9408"] == dryrun_presets.command("zeropp", 9408)
    assert todo["neox20b_4_48"][: len(dryrun_20b.RECIPE)] == dryrun_20b.RECIPE
    assert "model.layers=4" in todo["neox20b_4_48"] and "model.layers=4" not in todo["neox20b_48"]
    assert todo["neox20b_9408"][-2:] == ["dryrun.nodes=9408", "dryrun.steps=2"]
    # 1536 sequences do not split over 75,264 ranks: the one shortening the whole recipe takes there
    assert "global_batch=null" in todo["neox20b_9408"] and "global_batch=null" not in todo["neox20b_48"]
    assert list(dryrun.commands(["presets"], [2])) == [f"{p}_2" for p in dryrun_presets.PRESETS]


def test_a_child_runs_the_dry_runs_own_entry_with_this_checkout_first():
    argv, env = dryrun_presets.child(["preset=zero3", "dryrun.nodes=2"], "/tmp/r.json", threads=2)
    assert "zeropp_hier.dryrun.cli" in argv[2] and argv[3:] == [
        "preset=zero3",
        "dryrun.nodes=2",
        "dryrun.out=/tmp/r.json",
    ]
    assert env["OMP_NUM_THREADS"] == "2" and env["PYTHONPATH"].split(":")[0] == dryrun_presets.ROOT


def test_a_failed_run_is_reported_with_its_log():
    line = dryrun.summary("frontier_48", {"rc": None, "wall_s": 240.0, "log_tail": "timed out after 240 s"})
    assert line.startswith("frontier_48: FAILED (rc None, 240.0 s)") and line.endswith("timed out after 240 s")


def test_each_size_keeps_its_median_run_and_every_runs_figures():
    def rep(cpu, rss):
        return {"per_step": {"cpu_seconds": cpu, "host_seconds": cpu + 0.01}, "memory": {"peak_rss_bytes": rss}}

    runs = [rep(1.9, 700), rep(1.2, 900), rep(1.4, 800)]
    kept = dryrun_presets.median_run(runs)
    # the run in the middle by CPU seconds per step, whatever its place in the order
    assert kept["per_step"]["cpu_seconds"] == 1.4 and kept["memory"]["peak_rss_bytes"] == 800
    assert [r["cpu_seconds"] for r in kept["repeats"]] == [1.9, 1.2, 1.4]
    assert [r["peak_rss_bytes"] for r in kept["repeats"]] == [700, 900, 800]
    # an even count keeps the lower middle
    assert dryrun_presets.median_run(runs[:2])["per_step"]["cpu_seconds"] == 1.2
