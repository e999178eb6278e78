"""Functions the reliability tests run on every rank: dead and stuck ranks, interrupted and
damaged checkpoints, resharding, a long run. They return plain data; the tests assert.

Fault injection (a rank SIGKILLs itself, sleeps, or writes half a file and dies) happens in the
rank's own process, at a chosen point of real DeepSpeed code; nothing else is replaced.
"""

from __future__ import annotations

import gc
import io
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

from zeropp_hier.app import run as app_run
from zeropp_hier.app.data.tokens import synthetic_batch

# -- dead and stuck ranks -------------------------------------------------------------------------


def die_mid_step(config: dict, victim: int, stuck: int, kill_step: int) -> str:
    """Train; in the forward pass of ``kill_step``, ``victim`` SIGKILLs itself and ``stuck``
    stops (sleeps) just before a layer's gather: one dead peer, one silent peer."""
    engine = app_run.build_engine(config)
    rank = dist.get_rank()

    def hook(module, inputs):
        if engine.global_steps == kill_step:
            if rank == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == stuck:
                time.sleep(3600)

    engine.module.blocks[1].fc.register_forward_pre_hook(hook)
    app_run.train_steps(engine, kill_step + 2)
    return "finished"  # never reached: the test fails if it is


def stall_before_step(config: dict, stuck: int, stall_step: int) -> str:
    """``stuck`` stops between backward and ``engine.step()``: the other ranks wait in
    DeepSpeed's own gradient-norm all-reduce, on DeepSpeed's data-parallel group."""
    engine = app_run.build_engine(config)
    c = engine.module.config
    rank = dist.get_rank()
    for step in range(stall_step + 2):
        x, y = synthetic_batch(c, engine.train_micro_batch_size_per_gpu(), step, rank)
        engine.backward(engine(x, y))
        if step == stall_step and rank == stuck:
            time.sleep(3600)
        engine.step()
    return "finished"


# -- checkpoints ----------------------------------------------------------------------------------


def _die_while_writing(engine, victim: int, marker: str) -> None:
    """On ``victim``: the next save of a file whose name contains ``marker`` writes half of the
    real serialized bytes, then the process is SIGKILLed (a node lost mid-write)."""
    if dist.get_rank() != victim:
        return
    real_save = engine.checkpoint_engine.save

    def save(state_dict, path):
        if marker not in os.path.basename(path):
            return real_save(state_dict, path)
        buf = io.BytesIO()
        torch.save(state_dict, buf)
        data = buf.getvalue()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    engine.checkpoint_engine.save = save


def save_then_die_in_save(config: dict, root: str, victim: int, steps_good: int, steps_more: int) -> str:
    """Save tag "good" after ``steps_good`` steps, train on, and lose ``victim`` while it writes
    its optimizer file of tag "bad"."""
    engine = app_run.build_engine(config)
    app_run.train_steps(engine, steps_good)
    engine.save_checkpoint(root, tag="good")
    app_run.train_steps(engine, steps_more, start=steps_good)
    _die_while_writing(engine, victim, "optim_states")
    engine.save_checkpoint(root, tag="bad")
    return "finished"  # never reached


def resume_from_latest(config: dict, root: str, steps_good: int, steps_after: int) -> dict:
    """An uninterrupted run vs a fresh engine that loads whatever ``latest`` names and continues."""
    ref = app_run.build_engine(config)
    ref_losses = app_run.train_steps(ref, steps_good + steps_after)
    ref_state = app_run.gathered_state(ref)
    app_run.release(ref)

    engine = app_run.build_engine(config, seed=123)  # another init: the load must overwrite it
    path, _ = engine.load_checkpoint(root)
    loaded_steps = engine.global_steps
    losses = app_run.train_steps(engine, steps_after, start=steps_good)
    state = app_run.gathered_state(engine)
    app_run.release(engine)
    return {
        "path": path,
        "loaded_steps": loaded_steps,
        "ref_losses": ref_losses[steps_good:],
        "losses": losses,
        "ref_state": ref_state,
        "state": state,
    }


def try_loads(config: dict, cases: dict, good: tuple) -> dict:
    """Load each damaged checkpoint (root, tag) in ``cases`` into one engine, expecting refusal;
    then load ``good``. The engine's weights must be untouched by every refused load, and the
    world must stay usable (every rank refused the same way, nobody is left in a collective)."""
    import zeropp_hier

    engine = app_run.build_engine(config, seed=123)
    before = app_run.gathered_state(engine)
    errors = {}
    for name, (root, tag) in cases.items():
        try:
            engine.load_checkpoint(root, tag=tag)
            errors[name] = None
        except zeropp_hier.HierCheckpointError as e:
            errors[name] = {"path": e.path, "message": str(e)}
    after = app_run.gathered_state(engine)
    untouched = max(float((after[n] - before[n]).abs().max()) for n in before)
    path, _ = engine.load_checkpoint(*good)
    loaded = app_run.gathered_state(engine)
    moved = max(float((loaded[n] - before[n]).abs().max()) for n in before)
    losses = app_run.train_steps(engine, 1, start=engine.global_steps)
    app_run.release(engine)
    return {"errors": errors, "untouched": untouched, "good_path": path, "moved": moved, "loss_after": losses[0]}


# -- resharding -----------------------------------------------------------------------------------


def global_batch(c, micro: int, step: int, rank: int):
    """Sample i of the global batch depends on (step, i) only, so that 8 ranks x 2 and 4 ranks x 4
    see the same 16 samples per step and, averaged, compute the same gradient."""
    xs, ys = zip(*(synthetic_batch(c, 1, step, rank * micro + j) for j in range(micro)))
    return torch.cat(xs), torch.cat(ys)


def train_global(engine, steps: int, start: int) -> list[float]:
    """Per step, the loss averaged over every rank (= the loss of the global batch)."""
    c, micro, world = engine.module.config, engine.train_micro_batch_size_per_gpu(), dist.get_world_size()
    out = []
    for step in range(start, start + steps):
        x, y = global_batch(c, micro, step, dist.get_rank())
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        t = loss.detach().float().reshape(1).clone()
        dist.all_reduce(t)
        out.append(float(t) / world)
    return out


def reshard_source(config: dict, root: str, steps_before: int, steps_after: int) -> dict:
    engine = app_run.build_engine(config)
    train_global(engine, steps_before, 0)
    engine.save_checkpoint(root, tag="reshard")
    saved = app_run.gathered_state(engine)
    ref_losses = train_global(engine, steps_after, steps_before)
    ref_state = app_run.gathered_state(engine)
    app_run.release(engine)
    return {"saved": saved, "ref_losses": ref_losses, "ref_state": ref_state}


def reshard_target(config: dict, root: str, steps_before: int, steps_after: int, control: tuple | None = None) -> dict:
    """Load ``<root>``'s latest checkpoint into an engine of this world, continue training.
    ``control = (config, native_root)``: also continue from the weights alone (DeepSpeed's
    ``load_optimizer_states=False``, which consolidates them with zero_to_fp32 from a native
    checkpoint of any world size), i.e. with fresh Adam states: the run the full load must
    *not* look like."""
    engine = app_run.build_engine(config, seed=123)
    engine.load_checkpoint(root)
    loaded = app_run.gathered_state(engine)
    losses = train_global(engine, steps_after, steps_before)
    state = app_run.gathered_state(engine)
    app_run.release(engine)
    out = {"loaded": loaded, "losses": losses, "state": state, "world": dist.get_world_size()}
    if control is not None:
        engine = app_run.build_engine(control[0], seed=123)
        engine.load_checkpoint(control[1], load_optimizer_states=False)
        out["weights_only_loaded"] = app_run.gathered_state(engine)
        out["weights_only_losses"] = train_global(engine, steps_after, steps_before)
        app_run.release(engine)
    return out


# -- long run -------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _os_threads() -> int:
    """Threads of this process as the OS sees them: gloo's transport threads are native, so
    ``threading.active_count()`` would not see them pile up."""
    return len(os.listdir("/proc/self/task"))


def _process_groups() -> int:
    from torch.distributed import distributed_c10d

    return len(distributed_c10d._world.pg_map)


def soak(config: dict, stock_config: dict, steps: int, every: int) -> dict:
    """``steps`` steps of ``config`` sampling resident memory, process groups, open files and
    threads every ``every`` steps; then the same steps of ``stock_config`` for the losses."""
    engine = app_run.build_engine(config)
    samples = []

    def sample(step, loss, seconds):
        if (step + 1) % every == 0:
            gc.collect()
            samples.append(
                {
                    "step": step + 1,
                    "rss": _rss_bytes(),
                    "groups": _process_groups(),
                    "fds": len(os.listdir("/proc/self/fd")),
                    "threads": _os_threads(),
                    # a thread that is not a daemon would keep a failed rank from exiting
                    "non_daemon": [
                        t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()
                    ],
                }
            )

    groups_before = _process_groups()
    t0 = time.perf_counter()
    losses = app_run.train_steps(engine, steps, on_step=sample)
    seconds = time.perf_counter() - t0
    app_run.release(engine)
    stock = app_run.build_engine(stock_config)
    t0 = time.perf_counter()
    stock_losses = app_run.train_steps(stock, steps)
    stock_seconds = time.perf_counter() - t0
    app_run.release(stock)
    return {
        "losses": losses,
        "stock_losses": stock_losses,
        "samples": samples,
        "groups_before": groups_before,
        "seconds": seconds,
        "stock_seconds": stock_seconds,
    }


# -- bad configs in a real world ------------------------------------------------------------------
def initialize_bad_configs(configs: list) -> dict:
    """``zeropp_hier.initialize`` on every config of ``configs`` (all invalid), a real model each
    time. Records the error class and field per config, the process-group count before and after,
    and whether the world still answers a collective afterwards (nobody left inside one)."""
    import zeropp_hier
    from zeropp_hier.app.model.gpt import GPT, GPTConfig
    from zeropp_hier.core.errors import HierConfigError

    groups_before = _process_groups()
    outcomes = []
    for cfg in configs:
        model = GPT(GPTConfig())
        try:
            zeropp_hier.initialize(model=model, model_parameters=model.parameters(), config=cfg)
            outcomes.append(("accepted", None))
        except HierConfigError as e:
            outcomes.append((type(e).__name__, e.field))
        except Exception as e:  # noqa: BLE001 - the test reports what escaped
            outcomes.append((f"escaped {type(e).__name__}", str(e)[:300]))
    t = torch.ones(1)
    dist.all_reduce(t)  # every rank got here: no rank is waiting inside a half-started collective
    return {"outcomes": outcomes, "groups_before": groups_before, "groups_after": _process_groups(), "sum": t.item()}


def engines_one_after_another(config: dict, engines: int) -> list:
    """Build, train a step and release ``engines`` engines in turn; after each, the number of
    process groups and of this process's threads (a long-lived process must not accumulate them)."""
    out = []
    for _ in range(engines):
        engine = app_run.build_engine(config)
        app_run.train_steps(engine, 1)
        app_run.release(engine)
        gc.collect()
        out.append({"groups": _process_groups(), "threads": _os_threads()})
    return out
