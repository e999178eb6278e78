"""The main job with plain command-line flags (the Hydra app ``python -m zeropp_hier.app.train`` is
the same job with config groups and sweeps; both run ``zeropp_hier.app.job``).

    python -m zeropp_hier.app.demo                       # 8 ranks = 2 nodes x 2 GPUs x 2 GCDs, frontier preset
    python -m zeropp_hier.app.demo --preset zeropp --steps 50
    python -m zeropp_hier.app.demo --preset stock        # stock DeepSpeed ZeRO-3, for comparison

Without a launcher it starts its own ranks (gloo on CPU); under ``srun`` or ``torchrun`` it runs
as one rank per process. Rank 0 prints, per step, the loss (mean over ranks), tokens/s and the
bytes one rank sent over each tier, then a per-phase table. Exit status 0 when the loss fell.
"""

from __future__ import annotations

import argparse
import json
import sys

from .job import DTYPES, PRESETS, JobSpec, launch
from .models import CHECKPOINTING, MODELS

DEFAULT = JobSpec()  # every flag's default comes from the one spec


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d, topo = DEFAULT, DEFAULT.topology
    ap.add_argument("--preset", choices=PRESETS, default=d.preset)
    ap.add_argument(
        "--compression",
        default=None,
        help="'none' to switch compression off, or a JSON object for zeropp_hier.compression "
        "(default: the preset's own)",
    )
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--nodes", type=int, default=d.local_world // (topo["gpus_per_node"] * topo["gcds_per_gpu"]))
    ap.add_argument("--gpus-per-node", type=int, default=topo["gpus_per_node"])
    ap.add_argument("--gcds-per-gpu", type=int, default=topo["gcds_per_gpu"])
    ap.add_argument("--dtype", choices=DTYPES, default=d.dtype)
    ap.add_argument("--micro-batch", type=int, default=d.micro_batch)
    ap.add_argument("--model", choices=list(MODELS), default="tiny", help="named size (zeropp_hier.app.models)")
    ap.add_argument("--activation-checkpointing", choices=CHECKPOINTING, default=d.activation_checkpointing)
    ap.add_argument("--data", default=d.data_path, help="a `zeropp-hier data prepare` directory (default: synthetic)")
    ap.add_argument("--out-dir", default=d.out_dir, help="write metrics.jsonl and summary.json here")
    return ap.parse_args(argv)


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    comp = args.compression
    if comp is not None and comp not in ("none", "int8", "int4", "fp16", "bf16"):
        comp = json.loads(comp)
    return JobSpec(
        preset=args.preset,
        compression=comp,
        steps=args.steps,
        dtype=args.dtype,
        micro_batch=args.micro_batch,
        model=MODELS[args.model],
        activation_checkpointing=args.activation_checkpointing,
        data_path=args.data,
        topology={"gpus_per_node": args.gpus_per_node, "gcds_per_gpu": args.gcds_per_gpu},
        local_world=args.nodes * args.gpus_per_node * args.gcds_per_gpu,
        out_dir=args.out_dir,
    )


def main(argv=None) -> int:
    out = launch(spec_from_args(parse_args(argv)))
    return 0 if out["final_loss"] < out["first_loss"] else 1


if __name__ == "__main__":
    sys.exit(main())
