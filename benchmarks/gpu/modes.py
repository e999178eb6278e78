"""The issue modes side by side: one lane, serial, inline and ticks on the same world and data.

    python -m benchmarks.gpu.modes [--device cuda|cpu] [--ranks 8] [--steps 6]
                                   [--out benchmarks/results/gpu_modes.json]

``frontier`` (its default compression) and ``frontier_exact`` (compression none), fp32, each under
``zeropp_hier.overlap`` = ``"one_lane"``, ``"serial"``, ``false`` (inline) and ``"ticks"``
([Note: one issuing thread on GPUs] in zeropp_hier/comm/issue.py). The modes reorder when
collectives are issued, never what they compute, so every mode's losses must equal one lane's:
the table gives the largest difference per step over all ranks, and on rank 0 the largest final
weight difference. Per mode also: the host seconds the issuing thread spent in the serial
mode's waits per step (``serial_wait_s`` of ``zeropp_hier.comm_stats``, a difference per step;
a wait for a step's last collective falls in the next step), the step time (the slowest rank;
on a GPU after a device synchronize that ends each step), and on CUDA the host synchronisations
of forward and backward under ``torch.cuda.set_sync_debug_mode("warn")`` counted by the package
of the innermost frame that made them (zeropp_hier, deepspeed, other) and by thread (the
training thread, or another: the executor's lane). An event's ``synchronize`` (the serial wait
itself) is not a call sync-debug mode reports; ``serial_wait_s`` is what measures it.

``--device cuda`` (default): the ranks share GPU 0 through gloo with CUDA tensors, as
benchmarks/gpu/engine.py; gloo sends point-to-point only from host memory, so the tick mode is
refused there at start-up (``check_tick_device``, the check the runtime makes) and its row holds
the refusal's text. ``--device cpu``: CPU ranks and tensors over gloo, where ticks run and the
serial mode has nothing to wait for (a gloo collective on CPU tensors has ended when its call
returns: ``serial_wait_s`` is 0); no sync counts (no CUDA).
Timings through gloo on one GPU are not link speeds: only the comparison between modes means
something, and only roughly.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from zeropp_hier.files import write_json_atomic

from .engine import SyncRecorder, _batch, recorded_step

# the section's ``overlap`` value of each mode; one lane is the reference
MODES: dict[str, bool | str] = {"one_lane": "one_lane", "serial": "serial", "inline": False, "ticks": "ticks"}
REFERENCE = "one_lane"
PRESETS = {"frontier": None, "frontier_exact": "none"}  # name -> frontier's compression (None: its default)
PACKAGES = ("zeropp_hier", "deepspeed")
MODEL_KW = {
    "cuda": dict(vocab_size=256, seq_len=32, d_model=64, n_heads=4, n_layers=4),  # engine's
    "cpu": dict(vocab_size=128, seq_len=16, d_model=32, n_heads=2, n_layers=2),  # toy size
}


def configs_for(gpus: int, gcds: int) -> dict:
    """``{"<preset>/<mode>": ds_config}`` for every preset of PRESETS and mode of MODES. Pure."""
    from zeropp_hier.app.spec import ds_config

    out = {}
    for preset, compression in PRESETS.items():
        for mode, overlap in MODES.items():
            cfg = ds_config("frontier", gpus_per_node=gpus, gcds_per_gpu=gcds, compression=compression)
            cfg["zeropp_hier"]["overlap"] = overlap
            # DeepSpeed's 5e8-element reduce bucket per rank sharing the GPU; 2e7 still holds the model
            cfg["zero_optimization"]["reduce_bucket_size"] = 20_000_000
            out[f"{preset}/{mode}"] = cfg
    return out


def package_of(origin: str) -> str:
    """The package of a sync record's origin (SyncRecorder's "pkg/path:line (fn)"). Pure."""
    head = origin.split("/", 1)[0]
    return head if head in PACKAGES else "other"


def split_syncs(records: list, training_thread: str) -> dict:
    """``{phase: {package: {"training": n, "other_thread": n}}}`` of SyncRecorder records. Pure."""
    out: dict = {}
    for r in records:
        by_pkg = out.setdefault(r["phase"], {})
        by_thread = by_pkg.setdefault(package_of(r["origin"]), {"training": 0, "other_thread": 0})
        by_thread["training" if r["thread"] == training_thread else "other_thread"] += 1
    return out


def tick_refusal(overlap: bool | str, device_type: str) -> str | None:
    """The runtime's start-up refusal of ``overlap`` on this rank's backend and device, or None
    (the same pure check HierRuntime makes; run here so that a refused mode builds no engine)."""
    import torch
    import torch.distributed as dist

    from zeropp_hier.comm.issue import backend_for, check_tick_device, resolve_issue_mode
    from zeropp_hier.core.errors import HierConfigError

    backend = backend_for(dist.get_backend(), device_type)
    try:
        check_tick_device(resolve_issue_mode(overlap, backend, torch.version.hip is not None), backend, device_type)
    except HierConfigError as e:
        return str(e)
    return None


def rank_modes(configs: dict, steps: int, model_kw: dict, device: str) -> dict:
    """On every rank: train each config from the same seed and data; per step its loss, serial
    wait and time, and on CUDA the sync records of forward, backward and step."""
    from zeropp_hier.app.model.gpt import GPTConfig

    model_cfg = GPTConfig(**model_kw)
    # no try around the runs: a failure on one rank must fail the world at once
    return {name: _one_mode(cfg, steps, model_cfg, device) for name, cfg in configs.items()}


def _one_mode(cfg: dict, steps: int, model_cfg, device: str) -> dict:
    import torch

    import zeropp_hier
    from zeropp_hier.app import run as app_run

    refused = tick_refusal(cfg["zeropp_hier"]["overlap"], device)
    if refused is not None:
        return {"refused": refused}
    cuda = device == "cuda"
    engine = app_run.build_engine(cfg, model_cfg)
    losses, waits, times = [], [], []
    with SyncRecorder() as rec:
        for step in range(steps):
            x, y = _batch(engine, model_cfg, step)
            before = zeropp_hier.comm_stats(engine)["serial_wait_s"]
            if cuda:
                torch.cuda.synchronize()  # the step's time starts with an idle device
            t0 = time.perf_counter()
            loss = recorded_step(engine, x, y, rec, cuda)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            waits.append(zeropp_hier.comm_stats(engine)["serial_wait_s"] - before)
            losses.append(loss.detach())
    rt = engine.hier_runtime
    res = {
        "mode": rt.issue_mode.name,
        "chunks": rt.chunks,
        "losses": [float(v.float()) for v in losses],
        "serial_wait_s": waits,
        "step_s": times,
        "syncs": split_syncs(rec.records, threading.current_thread().name) if cuda else None,
        "sync_origins": rec.summary() if cuda else None,
    }
    state = app_run.gathered_state(engine)  # collective: every rank
    if torch.distributed.get_rank() == 0:
        res["state"] = {k: v.cpu() for k, v in state.items()}
    app_run.release(engine)
    return res


def _mean(xs: list) -> float | None:
    return sum(xs) / len(xs) if xs else None


def compare(results: list, steps: int) -> dict:
    """Per config: the resolved mode, the largest loss difference against the same preset's
    one lane over ranks and steps, rank 0's largest final weight difference, serial wait and
    step time per step (mean over steps after the first; the wait as the mean over ranks, the
    time the slowest rank's), and the sync counts of all ranks per phase and package."""
    table: dict = {}
    for name, r0 in results[0].items():
        if "refused" in r0:
            table[name] = {"refused": r0["refused"]}
            continue
        ref_name = f"{name.split('/')[0]}/{REFERENCE}"
        loss_diff = max(abs(a - b) for r in results for a, b in zip(r[name]["losses"], r[ref_name]["losses"]))
        ref_state = results[0][ref_name]["state"]
        w_diff = max(float((r0["state"][k] - v).abs().max()) for k, v in ref_state.items())
        later = slice(1, None) if steps > 1 else slice(None)  # the first step builds caches
        waits = [_mean([r[name]["serial_wait_s"][s] for r in results]) for s in range(steps)]
        times = [max(r[name]["step_s"][s] for r in results) for s in range(steps)]
        syncs: dict | None = None
        if r0["syncs"] is not None:
            syncs = {}
            for r in results:
                for phase, by_pkg in r[name]["syncs"].items():
                    for pkg, by_thread in by_pkg.items():
                        slot = syncs.setdefault(phase, {}).setdefault(pkg, {"training": 0, "other_thread": 0})
                        for k, v in by_thread.items():
                            slot[k] += v
        origins: dict = {}
        for r in results:
            for k, v in (r[name]["sync_origins"] or {}).items():
                origins[k] = origins.get(k, 0) + v
        table[name] = {
            "mode": r0["mode"],
            "chunks": r0["chunks"],
            "losses_rank0": r0["losses"],
            "max_abs_loss_diff_vs_one_lane": loss_diff,
            "max_abs_weight_diff_vs_one_lane_rank0": w_diff,
            "serial_wait_s_per_step_mean_ranks": waits,
            "serial_wait_s_per_step": _mean(waits[later]),
            "serial_wait_s_total_max_rank": max(sum(r[name]["serial_wait_s"]) for r in results),
            "step_s_per_step_slowest_rank": times,
            "step_s": _mean(times[later]),
            "syncs_all_ranks": syncs,
            "sync_origins_all_ranks": origins or None,
        }
    return table


def _count(syncs: dict | None, phases: tuple, pkg: str) -> str:
    if syncs is None:
        return "-"
    return str(sum(sum(syncs.get(p, {}).get(pkg, {}).values()) for p in phases))


def table_lines(table: dict) -> list[str]:
    """The printed table: a row per config; sync counts are forward + backward, all ranks. Pure."""
    head = f"{'config':24s} {'mode':16s} {'loss diff':>9s} {'wait/step s':>11s} {'step s':>8s}  syncs fwd+bwd "
    head += "zeropp_hier / deepspeed / other"
    lines = [head]
    fb = ("forward", "backward")
    for name, row in table.items():
        if "refused" in row:
            lines.append(f"{name:24s} refused: {row['refused'].splitlines()[0][:140]}")
            continue
        s = row["syncs_all_ranks"]
        lines.append(
            f"{name:24s} {row['mode']:16s} {row['max_abs_loss_diff_vs_one_lane']:9.2e} "
            f"{row['serial_wait_s_per_step']:11.6f} {row['step_s']:8.4f}  "
            f"{_count(s, fb, 'zeropp_hier')} / {_count(s, fb, 'deepspeed')} / {_count(s, fb, 'other')}"
        )
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--gcds-per-gpu", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "gpu_modes.json"))
    args = p.parse_args(argv)
    import torch

    from zeropp_hier.launch.world import LocalWorld, WorldError

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu/modes.py: no GPU visible to torch (--device cpu runs on CPU ranks)")
    gpus = 1 if cuda else 0
    model_kw = MODEL_KW[args.device]
    report: dict = {
        "machine": {
            "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "ranks": args.ranks,
            "shape": [args.ranks // (args.gpus_per_node * args.gcds_per_gpu), args.gpus_per_node, args.gcds_per_gpu],
            "backend": f"gloo ({args.device} tensors)",
        },
        "steps": args.steps,
        "model": model_kw,
    }
    cfgs = configs_for(args.gpus_per_node, args.gcds_per_gpu)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with LocalWorld(args.ranks, timeout=args.timeout, env={"OMP_NUM_THREADS": "1"}, gpus=gpus) as w:
        try:
            report["modes"] = compare(w.run(rank_modes, cfgs, args.steps, model_kw, args.device), args.steps)
        except WorldError as exc:
            report["error"] = str(exc)[-8000:]
            print(report["error"], flush=True)
    report["wall_s"] = time.perf_counter() - t0
    for line in table_lines(report.get("modes", {})):
        print(line, flush=True)
    write_json_atomic(out, report, indent=1, default=str)
    print(f"wrote {out} ({report['wall_s']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
