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
   smallest over all ranks (an all-reduce);
3. the model as the planner sees it: its parameter count, layers ([Note: kept levels]),
   weight width and largest tensor;
4. ``planner.rank_auto`` over ``planner.auto_candidates``, on rank 0 only: our presets
   with the policy's compression, frontier with gentler gradient compression, and frontier with
   per-layer kept levels; the candidate that fits with the shortest predicted communication is
   chosen. Each candidate is ranked in the issue mode it would run in, resolved from its own
   plan as the runtime resolves it (on NCCL/RCCL ``overlap: true`` runs ticks only where every
   hop spans one tier: frontier in ticks, zeropp and zero3 one lane). Where the hop groups run on
   lanes (gloo) or in ticks that is the busiest link's time or the jobs' time pipelined (or in
   ticks), whichever is longer, and the planner also picks the pipeline chunk count
   (``pipeline.chunks``, unless the config sets it), its extra staging counted in the memory
   check ([Note: busiest-link bound] in planner/pipeline.py); with one issuing lane hop after
   hop it is the collectives in sequence and one chunk. Compute time does not enter:
   the planner adds it alike to every candidate. Rank 0 broadcasts the choice and its record
   (one ``broadcast_object_list`` on the default group, before any hop group of the runtime
   exists), and every other rank takes the candidate of that name. The ranking's inputs are
   already the same on every rank, so this changes no choice; it saves every other rank the
   work, and if rank 0's ranking fails, it broadcasts the error and every rank raises it
   instead of waiting.

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

# [Note: auto ranks communication]
# ``auto`` ranks the candidates by their communication alone: bytes per link from the one link
# model ([Note: bytes per link] in core/wire.py), latency and (de)quantization at the device's
# rate. Compute and host work (the optimizer step, the Python around each gather, the CPU's
# copies on gloo) do not enter: the planner adds them alike to every candidate, and a candidate
# whose extra (de)quantization and hops cost host time can lose where the links are fast and that
# work binds. Where the links bind ``auto`` chose the faster preset at both emulated shapes
# (docs/benchmarks.md, "Two node shapes, links binding and unshaped").
# Where they do not, the emulated cluster's step is 16 CPU ranks' Python, gloo copies and
# quantization sharing 2 cores: frontier's ticks (many small transfers, a quantization per
# tier) cost more host time there, and ``auto`` chose it though zeropp was faster. That regime
# is outside auto's scope, by choice: on a GPU node each GCD has its own host cores and the
# (de)quantization runs on the device, so a host term measured on these shared cores would
# describe this machine, not the one ``auto`` is choosing for; and where the links are that
# fast, communication is not what decides the step. The record and the printed ranking say so.
RANKS = (
    "communication only: compute and host work are not ranked; where they bind (links faster "
    "than the host can feed, e.g. CPU ranks sharing cores) the ranking does not predict the step"
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


def resolve(cfg: HierConfig, module: torch.nn.Module, topo: Topology, rank: int, device: torch.device):
    """The config with the chosen preset, compression and kept budget, and a record of the
    choice ([Note: auto preset]). Collective."""
    from .. import planner as P

    t0 = time.perf_counter()
    rates, source = _rates(cfg, topo, rank, device)
    memory = _memory_per_gcd(device, topo)
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
        quant_rate=2e8 if device.type == "cpu" else 5e10,
        library=dist.get_backend(),
        efficiency=1.0,
        stock_quantization=False,
        compute_s=0.0,
        source=source,
    )
    wl = P.Workload(
        params=float(sum(numel)),
        tokens_per_gcd=1,
        weight_bytes=width,
        gathers_per_pass=max(1, len(named)),
        largest_layer_params=float(max(numel, default=0)),
        layers=max(1, len({levels.layer_of(n) for n, _ in named})),
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
            shared[0] = ("ok", *_rank_on_this_rank(P, cluster, clusters, wl, candidates, source, t0))
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
    P, cluster, clusters: dict, wl, candidates, source: str, t0: float
) -> tuple[str, float | None, dict]:
    """Rank 0's part of [Note: auto preset]: rank the candidates, each in its issue mode
    (``clusters`` by name), print the ranking, and return what every rank needs: the chosen
    candidate's name, its kept budget and the record."""
    preds = P.rank_auto(cluster, wl, candidates, clusters)
    fitting = [p for p in preds if p.memory.fits] or preds
    best = fitting[0]
    runner = fitting[1] if len(fitting) > 1 else None
    c = best.candidate
    kept_gb = c.kept_gb
    if c.fit and best.kept_levels is not None:
        kept_gb = best.kept_levels.budget_bytes / 1e9
    tiers = cluster.tiers
    record = {
        "chosen": c.name,
        "preset": c.preset,
        "predicted_comm_s": best.comm_s,
        # [Note: busiest-link bound]: what the ranking used where lanes or ticks run, the issue mode
        # it modelled, and the chunks chosen
        "predicted_pipelined_s": best.pipelined_comm_s,
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
        },
        "rates_gbps": {t: tiers[t].bandwidth / 1e9 for t in TIERS},
        "source": source,
        # what the ranking weighs ([Note: auto ranks communication])
        "ranks": RANKS,
        "seconds": time.perf_counter() - t0,
        "ranked_on": 0,
        "ranking": [
            {
                "name": p.candidate.name,
                "predicted_comm_s": p.comm_s,
                "predicted_pipelined_s": p.pipelined_comm_s,
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
    lines = [
        f"[zeropp_hier] preset auto: links per GCD {rates_s} ({source}); predicted communication per step ({RANKS}):"
    ]
    lines += [
        f"[zeropp_hier]   {p.candidate.name:<18} {P.rank_key(p):9.3f} s  "
        f"(busiest link {p.busiest_link or '-'} {p.link_bound_s:.3f} s, network "
        f"{p.tier_bytes.get('node', 0.0) / 1e6:.3g} MB/step, chunks {p.chunks}, {p.mode})  "
        f"{'fits' if p.memory.fits else 'does not fit'}{'  <- chosen' if p is best else ''}"
        for p in preds
    ]
    if runner is not None:
        key_best, key_runner = P.rank_key(best), P.rank_key(runner)
        lines.append(
            f"[zeropp_hier] chose {c.name}; runner-up {runner.candidate.name} predicted "
            f"{key_runner / key_best if key_best else float('inf'):.2f}x its communication time"
        )
    print("\n".join(lines), flush=True)
    return c.name, kept_gb, record
