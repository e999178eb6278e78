"""The block rotation ([Note: block rotation]): the compiled CPU kernels against the PyTorch
reference byte for byte, in every instruction-set variant this CPU runs, and the transform's
own properties (orthonormal, self-inverse, helps int4 on heavy tails).

Needs the extension built, like test_quant_kernels.py (whose fixtures and inputs this reuses).
"""

import math

import pytest
import torch

from zeropp_hier import quant
from zeropp_hier.quant import reference as R

from . import test_quant_kernels as qk
from .test_quant_kernels import BITS, assert_payload_equal, assert_values_equal, lengths, sum_lengths, torture_input

# the kernels' fixtures: the loaded ops, and each CPU instruction-set variant this CPU runs
ops = qk.ops
isa = qk.isa


def rotations(block: int):
    # 2: in-vector strides only; 32, 64: all in registers; 128, block: strides in memory too
    # ([Note: CPU rotation layout] in hip_kernels/quant_cpu_loops.h)
    return sorted({2, 16, 32, 64, 128, block} & set(range(2, block + 1)))


# ---- the transform ----------------------------------------------------------------------------


@pytest.mark.parametrize("r", [2, 4, 8, 32, 128, 1024])
def test_butterfly_is_the_normalised_hadamard_matrix(r):
    g = torch.Generator().manual_seed(r)
    x = torch.randn(3 * r, generator=g)
    idx = torch.arange(r)
    # H[i, j] = (-1)^popcount(i & j), Sylvester's construction, in float64
    parity = torch.zeros(r, r, dtype=torch.int64)
    both = idx[:, None] & idx[None, :]
    for bit in range(int(math.log2(r))):
        parity ^= (both >> bit) & 1
    h = (1 - 2 * parity).double() / math.sqrt(r)
    want = (x.double().view(-1, r) @ h.T).view(-1)
    got = R.hadamard_(x.clone(), r)
    assert (got.double() - want).abs().max() <= 1e-6 * want.abs().max()
    # orthonormal: norms kept, and applying it twice gives the input back
    assert abs(got.double().norm() / x.double().norm() - 1) < 1e-6
    assert (R.hadamard_(got.clone(), r) - x).abs().max() <= 4e-7 * x.abs().max()


def test_normalising_constant_is_float32_of_the_inverse_root():
    for k in range(1, 13):
        want = torch.tensor(1 / math.sqrt(2**k), dtype=torch.float32).item()
        assert R.inv_sqrt(2**k) == want


def test_rotation_off_is_todays_format(ops):
    x = torture_input(5000, 128, torch.float32, 3)
    for bits in BITS:
        want = R.quantize(x, bits, 128)
        got = quant.quantize(x, bits, 128, rotate=0)
        assert_payload_equal(got.data, got.scales, want)


# ---- the compiled CPU kernels against the reference ------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [32, 128, 256])
def test_quantize_and_dequantize_match_reference(isa, ops, dtype, block):
    for seed, n in enumerate(lengths(block)):
        x = torture_input(n, block, dtype, seed)  # NaN, Inf, near-max, subnormal blocks included
        for r in rotations(block):
            for bits in BITS:
                want = R.quantize(x, bits, block, r)
                data, scales = ops.quantize(x, bits, block, r)
                assert_payload_equal(data, scales, want)
                for out_dtype in (torch.float32, dtype):
                    assert_values_equal(
                        ops.dequantize(data, scales, n, bits, block, out_dtype, r), R.dequantize(want, out_dtype, r)
                    )


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("block", [32, 256])
def test_fused_sums_match_reference(isa, ops, bits, block):
    k = 3
    for n in sum_lengths(block):
        for r in rotations(block):
            parts = [R.quantize(torture_input(n, block, torch.float32, n + j), bits, block, r) for j in range(k)]
            data = torch.stack([p.data for p in parts])
            scales = torch.stack([p.scales for p in parts])
            for out_dtype in (torch.float32, torch.bfloat16):
                assert_values_equal(
                    ops.dequantize_sum(data, scales, n, bits, block, out_dtype, r),
                    R.dequantize_sum(parts, out_dtype, r),
                )
            # same R and block (the direct path), another R, no R, another block size
            for out_block, out_r in ((block, r), (block, 0), (block, 2), (64, 32), (1024, r)):
                for out_bits in BITS:
                    got = ops.dequantize_sum_requantize(data, scales, n, bits, block, out_bits, out_block, r, out_r)
                    want = R.dequantize_sum_requantize(parts, out_bits, out_block, r, out_r)
                    assert_payload_equal(*got, want)
        # unrotated parts requantized with rotation
        parts = [R.quantize(torture_input(n, block, torch.float32, 7 * n + j), bits, block) for j in range(k)]
        data = torch.stack([p.data for p in parts])
        scales = torch.stack([p.scales for p in parts])
        got = ops.dequantize_sum_requantize(data, scales, n, bits, block, 4, block, 0, 32)
        assert_payload_equal(*got, R.dequantize_sum_requantize(parts, 4, block, 0, 32))


def test_nonfinite_blocks_stay_nan_through_rotation(ops):
    x = torch.randn(6 * 64)
    x[70], x[200], x[383] = float("nan"), float("inf"), float("-inf")
    for r in (2, 32, 64):
        q = quant.quantize(x, 4, 64, r)
        assert quant.nonfinite_blocks(q).tolist() == [False, True, False, True, False, True]
        out = quant.dequantize(q, torch.float32, r)
        for b, bad in enumerate([False, True, False, True, False, True]):
            seg = out[64 * b : 64 * (b + 1)]
            assert torch.isnan(seg).all() if bad else torch.isfinite(seg).all()
        s = quant.dequantize_sum([q, q], torch.float32, r)
        assert torch.isnan(s[64:128]).all() and torch.isfinite(s[:64]).all()


# ---- what it is for ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r", [2, 32, 128])
def test_round_trip_error_is_bounded_by_the_rotated_scales(ops, dtype, r):
    # |x - x'| = |H (y - y')| with y the rotated block: each rotated value is off by at most
    # scale/2, so the error vector's norm per group is at most sqrt(R) * scale/2 (orthonormal H)
    block, n = 128, 20000
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 2)).to(dtype)
    for bits in BITS:
        q = quant.quantize(x, bits, block, r)
        err = (quant.dequantize(q, torch.float32, r) - x.float()).double()
        pad = R.num_blocks(n, block) * block - n
        err = torch.cat([err, torch.zeros(pad, dtype=torch.float64)]).view(-1, r)
        scale = q.scales.double().repeat_interleave(block).view(-1, r)[:, 0]
        bound = math.sqrt(r) * scale * (0.5 + 2.0**-16) + 1e-6 * scale * r
        # padding positions come back non-zero, so a group holding the tail is excluded
        full = n // r
        assert (err[:full].norm(dim=1) <= bound[:full]).all()


def test_rotation_cuts_int4_error_on_heavy_tails(ops):
    g = torch.Generator().manual_seed(0)
    # Student-t with 2 degrees of freedom: a few huge values per block set the scale
    x = torch.randn(1 << 16, generator=g) / torch.randn(1 << 16, generator=g).abs().clamp(min=1e-3).sqrt()
    block = 128

    def rel_err(r: int) -> float:
        q = quant.quantize(x, 4, block, r)
        return ((quant.dequantize(q, torch.float32, r) - x).norm() / x.norm()).item()

    plain, rot32, rot128 = rel_err(0), rel_err(32), rel_err(128)
    assert rot32 < 0.75 * plain and rot128 < 0.75 * plain, (plain, rot32, rot128)


def test_bad_rotation_is_named_with_the_fix(ops):
    x = torch.randn(100)
    for r, why in ((3, "power of two"), (256, "from 2 to the block size 128"), (1, "power of two"), (-2, "0 (off)")):
        with pytest.raises(quant.QuantArgumentError, match="rotate") as exc:
            quant.quantize(x, 8, 128, r)
        assert why in str(exc.value) and str(r) in str(exc.value)
    with pytest.raises(ValueError, match="rotate.*got 48"):
        ops.quantize(x, 8, 128, 48)
    q = quant.quantize(x, 8, 64)
    with pytest.raises(quant.QuantArgumentError, match="out_rotate"):
        quant.dequantize_sum_requantize([q], 8, 32, 0, 64)
