"""The hierarchical gather, over plain tensors and a ``CommPlan``.

A bucket of tensors is gathered as one buffer in the canonical layout ([Note: canonical buffer
layout] in core/layout.py): each tensor's partition on this rank side by side in ``[1, 1, 1, S]``
(from the primary partitions) or a kept copy ``[n, p, g, S]`` spanning some axes; each hop fills
in its axes; the end cuts every tensor's full values out of the ``[N, P, G, S]`` result.

``hop_steps`` is the driver: a generator that announces each hop's collective (``Move``, for the
executor: [Note: one order of hop collectives] in comm/executor.py) before issuing it, and
returns the gathered buffer. ``gather_bucket`` runs it over a bucket's start buffer and hands
the result to the bucket's end (``finish_bucket``: the copies to keep, the tensors' values).
Nothing here knows DeepSpeed: ``deepspeed/runtime.py`` maps parameters to these tensors and
back.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence, TypeVar

import torch

from .. import quant
from ..core import layout
from ..core.plan import CommPlan, Hop
from ..core.policy import QUANTIZED
from .collectives import Encoded
from .context import CommContext
from .job import Job, Move

Buffer = torch.Tensor | Encoded  # a gather buffer, plain or in a quantized wire format
R = TypeVar("R")  # what a bucket's ``finish`` makes of its gathered buffer


def exact(hops: Sequence[Hop]) -> tuple[Hop, ...]:
    return tuple(h._replace(scheme="none") for h in hops)


def hops_for(plan: CommPlan, src: tuple[str, ...], phase: str) -> tuple[Hop, ...]:
    """The hops of a gather from the primary partitions (``src`` empty) or from kept copies
    spanning ``src``. Gathers outside forward and backward (``phase`` "other_gather": saved,
    inspected or kept weights) take the forward's hops, exact ([Note: every gather through the
    hierarchy] in deepspeed/partition.py)."""
    if src:
        return plan.backward_for(src)
    return exact(plan.forward) if phase == "other_gather" else plan.forward


def backward_hops(plan: CommPlan, all_levels: bool) -> list[Hop]:
    """The backward hops of the kept levels in use: the preset's own, or every level the preset
    allows (``all_levels``: under a memory budget, [Note: kept levels] in core/levels.py)."""
    return [h for axes, hops in plan.by_level if all_levels or axes == plan.kept_axes for h in hops]


def slot_align(hops: Sequence[Hop]) -> int:
    """Slot granularity of gathered partitions: the largest block of any quantizing hop (block
    sizes are powers of two, so it is a multiple of every one); 1 when all are exact."""
    return max((h.block_size for h in hops if h.scheme in QUANTIZED), default=1)


def slots_of(sizes: Sequence[int], align: int, world: int = 1) -> list[int]:
    """Each partition in a slot of whole blocks ([Note: blocks never straddle]) while the padding
    over the ``world`` segments of a gathered bucket stays bounded ([Note: per-rank costs flat
    in the world] in core/layout.py)."""
    return list(layout.block_slots(sizes, align, world))


def with_block(hops: Sequence[Hop], block: int) -> tuple[Hop, ...]:
    """The hops as a bucket whose row is quantized in ``block`` runs them: every quantizing hop's
    block (and rotation) at most ``block`` ([Note: a packed row's block] in core/layout.py)."""
    return tuple(
        h._replace(block_size=block, rotate=min(h.rotate, block))
        if h.scheme in QUANTIZED and h.block_size > block
        else h
        for h in hops
    )


class KeptRow(NamedTuple):
    """A kept copy of a whole packed bucket ([Note: kept copies of packed buckets]): the copy,
    the bucket's layout and its tensors' keys (``ids``) in row order."""

    buf: Buffer  # [n, p, g, S]: every block along the kept axes, this rank's along the others
    ids: tuple[int, ...]
    sizes: tuple[int, ...]
    slots: tuple[int, ...]
    numels: tuple[int, ...]
    block: int  # the row's quantization block


# [Note: kept copies of packed buckets]
# A kept copy used to be cut per tensor, each on its own block boundaries, so a bucket that keeps
# copies kept whole-block slots ([Note: blocks never straddle]) whatever the world: at 75,264
# ranks a tertiary copy spans 37,632 peers, 256 bytes per peer per tensor (the 52 tensors of a
# 1.3 M-parameter GPT: 500 MB). Where a bucket's row is packed ([Note: per-rank costs flat in the
# world] in core/layout.py) its copy is kept whole instead, once, as ``KeptRow``: the backward
# gathers the whole row (the tensors of the bucket that it did not ask for too; their values are
# not handed out) from the same bytes the forward delivered, so it decodes exactly the weights the
# forward used (tests/dist/test_packed_rows.py). Whole-block buckets (every layout at test sizes)
# keep their copies per tensor as before.


def kept_copy(ctx: CommContext, full: Buffer, axes: tuple[str, ...]) -> Buffer:
    """The part of a gathered buffer this rank keeps for ``axes``: every block along them, its own
    coordinate along the others."""
    if isinstance(full, Encoded):
        return full._replace(
            data=layout.kept_shard(full.data, ctx.me, axes), scales=layout.kept_shard(full.scales, ctx.me, axes)
        )
    return layout.kept_shard(full, ctx.me, axes)


def primary_buffer(
    parts: Sequence[torch.Tensor], sizes: Sequence[int], numels: Sequence[int], slots: Sequence[int], rank: int
) -> torch.Tensor:
    """This rank's partitions (``parts[i]``: ``sizes[i]`` elements of a tensor of ``numels[i]``)
    side by side, each in its slot; everything else zero. The tail of the last partitions past
    a tensor's end is uninitialised memory (DeepSpeed leaves it so): uncompressed those
    elements are never read, but a quantization block holding them would take its scale from
    whatever is there (NaN included) and spoil the real values beside it."""
    dtype, device = parts[0].dtype, parts[0].device
    padded = list(slots) != list(sizes)
    if not padded:  # no padding: one concatenation, then zero the tails
        buf = torch.cat([t.reshape(-1) for t in parts])
    else:
        buf = torch.zeros(sum(slots), dtype=dtype, device=device)
    off = 0
    for t, n, numel, slot in zip(parts, sizes, numels, slots):
        valid = max(0, min(n, numel - rank * n))
        if padded:
            buf[off : off + valid].copy_(t.reshape(-1)[:valid])
        elif valid < n:
            buf[off + valid : off + n].zero_()
        off += slot
    return buf.view(1, 1, 1, -1)


def hop_steps(
    ctx: CommContext,
    hops: Sequence[Hop],
    start: Buffer,
    phase: str,
    carry: Sequence[torch.Tensor] = (),
    valid: layout.Valid | None = None,
) -> Job[Buffer]:
    """Run ``hops`` over ``start`` ([n, p, g, S], plain or encoded); announce each collective
    before issuing it. ``carry``: tensors made on other lanes that the first hop reads (the
    kept copies). ``valid``: the elements of a row that can hold a value, the only ones every
    hop sends ([Note: padding stays off the wire] in core/layout.py). Returns the full
    [N, P, G, S] buffer, encoded if a hop quantized ([Note: quantize once per gather] in
    comm/collectives.py)."""
    coll = ctx.coll
    enc: Encoded | None = start if isinstance(start, Encoded) else None
    buf: torch.Tensor | None = start if isinstance(start, torch.Tensor) else None
    for i, hop in enumerate(hops):
        # the tensors this hop reads that another lane made (on a GPU: its stream)
        moved: tuple[torch.Tensor, ...] = (
            (enc.data, enc.scales) if enc is not None else (buf,) if buf is not None else ()
        )
        yield Move(hop.axes, (*moved, *carry) if i == 0 else moved)
        hook = ctx.hooks.gather_hook(phase, hop)
        if enc is None and hop.scheme in QUANTIZED:
            assert buf is not None
            enc = coll.encode(buf, hop, hop.block_size, hook=hook)
        # the hop's transfer by its group's collective, or yielded to the tick driver
        # ([Note: collectives as steps] in comm/collectives.py)
        if enc is not None:
            enc = yield from ctx.wire(coll.gather_encoded_steps(enc, hop, phase, valid))
        else:
            assert buf is not None
            buf = yield from ctx.wire(coll.gather_hop_steps(buf, hop, hop.block_size, phase, hook=hook, valid=valid))
    out = enc if enc is not None else buf
    assert out is not None
    return out


def cut_kept(
    ctx: CommContext, full: Buffer, slots: Sequence[int], keep: Sequence[tuple[str, ...] | None]
) -> list[Buffer | None]:
    """From a gathered buffer, the copy of each tensor this rank keeps: every block along
    ``keep[i]``, its own coordinate along the other axes (None: keep nothing). An encoded
    buffer leaves encoded copies."""
    cut: dict[tuple[str, ...], Buffer] = {}  # kept axes -> this rank's part of the buffer
    out: list[Buffer | None] = []
    off = 0
    for axes, slot in zip(keep, slots):
        piece: Buffer | None = None
        if axes is not None:
            if axes not in cut:
                cut[axes] = kept_copy(ctx, full, axes)
            kept = cut[axes]
            piece = kept.payload(off, slot) if isinstance(kept, Encoded) else kept[..., off : off + slot].contiguous()
        out.append(piece)
        off += slot
    return out


def split_full(
    ctx: CommContext,
    full: Buffer,
    dtype: torch.dtype,
    sizes: Sequence[int],
    slots: Sequence[int],
    numels: Sequence[int],
) -> list[torch.Tensor]:
    """Every tensor's full values (1-D, ``numels[i]`` elements, rank order, contiguous) from a
    gathered buffer (decoded to ``dtype`` if encoded)."""
    if isinstance(full, Encoded) and not full.rotate and 2 * sum(sizes) <= full.row_elems:
        return _decoded_columns(ctx, full, dtype, sizes, slots, numels)
    buf = ctx.coll.decode(full, dtype) if isinstance(full, Encoded) else full
    rows = ctx.rows_by_rank(buf.reshape(ctx.world, -1))  # coordinate order -> global rank order
    out, off = [], 0
    for n, slot, numel in zip(sizes, slots, numels):
        # A one-element partition (a tensor no larger than the world) beside other slots is a
        # [world, 1] column, which reshape flattens to a strided view instead of a copy; the
        # parameter's data would then be strided, and DeepSpeed's GatheredParameters broadcast
        # (which views it as bytes) refuses it. contiguous() copies only that case.
        out.append(rows[:, off : off + n].reshape(-1)[:numel].contiguous())
        off += slot
    return out


def _decoded_columns(
    ctx: CommContext,
    full: Encoded,
    dtype: torch.dtype,
    sizes: Sequence[int],
    slots: Sequence[int],
    numels: Sequence[int],
) -> list[torch.Tensor]:
    """``split_full`` of an encoded buffer whose tensors use at most half of each row: each
    tensor's columns decoded by themselves, the padding never ([Note: decoding a few columns]
    in quant/__init__.py; at 9,408 nodes most rows of a small model are one block holding a
    few values)."""
    data = ctx.rows_by_rank(full.data.reshape(ctx.world, -1))
    scales = ctx.rows_by_rank(full.scales.reshape(ctx.world, -1))
    out, off = [], 0
    for n, slot, numel in zip(sizes, slots, numels):
        cols = quant.dequantize_columns(data, scales, full.bits, full.block_size, off, off + n, dtype)
        out.append(cols.reshape(-1)[:numel])  # a fresh tensor: its prefix is contiguous
        off += slot
    return out


class Gathered(NamedTuple):
    values: list[torch.Tensor]  # each tensor's full values, 1-D
    kept: list[Buffer | None]  # each tensor's kept copy, or None


def gather_bucket(
    ctx: CommContext,
    hops: Sequence[Hop],
    start: Buffer,
    phase: str,
    finish: Callable[[Buffer], R],
    carry: Sequence[torch.Tensor] = (),
    valid: layout.Valid | None = None,
) -> Job[R]:
    """One bucket in one job: the hops, then ``finish`` of the gathered buffer (``finish_bucket``:
    the copies to keep and the values). ``chunk_jobs`` is the same in a job per column chunk."""
    full = yield from hop_steps(ctx, hops, start, phase, carry, valid)
    return finish(full)


# [Note: chunked gathers]
# One gather runs its hops in sequence (each needs the previous one's output), so while its
# slow ``node`` hop runs, the ``gpu`` and ``gcd`` links wait. With ``zeropp_hier.pipeline.chunks``
# above 1, a bucket is cut into column chunks of every rank's segment and each chunk is its own
# job (``chunk_jobs``), submitted in chunk order with the same hop lanes. Each lane then keeps one
# program order on every rank (rule 1 of [Note: one order of hop collectives] in
# comm/executor.py), and the executor's slot order alone pipelines the tiers: on lanes (gloo),
# chunk i's ``gcd`` hop, chunk i+1's ``gpu`` hop and chunk i+2's ``node`` hop run at once, so a
# gather costs about its slowest tier plus the others' time for one chunk (fill and drain;
# [Note: pipelined hops] in planner/pipeline.py) instead of the sum of its tiers.
#
# Same bytes, same values: a gather only moves columns, and chunk edges fall on whole blocks of
# every quantizing hop and of an encoded start ([Note: blocks never straddle]: slots are whole
# blocks), so every block, scale and byte is the one the unchunked gather makes; the chunks are
# put side by side (``torch.cat`` / ``Encoded.cat``) before the copies to keep and the values
# are cut, bit for bit the unchunked result.
#
# Ordering: every chunk's last hop is on the same lane, which takes slots in submission order,
# so chunk i's job ends (its result stored) before chunk i+1's, and the last chunk's job finds
# every chunk done and assembles them; the start buffer is made by chunk 0's job on the first
# hop's lane, before any later chunk reads it there. On a GPU those are one stream per lane.
#
# Staging bound: each chunk holds only its latest hop's output (at most its share of the full
# buffer) and a running collective its input beside it, so the chunks in flight together hold at
# most one full gathered buffer plus one chunk's input per tier; the assembly then copies them
# into one full buffer (the unchunked gather's own result), so the peak is at most one full
# buffer above the unchunked gather's, briefly, at the end.
#
# Gradient buckets do the same with their streamed column chunks ([Note: streamed gradient
# stages] in comm/reduce.py): ``reduce.pipelined_rows`` makes a job per chunk, submitted together
# with ``CommExecutor.submit_all`` (one future: the last chunk's value or the first error).
#
# One lane (``one_lane``; serial on RCCL) stays correct but pipelines nothing between tiers:
# one host thread issues every collective in program order (chunk 0's node, gpu, gcd hops, then
# chunk 1's ...), and serial waits for each to complete before the next, because the GPU rules
# ([Note: one issuing thread on GPUs] in comm/issue.py) allow no two communicators' collectives
# in flight out of one agreed order; chunking then only adds latency. The tick mode (NCCL/RCCL's
# default for one-tier hops) overlaps them inside one communicator: [Note: ticks] in comm/tick/plan.py.


def column_ranges(width: int, align: int, chunks: int) -> list[tuple[int, int]]:
    """At most ``chunks`` column ranges covering ``[0, width)`` with every edge on a multiple of
    ``align`` (``width`` is one, [Note: blocks never straddle]); near-equal widths, fewer
    ranges when there are fewer than ``chunks`` blocks."""
    if width % align:
        raise AssertionError(f"a gather row of {width} elements is not whole {align}-element blocks")
    blocks = width // align
    n = max(1, min(chunks, blocks))
    edges = [align * (blocks * i // n) for i in range(n + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:])]


def columns(buf: Buffer, a: int, b: int) -> Buffer:
    """Columns ``[a, b)`` of every row of a [n, p, g, S] buffer, plain or encoded."""
    if isinstance(buf, Encoded):
        return buf.payload(a, b - a)
    return buf[..., a:b].contiguous()


def chunk_align(hops: Sequence[Hop], start_block: int = 1) -> int:
    """Granularity of chunk edges: every quantizing hop's block, and an encoded start's."""
    return max(slot_align(hops), start_block)


def chunk_jobs(
    ctx: CommContext,
    hops: Sequence[Hop],
    make_start: Callable[[], Buffer],
    ranges: Sequence[tuple[int, int]],
    phase: str,
    finish: Callable[[Buffer], R],
    carry: Sequence[torch.Tensor] = (),
    valid: layout.Valid | None = None,
) -> list[Job[R | None]]:
    """[Note: chunked gathers]: one job per column range of the start buffer (made by the first
    job, when it starts on its lane), each to be submitted in order with the lanes of ``hops``.
    The last job returns ``finish(full)`` of the assembled buffer; the others return None."""
    held: dict[str, Buffer] = {}
    done: list[Buffer | None] = [None] * len(ranges)

    def job(i: int, a: int, b: int) -> Job[R | None]:
        if i == 0:
            held["start"] = make_start()
        piece = columns(held["start"], a, b)
        done[i] = yield from hop_steps(ctx, hops, piece, phase, carry, None if valid is None else valid.columns(a, b))
        if i < len(ranges) - 1:
            return None
        held.clear()
        parts = [p for p in done if p is not None]
        if len(parts) != len(ranges):  # its error is in that chunk's future, taken first
            raise RuntimeError(f"zeropp_hier: {len(ranges) - len(parts)} earlier chunk(s) of this gather failed")
        done.clear()
        if isinstance(parts[0], Encoded):
            full: Buffer = Encoded.cat(parts)  # type: ignore[arg-type]
        else:
            full = parts[0] if len(parts) == 1 else torch.cat(parts, dim=3)  # type: ignore[arg-type]
        return finish(full)

    return [job(i, a, b) for i, (a, b) in enumerate(ranges)]


def finish_bucket(
    ctx: CommContext,
    dtype: torch.dtype,
    sizes: Sequence[int],
    slots: Sequence[int],
    numels: Sequence[int],
    keep: Sequence[tuple[str, ...] | None] | None = None,
) -> Callable[[Buffer], Gathered]:
    """The end of a bucket's gather as a function of the gathered buffer (for ``gather_bucket``
    and ``chunk_jobs``)."""

    def finish(full: Buffer) -> Gathered:
        kept: list[Buffer | None] = cut_kept(ctx, full, slots, keep) if keep is not None else [None] * len(sizes)
        return Gathered(split_full(ctx, full, dtype, sizes, slots, numels), kept)

    return finish
