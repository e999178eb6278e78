"""``"topology": "auto"``: where each rank sits, worked out from what the ranks can see. Pure logic.

Each rank describes itself in a ``RankRecord`` (``local_record``: host, rank within the host,
the physical GPU it drives, that GPU's package and how it was found); the records of all
ranks are exchanged (``zeropp_hier.detect.probe``), and every rank runs ``build_topology`` on the same
list, so every rank reaches the same ``Topology`` or the same error.

[Note: auto topology rules]
- node = host name (Slurm's ``SLURMD_NODENAME`` when set). Every host must run the same number
  of ranks.
- With GPUs: a rank's GCD is the physical device it drives (``ROCR_VISIBLE_DEVICES`` /
  ``HIP_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES``; the device at ``LOCAL_RANK`` when several
  are visible). Its package (``node_packages``): with neither ``rocm-smi --showtopo`` nor the
  amdgpu XGMI link counts readable, ``index // gcds_per_gpu`` (declared, default 2 — MI250X
  numbering). Otherwise, on a node recognised as Frontier or LUMI, the documented map (GCDs 2k,
  2k+1 on one MI250X; [Note: documented node map] in ``node_maps``), and the one line rank 0
  logs says whether the link counts and the rocm-smi table agree or which was missing or
  disagreed. Elsewhere: the link counts when they form clean packages ([Note: packages from XGMI
  link counts] in ``xgmi_links``); else a rocm-smi table with no XGMI link (one GCD per package;
  [Note: packages from link weights] in ``rocm_topo``); XGMI links that nothing settles are
  refused, naming the explicit topology to give. Two ranks on one GCD, packages of
  different sizes or hosts of different shapes are refused. Declared ``gcds_per_gpu`` /
  ``gpus_per_node`` must agree with what was found.
- Without GPUs (CPU, gloo): packages are runs of ``gcds_per_gpu`` consecutive local ranks
  (declared, default 2); a host is one node of all its packages, or, when ``gpus_per_node`` is
  declared, is cut into simulated nodes of ``gpus_per_node`` packages (how one machine
  simulates several nodes).
- Order: nodes by their lowest rank, packages by their lowest rank, GCDs by rank; ``rank_map``
  lists the rank at each position of that order.

[Note: launch order]
Which package a rank sits on comes from the hardware; the order the packages are numbered in is
ours to choose. Numbered by hardware id, Frontier's standard launch (``srun --ntasks-per-node=8
--gpus-per-task=1 --gpu-bind=closest``: local ranks 0,1 on GCDs 4,5, which share package 2, ranks
2,3 on GCDs 2,3, ...) gave a permuted rank map, and every gather and reduce stage paid for the
permutation. Numbered by their lowest rank, the same placement is the identity map: ranks that
share a package are still grouped by what the hardware says, but the hop groups, and so the
collectives, are the same.
"""

from __future__ import annotations

import re
from typing import Mapping, NamedTuple, Sequence

from ..core.errors import HierTopologyError
from ..core.topology import Topology
from .node_maps import SOURCE as DOCUMENTED_MAP
from .node_maps import documented_map, recognised_node, refuse_unrecognised, table_mismatch
from .rocm_topo import packages_from_showtopo, parse_showtopo
from .slurm_env import check_uniform, slurm_task, visible_devices
from .xgmi_links import packages_from_link_counts, parse_link_counts

DEFAULT_GCDS_PER_GPU = 2  # MI250X


class RankRecord(NamedTuple):
    rank: int
    host: str
    local_rank: int
    device: int | None  # physical GPU index this rank drives; None on CPU
    package: int | None  # package id from rocm-smi; None when not known
    slurm_ntasks: int | None  # the step's task count when under srun
    slurm_nnodes: int | None
    package_source: str | None = None  # how ``package`` was found; None when it was not


class Detected(NamedTuple):
    topology: Topology
    hosts: tuple[str, ...]
    source: str  # how packages were found

    def describe(self) -> str:
        t = self.topology
        hosts = ", ".join(self.hosts[:4]) + (", ..." if len(self.hosts) > 4 else "")
        rm = "identity" if t.rank_map is None or t.is_identity_map else list(t.rank_map)
        return (
            f"auto topology: {t.num_nodes} nodes x {t.gpus_per_node} GPUs x {t.gcds_per_gpu} GCDs "
            f"on {len(self.hosts)} host(s) [{hosts}]; packages from {self.source}; rank_map {rm}"
        )


def _device_index(dev: str, var_value) -> int:
    if not dev.isdigit():
        raise HierTopologyError(
            "ROCR_VISIBLE_DEVICES",
            var_value,
            "auto topology needs device indices (as Slurm's --gpus-per-task sets "
            "them), not UUIDs; use indices or give the topology explicitly",
        )
    return int(dev)


LINK_COUNTS = "XGMI link counts (amdgpu sysfs xgmi_num_links)"


def _groups(packages: Mapping[int, int]) -> str:
    by: dict[int, list[int]] = {}
    for g, p in sorted(packages.items()):
        by.setdefault(p, []).append(g)
    return " ".join("-".join(map(str, m)) for m in by.values())


def node_packages(
    env: Mapping[str, str], hostname: str, showtopo_text: str | None, link_counts_text: str | None
) -> tuple[dict[int, int] | None, str | None]:
    """GPU index -> package id on this node, and how it was found ([Note: auto topology rules]);
    (None, None) when neither signal was read (the caller then uses the device index)."""
    if showtopo_text is None and link_counts_text is None:
        return None, None  # no AMD signal at all (no rocm-smi, no amdgpu hive): the device index rule
    recognised = recognised_node(env, hostname) is not None
    why: list[str] = []  # on a recognised node: each signal that is missing or disagrees

    def read(parse, text, what):
        if text is None:
            return None
        try:
            return parse(text)
        except HierTopologyError as e:
            if not recognised:
                raise
            why.append(f"{what} unreadable ({e.value})")
            return None

    counts = read(parse_link_counts, link_counts_text, "XGMI link counts")
    from_counts = packages_from_link_counts(counts) if counts is not None else None
    topo = read(parse_showtopo, showtopo_text, "rocm-smi table")
    if recognised:
        documented = documented_map()
        if from_counts is None:
            if counts is not None:
                why.append("XGMI link counts without clean packages")
            elif link_counts_text is None:
                why.append("no XGMI link counts")
        elif from_counts != documented:
            why.append(f"XGMI link counts that group the GCDs otherwise ({_groups(from_counts)})")
        if topo is None and showtopo_text is None:
            why.append("no rocm-smi table")
        elif topo is not None and (misfit := table_mismatch(topo)) is not None:
            why.append(f"rocm-smi table: {misfit}")
        if from_counts == documented and not why:
            return documented, f"{LINK_COUNTS}, agreeing with {DOCUMENTED_MAP} and rocm-smi"
        if from_counts == documented:
            return documented, f"{LINK_COUNTS}, agreeing with {DOCUMENTED_MAP}; {'; '.join(why)}"
        return documented, f"{DOCUMENTED_MAP}, as the node gave {'; '.join(why)}"
    if from_counts is not None:
        return from_counts, LINK_COUNTS
    if topo is not None:
        single = packages_from_showtopo(topo)
        if single is not None:
            return single, "rocm-smi --showtopo (no XGMI link: one GCD per package)"
        raise refuse_unrecognised("rocm-smi --showtopo", f"XGMI links among GPUs {list(topo.gpus)}", env, hostname)
    if counts is not None:
        raise refuse_unrecognised("xgmi_num_links", [list(r) for r in counts], env, hostname)
    return None, None


def _local_rank(env: Mapping[str, str], rank: int) -> int:
    v = env.get("LOCAL_RANK")
    if v is None:
        return rank
    if not re.fullmatch(r"[0-9]+", v.strip()):
        raise HierTopologyError(
            "LOCAL_RANK", v, "set it to this process's index on its node, a whole number >= 0 (or run under srun)"
        )
    return int(v)


def local_record(
    rank: int,
    env: Mapping[str, str],
    hostname: str,
    gpu_count: int,
    showtopo_text: str | None,
    link_counts_text: str | None = None,
) -> RankRecord:
    """This rank's record, from its environment, host name, visible GPU count and (optionally)
    the text of ``rocm-smi --showtopo`` and of the amdgpu XGMI link counts
    (``node_read.read_xgmi_num_links``)."""
    task = slurm_task(env)
    if task is not None:
        check_uniform(task)
        if task.procid != rank:
            raise HierTopologyError(
                "SLURM_PROCID",
                task.procid,
                f"differs from the torch.distributed rank {rank}; set RANK from "
                "SLURM_PROCID (zeropp_hier.app.train does) or give the topology explicitly",
            )
    local_rank = task.localid if task is not None else _local_rank(env, rank)
    host = env.get("SLURMD_NODENAME") or hostname
    device = package = package_source = None
    if gpu_count > 0:
        vis = visible_devices(env)
        if vis is None:
            device = local_rank % gpu_count
        else:
            device = _device_index(vis[local_rank % len(vis)] if len(vis) > 1 else vis[0], ",".join(vis))
        packages, source = node_packages(env, hostname, showtopo_text, link_counts_text)
        if packages is not None:
            if device not in packages:
                raise HierTopologyError(
                    source or "topology", sorted(packages), f"does not list GPU{device}, the device of rank {rank}"
                )
            package, package_source = packages[device], source
    return RankRecord(
        rank,
        host,
        local_rank,
        device,
        package,
        task.ntasks if task else None,
        task.nnodes if task else None,
        package_source,
    )


def _field(name: str) -> str:
    return f"zeropp_hier.topology.{name}"


def build_topology(
    records: Sequence[RankRecord], gcds_per_gpu: int | None = None, gpus_per_node: int | None = None
) -> Detected:
    """Every rank's record -> the topology ([Note: auto topology rules])."""
    world = len(records)
    records = sorted(records, key=lambda r: r.rank)
    if [r.rank for r in records] != list(range(world)):
        raise HierTopologyError("topology", [r.rank for r in records], f"records must cover ranks 0..{world - 1}")
    for r in records:
        if r.slurm_ntasks is not None and r.slurm_ntasks != world:
            raise HierTopologyError(
                "SLURM_NTASKS",
                r.slurm_ntasks,
                f"the Slurm step has {r.slurm_ntasks} tasks but {world} ranks joined; launch one rank per task",
            )
    hosts: list[str] = []
    by_host: dict[str, list[RankRecord]] = {}
    for r in records:  # hosts in order of their lowest rank
        if r.host not in by_host:
            hosts.append(r.host)
            by_host[r.host] = []
        by_host[r.host].append(r)
    nnodes = {r.slurm_nnodes for r in records if r.slurm_nnodes is not None}
    if nnodes and nnodes != {len(hosts)}:
        raise HierTopologyError(
            "SLURM_NNODES",
            sorted(nnodes),
            f"but ranks report {len(hosts)} distinct host names {hosts[:8]}; check the host names (SLURMD_NODENAME)",
        )
    counts = {h: len(rs) for h, rs in by_host.items()}
    if len(set(counts.values())) > 1:
        raise HierTopologyError(
            "topology",
            counts,
            "hosts run different numbers of ranks; launch the same number of ranks on every node (--ntasks-per-node)",
        )
    has_gpu = {r.device is not None for r in records}
    if len(has_gpu) > 1:
        raise HierTopologyError(
            "topology",
            {r.rank: r.device for r in records},
            "some ranks see a GPU and others do not; check --gpus-per-task",
        )
    if has_gpu == {True}:
        packages_per_host, source = _gpu_packages(by_host, hosts, gcds_per_gpu)
    else:
        packages_per_host, source = _cpu_packages(by_host, hosts, gcds_per_gpu)
    sizes = {len(p) for pk in packages_per_host for p in pk}
    if len(sizes) > 1:
        raise HierTopologyError(
            "topology",
            {h: [len(p) for p in pk] for h, pk in zip(hosts, packages_per_host)},
            "packages hold different numbers of ranks (e.g. one GCD of a package "
            "unused); use every GCD of each package you use, or give the topology "
            "explicitly",
        )
    g = sizes.pop()
    per_host = len(packages_per_host[0])
    if gcds_per_gpu is not None and gcds_per_gpu != g:
        raise HierTopologyError(
            _field("gcds_per_gpu"),
            gcds_per_gpu,
            f"the ranks found {g} GCDs per package ({source}); remove the setting or set {g}",
        )
    if has_gpu == {True} or gpus_per_node is None:
        p = per_host
        if gpus_per_node is not None and gpus_per_node != p:
            raise HierTopologyError(
                _field("gpus_per_node"),
                gpus_per_node,
                f"the ranks found {p} GPU packages per node; remove the setting or set {p}",
            )
    else:  # CPU: cut each host into simulated nodes of gpus_per_node packages
        p = gpus_per_node
        if per_host % p:
            raise HierTopologyError(
                _field("gpus_per_node"),
                p,
                f"each host has {per_host} packages of "
                f"{g} ranks, not a multiple of {p}; choose a divisor of {per_host}",
            )
    rank_map = [r for pk in packages_per_host for pkg in pk for r in pkg]
    topo = Topology.for_world(world, p, g, None if rank_map == list(range(world)) else rank_map)
    return Detected(topo, tuple(hosts), source)


def _gpu_packages(by_host, hosts, gcds_hint):
    from_smi = all(r.package is not None for rs in by_host.values() for r in rs)
    if from_smi:
        sources = sorted({r.package_source or "rocm-smi --showtopo" for rs in by_host.values() for r in rs})
        source = "; ".join(sources)
    else:
        g = gcds_hint or DEFAULT_GCDS_PER_GPU
        source = f"device index // {g} (neither rocm-smi nor XGMI link counts available)"
    out = []
    for h in hosts:
        seen: dict[int, int] = {}
        pk: dict[int, list[RankRecord]] = {}
        for r in by_host[h]:
            if r.device in seen:
                raise HierTopologyError(
                    "topology",
                    {"host": h, "device": r.device, "ranks": [seen[r.device], r.rank]},
                    "two ranks drive the same GCD; launch one rank per GCD "
                    "(srun --gpus-per-task=1 --gpu-bind=closest)",
                )
            seen[r.device] = r.rank
            key = r.package if from_smi else r.device // g
            pk.setdefault(key, []).append(r)
        # packages by their lowest rank, GCDs by rank: the order the ranks were launched in, so a
        # standard launch is the identity map whatever the hardware ids are ([Note: launch order])
        members = [sorted(r.rank for r in pk[k]) for k in pk]
        out.append(sorted(members, key=lambda ranks: ranks[0]))
    return out, source


def _cpu_packages(by_host, hosts, gcds_hint):
    g = gcds_hint or DEFAULT_GCDS_PER_GPU
    out = []
    for h in hosts:
        rs = sorted(by_host[h], key=lambda r: r.local_rank)
        if len({r.local_rank for r in rs}) != len(rs):
            raise HierTopologyError(
                "LOCAL_RANK",
                [r.local_rank for r in by_host[h]],
                f"ranks on host {h} repeat a local rank; set LOCAL_RANK (or run under srun)",
            )
        if len(rs) % g:
            raise HierTopologyError(
                _field("gcds_per_gpu"),
                g,
                f"host {h} runs {len(rs)} ranks, not a "
                f"multiple of {g}; launch a multiple of {g} ranks per node or set "
                "gcds_per_gpu to a divisor",
            )
        out.append([[r.rank for r in rs[i : i + g]] for i in range(0, len(rs), g)])
    return out, f"no GPU: runs of {g} consecutive local ranks"
