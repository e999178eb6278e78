"""Assertion helpers shared by the distributed tests."""

import math

import pytest

from zeropp_hier.detect.hardware import cpu_summary


def _fp16_refused() -> str | None:
    """Why DeepSpeed will refuse fp16 in this machine's CPU ranks, or None. Asks DeepSpeed's CPU
    accelerator itself: the question its ``_do_sanity_check`` asks before refusing."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    if CPU_Accelerator().is_fp16_supported():
        return None
    return f"no fp16 on this CPU: DeepSpeed's CPU accelerator refuses it (oneDNN lacks fp16; {cpu_summary()})"


FP16_REFUSED = _fp16_refused()
# the one honest skip: the hardware lacks the capability (fp16 tests run where oneDNN has fp16).
# Each such test also carries the marker ``cpu_fp16`` (pyproject.toml), so that whoever is on a
# capable host runs them on purpose: ``python -m pytest -m cpu_fp16 tests`` (docs/usage.md lists
# them). ``FP16_MARKS`` for ``pytest.param(..., marks=FP16_MARKS)``, ``@requires_fp16`` for a test.
FP16_MARKS = (pytest.mark.cpu_fp16, pytest.mark.skipif(FP16_REFUSED is not None, reason=FP16_REFUSED or ""))


def requires_fp16(test):
    for mark in FP16_MARKS:
        test = mark(test)
    return test


def error_feedback_expected(ds_config: dict) -> bool:
    """Whether a config keeps error-feedback residuals: any tier's flag as the package's own
    parser resolves it (the preset's defaults, then the section's ``compression``)."""
    from zeropp_hier.core.config import hier_config_from_ds
    from zeropp_hier.core.vocab import TIERS

    cfg = hier_config_from_ds(ds_config)
    return cfg.enabled and any(getattr(cfg.compression.error_feedback, t) for t in TIERS)


def nonfinite_carried(run: dict, ef_expected: bool) -> list[str]:
    """What a run that met a non-finite gradient carried into its later steps, one sentence each
    ([] when nothing): a non-finite loss, a non-finite error-feedback residual, or residuals that
    disagree with the config (none where it keeps them proves nothing about them; some where it
    keeps none is a bug). ``run``: ``losses``, ``ef_finite``, ``ef_buffers``
    (tests/dist/ranks_numerics.py)."""
    found = []
    bad = [(step, x) for step, x in enumerate(run["losses"]) if not math.isfinite(x)]
    if bad:
        found.append(f"non-finite losses (step, loss): {bad}")
    if not run["ef_finite"]:
        found.append("a non-finite error-feedback residual")
    if ef_expected and run["ef_buffers"] == 0:
        found.append("no error-feedback residual, though the config keeps them: nothing about them was checked")
    if not ef_expected and run["ef_buffers"]:
        found.append(f"{run['ef_buffers']} error-feedback residuals, though the config keeps none")
    return found


def data_job_spec(tmp_path, name: str, **kw):
    """The small job the resume, kill and monitoring tests run on prepared data in
    ``tmp_path/data``, writing to ``tmp_path/name``; ``kw`` sets ``steps`` and replaces any field."""
    from zeropp_hier.app.spec import JobSpec, ModelSpec

    fields = dict(
        micro_batch=2,
        model=ModelSpec(seq_len=32),
        data_path=str(tmp_path / "data"),
        progress="off",
        out_dir=str(tmp_path / name),
    )
    return JobSpec(**{**fields, **kw})


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def assert_losses_close(got, ref, rtol, what):
    assert len(got) == len(ref), what
    for step, (g, r) in enumerate(zip(got, ref)):
        assert math.isfinite(g), f"{what}: step {step} loss {g}"
        assert rel_diff(g, r) <= rtol, f"{what}: step {step} loss {g} vs stock {r} (rtol {rtol})"


def assert_states_close(got: dict, ref: dict, atol, what):
    assert got.keys() == ref.keys(), what
    for name in ref:
        err = float((got[name] - ref[name]).abs().max())
        assert err <= atol, f"{what}: parameter {name} differs from stock by {err} (atol {atol})"


def max_state_diff(got: dict, ref: dict) -> float:
    """The largest absolute difference of two state dicts over ``ref``'s tensors, in fp32."""
    return max(float((got[n].detach().float() - ref[n].detach().float()).abs().max()) for n in ref)


def set_path(section: dict, path: tuple, value) -> dict:
    """Set ``path`` in a copy of ``section``, turning whatever is on the way into objects."""
    out = dict(section)
    node = out
    for key in path[:-1]:
        child = node.get(key)
        child = dict(child) if isinstance(child, dict) else {}
        node[key] = child
        node = child
    node[path[-1]] = value
    return out


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None when the
    process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def marked_processes(mark: str) -> list[int]:
    """Live processes (not zombies) whose initial environment carries ``mark`` (``NAME=value``):
    how a test proves that nothing it started survives it."""
    import os

    want = mark.encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        stat = _stat(pid)
        if stat is not None and stat[0] != "Z":
            found.append(int(pid))
    return found


def world_processes(world) -> list[int]:
    """Live processes (not zombies) of a ``LocalWorld``: its ranks, by pid, and every process
    whose initial environment carries the world's mark (what a rank started; a spawned rank
    itself), less this test process's multiprocessing fork server. A preloaded world's ranks are
    forked by that server, so their own initial environment is the server's: they are found by
    pid. The server starts on the session's first preloaded world (and so may carry that world's
    mark) and serves every later one; it is no rank and outlives each world by design."""
    import os

    def my_fork_server(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            return False
        stat = _stat(pid)
        return b"multiprocessing.forkserver" in cmd and stat is not None and int(stat[1]) == os.getpid()

    marked = marked_processes(f"ZEROPP_HIER_WORLD_ID={world.world_id}")
    ranks = [pid for pid in world.pids if (stat := _stat(pid)) is not None and stat[0] != "Z"]
    return sorted(pid for pid in {*marked, *ranks} if not my_fork_server(pid))
