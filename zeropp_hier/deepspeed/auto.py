"""``"preset": "auto"``: choose the layout, compression and kept levels at initialize from
measured (or declared) link rates.

[Note: auto preset]
At ``initialize`` every rank takes part in the same steps, so all end with the same choice:

1. link rates per tier: from ``auto.probe_file`` (``zeropp-hier probe --out``; rank 0 reads it
   and broadcasts the rates, or the problem, to every rank), from
   ``auto.tier_gbps``, or measured now with two all-gathers per tier (``auto.probe_kb``, a
   fraction of a second per tier on real links); a measured time is the slowest rank's
   (an all-reduce), so every rank computes the same rates;
2. memory per GCD: the device's (the CPU's RAM shared by the node's ranks on the CPU), the
   smallest over all ranks (an all-reduce); the host's seconds per collective call and per
   point-to-point op and the device's quantization rate, from ``auto.host`` or measured now
   ([Note: host probe] in auto_host.py, the slowest rank's: an all-reduce), unless
   ``auto.host`` is false;
3. the model as the planner sees it: its parameter count, layers ([Note: kept levels]),
   weight width and largest tensor;
4. ``planner.rank_auto`` over ``planner.auto_candidates``, on rank 0 only: our presets
   with the policy's compression, frontier with gentler gradient compression, and frontier with
   per-layer kept levels; the candidate that fits with the shortest predicted time is chosen:
   its communication and its host work ([Note: auto ranks communication and host work]).
   Each candidate is ranked in the issue mode it would run in, resolved from its own plan as
   the runtime resolves it (on NCCL/RCCL ``overlap: true`` runs ticks only where every hop
   spans one tier: frontier in ticks, zeropp and zero3 one lane). Where the hop groups run on
   lanes (gloo) or in ticks the links' time is the busiest link's time or the jobs' time
   pipelined (or in ticks), whichever is longer ([Note: busiest-link bound] in
   planner/pipeline.py); with one issuing lane hop after hop it is the collectives in sequence
   and one chunk. The host's time is added to that where the issuing thread waits for each
   transfer, and overlaps it otherwise ([Note: host term] in planner/host.py). Where lanes or
   ticks run the planner also picks the pipeline chunk count (``pipeline.chunks``, unless the
   config sets it) that minimises the two together, its extra staging counted in the memory
   check. Compute time does not enter: the planner adds it alike to every candidate. Rank 0
   broadcasts the choice and its record (one ``broadcast_object_list`` on the default group,
   before any hop group of the runtime exists), and every other rank takes the candidate of
   that name. The ranking's inputs are already the same on every rank, so this changes no
   choice; it saves every other rank the work, and if rank 0's ranking fails, it broadcasts
   the error and every rank raises it instead of waiting.

Rank 0 prints the ranking with the prediction and the runner-up; ``comm_stats(engine)["auto"]``
and the training job's summary record it. Everything after this runs as for the chosen preset.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..core import levels
from ..core.config import HierConfig, MemoryConfig
from ..core.topology import Topology
from ..core.vocab import TIERS

if TYPE_CHECKING:
    from ..planner.candidates import Candidate
    from ..planner.clusters import ClusterModel

# [Note: auto ranks communication and host work]
# ``auto`` ranks each candidate by two times per step: the links' (bytes per link from the one
# link model, [Note: bytes per link] in core/wire.py; latency; (de)quantization at the device's
# rate) and the host's: what the one issuing thread issues (a collective per hop and chunk, or in
# ticks every point-to-point op of every grouped call), at per-op seconds measured at initialize
# on the ranks themselves ([Note: host probe] in auto_host.py) or declared (``auto.host``), and
# in ticks the elements the hops touch at a measured rate per element: the rows the tick mode
# assembles itself from its transfers, which a library collective does inside its call and the
# link probe's rates already carry. They add up where the thread waits for each transfer (gloo,
# RCCL's serial one lane) and overlap otherwise ([Note: host term] in planner/host.py). Measured
# on the ranks as they run, all at once, the host figures describe the machine the job runs on:
# on the emulated cluster 16 CPU ranks sharing 2 cores, where ``frontier``'s ticks post many
# small transfers and assemble their rows in Python and the host binds; on a GPU node the Python
# of one thread per GCD and the device's copies, which bind where the links are fast and the
# pieces small. Compute does not enter: it is the same for every candidate. ``"host": false``
# ranks communication alone. The workload counts a job per layer and pass and DeepSpeed's own
# gradient and prefetch buckets (the engine passes them), as the runtime runs them. With the
# links unshaped on the emulated cluster (2 nodes x 4 x 2 and 8 x 1 x 2, GPU issue mode) it chose
# ``zeropp`` in all four rankings, the faster preset at both (0.97x its step: the noise of the
# runs), predicting ``frontier`` in one chunk 0.18-0.37 s per step slower where it ran 0.17-0.29 s
# slower (docs/benchmarks.md, "auto with its host term").
RANKS = (
    "communication and host work: the links' time and the issuing thread's (collectives and "
    "point-to-point ops at measured per-op seconds, and in ticks the elements their hops touch), "
    "added where the thread waits for each transfer; compute is not ranked"
)
RANKS_COMM_ONLY = (
    "communication only (auto.host false): compute and host work are not ranked; where they bind "
    "(links faster than the host can feed, e.g. CPU ranks sharing cores) the ranking does not predict the step"
)

PROBE_REPS = 2
# the larger probe message of a tier is cut to about this long a collective (links.measure_tiers)
PROBE_TARGET_S = 0.05


def _rates(cfg: HierConfig, topo: Topology, rank: int, device: torch.device) -> tuple[dict, str]:
    a = cfg.auto
    if a.probe_file is not None:
        return _probe_file_rates(a.probe_file, rank), f"probe file {a.probe_file} (read by rank 0)"
    if a.tier_gbps is not None:
        return {t: (gbps * 1e9, 0.0) for t, gbps in a.tier_gbps}, "declared tier_gbps"
    from ..comm.groups import build_hop_groups, release_hop_groups
    from ..detect.links import measure_tiers

    groups = build_hop_groups(topo, [(t,) for t in TIERS if topo.axes_size((t,)) > 1], rank, cfg.collective_timeout_s)
    try:
        big = a.probe_kb * 1024
        measured = measure_tiers(groups, device, [big // 16, big], PROBE_REPS, target_s=PROBE_TARGET_S)
    finally:
        release_hop_groups(groups)
    used = max(int(s) for v in measured.values() for s in v["all_gather_s"]) // 1024 if measured else 0
    return {t: (v["bandwidth"], v["latency"]) for t, v in measured.items()}, (
        f"probed at initialize ({used} of {a.probe_kb} KB)"
    )


def _probe_file_rates(path: str, rank: int) -> dict:
    """Rank 0 reads the file and broadcasts what it found, the rates or the problem: every rank
    plans from the same rates, and a file missing or different on another node cannot split
    the ranks ([Note: agreed local checks] in comm/agree.py). Collective."""
    from ..core.errors import HierConfigError
    from ..detect.probe_file import FIX, read_probe

    box: list = [None]
    if rank == 0:
        try:
            box[0] = ("ok", read_probe(path))
        except Exception as e:  # noqa: BLE001 - broadcast, raised on every rank below
            box[0] = ("error", str(e) if str(e) else type(e).__name__)
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status != "ok":
        raise HierConfigError("zeropp_hier.auto.probe_file", path, f"rank 0 read it: {value}; {FIX}")
    return value


def _memory_per_gcd(device: torch.device, topo: Topology) -> float:
    if device.type == "cuda":
        mine = float(torch.cuda.get_device_properties(device).total_memory)
    else:  # the CPU accelerator: the node's RAM, shared by its ranks
        mine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (topo.gpus_per_node * topo.gcds_per_gpu)
    t = torch.tensor([mine], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return float(t)


def _host(cfg: HierConfig, topo: Topology, device: torch.device):
    """The host term's rates ([Note: host term] in planner/host.py): declared, measured now
    ([Note: host probe] in auto_host.py), or None where ``auto.host`` is false; the device's
    quantization rate (the constant of old where the host term is off); the probe's seconds."""
    declared = cfg.auto.host
    if declared is False:
        return None, 2e8 if device.type == "cpu" else 5e10, 0.0
    from .auto_host import declared_host, measure_host

    if declared is not None:
        return (*declared_host(declared), 0.0)
    # the tick pieces run the plan of the candidates that run in ticks ([Note: host probe], 2.)
    return measure_host(device, topo, cfg.compression)


def resolve(
    cfg: HierConfig,
    module: torch.nn.Module,
    topo: Topology,
    rank: int,
    device: torch.device,
    reduce_bucket: float | None = None,
    prefetch_bucket: float | None = None,
):
    """The config with the chosen preset, compression and kept budget, and a record of the
    choice ([Note: auto preset]). ``reduce_bucket``, ``prefetch_bucket``: DeepSpeed's
    ``reduce_bucket_size`` and ``stage3_prefetch_bucket_size`` (elements), which set the
    gradient jobs per step and what backward need not gather again. Collective."""
    from .. import planner as P

    t0 = time.perf_counter()
    rates, source = _rates(cfg, topo, rank, device)
    memory = _memory_per_gcd(device, topo)
    host, quant_rate, host_probe_s = _host(cfg, topo, device)
    named = list(module.named_parameters())
    numel = [getattr(p, "ds_numel", p.numel()) for _, p in named]
    width = named[0][1].element_size() if named else 2
    tiers: dict[str, P.TierLink] = {t: P.TierLink(*rates.get(t, (float("inf"), 0.0))) for t in TIERS}

    cluster = P.ClusterModel(
        name=f"this job ({topo.num_nodes}x{topo.gpus_per_node}x{topo.gcds_per_gpu})",
        nodes=topo.num_nodes,
        gpus_per_node=topo.gpus_per_node,
        gcds_per_gpu=topo.gcds_per_gpu,
        tiers=tiers,
        memory_per_gcd=memory,
        device_flops=float("inf"),
        quant_rate=quant_rate,
        library=dist.get_backend(),
        efficiency=1.0,
        stock_quantization=False,
        compute_s=0.0,
        source=source,
    )
    layers = max(1, len({levels.layer_of(n) for n, _ in named}))
    params = float(sum(numel))
    wl = P.Workload(
        params=params,
        tokens_per_gcd=1,
        weight_bytes=width,
        # the runtime gathers a job per layer and pass ([Note: a job per layer] in inflight.py):
        # one collective per hop and layer, not per parameter
        gathers_per_pass=layers,
        largest_layer_params=float(max(numel, default=0)),
        layers=layers,
        reduce_bucket=float(reduce_bucket) if reduce_bucket else P.Workload.reduce_bucket,
        kept_at_turn=min(float(prefetch_bucket or 0.0), params),  # [Note: the turn] in planner/workload.py
    )
    # each candidate ranked in the issue mode it would run in (on NCCL/RCCL, overlap true runs
    # ticks only where every hop of its plan spans one tier); the planner picks the chunks where
    # they overlap hops (lanes, ticks) and the config leaves them out; a config's own count stays,
    # and one lane overlaps nothing (one chunk)
    candidates = P.auto_candidates(cfg.memory.kept_shards_gb, cfg.pipeline.chunks)
    clusters = {c.name: dataclasses.replace(cluster, issue_mode=_planner_mode(cfg, c, cluster)) for c in candidates}
    shared: list = [None]
    failure: Exception | None = None
    if rank == 0:
        try:
            host_in = (host, quant_rate, host_probe_s)
            shared[0] = ("ok", *_rank_on_this_rank(P, cluster, clusters, wl, candidates, source, t0, host_in))
        except Exception as e:  # every rank raises it after the broadcast, none waits
            failure, shared[0] = e, ("error", f"{type(e).__name__}: {e}")
    nccl = dist.get_backend() == "nccl"  # broadcast_object_list stages through this device
    dist.broadcast_object_list(shared, src=0, device=device if nccl else None)
    if shared[0][0] == "error":
        raise RuntimeError(
            f"zeropp_hier: preset auto: ranking the candidates failed on rank 0 ({shared[0][1]}); "
            "name a preset instead of auto to train meanwhile"
        ) from failure
    _, name, kept_gb, record = shared[0]
    c = next(cand for cand in candidates if cand.name == name)
    chosen = dataclasses.replace(
        cfg,
        preset=c.preset,
        compression=c.compression,
        memory=MemoryConfig(kept_shards_gb=kept_gb),
        pipeline=dataclasses.replace(cfg.pipeline, chunks=int(record["chunks"])),
        chosen_by_auto=c.name,
    )
    return chosen, record


def _planner_mode(cfg: HierConfig, cand: Candidate, cluster: ClusterModel) -> str:
    """The issue mode ``cand`` would run in, as the planner names it: the job's ``overlap``
    resolved as the runtime resolves it (comm/issue.py), from the hops of the candidate's plan."""
    from .. import planner as P
    from ..comm.issue import resolve_issue_mode

    one_tier = P.one_tier_plan(cand, cluster)
    hip = bool(getattr(torch.version, "hip", None))
    return resolve_issue_mode(cfg.overlap, dist.get_backend(), hip, one_tier).schedule


def _rank_on_this_rank(
    P, cluster, clusters: dict, wl, candidates, source: str, t0: float, host_in: tuple = (None, 0.0, 0.0)
) -> tuple[str, float | None, dict]:
    """Rank 0's part of [Note: auto preset]: rank the candidates, each in its issue mode
    (``clusters`` by name), with the host term where ``host_in`` has rates ([Note: host term] in
    planner/host.py), print the ranking, and return what every rank needs: the chosen
    candidate's name, its kept budget and the record."""
    host, quant_rate, host_probe_s = host_in
    preds = P.rank_auto(cluster, wl, candidates, clusters, host)
    fitting = [p for p in preds if p.memory.fits] or preds
    best = fitting[0]
    runner = fitting[1] if len(fitting) > 1 else None
    c = best.candidate
    kept_gb = c.kept_gb
    if c.fit and best.kept_levels is not None:
        kept_gb = best.kept_levels.budget_bytes / 1e9
    tiers = cluster.tiers
    ranks = RANKS if host is not None else RANKS_COMM_ONLY
    record = {
        "chosen": c.name,
        "preset": c.preset,
        "predicted_comm_s": best.comm_s,
        # [Note: busiest-link bound]: what the ranking used where lanes or ticks run, the issue mode
        # it modelled, and the chunks chosen
        "predicted_pipelined_s": best.pipelined_comm_s,
        "predicted_link_s": P.rank_key(best),
        "predicted_host_s": best.host_s,
        "predicted_s": P.auto_key(best),
        "issue_mode": best.mode,
        "busiest_link": best.busiest_link,
        "link_bound_s": best.link_bound_s,
        "chunks": best.chunks,
        "runner_up": None
        if runner is None
        else {
            "name": runner.candidate.name,
            "predicted_comm_s": runner.comm_s,
            "predicted_pipelined_s": runner.pipelined_comm_s,
            "predicted_s": P.auto_key(runner),
        },
        "rates_gbps": {t: tiers[t].bandwidth / 1e9 for t in TIERS},
        "source": source,
        # [Note: host term]: the rates the host term used (None: left out, ``auto.host`` false)
        "host": None
        if host is None
        else {
            "collective_s": host.collective_s,
            "p2p_op_s": host.p2p_op_s,
            "tick_elem_s": host.tick_elem_s,
            "ring_steps": host.ring_steps,
            "quant_rate": quant_rate,
            "source": host.source,
            "seconds": host_probe_s,
        },
        # what the ranking weighs ([Note: auto ranks communication and host work])
        "ranks": ranks,
        "seconds": time.perf_counter() - t0,
        "ranked_on": 0,
        "ranking": [
            {
                "name": p.candidate.name,
                "predicted_comm_s": p.comm_s,
                "predicted_pipelined_s": p.pipelined_comm_s,
                "predicted_link_s": P.rank_key(p),
                "predicted_host_s": p.host_s,
                "predicted_s": P.auto_key(p),
                "combine": p.combine if host is not None else None,
                "host_work": None if p.host_work is None else p.host_work._asdict(),
                "link_bound_s": p.link_bound_s,
                "chunks": p.chunks,
                "issue_mode": p.mode,
                # bytes per step on each tier, whole cluster, as the wire carries them ([Note: bytes
                # per link] in core/wire.py): why a candidate with fewer hops can still lose
                "tier_bytes": dict(p.tier_bytes),
                "fits": p.memory.fits,
                "memory_gb": p.memory.total / 1e9,
            }
            for p in preds
        ],
    }
    rates_s = ", ".join(f"{t} {tiers[t].bandwidth * 8 / 1e6:.4g} Mbit/s" for t in TIERS)
    host_s = (
        "host term off (auto.host false)"
        if host is None
        else f"host {host.collective_s * 1e6:.4g} us per collective"
        + (f" of {host.ring_steps} ring steps" if host.ring_steps else "")
        + f", {host.p2p_op_s * 1e6:.4g} us per point-to-point op, {host.tick_elem_s * 1e9:.3g} ns per "
        f"element a tick hop touches, quantization {quant_rate / 1e6:.4g} M elem/s ({host.source})"
    )
    lines = [f"[zeropp_hier] preset auto: links per GCD {rates_s} ({source}); {host_s}; predicted per step ({ranks}):"]
    lines += [
        f"[zeropp_hier]   {p.candidate.name:<18} {P.auto_key(p):9.3f} s = links {P.rank_key(p):.3f} s "
        f"{'+' if p.combine == 'sum' else 'max'} host {p.host_s:.3f} s  "
        f"(busiest link {p.busiest_link or '-'} {p.link_bound_s:.3f} s, network "
        f"{p.tier_bytes.get('node', 0.0) / 1e6:.3g} MB/step, chunks {p.chunks}, {p.mode}"
        + (
            f"; {p.host_work.collectives} collectives, {p.host_work.p2p_ops} p2p ops in {p.host_work.ticks} ticks"
            + (f", {p.host_work.tick_elems / 1e6:.3g} M elements touched" if p.host_work.tick_elems else "")
            if p.host_work is not None
            else ""
        )
        + f")  {'fits' if p.memory.fits else 'does not fit'}{'  <- chosen' if p is best else ''}"
        for p in preds
    ]
    if runner is not None:
        key_best, key_runner = P.auto_key(best), P.auto_key(runner)
        lines.append(
            f"[zeropp_hier] chose {c.name}; runner-up {runner.candidate.name} predicted "
            f"{key_runner / key_best if key_best else float('inf'):.2f}x its time"
        )
    print("\n".join(lines), flush=True)
    return c.name, kept_gb, record
