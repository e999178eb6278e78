"""The engine on CUDA tensors: several ranks sharing one GPU, beside stock DeepSpeed ZeRO-3.

    python -m benchmarks.gpu.engine [--ranks 8] [--steps 6] [--out benchmarks/results/gpu_engine.json]

NCCL refuses two ranks of one communicator on one device, so the ranks talk through gloo, whose
collectives accept CUDA tensors (it stages them through host memory on its own threads). What
this shows: every tensor the engine and DeepSpeed handle lives on the GPU (parameters, shards,
kept copies, gradient buckets, quantized payloads), the GPU kernels run inside the engine, the
executor's side stream and its events order the hops, and the losses and weights equal stock
DeepSpeed's on the same GPU. What it does not show: NCCL/RCCL behaviour, link speeds, or any
timing worth quoting (gloo copies every collective through the host).

Host synchronisation: each step runs under ``torch.cuda.set_sync_debug_mode("warn")``; every
synchronising call is recorded with the phase (forward, backward, step) and the innermost
frame of this package or of DeepSpeed that made it. A second pass then runs the hierarchical
configurations' forward and backward under ``set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import argparse
import os
import threading
import traceback
import warnings
from pathlib import Path

from zeropp_hier.files import write_json_atomic

SYNC_TEXT = "synchroniz"  # torch's warning: "called a synchronizing CUDA operation"


def _origin(stack: list) -> str:
    """The innermost frame in zeropp_hier or deepspeed (else the innermost frame at all)."""
    for f in reversed(stack):
        for pkg in ("zeropp_hier", "deepspeed"):
            key = os.sep + pkg + os.sep
            if key in f.filename:
                rel = f.filename.split(key, 1)[1]
                return f"{pkg}/{rel}:{f.lineno} ({f.name})"
    f = stack[-1]
    return f"{f.filename}:{f.lineno} ({f.name})"


class SyncRecorder:
    """Records torch's sync-debug warnings (raised on whichever Python thread made the call)."""

    def __init__(self):
        self.phase = "setup"
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self._orig = warnings.showwarning

    def __enter__(self):
        warnings.filterwarnings("always", message=f".*{SYNC_TEXT}.*")

        def show(message, category, filename, lineno, file=None, line=None):
            if SYNC_TEXT in str(message):
                # drop the frames of the warnings machinery and of this recorder
                here = (warnings.__file__, __file__)
                stack = [f for f in traceback.extract_stack() if f.filename not in here]
                with self._lock:
                    self.records.append(
                        {"phase": self.phase, "thread": threading.current_thread().name, "origin": _origin(stack)}
                    )
            else:
                self._orig(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        return self

    def __exit__(self, *exc):
        warnings.showwarning = self._orig

    def summary(self) -> dict:
        out: dict = {}
        for r in self.records:
            key = f"{r['phase']} | {r['origin']} | {r['thread']}"
            out[key] = out.get(key, 0) + 1
        return out


def dtype_of(name: str) -> str:
    """The dtype a config of ``configs_for`` trains in: its name's suffix (``frontier_bf16``)."""
    return name.rsplit("_", 1)[1]


def _batch(engine, model_cfg, step: int):
    """The step's synthetic batch, already on the engine's device (the copy is outside the
    sync-debug windows: it is the input, not the engine's work)."""
    import torch

    from zeropp_hier.app.data.tokens import synthetic_batch

    x, y = synthetic_batch(model_cfg, engine.train_micro_batch_size_per_gpu(), step, torch.distributed.get_rank())
    return x.to(engine.device), y.to(engine.device)


def recorded_step(engine, x, y, rec: SyncRecorder, cuda: bool = True):
    """One training step, its phases named in ``rec`` and, on a GPU, under sync-debug "warn"
    (every synchronising call is recorded with its phase); returns the loss."""
    import torch

    if cuda:
        torch.cuda.set_sync_debug_mode("warn")
    try:
        rec.phase = "forward"
        loss = engine(x, y)
        rec.phase = "backward"
        engine.backward(loss)
        rec.phase = "step"
        engine.step()
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
        rec.phase = "between steps"
    return loss


def rank_run(configs: dict, steps: int, model_kw: dict) -> dict:
    """On every rank: train each config on the GPU, steps under sync-debug "warn"."""
    from zeropp_hier.app.model.gpt import GPTConfig

    model_cfg = GPTConfig(**model_kw)
    # no try: a failure on one rank must fail the world at once (its peers would wait)
    return {name: _one_config(cfg, steps, model_cfg) for name, cfg in configs.items()}


def _one_config(cfg: dict, steps: int, model_cfg) -> dict:
    import torch

    import zeropp_hier
    from zeropp_hier.app import run as app_run

    torch.cuda.reset_peak_memory_stats()  # the peak of this config, not of the process
    engine = app_run.build_engine(cfg, model_cfg)
    dev = engine.device
    params = list(engine.module.parameters())
    devices = sorted({str(p.ds_tensor.device) for p in params} | {str(p.device) for p in params} | {str(dev)})
    losses = []
    with SyncRecorder() as rec:
        for step in range(steps):
            x, y = _batch(engine, model_cfg, step)
            loss = recorded_step(engine, x, y, rec)
            losses.append(float(loss.detach().float()))
    res = {
        "losses": losses,
        "devices": devices,
        "syncs": rec.summary(),
        "state": {k: v.cpu() for k, v in app_run.gathered_state(engine).items()},
        "max_memory_allocated": torch.cuda.max_memory_allocated(dev),
    }
    rt = getattr(engine, "hier_runtime", None)
    if rt is not None:
        st = zeropp_hier.comm_stats(engine)
        res["stats"] = {"bytes": st["bytes"], "calls": st.get("calls"), "kernels": zeropp_hier.quant.backend(dev)}
        res["comm_device"] = str(rt.comm_device)
    app_run.release(engine)
    return res


def rank_error_pass(configs: dict, steps: int, model_kw: dict) -> dict:
    """Forward and backward of each config under sync-debug "error": a host sync raises."""
    import torch

    from zeropp_hier.app import run as app_run
    from zeropp_hier.app.model.gpt import GPTConfig

    model_cfg = GPTConfig(**model_kw)
    out = {}
    for name, cfg in configs.items():
        engine = app_run.build_engine(cfg, model_cfg)
        losses: list = []
        raised = None
        for step in range(steps):
            x, y = _batch(engine, model_cfg, step)
            torch.cuda.set_sync_debug_mode("error")
            try:
                loss = engine(x, y)
                engine.backward(loss)
            except RuntimeError:
                raised = traceback.format_exc()[-3000:]
            finally:
                torch.cuda.set_sync_debug_mode("default")
            if raised:
                break
            engine.step()
            losses.append(float(loss.detach().float()))
        if not raised:
            app_run.release(engine)
        out[name] = {"losses": losses, "raised": raised}
    return out


def configs_for(gpus: int, gcds: int) -> dict:
    """Each configuration in fp32 and bf16, named ``<config>_<dtype>`` (``dtype_of``)."""
    from zeropp_hier.app.spec import ds_config

    topo = dict(gpus_per_node=gpus, gcds_per_gpu=gcds)
    cfgs = {}
    for dt in ("fp32", "bf16"):
        cfgs[f"stock_{dt}"] = ds_config(None, dtype=dt)
        cfgs[f"zero3_{dt}"] = ds_config("zero3", dtype=dt, compression="none", **topo)
        cfgs[f"frontier_exact_{dt}"] = ds_config("frontier", dtype=dt, compression="none", **topo)
        cfgs[f"frontier_{dt}"] = ds_config("frontier", dtype=dt, **topo)
        cfgs[f"zeropp_{dt}"] = ds_config("zeropp", dtype=dt, **topo)
    for cfg in cfgs.values():
        # DeepSpeed's default reduce bucket (5e8 elements) is allocated by each of the ranks
        # sharing the one GPU; 2e7 still holds the whole demo model's gradients (one bucket)
        cfg["zero_optimization"]["reduce_bucket_size"] = 20_000_000
    return cfgs


def compare(results: list) -> dict:
    """Parity against stock on the GPU, per rank: max relative loss difference and max weight
    difference of every config against stock of its dtype."""
    import torch

    table = {}
    names = list(results[0])
    for name in names:
        dt = dtype_of(name)
        stock = f"stock_{dt}"
        loss_rel, w_abs = 0.0, 0.0
        for r in results:
            for a, b in zip(r[name]["losses"], r[stock]["losses"]):
                loss_rel = max(loss_rel, abs(a - b) / max(abs(b), 1e-12))
            for k, v in r[stock]["state"].items():
                w_abs = max(w_abs, float((r[name]["state"][k] - v).abs().max()))
        syncs: dict = {}
        for r in results:
            for k, v in r[name]["syncs"].items():
                syncs[k] = syncs.get(k, 0) + v
        table[name] = {
            "dtype": dt,
            "loss_first": sum(r[name]["losses"][0] for r in results) / len(results),
            "loss_last": sum(r[name]["losses"][-1] for r in results) / len(results),
            "max_rel_loss_diff_vs_stock": loss_rel,
            "max_abs_weight_diff_vs_stock": w_abs,
            "devices": sorted({d for r in results for d in r[name]["devices"]}),
            "comm_device": results[0][name].get("comm_device"),
            "kernels": (results[0][name].get("stats") or {}).get("kernels"),
            "syncs_all_ranks": syncs,
            "max_memory_allocated_rank0": results[0][name]["max_memory_allocated"],  # this config's peak
            "finite": all(bool(torch.isfinite(v).all()) for r in results for v in r[name]["state"].values()),
        }
    return table


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--gcds-per-gpu", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "gpu_engine.json"))
    args = p.parse_args(argv)
    import torch

    from zeropp_hier.launch.world import LocalWorld, WorldError

    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu/engine.py: no GPU visible to torch")
    model_kw = dict(vocab_size=256, seq_len=32, d_model=64, n_heads=4, n_layers=4)
    cfgs = configs_for(args.gpus_per_node, args.gcds_per_gpu)
    env = {"OMP_NUM_THREADS": "1"}
    report: dict = {
        "machine": {
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "ranks": args.ranks,
            "shape": [args.ranks // (args.gpus_per_node * args.gcds_per_gpu), args.gpus_per_node, args.gcds_per_gpu],
            "backend": "gloo (CUDA tensors)",
        },
        "steps": args.steps,
    }
    try:
        with LocalWorld(args.ranks, timeout=args.timeout, env=env, gpus=1) as w:
            results = w.run(rank_run, cfgs, args.steps, model_kw)
    except WorldError as exc:
        report["parity_error"] = str(exc)[-8000:]
        print(report["parity_error"], flush=True)
        results = None
    if results is not None:
        report["parity"] = compare(results)
        for name, row in report["parity"].items():
            print(
                f"{name:22s} loss {row['loss_first']:.4f} -> {row['loss_last']:.4f}  "
                f"rel diff vs stock {row['max_rel_loss_diff_vs_stock']:.2e}  "
                f"weights {row['max_abs_weight_diff_vs_stock']:.2e}  devices {row['devices']}  "
                f"syncs {sum(row['syncs_all_ranks'].values())}",
                flush=True,
            )
            for k, v in sorted(row["syncs_all_ranks"].items()):
                print(f"    {v:5d}  {k}")
    # its own world and a short timeout: a sync that raises on some ranks only leaves the
    # others waiting in a collective
    hier = {k: v for k, v in cfgs.items() if not k.startswith("stock")}
    with LocalWorld(args.ranks, timeout=180, env=env, gpus=1) as w:
        try:
            err = w.run(rank_error_pass, hier, 2, model_kw)
            report["sync_error_pass"] = {
                "ok": not any(v["raised"] for r in err for v in r.values()),
                "per_config_rank0": err[0],
            }
        except WorldError as exc:
            report["sync_error_pass"] = {"ok": False, "error": str(exc)[-6000:]}
        print("sync-debug error pass:", "passed" if report["sync_error_pass"]["ok"] else "RAISED", flush=True)
        for name, v in report["sync_error_pass"].get("per_config_rank0", {}).items():
            if v["raised"]:
                print(f"  {name} raised:\n{v['raised'][-1500:]}", flush=True)
        if "error" in report["sync_error_pass"]:
            print(report["sync_error_pass"]["error"][-3000:], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, report, indent=1, default=str)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
