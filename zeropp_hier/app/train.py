"""The main job as a Hydra application (config groups in zeropp_hier/app/configs/), run as
``zeropp-hier train`` (``python -m zeropp_hier.app.train`` is the same):

    zeropp-hier train                                   # the README demo: 8 CPU ranks, 2x2x2
    zeropp-hier train data=tokens data.path=DIR model=small activation_checkpointing=torch
    zeropp-hier train preset=zeropp compression=none steps=50
    zeropp-hier train -m preset=zero3,frontier compression=preset_default,none
    zeropp-hier report multirun/<date>/<time>           # one table for the sweep

The defaults are ``JobSpec``'s (spec.py); the YAML repeats them and a unit test keeps the two equal.

Without a launcher it starts ``topology.local_ranks`` ranks itself; under ``srun`` or
``torchrun`` every process is one rank (use ``launcher=srun`` so that all ranks share one run
directory). Rank 0 writes ``metrics.jsonl`` (one line per step) and ``summary.json`` into the
Hydra run directory (a resumed run continues the first job's ``metrics.jsonl`` and monitors:
[Note: one run in the monitor] in app/monitoring/monitor_run.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Sequence, cast

import hydra
from omegaconf import DictConfig, OmegaConf

from ..core.errors import HierConfigError
from ..launch.world import WorldError
from .launch import launch
from .longrun.chain import config_error_in
from .monitoring.monitor import MonitorSpec
from .spec import JobSpec, ModelSpec, recipe_fields


def spec_from_overrides(overrides: Sequence[str]) -> JobSpec:
    """The job ``zeropp-hier train OVERRIDES...`` would run, composed without running it (Hydra's
    compose of this package's configs; ``hydra.*`` keys, which only place the run, are left out)."""
    with hydra.initialize_config_module(version_base="1.3", config_module="zeropp_hier.app.configs"):
        cfg = hydra.compose("train", overrides=[o for o in overrides if not o.startswith("hydra.")])
        return spec_from_config(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]


def spec_from_config(cfg: Mapping[str, Any], out_dir: str | None = None, label: dict | None = None) -> JobSpec:
    """The composed config (a plain dict) -> the job. Unknown keys were already refused by
    Hydra's struct mode; values are checked by ``JobSpec.check`` and at ``initialize``."""
    m, d, t = cfg["model"], cfg["data"], cfg["topology"]
    if d.get("kind") not in ("synthetic", "tokens"):
        raise HierConfigError(
            "data.kind",
            d.get("kind"),
            "use data=synthetic (generated on every rank) or data=tokens data.path=DIR "
            "(a `zeropp-hier data prepare` directory)",
        )
    path = d.get("path") if d["kind"] == "tokens" else None
    if d["kind"] == "tokens":
        if not path:
            raise HierConfigError("data.path", path, "name the directory `zeropp-hier data prepare --out DIR` wrote")
        from .data.blend import is_blend, parse_blend

        if is_blend(path):  # Megatron's `W1 PREFIX1 W2 PREFIX2 ...`: the weights as given, the prefixes absolute
            words = path.split()
            parse_blend(path)  # refused here, naming the field, if it is not weights and prefixes
            path = " ".join(w if i % 2 == 0 else os.path.abspath(w) for i, w in enumerate(words))
        else:
            path = os.path.abspath(path)  # every rank, and summary.json, see the same directory
    return JobSpec(
        preset=cfg["preset"]["name"],
        compression=cfg["compression"]["spec"],
        steps=cfg["steps"],
        dtype=cfg["dtype"],
        micro_batch=d["micro_batch"],
        model=ModelSpec(**m),
        activation_checkpointing=cfg["activation_checkpointing"],
        data_path=path,
        data_split=None if d.get("split") is None else str(d["split"]),
        data_cache_dir=os.path.abspath(d["cache_dir"]) if d.get("cache_dir") else None,
        topology=t["section"],
        local_world=t["local_ranks"],
        regather=cfg["regather"],
        save_every=cfg["save_every"],
        checkpoint_dir=cfg["checkpoint_dir"],
        resume=cfg["resume"],
        lr=cfg["lr"],
        warmup_steps=cfg["warmup_steps"],
        seed=cfg["seed"],
        init_from=os.path.abspath(cfg["init_from"]) if cfg.get("init_from") else None,
        out_dir=out_dir,
        memory_gb=cfg["memory_gb"],
        progress=cfg["progress"],
        label=label or {},
        **recipe_fields(cfg),  # the recipe group's keys and the user's DeepSpeed keys
        log_every=cfg["log_every"],
        monitor=MonitorSpec(**cfg["monitor"]),
        eval_every=cfg["eval_every"],
        eval_batches=cfg["eval_batches"],
    )


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig

    from .longrun.deadline import watch_signal_early

    watch_signal_early()  # Slurm's warning may come before the engine exists (app/longrun/deadline.py)
    hc = HydraConfig.get()
    plain = cast(dict, OmegaConf.to_container(cfg, resolve=True))  # a DictConfig becomes a dict
    # HydraConfig.get() is typed as the HydraConf dataclass but is a DictConfig at run time
    label = {"overrides": list(hc.overrides.task), "job_num": cast(DictConfig, hc.job).get("num")}
    try:
        spec = spec_from_config(plain, out_dir=hc.runtime.output_dir, label=label)
        if (plain.get("dryrun") or {}).get("nodes") is not None:
            # the dry run sits above the app (zeropp_hier/dryrun/): the command routes to it
            raise HierConfigError(
                "dryrun.nodes",
                plain["dryrun"]["nodes"],
                "run the dry run through the command: zeropp-hier train ... dryrun.nodes=N "
                "(or python -m zeropp_hier train ...)",
            )
        out = launch(spec)
    except HierConfigError as e:
        # [Note: a user's error in one line] Hydra reports an exception as a traceback ending in
        # "Set the environment variable HYDRA_FULL_ERROR=1"; a user's configuration error is one
        # line naming the key, the values and the fix (every rank under srun prints the same; the
        # chain reads it, app/longrun/chain.py), and a non-zero exit (SystemExit passes through Hydra).
        print(str(e), file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except WorldError as e:  # the ranks this process spawned refused it: the same one line
        line = config_error_in(str(e))
        if line is None:
            raise
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    return out["final_loss"]  # Hydra keeps it as the job's return value (sweepers can use it)


def rank_overrides(env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    """Hydra overrides for this process (pure): none for rank 0 or a process that spawns its
    ranks; for any other rank a launcher started (srun, torchrun: RANK or SLURM_PROCID not 0),
    no ``.hydra/`` copy of the config and no ``train.log`` file, so that the run directory the
    ranks share is written by rank 0 alone (75,264 ranks writing the same three YAML files and
    one log is a storm on the file system's metadata server, and the last writer wins). Such a
    rank still logs to its own stdout. A sweep (``-m``) is left as it is: its jobs are launched
    by Hydra itself."""
    if any(a in ("-m", "--multirun") for a in argv):
        return []
    rank = env.get("RANK") or (env.get("SLURM_PROCID") if int(env.get("SLURM_NTASKS", "1") or 1) > 1 else None)
    if rank is None or rank.strip() in ("", "0"):
        return []
    return ["hydra.output_subdir=null", "hydra/job_logging=stdout"]


def main_for_rank() -> None:
    """``main`` with this rank's overrides (``rank_overrides``) after the user's."""
    extra = [o for o in rank_overrides(os.environ, sys.argv[1:]) if o not in sys.argv]
    saved = sys.argv
    sys.argv = [*saved, *extra]
    try:
        main()
    finally:
        sys.argv = saved


if __name__ == "__main__":
    main_for_rank()
