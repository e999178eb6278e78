"""The job's memory check: the planner's memory per GCD for this model and layout, printed before
the model is built, and a refusal when the chosen layout cannot fit.

Pure: the planner's arithmetic (``planner/memory_per_gcd.memory``, docs/design.md#memory-per-gcd) on the
job's shape; no torch.distributed. ``launch`` calls it on every rank before any rank builds a
model, so every rank refuses alike and nothing is spent on a run that cannot fit.

The budget per rank is ``JobSpec.memory_gb`` when given, else the device's memory: a MI250X GCD
64 GB, an H100 80 GB (the vendors' specifications), another GPU what torch reports, a CPU the
machine's RAM shared by the ranks of one node.
"""

from __future__ import annotations

import os
from dataclasses import replace

from .. import planner as P
from ..comm.issue import default_chunks
from ..core.errors import HierConfigError
from .spec import JobSpec, n_params

GB = 1e9
# device memory by name (substring of torch.cuda.get_device_name): MI250X 128 GB HBM2e per GPU,
# 64 GB per GCD (AMD's MI250X specification); H100 80 GB (NVIDIA's H100 SXM/PCIe specification)
DEVICE_MEMORY = (("MI250X", 64 * GB), ("H100", 80 * GB))


def device_budget(device_name: str | None, ranks_per_node: int, total_bytes: float | None = None) -> tuple[float, str]:
    """Bytes one rank may use, and where the number comes from. ``device_name`` None: a CPU rank,
    whose share is the machine's RAM over the ranks of the node; ``total_bytes``: what the device
    reports (used for a GPU not in ``DEVICE_MEMORY``)."""
    if device_name is None:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return ram / max(1, ranks_per_node), f"CPU: {ram / GB:.0f} GB RAM / {ranks_per_node} ranks per node"
    for key, size in DEVICE_MEMORY:
        if key in device_name:
            return size, f"{key}: {size / GB:.0f} GB"
    if total_bytes is None:
        raise HierConfigError("memory_gb", None, f"the memory of {device_name!r} is unknown: give memory_gb")
    return total_bytes, f"{device_name}: {total_bytes / GB:.0f} GB"


def _layout(spec: JobSpec, world: int, ranks_per_node: int, device_name: str | None) -> tuple[int, int, int, str]:
    """(nodes, gpus_per_node, gcds_per_gpu) the planner models, and a note on where they come from."""
    topo = spec.topology if isinstance(spec.topology, dict) else {}
    declared_gpn, declared_gpg = topo.get("gpus_per_node"), topo.get("gcds_per_gpu")
    if declared_gpn is not None and declared_gpg is not None:  # declared, or auto's simulated shape
        gpn, gpg = int(declared_gpn), int(declared_gpg)
        note = "topology as configured"
    else:
        # auto: detected once ranks run. Packages of two GCDs on a MI250X, and on CPUs pairs of
        # consecutive local ranks ([Note: auto topology rules]); one device per package elsewhere
        gpg = 2 if (device_name is None or "MI250X" in device_name) and ranks_per_node % 2 == 0 else 1
        gpn = ranks_per_node // gpg
        note = f"topology auto: assumed {gpn} packages of {gpg} per node"
    per_node = gpn * gpg
    if per_node < 1 or world % per_node:
        raise HierConfigError(
            "topology",
            spec.topology,
            f"{world} ranks are not whole nodes of {per_node}: launch a multiple of {per_node}",
        )
    return world // per_node, gpn, gpg, note


def _candidates(spec: JobSpec) -> list[P.Candidate]:
    comp = spec.compression
    if spec.preset == "stock":
        return [P.Candidate("stock", True, "zero3", P.compression_for("zero3"))]
    if spec.preset == "auto":
        return P.auto_candidates()
    if isinstance(comp, dict):  # its block_size (one, or per tier) replaces the default 256
        c = P.compression_for(spec.preset, schemes=dict(comp))
    else:
        c = P.compression_for(spec.preset, comp)
    return [P.Candidate(spec.preset, False, spec.preset, c)]


def _as_run(cands: list[P.Candidate], spec: JobSpec, cluster: P.ClusterModel, world: int) -> list[P.Candidate]:
    """A fixed preset with the pipeline chunks the runtime will run, whose staging counts
    (comm/issue.default_chunks in the mode its plan resolves to on the GPUs); ``auto``'s
    candidates keep the planner's choice, as ``auto`` itself makes it."""
    if spec.preset == "auto":
        return cands
    chunks = spec.ds_config(world=world).get("zeropp_hier", {}).get("pipeline", {}).get("chunks")
    return [c._replace(chunks=default_chunks(chunks, P.resolved_issue_mode(c, cluster))) for c in cands]


def _predictions(
    spec: JobSpec, world: int, ranks_per_node: int, device_name: str | None, budget: float
) -> tuple[list[P.Prediction], P.ClusterModel, P.Workload, str]:
    """The planner's prediction of each of the job's layouts (one, or ``auto``'s candidates) on
    ``world`` ranks with ``budget`` bytes each, the cluster and workload it modelled, and the
    table's first line without the budget."""
    m = spec.model
    nodes, gpn, gpg, note = _layout(spec, world, ranks_per_node, device_name)
    # the buckets of the config the job builds (the recipe's, or the user's DeepSpeed keys)
    zero = spec.ds_config(world=world)["zero_optimization"]
    cluster = replace(
        P.frontier(nodes), name=f"{nodes}x{gpn}x{gpg}", gpus_per_node=gpn, gcds_per_gpu=gpg, memory_per_gcd=budget
    )
    wl = P.gpt_workload(
        float(n_params(m)),
        m.layers,
        m.hidden,
        m.seq_len,
        spec.micro_batch,
        weight_bytes=4 if spec.dtype == "fp32" else 2,
        activation_checkpointing=spec.activation_checkpointing != "none",
        vocab=m.vocab,
        # DeepSpeed's 5e7 when the config leaves it unset (prefetch on: what backward still holds)
        prefetch_bucket=float(zero.get("stage3_prefetch_bucket_size", 5e7)),
    )
    wl = replace(
        wl,
        reduce_bucket=float(zero.get("reduce_bucket_size", wl.reduce_bucket)),
        bucket_committed=device_name is not None,  # a device's allocator commits DeepSpeed's bucket whole
    )
    preds = [P.predict(c, cluster, wl) for c in _as_run(_candidates(spec), spec, cluster, world)]
    head = (
        f"memory per rank (planner's model, docs/design.md#memory-per-gcd), {world} ranks as "
        f"{nodes}x{gpn}x{gpg} ({note})"
    )
    return preds, cluster, wl, head


def parts(
    spec: JobSpec, world: int, ranks_per_node: int, device_name: str | None, device_bytes: float | None = None
) -> dict[str, dict[str, float]]:
    """The memory table as data: bytes per rank by part (and ``total``) for each of the job's
    layouts, keyed by the layout's name (the dry run reports it beside what the engine holds)."""
    budget, _ = _budget(spec, ranks_per_node, device_name, device_bytes)
    preds = _predictions(spec, world, ranks_per_node, device_name, budget)[0]
    return {p.candidate.name: {**p.memory.parts, "total": p.memory.total} for p in preds}


def need_bytes(
    spec: JobSpec, world: int, ranks_per_node: int, device_name: str | None, device_bytes: float | None = None
) -> float:
    """Bytes per rank the job's layout needs by the planner's model: the least total of its
    candidates (one for a fixed preset), which ``check`` compares with the budget."""
    budget, _ = _budget(spec, ranks_per_node, device_name, device_bytes)
    preds = _predictions(spec, world, ranks_per_node, device_name, budget)[0]
    return min(p.memory.total for p in preds)


def _budget(
    spec: JobSpec, ranks_per_node: int, device_name: str | None, device_bytes: float | None
) -> tuple[float, str]:
    if spec.memory_gb is not None:
        return spec.memory_gb * GB, f"memory_gb={spec.memory_gb:g}"
    return device_budget(device_name, ranks_per_node, device_bytes)


def check(
    spec: JobSpec, world: int, ranks_per_node: int, device_name: str | None, device_bytes: float | None = None
) -> list[str]:
    """The memory table's lines; raises ``HierConfigError`` when the job's layout cannot fit."""
    m = spec.model
    budget, source = _budget(spec, ranks_per_node, device_name, device_bytes)
    preds, cluster, wl, head = _predictions(spec, world, ranks_per_node, device_name, budget)
    names = list(dict.fromkeys(k for p in preds for k in p.memory.parts))  # auto: candidates differ
    lines = [
        f"{head}; budget {budget / GB:.3g} GB ({source}):",
        "| layout | " + " | ".join(names) + " | total GB | fits |",
        "|---|" + "---|" * (len(names) + 2),
    ]
    for p in preds:
        parts = " | ".join(f"{p.memory.parts[k] / GB:.3g}" if k in p.memory.parts else "-" for k in names)
        fits = "yes" if p.memory.fits else "NO"
        lines.append(f"| {p.candidate.name} | {parts} | {p.memory.total / GB:.3g} | {fits} |")
    if any(p.memory.fits for p in preds):
        return lines
    need = min(preds, key=lambda p: p.memory.total)
    # another preset that fits is the cheapest fix; else the model (or the budget) must change
    others = [
        P.predict(c, cluster, wl)
        for c in (P.Candidate(n, False, n, P.compression_for(n)) for n in ("zeropp", "zero3"))
        if c.preset != spec.preset
    ]
    fitting = [p for p in others if p.memory.fits]
    value: object  # the refused field's value: a preset name or a description of the model
    if fitting and spec.preset not in ("stock", "auto"):
        field, value = "preset", spec.preset
        fix = f"preset {fitting[0].candidate.name} fits ({fitting[0].memory.total / GB:.3g} GB); " + P.fit_advice(
            need.candidate.preset
        )
    else:
        field, value = "model", f"{n_params(m) / 1e9:.3g}B params, {m.layers} layers x {m.hidden}"
        fix = (
            P.fit_advice(need.candidate.preset)
            + " Or a smaller model, micro_batch or seq_len"
            + (", or activation_checkpointing=torch." if spec.activation_checkpointing == "none" else ".")
        )
    big = max(need.memory.parts, key=lambda part: need.memory.parts[part])
    raise HierConfigError(
        field,
        value,
        f"needs {need.memory.total / GB:.3g} GB per rank ({need.candidate.name}; largest part {big} "
        f"{need.memory.parts[big] / GB:.3g} GB) of a {budget / GB:.3g} GB budget ({source}). {fix}",
    )
