"""Functions the boundary tests run on every rank: a hop gather queued on the real executor, then
the step's boundary operations of a real engine ([Note: quiet boundaries] in
zeropp_hier/comm/boundary.py). They return plain data; the tests assert.

The gather is a real hierarchical all-gather on the engine's hop groups (``gather.hop_steps``,
the driver every parameter gather runs), queued behind a *gate*: a job on the gather's first lane
that waits for an event. Only a watcher thread opens the gate, and only once it sees the drain's
barrier job submitted; so when the boundary operation begins, the gather is certainly queued,
and it can finish only through the drain. Observers record, when the operation's own work
starts (the agreed non-finite check, DeepSpeed's first file write or read), whether the gather
had finished and how many collectives were still in flight; they call the real functions.
"""

from __future__ import annotations

import os
import threading

import torch
import torch.distributed as dist

from zeropp_hier.app import run as app_run
from zeropp_hier.app.data.tokens import synthetic_batch
from zeropp_hier.comm import gather
from zeropp_hier.comm.job import Move

WAIT_S = 120.0
S = 8  # elements per rank


def _queue_gated_gather(rt, events: list) -> tuple:
    """Queue the gate, then a real hop gather behind it; a watcher opens the gate when the drain
    submits its barrier (the executor's in-flight count grows past the two)."""
    ex = rt.executor
    hops = gather.hops_for(rt.plan, (), "other_gather")
    lanes = [h.axes for h in hops]
    gate = threading.Event()

    def gate_job():
        yield Move(lanes[0])
        if not gate.wait(WAIT_S):
            raise AssertionError("the gate was never opened: nothing drained the executor")
        return None

    start = (torch.arange(S, dtype=torch.float32) + 1000.0 * rt.rank).view(1, 1, 1, S)
    gate_fut = ex.submit(gate_job(), [lanes[0]])
    gather_fut = ex.submit(gather.hop_steps(rt.comm, hops, start, "other_gather"), lanes)
    gather_fut.add_done_callback(lambda f: events.append("gather done"))
    queued = ex.in_flight
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if ex.in_flight > queued:  # the drain's barrier job: nothing else submits meanwhile
                events.append("drain began")
                gate.set()
                return
            stop.wait(0.001)
        gate.set()  # the operation ended without draining: free the lane so the world can go on

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return ex, gate_fut, gather_fut, queued, stop, watcher


def _observe(obj, name: str, label: str, events: list, ex, gather_fut, seen: dict) -> None:
    real = getattr(obj, name)

    def observed(*args, **kwargs):
        if label not in seen:
            seen[label] = {"gather_done": gather_fut.done(), "in_flight": ex.in_flight}
            events.append(label)
        return real(*args, **kwargs)

    setattr(obj, name, observed)


def _finish(ex, gate_fut, gather_fut, stop, watcher) -> dict:
    stop.set()
    watcher.join(WAIT_S)
    ex.result(gate_fut)
    full = ex.result(gather_fut)
    rows = sorted(float(v) for v in full.reshape(-1, S)[:, 0])
    by_row = full.reshape(-1, S)
    return {"rows": rows, "row_ok": bool((by_row[:, 1:] - by_row[:, :1] == torch.arange(1, S)).all())}


def boundaries_drain(config: dict, root: str) -> dict:
    """For the optimizer step, a save and a load: queue a gated gather, run the operation,
    and report what the observers saw and the order of events."""
    engine = app_run.build_engine(config)
    app_run.train_steps(engine, 1)
    rt = engine.hier_runtime
    c = engine.module.config
    out = {}
    for op in ("step", "save", "load"):
        events: list = []
        seen: dict = {}
        if op == "step":  # forward and backward first: the gate would hold their own gathers
            x, y = synthetic_batch(c, engine.train_micro_batch_size_per_gpu(), 1, dist.get_rank())
            engine.backward(engine(x, y))
        ex, gate_fut, gather_fut, queued, stop, watcher = _queue_gated_gather(rt, events)
        if op == "step":
            _observe(rt.numerics, "agree", "numerics agreement", events, ex, gather_fut, seen)
            engine.step()
            del rt.numerics.agree
        elif op == "save":
            _observe(engine.checkpoint_engine, "save", "first file write", events, ex, gather_fut, seen)
            engine.save_checkpoint(root, tag="t")
            del engine.checkpoint_engine.save
        else:
            _observe(engine.checkpoint_engine, "load", "first file read", events, ex, gather_fut, seen)
            engine.load_checkpoint(root)
            del engine.checkpoint_engine.load
        result = _finish(ex, gate_fut, gather_fut, stop, watcher)
        out[op] = {"queued": queued, "events": events, "seen": seen, **result}
    app_run.release(engine)
    return {"ops": out, "world": dist.get_world_size(), "saved": os.path.isdir(os.path.join(root, "t"))}
