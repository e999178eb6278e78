"""Memory per GCD by part, and what to do when it does not fit.

Memory per GCD follows docs/design.md#memory-per-gcd: primary 2M/W + kept shard (secondary 2M/gcds_per_node for
ZeRO++, tertiary 2M/gcds_per_gpu for frontier) + optimizer 12M/W + gradient partition 2M/W
(bytes for 16-bit weights; other widths scale), plus the error-feedback residuals (one per
compressed stage that feeds back, the size of that stage's send buffer; fp32 or bf16), DeepSpeed's
gradient bucket, the fp32 staging of the reduce buckets, two gathered layers and activations.
"""

from __future__ import annotations

from typing import NamedTuple

from ..core import levels
from ..core.plan import STREAM_CHUNK_ELEMS, make_plan
from .candidates import Candidate
from .clusters import ClusterModel
from .workload import Workload

# DeepSpeed's gradient bucket: with ``contiguous_gradients`` (its default, which the job keeps)
# ZeRO-3 allocates one buffer of ``reduce_bucket_size`` elements per gradient dtype up front,
# whatever the model's size (``IPGBucketZ3.buffer`` in its stage3.py): 2 GB of fp32 at the
# default 5e8 elements, measured on one H200 as a dry run's 3.2M-parameter model's whole
# engine (benchmarks/results/gpu_dryrun_h200.json). On a CPU the buffer's pages are resident only
# once gradients are copied into them: at most the model's (``Workload.bucket_committed``).
# gradient staging ([Note: streamed gradient stages] in comm/reduce.py): the packed fp32
# rows of two buckets (the one in flight beside backward and the next being packed), plus, per
# streamed chunk, its reordering, stage layout, wire and receive buffers
STAGED_BUCKETS = 2
CHUNK_STAGING_COPIES = 4


class Memory(NamedTuple):
    parts: dict  # name -> bytes per GCD
    total: float
    fits: bool


def level_plan(cand: Candidate, cluster: ClusterModel, wl: Workload, chunks: int = 1) -> levels.LevelPlan | None:
    """The kept level of each of the workload's (equal) layers under the candidate's budget;
    ``chunks``: the pipeline chunks whose staging the other parts hold beside the kept copies."""
    if cand.kept_gb is None and not cand.fit:
        return None
    topo = cluster.topology
    if cand.kept_gb is not None:
        budget = cand.kept_gb * 1e9
    else:  # what the other parts leave
        others = memory(cand, cluster, wl, kept=0.0, chunks=chunks).parts.values()
        budget = max(0.0, cluster.memory_per_gcd - sum(others))
    share = wl.params / wl.layers / topo.world_size
    layers = [(f"layer {i}", share) for i in range(wl.layers)]
    per_elem = levels.kept_bytes_per_elem(make_plan(cand.preset, cand.compression, topo), wl.weight_bytes)
    return levels.assign(layers, cand.preset, topo, per_elem, budget)


def pipeline_staging(wl: Workload, chunks: int, stages: int) -> float:
    """Bytes per GCD that ``chunks`` pipelined chunks hold beyond the unchunked jobs
    ([Note: busiest-link bound]; [Note: chunked gathers] in comm/gather.py): one more gathered
    bucket (the assembly copies the chunks into one buffer beside them), one more fp32 copy of a
    gradient bucket's rows (the chunks waiting between stages hold at most the rows together)
    and, per stage, one running chunk's staging copies. 0 for one chunk."""
    if chunks <= 1:
        return 0.0
    bucket = min(wl.reduce_bucket, wl.params)
    chunk = min(STREAM_CHUNK_ELEMS, bucket / chunks)
    return wl.weight_bytes * wl.largest_layer_params + 4 * bucket + 4 * CHUNK_STAGING_COPIES * stages * chunk


def memory(cand: Candidate, cluster: ClusterModel, wl: Workload, kept: float | None = None, chunks: int = 1) -> Memory:
    """Bytes per GCD by part; ``kept``: the kept copies' bytes (default: the preset's copy of
    every layer); ``chunks``: pipelined chunks per job (their extra staging, ``pipeline_staging``)."""
    w, m, b = cluster.world_size, wl.params, wl.weight_bytes
    parts = {"primary": b * m / w, "optimizer": wl.optimizer_bytes_per_param * m / w, "gradients": b * m / w}
    plan = make_plan(cand.preset, cand.compression, cluster.topology)
    if plan.kept_axes is not None:
        name = "secondary (node copy)" if cand.preset == "zeropp" else "tertiary (package copy)"
        if kept is None:
            kept = levels.kept_bytes_per_elem(plan, b) * m / w * cluster.topology.axes_size(plan.kept_axes)
        elif cand.kept_gb is not None or cand.fit:
            name = "kept copies (per-layer levels)"
        if kept:
            parts[name] = kept
    # error feedback keeps, per compressed stage that feeds back, a residual the size of that
    # stage's send buffer: the rank's gradient rows not yet reduced by earlier stages
    residual_elems, rows = 0.0, w
    for hop in plan.reduce:
        if hop.error_feedback:
            residual_elems += m / w * rows
        rows //= cluster.topology.axes_size(hop.axes)
    if residual_elems:
        parts["error-feedback residuals"] = wl.residual_bytes * residual_elems
    parts["gradient bucket (DeepSpeed)"] = b * (wl.reduce_bucket if wl.bucket_committed else min(wl.reduce_bucket, m))
    bucket = min(wl.reduce_bucket, m)
    parts["gradient staging"] = 4 * (STAGED_BUCKETS * bucket + CHUNK_STAGING_COPIES * min(STREAM_CHUNK_ELEMS, bucket))
    parts["gathered layers"] = 2 * b * wl.largest_layer_params + 4 * wl.largest_layer_params
    if chunks > 1:
        parts["pipeline staging"] = pipeline_staging(wl, chunks, len(plan.reduce))
    parts["activations"] = wl.activation_bytes
    total = sum(parts.values())
    return Memory(parts, total, total <= cluster.memory_per_gcd)


def fit_advice(preset: str) -> str:
    """What to change when a candidate of ``preset`` does not fit, in a sentence or two."""
    if preset == "frontier":
        return (
            'Keep package copies only for the layers that fit ("memory": {"kept_shards_gb": ...}, '
            "the frontier/fit row), relax the kept shard to the node (preset zeropp: a node-sized "
            "secondary shard, 1/4 of it on Frontier), or drop it (zero3)."
        )
    if preset == "zeropp":
        return "Drop the secondary shard (zero3), or add nodes."
    return "Add nodes, or enable activation checkpointing / optimizer offload."
