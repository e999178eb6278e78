"""``zeropp-hier train [overrides] dryrun.nodes=N [dryrun.rank=R]``: the job's overrides composed
as ``zeropp-hier train`` composes them, then one rank of it run here (``job.dry_run_job``)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from typing import Any, Mapping, cast

from ..core.errors import HierConfigError
from .world import DryWorld


def settings(overrides: list[str]) -> tuple[Any, dict]:
    """The job (``JobSpec``) and the ``dryrun`` section the overrides compose to."""
    import hydra
    from omegaconf import OmegaConf

    from ..app.train import spec_from_config

    with hydra.initialize_config_module(version_base="1.3", config_module="zeropp_hier.app.configs"):
        cfg = hydra.compose("train", overrides=[o for o in overrides if not o.startswith("hydra.")])
        plain = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    return spec_from_config(plain), dict(plain["dryrun"])


def run_from_config(spec: Any, dry: Mapping[str, Any], out_dir: str | None = None) -> dict:
    """Run the dry run ``dry`` (the ``dryrun`` section) of ``spec``; print and write the report."""
    from . import job, report

    world = DryWorld(nodes=dry["nodes"], rank=dry["rank"], gpus=dry["gpus"], gcds=dry["gcds"])
    world.check()
    steps = dry["steps"]
    if not isinstance(steps, int) or steps < 1:
        raise HierConfigError(
            "dryrun.steps", steps, "use a positive integer (2 or more: the first step builds caches)"
        )
    if out_dir is None:
        out_dir = os.path.abspath(os.path.join("outputs", "dryrun", time.strftime("%Y-%m-%d_%H-%M-%S")))
    spec = replace(spec, out_dir=spec.out_dir or out_dir)
    rep = job.dry_run_job(
        spec,
        world,
        steps=steps,
        trace_memory=bool(dry.get("tracemalloc", True)),
        profile=bool(dry.get("profile", False)),
    )
    path = report.write(rep, dry.get("out") or os.path.join(spec.out_dir, "dryrun.json"))
    print("\n".join(report.lines(rep)), flush=True)
    print(f"report: {path}", flush=True)
    return rep


def main(overrides: list[str]) -> int:
    try:
        spec, dry = settings(overrides)
        run_from_config(spec, dry)
    except HierConfigError as e:
        print(str(e), file=sys.stderr, flush=True)
        return 1
    return 0


__all__ = ["main", "run_from_config", "settings"]
