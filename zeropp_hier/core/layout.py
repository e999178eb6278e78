"""Layout maths of the hierarchical collectives: pure tensor reshapes, no communication.

[Note: canonical buffer layout]
Every buffer a hop works on is 4-D: ``[n, p, g, S]`` where (n, p, g) run along the axes
(node, gpu, gcd) and S is the per-rank payload. An axis that has not been gathered yet (or has
already been reduced) has size 1. Blocks of a collective are ordered row-major by the peers'
coordinates along the hop's axes (``Topology.peers``), so after an all-gather the k received
blocks are reshaped to the hop axes and interleaved into the axes they fill. Global ranks
appear only at the two ends, through ``Topology.rank_of_index``.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from .plan import STREAM_CHUNK_ELEMS as _STREAM_CHUNK_ELEMS
from .topology import Coord, Topology, normalize_axes
from .vocab import AXES


def hop_dims(topo: Topology, axes: Sequence[str]) -> tuple[int, int, int]:
    """(n, p, g) sizes of a hop's block grid: the topology's size along ``axes``, 1 elsewhere."""
    axes = normalize_axes(axes)
    return tuple(topo.axis_size(a) if a in axes else 1 for a in AXES)  # type: ignore[return-value]


def merge_gathered(
    out: torch.Tensor, have: tuple[int, int, int], hop: tuple[int, int, int], payload: int
) -> torch.Tensor:
    """Interleave an all-gather result into the canonical layout.

    out: [k * prod(have) * payload], k = prod(hop), blocks in peer order.
    Returns [hop[0]*have[0], hop[1]*have[1], hop[2]*have[2], payload]; for each axis one of
    hop/have is 1 (an axis is gathered once).
    """
    x = out.view(*hop, *have, payload)
    return x.permute(0, 3, 1, 4, 2, 5, 6).reshape(hop[0] * have[0], hop[1] * have[1], hop[2] * have[2], payload)


def split_for_stage(buf: torch.Tensor, stage_axes: Sequence[str]) -> torch.Tensor:
    """Arrange a [n, p, g, C] buffer as [k, m]: block j holds every row whose destination
    coordinates along ``stage_axes`` are those of the j-th peer (peer order)."""
    idx = [AXES.index(a) for a in normalize_axes(stage_axes)]
    rest = [i for i in range(3) if i not in idx]
    x = buf.permute(*idx, *rest, 3).contiguous()
    k = 1
    for i in idx:
        k *= buf.shape[i]
    return x.view(k, -1)


def dims_after_stage(dims: tuple[int, int, int], stage_axes: Sequence[str]) -> tuple[int, int, int]:
    axes = normalize_axes(stage_axes)
    return tuple(1 if a in axes else d for a, d in zip(AXES, dims))  # type: ignore[return-value]


def index_order(topo: Topology) -> torch.Tensor | None:
    """For each coordinate index i, the global rank placed there (None for the identity map)."""
    if topo.is_identity_map:
        return None
    return torch.tensor([topo.rank_of_index(i) for i in range(topo.world_size)], dtype=torch.long)


def rank_order(topo: Topology) -> torch.Tensor | None:
    """For each global rank r, its coordinate index (None for the identity map)."""
    if topo.is_identity_map:
        return None
    return torch.tensor([topo.index_of_rank(r) for r in range(topo.world_size)], dtype=torch.long)


class DevicePerms:
    """Index tensors of fixed permutations, copied to each device once and then reused.

    [Note: no host traffic in the hot path]
    A permutation built on the host and moved with ``.to(device)`` inside a gather or a reduce
    stage is a host-to-device copy per call, and on CUDA/ROCm a copy from pageable memory
    synchronises the host. The permutations are fixed per engine (rank map, group order), so
    each is made once per device on first use and looked up after that."""

    def __init__(self):
        self._cache: dict[tuple[str, str], torch.Tensor] = {}

    def get(self, name: str, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        key = (name, str(device))
        t = self._cache.get(key)
        if t is None:
            t = self._cache[key] = host.to(device)
        return t


def kept_shard(full: torch.Tensor, me: Coord, kept_axes: Sequence[str]) -> torch.Tensor:
    """From a fully gathered [N, P, G, S] buffer, the part this rank keeps: every block along
    ``kept_axes``, its own coordinate along the others. Returns a contiguous [n, p, g, S]."""
    kept = normalize_axes(kept_axes)
    x = full
    for dim, axis in enumerate(AXES):
        if axis not in kept:
            x = x.narrow(dim, me[dim], 1)
    return x.contiguous()


def aligned(n: int, block: int) -> int:
    """``n`` rounded up to a multiple of ``block``."""
    return -(-n // block) * block


# [Note: blocks never straddle]
# A quantization block takes one scale from its largest element. Blocks laid over a buffer that
# concatenates tensors would mix a small tensor with a large neighbour (a bias of std 0.002 beside
# a weight of std 0.02 loses most of its precision, and under int4 may round to zero), and a
# block across two ranks' segments would mix their data. So every tensor's piece starts on a
# block boundary: in a gather each parameter's partition takes a slot padded to a whole number
# of blocks (a rank's segment is then aligned too), and in a gradient row each tensor's chunk
# does. Only buffers that some hop quantizes are padded; the padding is zeros and stays off the
# wire ([Note: padding stays off the wire]): the buffers keep it, the collectives do not send it.
# Alignment has a bound ([Note: per-rank costs flat in the world]): ``block_slots``.

# [Note: per-rank costs flat in the world]
# What one rank holds or computes per step must not grow with the world (9,408 nodes x 4 x 2 is
# 75,264 ranks). Three places used to:
# - Slots of whole blocks: a tensor's piece per rank is ceil(numel / world), so a small tensor's
#   piece shrinks to a few elements while its slot stays a block (256): a gradient bucket's rows
#   and a gathered bucket are world x slots, 256 x world elements per tensor (a 1-D tensor of
#   6,016 elements became 19 M at 75,264 ranks). ``block_slots`` keeps the whole-block slots while
#   their padding costs at most the values themselves (or under ``PAD_ALLOWANCE`` elements in
#   all, every case at test sizes), and otherwise packs the pieces side by side and pads the
#   rank's row once, as DeepSpeed's flat buffers do: blocks may then straddle tensors, which at
#   that size hold a few elements per rank each; a row under a block takes a smaller one
#   ([Note: a packed row's block]), and a bucket that keeps copies keeps its row whole
#   ([Note: kept copies of packed buckets] in comm/gather.py).
# - Lists as long as a send block's rows: ``Valid`` holds one row's runs and a repeat count, and
#   makes its index with one broadcast add on the device.
# - The per-step non-finite agreement (comm/numerics.py) and the byte counters (comm/stats.py):
#   a fixed-size all-reduce with a second round only when something is set; a group's per-tier
#   split counted once per group.
# The bounds are unit-tested at 75,264 ranks by pure code (tests/unit/test_flat_costs.py).

# padding of whole-block slots (elements, all rows of a buffer together) that is always accepted
PAD_ALLOWANCE = 1 << 22


def block_slots(lengths: Sequence[int], block: int, world: int) -> tuple[int, ...]:
    """Slots for pieces of ``lengths`` in a row that ``world`` rows repeat, each piece starting on
    a ``block`` boundary ([Note: blocks never straddle]) while that padding (over all rows) is at
    most the values themselves or ``PAD_ALLOWANCE``; otherwise the pieces side by side, the last
    slot padded so that the row is whole blocks ([Note: per-rank costs flat in the world])."""
    lengths = tuple(lengths)
    if block <= 1 or not lengths:
        return lengths
    slots = tuple(aligned(n, block) for n in lengths)
    values = sum(lengths)
    if not _over(slots, values, world):
        return slots
    return (*lengths[:-1], lengths[-1] + aligned(values, block) - values)


def _over(slots: Sequence[int], values: int, world: int) -> bool:
    """Whether the padding of ``slots`` over ``world`` rows exceeds what is always accepted."""
    return world * (sum(slots) - values) > max(world * values, PAD_ALLOWANCE)


# the quantizer's smallest block (quant/_checks.py's MIN_BLOCK; core imports no kernel code, a
# unit test checks that the two agree)
SMALLEST_BLOCK = 32


class BucketLayout(NamedTuple):
    """A bucket's row: each piece's slot, and the block its quantizing hops use."""

    slots: tuple[int, ...]
    block: int
    packed: bool  # pieces side by side (not each in whole blocks)


def bucket_layout(lengths: Sequence[int], block: int, world: int) -> BucketLayout:
    """``block_slots``, and the block of the row: ``block`` for whole-block slots; for packed
    pieces whose values fill less than a block, the smallest power of two that holds them (at
    least ``SMALLEST_BLOCK``), the row padded to it ([Note: a packed row's block])."""
    lengths = tuple(lengths)
    slots = block_slots(lengths, block, world)
    values = sum(lengths)
    # whole-block slots whose padding is allowed; a bucket of one tensor past the allowance has
    # the same slot either way and takes the small block too
    if (
        block <= 1
        or not lengths
        or (slots == tuple(aligned(n, block) for n in lengths) and not _over(slots, values, world))
    ):
        return BucketLayout(slots, block, False)
    small = packed_block(values, block)
    return BucketLayout((*lengths[:-1], lengths[-1] + aligned(values, small) - values), small, True)


def packed_block(values: int, block: int) -> int:
    """The block of a packed row of ``values`` elements ([Note: a packed row's block])."""
    if block <= 1:
        return block
    return min(block, max(SMALLEST_BLOCK, 1 << max(0, values - 1).bit_length()))


# [Note: a packed row's block]
# Packed pieces ([Note: per-rank costs flat in the world]) still padded every rank's row to a
# whole block: at 75,264 ranks a bucket of a small model holds a few values per rank, and its
# row of 256 made every gathered bucket 19 M elements and every kept copy 256 bytes per peer
# (a tertiary copy spans 37,632 of them). A row whose values fill less than a block is
# quantized in a smaller block instead: the smallest power of two that holds its values, so the
# row stays one block and the padding is under the values themselves or the quantizer's
# smallest block. The codes are the same bytes: a symmetric block takes its scale from its
# largest magnitude, and the one small block holds every value the one large block held with
# fewer zeros beside them; only the zero blocks after it (and their scales) are gone. A
# rotation ([Note: block rotation] in quant/reference.py) is capped at the small block. A bucket
# of one tensor past the allowance (a LayerNorm of its own: one value per rank at 9,408 nodes)
# is such a row too: its one slot is the same packed or not, and a whole block of 256 made its
# gather 256 elements per rank for one value. Only packed rows change, and rows are packed only
# past ``PAD_ALLOWANCE`` (never at test sizes): every layout the exactness tests run is the one
# they ran before.


# elements (all rows together) of one streamed chunk of a gradient bucket ([Note: streamed
# gradient stages] in comm/reduce.py): defined in plan.py, which the planner reads without
# importing torch
STREAM_CHUNK_ELEMS = _STREAM_CHUNK_ELEMS


class GradRows(NamedTuple):
    rows: torch.Tensor  # [world, C] fp32, row r = the chunks rank r will own
    chunk: tuple[int, ...]  # per-tensor chunk length (ceil(numel / world))
    width: int  # C before padding
    slots: tuple[int, ...] | None = None  # per-tensor slot width in a row (None: = chunk)
    block: int = 1  # the rows' quantization block: pad_to, or a packed row's ([Note: a packed row's block])


def pack_grad_rows(
    grads: Sequence[torch.Tensor], world: int, pad_to: int = 1, scale: float = 1.0, align_chunks: bool = False
) -> GradRows:
    """Lay out gradients as DeepSpeed's reduce-scatter does (tensor t is cut into ``world``
    chunks of ceil(numel/world); rank r owns chunk r of every tensor), one row per rank, with
    the row padded to a multiple of ``pad_to`` (so quantization blocks never straddle rows) and,
    with ``align_chunks``, every tensor's chunk in a slot of whole ``pad_to`` blocks
    ([Note: blocks never straddle]) within ``block_slots``'s bound. Values are converted to fp32
    and multiplied by ``scale`` (the averaging factor)."""
    chunks = tuple(-(-g.numel() // world) for g in grads)
    slots, block = bucket_layout(chunks, pad_to, world)[:2] if align_chunks else (chunks, pad_to)
    width = sum(slots)
    padded = aligned(width, block) if width else 0
    rows = torch.zeros(world, padded, dtype=torch.float32, device=grads[0].device if grads else None)
    off = 0
    for g, c, slot in zip(grads, chunks, slots):
        flat = g.reshape(-1)
        full_rows = flat.numel() // c if c else 0
        if full_rows:
            rows[:full_rows, off : off + c].copy_(flat[: full_rows * c].view(full_rows, c))
        tail = flat.numel() - full_rows * c
        if tail:
            rows[full_rows, off : off + tail].copy_(flat[full_rows * c :])
        off += slot
    if scale != 1.0:
        rows.mul_(scale)
    return GradRows(rows, chunks, width, slots if align_chunks else None, block)


def unpack_my_chunks(
    row: torch.Tensor, grads_numel: Sequence[int], chunk: Sequence[int], rank: int, slots: Sequence[int] | None = None
) -> list[torch.Tensor]:
    """This rank's reduced chunk of every tensor, cut from its reduced row. Sizes match
    DeepSpeed's ``reduce_scatter_coalesced`` (a rank past the end of a tensor gets 0 elements)."""
    out, off = [], 0
    for i, (n, c) in enumerate(zip(grads_numel, chunk)):
        size = max(0, min(c, n - rank * c))
        out.append(row.narrow(0, off, size))
        off += c if slots is None else slots[i]
    return out


# [Note: padding stays off the wire]
# Slots of whole blocks ([Note: blocks never straddle]) pad every small tensor's piece with zeros,
# and every hop of a gather (and every stage of a gradient bucket) would carry those zeros again:
# a tensor of 16 elements per rank in a 256-element slot sends 16x its bytes at each hop. The
# padding is paid once instead: the buffers keep their padded layout (the quantizer's blocks
# need it), but each collective sends only the columns that can hold a value, and the receiver
# puts them back into zeros. Exact because the padding is zero wherever it is: ``primary_buffer``
# and ``pack_grad_rows`` write zeros there, a quantized zero is the byte 0 (int8, and both int4
# nibbles), a sum of zeros is zero and an exact cast of zero is zero, so every buffer the
# receiver rebuilds is the one the padded collective delivered, bit for bit. Scales are sent
# whole (one per block, padding blocks included). Quantized data is cut by bytes: an int4 byte
# holds two elements and is sent when either holds a value.


class Valid:
    """Which elements of a padded row can hold a value ([Note: padding stays off the wire]), as
    runs of (start, length) in plain ints over one row, repeated ``reps`` times side by side
    (the rows of one send block): building it, slicing it and counting it touch no tensor and
    cost the runs of one row, whatever the number of rows ([Note: per-rank costs flat in the
    world]); its device indices are made by ``arange`` on the device (no host data copied, no
    sync: [Note: no host traffic in the hot path]), once per layout and device."""

    def __init__(self, runs: Sequence[tuple[int, int]], length: int, reps: int = 1):
        merged: list[tuple[int, int]] = []
        for s, n in runs:
            if n <= 0:
                continue
            if merged and merged[-1][0] + merged[-1][1] == s:  # adjacent: one run
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self.runs = tuple(merged)  # of one row
        self.period = length  # elements of one row
        self.reps = reps
        self.length = length * reps
        self.count = sum(n for _, n in self.runs) * reps
        self._index: dict[tuple[int, str], torch.Tensor] = {}
        self._derived: dict[tuple, Valid] = {}

    @property
    def full(self) -> bool:
        return self.count == self.length

    def _unit_runs(self, per_unit: int) -> list[tuple[int, int]]:
        # unit j holds elements [j * per_unit, (j + 1) * per_unit); runs are separated by at least
        # one padding element, so two runs never share a unit
        return [(s // per_unit, -(-(s + n) // per_unit) - s // per_unit) for s, n in self.runs]

    def prefix_units(self, per_unit: int) -> int | None:
        """``u`` when the units ``index`` lists are exactly [0, u) (one row whose values are one
        run from its start, as a packed row's are), else None."""
        if self.reps != 1 or len(self.runs) != 1 or self.runs[0][0] != 0:
            return None
        return -(-self.runs[0][1] // per_unit)

    def index(self, per_unit: int, device: torch.device) -> torch.Tensor:
        """Indices of the units of ``per_unit`` elements (1: elements or int8 bytes, 2: int4
        bytes) that hold any valid element, on ``device``, ascending. One row's indices, then
        the rows' offsets added on the device: no Python list as long as the rows."""
        key = (per_unit, str(device))
        t = self._index.get(key)
        if t is None:
            if self.reps > 1 and self.period % per_unit:  # a unit would straddle two rows
                t = Valid(self.tiled_runs(), self.length).index(per_unit, device)
            else:
                parts = [torch.arange(u, u + k, device=device) for u, k in self._unit_runs(per_unit)]
                t = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=device)
                if self.reps > 1:
                    offsets = torch.arange(self.reps, device=device) * (self.period // per_unit)
                    t = (offsets[:, None] + t[None, :]).reshape(-1)
            self._index[key] = t
        return t

    def tiled_runs(self) -> list[tuple[int, int]]:
        """Every run of every row (as long as the rows: for tests and the rare odd case only)."""
        return [(s + k * self.period, m) for k in range(self.reps) for s, m in self.runs]

    def columns(self, a: int, b: int) -> Valid:
        """Elements [a, b) of the row (a chunk of columns; of a single row only)."""
        if self.reps != 1:
            raise ValueError("zeropp_hier internal: Valid.columns of a tiled row")
        key = ("columns", a, b)
        v = self._derived.get(key)
        if v is None:
            runs = [(max(s, a) - a, min(s + n, b) - max(s, a)) for s, n in self.runs if s < b and s + n > a]
            v = self._derived[key] = Valid(runs, b - a)
        return v

    def widened(self, unit: int) -> Valid:
        """Every run rounded out to whole groups of ``unit`` elements (a divisor of the row
        length), overlapping groups merged: the elements a rotated payload must send, since a
        group's rotation spreads its values over the whole group ([Note: block rotation] in
        quant/reference.py); a group of padding alone rotates to zeros, so still stays home."""
        key = ("widened", unit)
        v = self._derived.get(key)
        if v is None:
            merged: list[tuple[int, int]] = []
            for s, n in self.runs:
                a, b = s // unit * unit, -(-(s + n) // unit) * unit
                if merged and a <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
                else:
                    merged.append((a, b))
            # of one row, kept tiled as this one is
            v = self._derived[key] = Valid([(a, b - a) for a, b in merged], self.period, self.reps)
        return v

    def tiled(self, n: int) -> Valid:
        """The row repeated ``n`` times (rows side by side in one flat send block)."""
        key = ("tiled", n)
        v = self._derived.get(key)
        if v is None:
            v = self._derived[key] = Valid(self.runs, self.period, self.reps * n)
        return v


_VALID: dict[tuple[tuple[int, ...], tuple[int, ...]], Valid] = {}


def valid_of(lengths: Sequence[int], slots: Sequence[int]) -> Valid | None:
    """The valid elements of a row of slots, each holding ``lengths[i]`` values first (None when
    nothing is padded). One object per layout, so its device indices are made once."""
    if list(lengths) == list(slots):
        return None
    key = (tuple(lengths), tuple(slots))
    v = _VALID.get(key)
    if v is None:
        runs, off = [], 0
        for n, slot in zip(lengths, slots):
            runs.append((off, n))
            off += slot
        v = _VALID[key] = Valid(runs, off)
    return v
