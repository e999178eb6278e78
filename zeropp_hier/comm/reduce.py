"""The hierarchical reduce-scatter of a gradient bucket, over plain tensors and a ``CommPlan``.

The gradients are laid out as DeepSpeed's reduce-scatter cuts them (tensor t in ``world`` chunks
of ceil(numel / world); rank r owns chunk r of every tensor), one row per destination rank
(``layout.pack_grad_rows``); the plan's stages then sum the rows away axis by axis, and each
rank ends with its own row, the world's average of its chunks. Nothing here knows DeepSpeed:
``deepspeed/stage3.py`` hands the bucket's gradients in and the chunks to DeepSpeed's
partitions.

[Note: streamed gradient stages]
Reduce-scatter sums each column of the rows on its own, so the stages run on column chunks one
after another: the reordering, the stage layout, the wire and receive buffers are the size of
one chunk, not of the bucket (DeepSpeed's default bucket is 5e8 elements: several GB per staging
copy in fp32). Chunk edges fall on block boundaries, where the rows' quantization blocks already
end, so every block, sum and residual is the same as unchunked: the result is bit for bit the
same.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Sequence

import torch

from ..core import layout
from ..core.policy import QUANTIZED
from .context import CommContext
from .gather import with_block
from .job import Done, Job, Move


def row_pad(ctx: CommContext) -> int:
    """Rows padded to every quantized stage's block size (powers of two: the largest), so that
    no quantization block straddles two destinations."""
    return max((h.block_size for h in ctx.plan.reduce if h.scheme in QUANTIZED), default=1)


@dataclass(frozen=True)
class Bucket:
    """One gradient bucket as its stages take it: the packed rows, the column chunks the stages
    run on ([Note: streamed gradient stages]), the gradients' sizes (to cut this rank's chunks
    out), the wire dtype, the error-feedback key (None: no feedback) and the loss scale the
    gradients carry (fp16)."""

    packed: layout.GradRows
    chunks: Sequence[tuple[int, int]]
    numels: Sequence[int]
    wire_dtype: torch.dtype
    key: tuple[str, ...] | None = None
    loss_scale: float = 1.0


def submit_reduce_scatter(
    ctx: CommContext,
    grads: Sequence[torch.Tensor],
    wire_dtype: torch.dtype,
    key: tuple[str, ...] | None = None,
    loss_scale: float = 1.0,
) -> Future[Done[list[torch.Tensor]]]:
    """Average ``grads`` over the world without waiting; ``ctx.executor.result`` of the returned
    future gives this rank's chunk of each (fp32), in the sizes DeepSpeed's
    ``reduce_scatter_coalesced`` returns. The gradients are copied into the stage layout now, on
    the caller (who may reuse their memory at once: DeepSpeed's bucket buffer), and the stages
    run on the executor behind any gather in flight (one order per hop group, [Note: one order
    of hop collectives] in comm/executor.py). ``key`` names the bucket for error feedback;
    ``loss_scale`` is the one the gradients carry (fp16)."""
    world = ctx.world
    pad = row_pad(ctx)
    packed = layout.pack_grad_rows(grads, world, pad, scale=1.0 / world, align_chunks=pad > 1)
    numels = [g.numel() for g in grads]
    width = packed.rows.shape[1]
    pad = packed.block  # a packed row's own block ([Note: a packed row's block] in core/layout.py)
    if ctx.pipeline_chunks > 1:  # a job per chunk ([Note: chunked gathers] in comm/gather.py)
        per = world * -(-width // ctx.pipeline_chunks)
        chunks = column_chunks(width, pad, world, min(ctx.stream_chunk_elems, per))
        jobs = pipelined_rows(ctx, Bucket(packed, chunks, numels, wire_dtype, key, loss_scale))
        return ctx.executor.submit_all(jobs, [hop.axes for hop in ctx.plan.reduce], kind="exchange")
    chunks = column_chunks(width, pad, world, ctx.stream_chunk_elems)
    lanes = [hop.axes for _ in chunks for hop in ctx.plan.reduce]
    job = reduce_rows(ctx, Bucket(packed, chunks, numels, wire_dtype, key, loss_scale))
    return ctx.executor.submit(job, lanes, kind="exchange")


def pipelined_rows(ctx: CommContext, bucket: Bucket) -> list[Job[list[torch.Tensor] | None]]:
    """``reduce_rows`` as one job per column chunk, to be submitted in order: chunk i's slow
    stage runs beside chunk i+1's faster one on lanes. Every chunk's last stage is on one lane,
    so each chunk's job writes its columns before the next one's, and the last job hands out
    the chunks. The same chunks, error-feedback keys and sums as ``reduce_rows`` over ``chunks``:
    bit for bit its result."""
    packed, chunks = bucket.packed, bucket.chunks
    rows = packed.rows
    out = rows.new_empty(rows.shape[1])

    valid = _valid(packed)

    def job(i: int, a: int, b: int) -> Job[list[torch.Tensor] | None]:
        if i == 0:
            ctx.hooks.check_local(rows)
        buf = yield from _chunk_stages(ctx, bucket, (a, b), valid, out)
        out[a:b].copy_(buf.reshape(-1))
        if i < len(chunks) - 1:
            return None
        return layout.unpack_my_chunks(out, bucket.numels, packed.chunk, ctx.rank, packed.slots)

    return [job(i, a, b) for i, (a, b) in enumerate(chunks)]


def _valid(packed: layout.GradRows) -> layout.Valid | None:
    """The columns of the rows that can hold a value: each tensor's chunk, not its slot's
    padding ([Note: padding stays off the wire] in core/layout.py)."""
    if packed.slots is None or packed.rows.shape[1] != sum(packed.slots):
        return None
    return layout.valid_of(packed.chunk, packed.slots)


def column_chunks(width: int, pad: int, world: int, chunk_elems: int) -> list[tuple[int, int]]:
    """[Note: streamed gradient stages]: column ranges of at most ``chunk_elems`` elements over
    all ``world`` rows, edges on ``pad``-element block boundaries."""
    step = max(pad, layout.aligned(-(-chunk_elems // world), pad))
    return [(a, min(a + step, width)) for a in range(0, width, step)] or [(0, 0)]


def _chunk_stages(
    ctx: CommContext, bucket: Bucket, span: tuple[int, int], valid: layout.Valid | None, out: torch.Tensor | None
) -> Job[torch.Tensor]:
    """The plan's stages over the columns ``span`` of the bucket's rows (one chunk), announcing each
    stage's collective (``Move``) before issuing it; returns the chunk's sum. One definition
    for ``reduce_rows`` (every chunk in one job) and ``pipelined_rows`` (a job per chunk), so
    that both give the same blocks, sums and error-feedback keys."""
    a, b = span
    rows, key = bucket.packed.rows, bucket.key
    cols = None if valid is None else valid.columns(a, b)
    buf = ctx.rows_by_coord(rows[:, a:b]).contiguous().view(*ctx.topo.dims, -1)
    ckey = key if len(bucket.chunks) == 1 or key is None else (*key, f"columns {a}:{b}")
    # the stages quantize in the rows' block ([Note: a packed row's block] in core/layout.py)
    for s, hop in enumerate(with_block(ctx.plan.reduce, bucket.packed.block)):
        # the rows and the output are read and written on several lanes (GPU streams)
        yield Move(hop.axes, (buf, rows) if out is None else (buf, rows, out))
        hook = ctx.hooks.reduce_hook(ckey, s, hop, bucket.loss_scale)
        buf = yield from ctx.wire(
            ctx.coll.reduce_stage_steps(buf, hop, hop.block_size, bucket.wire_dtype, hook=hook, valid=cols)
        )
    return buf


def reduce_rows(ctx: CommContext, bucket: Bucket) -> Job[list[torch.Tensor]]:
    """The stages of one gradient bucket, chunk by chunk ([Note: streamed gradient stages]): a
    job for the executor, which announces each stage's collective (``Move``) before issuing it."""
    packed, chunks = bucket.packed, bucket.chunks
    rows = packed.rows
    ctx.hooks.check_local(rows)
    width = rows.shape[1]
    out = rows.new_empty(width) if len(chunks) > 1 else None
    valid = _valid(packed)
    for a, b in chunks:
        buf = yield from _chunk_stages(ctx, bucket, (a, b), valid, out)
        if out is None:
            out = buf.reshape(-1)
        else:
            out[a:b].copy_(buf.reshape(-1))
    assert out is not None
    return layout.unpack_my_chunks(out, bucket.numels, packed.chunk, ctx.rank, packed.slots)
