"""The two hierarchical collectives: gather hop by hop, reduce-scatter stage by stage.

Thin wrappers: layouts come from ``layout``, groups from ``groups``, (de)quantization from
``quant``; this module only issues collectives on explicit groups and counts their bytes.
Every collective is an ``all_gather_into_tensor`` or ``all_to_all_single`` (both work on gloo,
RCCL and NCCL); coalescing managers are avoided because they fail on gloo and poison the group.
"""

from __future__ import annotations

from typing import Generator, NamedTuple, Sequence, TypeVar

import torch
import torch.distributed as dist

from .. import quant
from ..core import layout, wire
from ..core.plan import Hop
from ..core.policy import BITS
from ..core.topology import Topology
from .failures import collective_guard, slowest_tier
from .groups import HopGroup
from .hooks import PayloadHook, StageHook
from .issue import backend_for
from .stats import CommStats

# torch 2.13 renamed the tensor-in/tensor-out gather; older ROCm/CUDA builds have only the old name.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_CAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _keep(rows: torch.Tensor, valid: layout.Valid | None, per_unit: int = 1) -> torch.Tensor:
    """[R, L] rows -> only the columns that can hold a value ([Note: padding stays off the wire])."""
    if valid is None or valid.full:
        return rows
    u = valid.prefix_units(per_unit)
    if u is not None:  # one run from the row's start: a slice (a quarter of index_select's time)
        return rows[:, :u].contiguous()
    return rows.index_select(1, valid.index(per_unit, rows.device))


def _restore(rows: torch.Tensor, valid: layout.Valid | None, length: int, per_unit: int = 1) -> torch.Tensor:
    """Inverse of ``_keep``: [R, kept] -> [R, length], zeros in the padding."""
    if valid is None or valid.full:
        return rows
    u = valid.prefix_units(per_unit)
    if u is not None:  # one run from the row's start: the padding after it
        return torch.nn.functional.pad(rows, (0, length - u))
    out = torch.zeros(rows.shape[0], length, dtype=rows.dtype, device=rows.device)
    return out.index_copy_(1, valid.index(per_unit, rows.device), rows)


# [Note: one collective per hop]
# A quantized payload is data (int8, or two int4 per byte) plus one fp32 scale per block. Sent as
# two collectives, every hop pays the latency of two (on the network tier, where latency is
# highest, per bucket and per layer). Both travel as one byte buffer instead: the data bytes,
# then the scales' bytes. The data length is a multiple of 4 (a block holds at least 32
# elements), so the scales stay 4-byte aligned and are read back with a view, not a conversion.


def _pack(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[k, d] data bytes and [k, s] fp32 scales (k rows, one per destination) -> [k, d + 4 s] bytes."""
    return torch.cat([data.view(torch.uint8), scales.contiguous().view(torch.uint8)], dim=1)


def _unpack(packed: torch.Tensor, data_bytes: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``_pack`` for [k, L] bytes: ([k, data_bytes] data in ``dtype``, [k, s] fp32 scales)."""
    data = packed[:, :data_bytes].contiguous().view(dtype)
    scales = packed[:, data_bytes:].contiguous().view(torch.float32)
    return data, scales


class Encoded(NamedTuple):
    """A gather buffer in a quantized wire format ([Note: quantize once per gather]): row
    (n, p, g) holds ``row_elems`` values as ``data[n, p, g]`` (int8, or two int4 per uint8) and
    one fp32 scale per block in ``scales[n, p, g]``."""

    data: torch.Tensor  # [n, p, g, D]
    scales: torch.Tensor  # [n, p, g, B]
    bits: int
    block_size: int
    row_elems: int
    rotate: int = 0  # the Hadamard rotation size it was quantized with ([Note: block rotation])

    def payload(self, start: int, length: int) -> Encoded:
        """Elements [start, start + length) of every row (both on block boundaries)."""
        b, bits = self.block_size, self.bits
        if start % b or length % b:
            raise AssertionError(f"slice [{start}, {start + length}) is not on {b}-element block boundaries")
        per_byte = 8 // bits
        return Encoded(
            self.data[..., start // per_byte : (start + length) // per_byte].contiguous(),
            self.scales[..., start // b : (start + length) // b].contiguous(),
            bits,
            b,
            length,
            self.rotate,
        )

    @staticmethod
    def cat(parts: Sequence[Encoded]) -> Encoded:
        """Rows side by side: the payloads of ``parts`` one after another in every row."""
        first = parts[0]
        for p in parts:
            if (p.bits, p.block_size, p.rotate) != (first.bits, first.block_size, first.rotate):
                raise AssertionError("encoded parts of one gather must share bits, block size and rotation")
        return Encoded(
            torch.cat([p.data for p in parts], dim=3),
            torch.cat([p.scales for p in parts], dim=3),
            first.bits,
            first.block_size,
            sum(p.row_elems for p in parts),
            first.rotate,
        )

    @property
    def nbytes(self) -> int:
        return _nbytes(self.data) + _nbytes(self.scales)


class Wire(NamedTuple):
    """The transfer a hop needs, as its driver yields it ([Note: collectives as steps]):
    ``kind`` "gather" (all-gather of the 1-D ``send`` over ``hg``; the answer is [k, numel] in
    peer order) or "exchange" (all-to-all of the [k, m] ``send`` rows in peer order; the answer
    is the k received rows, peer order)."""

    kind: str
    hg: HopGroup
    send: torch.Tensor
    phase: str


R = TypeVar("R")
Steps = Generator[Wire, torch.Tensor, R]  # a hop's work; returns its result (R)

# [Note: collectives as steps]
# Each hop's work is written once, as a generator (``*_steps``) that yields the one transfer it
# needs (``Wire``) and is sent the received rows back; everything before (cast, encode, the
# padding off the wire) and after (decode, merge, the stage sum) is the same code whoever moves
# the bytes. ``drive`` moves them with the hop group's own collective (the hop-by-hop modes);
# the tick mode ([Note: ticks] in comm/tick/plan.py) moves the transfers of several hops in one
# grouped point-to-point call. Bit-identical values by construction: only the transport differs.


class HierCollectives:
    def __init__(self, topo: Topology, groups: dict[tuple[str, ...], HopGroup], stats: CommStats):
        self.topo = topo
        self.groups = groups
        self.stats = stats
        self._perms = layout.DevicePerms()  # [Note: no host traffic in the hot path]

    def _peer_order(self, x: torch.Tensor, hg: HopGroup) -> torch.Tensor:
        if hg.peer_from_torch is None:
            return x
        return x.index_select(0, self._perms.get(f"peer<-torch {hg.axes}", hg.peer_from_torch, x.device))

    def _torch_order(self, x: torch.Tensor, hg: HopGroup) -> torch.Tensor:
        if hg.torch_from_peer is None:
            return x
        return x.index_select(0, self._perms.get(f"torch<-peer {hg.axes}", hg.torch_from_peer, x.device))

    def _record(self, phase: str, op: str, hg: HopGroup, tensor: torch.Tensor, bytes_per_peer: int) -> None:
        """Count one collective in both views, moved as the group's backend moves ``op`` on
        ``tensor``'s device ([Note: bytes per link])."""
        library = backend_for(dist.get_backend(hg.group), tensor.device.type)
        self.stats.record(phase, hg.peers, bytes_per_peer, op, wire.algorithm_of(op, library), library)

    def _guard(self, hg: HopGroup, phase: str):
        """A dead or stuck peer ends the collective with a HierCommError naming it."""
        return collective_guard(
            rank=self.stats.rank,
            phase=phase,
            tier=slowest_tier(self.topo, hg.axes),
            axes=hg.axes,
            peers=hg.peers,
            timeout_s=hg.timeout_s,
        )

    # -- gather --------------------------------------------------------------------------------
    def _gather_blocks(self, local: torch.Tensor, hg: HopGroup, phase: str) -> torch.Tensor:
        """All-gather a 1-D tensor; returns [k, numel] in peer order."""
        k = len(hg.peers)
        out = torch.empty(k * local.numel(), dtype=local.dtype, device=local.device)
        with self._guard(hg, phase):
            _all_gather_tensor(out, local, group=hg.group)
        self._record(phase, "all_gather", hg, local, _nbytes(local))
        return self._peer_order(out.view(k, -1), hg)

    def drive(self, steps: Steps[R]) -> R:
        """Run a hop's steps with the hop group's own collective."""
        try:
            wire = next(steps)
            while True:
                if wire.kind == "gather":
                    got = self._gather_blocks(wire.send, wire.hg, wire.phase)
                else:
                    got = self._exchange(wire.send, wire.hg, wire.phase)
                wire = steps.send(got)
        except StopIteration as stop:
            return stop.value

    def gather_hop_steps(
        self,
        buf: torch.Tensor,
        hop: Hop,
        block_size: int,
        phase: str,
        hook: PayloadHook | None = None,
        valid: layout.Valid | None = None,
    ) -> Steps[torch.Tensor]:
        """One gather hop on a plain buffer. buf: [n, p, g, S] (canonical layout); returns the
        buffer with the hop's axes filled in. A compressed hop encodes this rank's buffer, gathers
        the encoded rows and decodes every row, this rank's own included, so all ranks end with
        the same values. ``hook`` sees this rank's payload and a lazy
        decoder of it. ``valid``: the elements of a row that can hold a value; only those are
        sent ([Note: padding stays off the wire])."""
        if hop.scheme in BITS:
            enc = self.encode(buf, hop, block_size, hook)
            got = yield from self.gather_encoded_steps(enc, hop, phase, valid)
            return self.decode(got, buf.dtype)
        hg = self.groups[hop.axes]
        have = (buf.shape[0], buf.shape[1], buf.shape[2])
        local = buf.reshape(-1)
        sent = _keep(buf.reshape(-1, buf.shape[3]), valid).reshape(-1)
        if hop.scheme in _CAST:
            wire = sent.to(_CAST[hop.scheme])
            if hook is not None:
                full = local.to(_CAST[hop.scheme]) if sent is not local else wire
                hook.encoded(local, lambda: full.to(torch.float32))
            flat = (yield Wire("gather", hg, wire, phase)).to(buf.dtype)
        else:
            flat = yield Wire("gather", hg, sent.contiguous(), phase)
        k = len(hg.peers)
        rows = _restore(flat.reshape(k * have[0] * have[1] * have[2], -1), valid, buf.shape[3])
        return layout.merge_gathered(rows.reshape(-1), have, layout.hop_dims(self.topo, hop.axes), buf.shape[3])

    # [Note: quantize once per gather]
    # Once a gather hop has quantized the weights, the later hops of the same gather carry the
    # encoded rows as they are (bytes, gathered exactly) and only the end decodes. Decoding in
    # between and sending the decoded values exactly (a later hop with scheme none) gives the
    # same numbers at twice the bytes (bf16) or four times (fp32); re-quantizing them (a later
    # quantized hop) adds a second rounding error for nothing. So a gather quantizes at most
    # once, at its first quantizing hop, and each row (one rank's segment, whole blocks:
    # [Note: blocks never straddle]) keeps its own data and scales through every later hop. A
    # kept shard cut from an encoded gather stays encoded: the backward gathers the same bytes
    # and decodes exactly the weights the forward used, and the copy takes about half the
    # memory of a bf16 one.

    def encode(self, buf: torch.Tensor, hop: Hop, block_size: int, hook: PayloadHook | None = None) -> Encoded:
        """Quantize a [n, p, g, S] buffer row by row (S whole blocks) into an ``Encoded``."""
        rows = buf.shape[:3]
        if buf.shape[3] % block_size:
            raise AssertionError(f"gather rows of {buf.shape[3]} elements are not whole {block_size}-blocks")
        local = buf.reshape(-1)
        q = quant.quantize(local, BITS[hop.scheme], block_size, hop.rotate)
        if hook is not None:
            hook.encoded(local, lambda: quant.dequantize(q, torch.float32, hop.rotate))
        return Encoded(q.data.view(*rows, -1), q.scales.view(*rows, -1), q.bits, block_size, buf.shape[3], hop.rotate)

    def gather_encoded_steps(
        self, enc: Encoded, hop: Hop, phase: str, valid: layout.Valid | None = None
    ) -> Generator[Wire, torch.Tensor, Encoded]:
        """One gather hop of encoded rows: data and scales of each row as one byte row, one
        collective ([Note: one collective per hop]), gathered exactly; of the data, only the
        bytes of ``valid`` elements ([Note: padding stays off the wire])."""
        hg = self.groups[hop.axes]
        if enc.rotate and valid is not None:  # a rotated group holding any value is sent whole
            valid = valid.widened(enc.rotate)
        shape = enc.data.shape
        have = (shape[0], shape[1], shape[2])
        per_unit = 8 // enc.bits  # elements per data byte
        width = enc.data.shape[3]  # data bytes per row, padding included
        data = _keep(enc.data.reshape(-1, width), valid, per_unit)
        data_bytes = data.shape[1] * enc.data.element_size()
        wire = _pack(data, enc.scales.reshape(-1, enc.scales.shape[3]))
        flat = yield Wire("gather", hg, wire.view(-1), phase)
        merged = layout.merge_gathered(flat.reshape(-1), have, layout.hop_dims(self.topo, hop.axes), wire.shape[1])
        rows = merged.shape[:3]
        got, scales = _unpack(merged.reshape(-1, wire.shape[1]), data_bytes, enc.data.dtype)
        got = _restore(got, valid, width, per_unit)
        return enc._replace(data=got.view(*rows, -1), scales=scales.view(*rows, -1))

    @staticmethod
    def decode(enc: Encoded, dtype: torch.dtype) -> torch.Tensor:
        """[n, p, g, S] of ``dtype`` from encoded rows."""
        rows = enc.data.shape[:3]
        n = rows[0] * rows[1] * rows[2] * enc.row_elems
        q = quant.Quantized(enc.data.reshape(-1), enc.scales.reshape(-1), n, enc.bits, enc.block_size)
        return quant.dequantize(q, dtype, enc.rotate).view(*rows, enc.row_elems)

    # -- reduce-scatter ------------------------------------------------------------------------
    def _exchange(self, send: torch.Tensor, hg: HopGroup, phase: str) -> torch.Tensor:
        """All-to-all of [k, m] blocks (peer order); returns the k received blocks, peer order."""
        send = self._torch_order(send, hg).contiguous()
        recv = torch.empty_like(send)
        with self._guard(hg, phase):
            dist.all_to_all_single(recv, send, group=hg.group)
        self._record(phase, "all_to_all", hg, send, _nbytes(send[0]))
        return self._peer_order(recv, hg)

    def reduce_stage_steps(
        self,
        buf: torch.Tensor,
        hop: Hop,
        block_size: int,
        wire_dtype: torch.dtype,
        phase: str = "grad_reduce",
        hook: StageHook | None = None,
        valid: layout.Valid | None = None,
    ) -> Steps[torch.Tensor]:
        """One reduce-scatter stage. buf: [n, p, g, C] fp32 partial sums, rows by destination;
        returns fp32 [n', p', g', C] with the stage's axes summed away. Sums are in fp32 after
        dequantization, never in the wire format. ``hook`` may adjust the
        send buffer before it is encoded (error feedback), sees it with a lazy decoder of its
        payload, and sees the stage's sum. ``valid``: the columns of a row (the last axis of
        ``buf``) that can hold a value; only those are sent ([Note: padding stays off the wire])."""
        send = layout.split_for_stage(buf, hop.axes)  # [k, m]
        if hook is not None:
            send = hook.prepare(send)
        k, m = send.shape
        cols = None if valid is None or valid.full else valid.tiled(m // buf.shape[3])  # rows of the block
        if hop.scheme in BITS:
            q = quant.quantize(send.reshape(-1), BITS[hop.scheme], block_size, hop.rotate)
            if hook is not None:
                hook.encoded(send, lambda: quant.dequantize(q, torch.float32, hop.rotate).view_as(send))
            sent_cols = cols.widened(hop.rotate) if hop.rotate and cols is not None else cols
            per_unit = 8 // q.bits
            data_rows, scale_rows = q.data.view(k, -1), q.scales.view(k, -1)
            sent = _keep(data_rows, sent_cols, per_unit)
            packed = yield Wire("exchange", self.groups[hop.axes], _pack(sent, scale_rows).contiguous(), phase)
            data, scales = _unpack(packed, sent.shape[1] * sent.element_size(), q.data.dtype)
            data = _restore(data, sent_cols, data_rows.shape[1], per_unit)
            # the k payloads as one stacked Quantized ([k, bytes], [k, blocks]): no Python object
            # per peer (a node stage has one per node: [Note: per-rank costs flat in the world])
            stacked = quant.Quantized(data, scales, m, q.bits, block_size)
            summed = quant.dequantize_sum(stacked, torch.float32, hop.rotate)
            if sent_cols is not cols:  # rotating back leaves noise in the padding: zero it again
                summed = _restore(_keep(summed.view(1, -1), cols), cols, m).view(-1)
        else:
            dtype = _CAST.get(hop.scheme, wire_dtype)
            wire = send.to(dtype)
            if hook is not None:
                hook.encoded(send, lambda: wire.to(torch.float32))
            got = yield Wire("exchange", self.groups[hop.axes], _keep(wire, cols).contiguous(), phase)
            recv = _restore(got, cols, m)
            summed = recv.to(torch.float32).sum(0)
        if hook is not None:
            hook.reduced(summed)
        return summed.view(
            *layout.dims_after_stage((buf.shape[0], buf.shape[1], buf.shape[2]), hop.axes), buf.shape[3]
        )
