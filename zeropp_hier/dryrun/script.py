"""A dry run of a user's own script: ``start`` before it builds anything, ``finish`` after;
or ``python -m zeropp_hier.dryrun --nodes N [--rank R] script.py [args]``, which does both
around the script.

Between them this process is rank ``rank`` of ``nodes x gpus x gcds`` on the fake process group
with the mirror in place: the script's own ``init_process_group`` / ``deepspeed.init_distributed``
find it initialised. Every engine ``zeropp_hier.initialize`` returns is instrumented: each
``engine.step()`` ends a step (host seconds of forward, backward and step), and
``save_checkpoint`` / ``load_checkpoint`` are the save and load phases.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
import time
from typing import Any

from .job import _manifest_problems_kept
from .meters import Meters
from .mirror import Mirror
from .world import DryWorld, flush_subnormals, init_fake_world, keep_subnormals


class Session:
    """One dry run of a script (``start``'s result)."""

    def __init__(self, world: DryWorld, trace_memory: bool) -> None:
        self.world = world
        self.meters = Meters(trace_memory=trace_memory)
        self.mirror = Mirror(self.meters)
        self.t0 = time.perf_counter()
        self.steps = 0
        self._real_initialize: Any = None
        self.manifest_problems: list = []
        self.flushed = False  # subnormals ([Note: subnormals in a CPU dry run])

    def _engine(self, engine: Any) -> None:
        m = self.meters
        for part in ("forward", "backward"):
            setattr(engine, part, m.timed(part, getattr(engine, part)))
        timed_step = m.timed("step", engine.step)

        def step(*args: Any, **kwargs: Any) -> Any:
            boundary = engine.is_gradient_accumulation_boundary()  # before step() advances it
            out = timed_step(*args, **kwargs)
            if boundary:
                self.steps += 1
                m.begin(f"step{self.steps}")
            return out

        engine.step = step
        for name, phase in (("save_checkpoint", "save"), ("load_checkpoint", "load")):
            real = getattr(engine, name)

            def around(*args: Any, _real: Any = real, _phase: str = phase, **kwargs: Any) -> Any:
                m.begin(_phase)
                try:
                    if _phase == "save":
                        return _real(*args, **kwargs)
                    with _manifest_problems_kept(self.manifest_problems):  # as the job's dry run
                        return _real(*args, **kwargs)
                finally:
                    m.begin(f"step{self.steps}")

            setattr(engine, name, around)

    def install(self) -> None:
        import zeropp_hier

        self.meters.__enter__()
        self.meters.begin("process_group")
        init_fake_world(self.world)
        self.mirror.install()
        self.flushed = flush_subnormals()
        self.meters.begin("engine")
        real = zeropp_hier.initialize
        self._real_initialize = real

        @functools.wraps(real)
        def initialize(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            self._engine(out[0])
            self.meters.begin("step0")
            return out

        zeropp_hier.initialize = initialize

    def finish(self, out: str | None = None) -> dict:
        """Stop counting; print the report and write its JSON to ``out`` (default
        ``dryrun.json`` in the current directory). Returns the report."""
        import zeropp_hier

        from . import report

        self.meters.end()
        # the step begun by the last engine.step() has no work in it
        self.meters.phases.pop(f"step{self.steps}", None)
        memory = self.meters.memory()
        self.meters.__exit__(None, None, None)
        self.mirror.uninstall()
        if self.flushed:
            keep_subnormals()
        if self._real_initialize is not None:
            zeropp_hier.initialize = self._real_initialize

        class _Spec:  # what the report names of the job
            preset = os.environ.get("ZEROPP_HIER_PRESET", "(the script's)")

            class model:  # noqa: N801 - a namespace
                hidden = layers = None

        result = {
            "manifest_problems_from_the_mirror": len(self.manifest_problems),
            "steps": self.steps,
            "subnormals_flushed": self.flushed,
        }
        rep = report.build(_Spec, self.world, self.meters, memory, result, time.perf_counter() - self.t0)
        path = report.write(rep, out or "dryrun.json")
        print("\n".join(report.lines(rep)), flush=True)
        print(f"report: {path}", flush=True)
        return rep


_session: list[Session] = []


def start(nodes: int, rank: int = 0, gpus: int = 4, gcds: int = 2, trace_memory: bool = True) -> Session:
    """Make this process rank ``rank`` of ``nodes x gpus x gcds`` for a dry run (before the
    script initialises torch.distributed or builds a model)."""
    s = Session(DryWorld(nodes=nodes, rank=rank, gpus=gpus, gcds=gcds), trace_memory)
    s.install()
    _session.append(s)
    return s


def finish(out: str | None = None) -> dict:
    """End the dry run ``start`` began: print and write its report."""
    if not _session:
        raise RuntimeError("zeropp_hier.dryrun.finish: no dry run was started (call start(nodes=...) first)")
    return _session.pop().finish(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m zeropp_hier.dryrun",
        description="run a script as one rank of an N-node job on the fake process group (docs/usage.md)",
    )
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--gpus", type=int, default=4, help="packages per node (Frontier: 4)")
    ap.add_argument("--gcds", type=int, default=2, help="GCDs per package (Frontier: 2)")
    ap.add_argument("--no-tracemalloc", action="store_true")
    ap.add_argument("--out", default=None, help="the report's JSON (default: dryrun.json)")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    start(a.nodes, a.rank, a.gpus, a.gcds, trace_memory=not a.no_tracemalloc)
    sys.argv = [a.script, *a.args]
    try:
        runpy.run_path(a.script, run_name="__main__")
    finally:
        finish(a.out)
    return 0


__all__ = ["Session", "finish", "main", "start"]
