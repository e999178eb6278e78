"""What every rank runs for tests/test_netfail.py, inside the emulated cluster.

    python -m tests.system.netfail_rank '<json plan>'   (from the repository root)

The plan gives a DeepSpeed config, a list of run labels and a number of steps. For each label
rank 0 raises a mark (``MARK <label>``: the driver changes the network there, every rank waits),
then every rank builds a fresh engine with the same seed, trains the steps and reports its
losses and step times (rank 0: ``RESULT``). With ``event_step`` set, rank 0 prints
``EVENT step <n>`` in the forward pass of that step, inside the first block, and goes on: the
driver breaks the network in the middle of the step.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning)


def main() -> int:
    plan = json.loads(sys.argv[1])
    from zeropp_hier.launch.world import RANK_MODULES, import_frozen

    # what the job's own ranks do ([Note: frozen start-up objects]): the imports frozen, so that
    # neither engine's build and release nor the exit walks them again
    import_frozen([*RANK_MODULES, "zeropp_hier.app.run", "benchmarks.cluster.rankside"])
    import torch

    torch.set_num_threads(1)
    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel("ERROR")
    deepspeed.init_distributed(dist_backend="gloo")
    import torch.distributed as dist

    from benchmarks.cluster.rankside import event, mark, send_result
    from zeropp_hier.app import run as app_run

    rank = dist.get_rank()
    for label in plan["runs"]:
        mark(label)
        engine = app_run.build_engine(plan["config"])
        if plan.get("event_step") is not None:

            def hook(module, inputs, step=plan["event_step"]):
                if engine.global_steps == step and not getattr(hook, "done", False):
                    hook.done = True
                    event(f"step {step}")

            engine.module.blocks[0].register_forward_pre_hook(hook)
        times: list[float] = []
        t0 = time.perf_counter()
        losses = app_run.train_steps(engine, plan["steps"], on_step=lambda s, loss, dt: times.append(dt))
        wall = time.perf_counter() - t0
        app_run.release(engine)
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, {"losses": losses, "times": times, "wall": wall})
        if rank == 0:
            send_result({"label": label, "per_rank": per_rank})
    mark("done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except Exception:
        import traceback

        traceback.print_exc()
        # when it raised (wall clock), after the traceback so the driver's tail keeps both
        print(f"FAILED_AT {time.time():.3f}", file=sys.stderr, flush=True)
        code = 1
    sys.exit(code)
