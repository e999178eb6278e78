"""DeepSpeed ZeRO++'s qgZ gradient reduce as DeepSpeed 0.19 runs it, reimplemented on the CPU
(DeepSpeed's kernels are CUDA-only): ``all_to_all_quant_reduce`` in
deepspeed/runtime/comm/coalesced_collectives.py with the quantizer ops of
csrc/quantization (swizzled_quantize.cu, quant_reduce.cu, includes/quantization_utils.h).

What it does, per gradient tensor, read from that source:
- 1-D tensors, and tensors whose size is not a multiple of 2 x world, are not quantized: they go
  through ``reduce_scatter_coalesced`` (divided by the world in the wire dtype, then summed).
- Others: ``max(shape[0], shape[1], world)`` quantization groups over the whole tensor (so a
  group is ``numel / groups`` contiguous elements, e.g. one row of a [4h, h] weight), symmetric
  int4: ``scale = 16 / (2 * absmax)``, ``q = clamp(round_half_even(x * scale), -8, 7)``,
  dequantized as ``q * (1 / scale)`` into fp16. The absmax maps to +8, so a positive absmax is
  clipped to 7/8 of itself.
- Intra-node all-to-all of the int4 partitions; each rank dequantizes the ``devices`` parts it
  got and sums them in fp16 (``__half2`` adds, part order), requantizes that sum (int4, groups of
  the same size), inter-node all-to-all, dequantizes to fp16, sums the ``nodes`` parts in fp16
  and divides by ``nodes``.
- The input is the gradient in the communication dtype, fp16 (the kernels take ``__half``), not
  divided by the world first; fp16 training multiplies it by the loss scale.

Emulated here: gradients computed in fp32, multiplied by a power-of-two loss scale (the largest
up to DeepSpeed's initial 2^16 at which none of this step's fp16 sums overflows, the level its
dynamic scaler settles at), cast to fp16. The result is divided by the loss scale and by the
devices per node (``all_to_all_quant_reduce`` returns the sum over the world divided by
``nodes`` only), both exact powers of two, so that it estimates the world's mean.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

QMIN, QMAX = -8, 7  # int4, DeepSpeed's symmetric range
INITIAL_LOSS_SCALE = 2.0**16


def loss_scale(grads: Sequence[Sequence[torch.Tensor]], world: int) -> float:
    """The largest power of two up to 2^16 at which the world's sum of the largest gradient
    element stays inside fp16's range (65504)."""
    top = max(float(t.abs().max()) for g in grads for t in g)
    if top == 0.0:
        return INITIAL_LOSS_SCALE
    return min(INITIAL_LOSS_SCALE, 2.0 ** math.floor(math.log2(65504.0 / (world * top))))


def fake_quant(x: torch.Tensor, group: int) -> torch.Tensor:
    """fp16 [..., n] -> fp16: quantize groups of ``group`` contiguous elements to DeepSpeed's
    symmetric int4 and dequantize, as swizzle_quant / quantized_reduction / dequantize do."""
    g = x.reshape(-1, group).to(torch.float32)
    absmax = g.abs().amax(dim=1, keepdim=True)
    scale = torch.where(absmax == 0, torch.ones_like(absmax), 16.0 / (2.0 * absmax))
    q = torch.round(g * scale).clamp_(QMIN, QMAX)
    return (q * (1.0 / scale)).to(torch.float16).view_as(x)


def _half_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """fp16 parts added one after another in fp16 (each add rounded to fp16)."""
    acc = parts[0].clone()
    for p in parts[1:]:
        acc = acc + p
    return acc


def reduce(grads: Sequence[Sequence[torch.Tensor]], nodes: int, devices: int) -> tuple[list[torch.Tensor], float]:
    """grads[r]: rank r's gradients, rank = node * devices + device. Returns the estimate of
    the world's mean of each tensor (fp32, flat) and the loss scale used."""
    world = nodes * devices
    if len(grads) != world:
        raise ValueError(f"{len(grads)} ranks' gradients for {nodes} nodes x {devices} devices")
    scale = loss_scale(grads, world)
    out = []
    for t in range(len(grads[0])):
        shape = grads[0][t].shape
        x = torch.stack([g[t].reshape(-1) for g in grads]).to(torch.float32).mul_(scale).to(torch.float16)  # [W, n]
        n = x.shape[1]
        if len(shape) == 1 or n % (2 * world) != 0:
            # reduce_scatter_coalesced: divided by the world in fp16, then summed
            mean = _half_sum(list((x / world).unbind(0)))
            out.append(mean.to(torch.float32) / scale)
            continue
        groups = max(shape[0], shape[1], world)
        if groups % world:  # the kernels cut every partition into whole groups
            raise ValueError(f"a {tuple(shape)} tensor: {groups} qgZ groups do not divide among {world} ranks")
        group = n // groups
        # partition p = node m * devices + device d: rank (m, d) ends with it
        y = fake_quant(x, group).view(nodes, devices, nodes, devices, n // world)
        # intra-node: rank (node i, device d) sums, over its node's devices j, their partitions (m, d)
        local = _half_sum(list(y.unbind(1)))  # [node i, m, d, e]
        z = fake_quant(local, group)
        # inter-node: rank (m, d) sums, over the nodes i, their requantized (m, d) and divides by nodes
        final = _half_sum(list(z.unbind(0))) / nodes  # [m, d, e]
        out.append(final.reshape(-1).to(torch.float32) / scale / devices)
    return out, scale
