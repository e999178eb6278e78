"""The PyTorch reference defines the quantization format: pin its layout, rounding and edge
cases (see [Note: quantization format] in zeropp_hier/quant/reference.py)."""

import math

import pytest
import torch

from zeropp_hier.quant import reference as R

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TINY = 2.0**-149  # smallest fp32 subnormal


def f32_bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def roundtrip_bound(scale_per_elem: torch.Tensor, deq: torch.Tensor, dtype) -> torch.Tensor:
    """|x - dequantize(quantize(x))| may reach scale/2, plus the fp32 rounding of x/scale and of
    q*scale (a few ulps), plus the rounding of the output to ``dtype``."""
    deq = deq.float().abs()
    bound = scale_per_elem * (0.5 + 2.0**-16) + deq * 2.0**-22
    if dtype != torch.float32:
        fi = torch.finfo(dtype)
        bound = bound + deq * fi.eps + fi.smallest_normal * fi.eps
    return bound


def test_empty_input_gives_empty_payload():
    q = R.quantize(torch.empty(0), 8, 64)
    assert q.data.shape == (0,) and q.scales.shape == (0,) and q.numel == 0
    assert R.dequantize(q).shape == (0,)


@pytest.mark.parametrize("bits,qmax", [(8, 127), (4, 7)])
def test_one_element_is_padded_to_a_block(bits, qmax):
    q = R.quantize(torch.tensor([-3.0]), bits, 32)
    assert q.scales.tolist() == [torch.tensor(3.0 / qmax).item()]
    vals = R.unpack_int4(q.data) if bits == 4 else q.data
    assert vals.tolist() == [-qmax] + [0] * 31
    assert q.data.numel() == (32 if bits == 8 else 16)
    assert R.dequantize(q).tolist() == [-3.0]


def test_int8_rounds_half_to_even_with_fp32_division():
    # absmax 127 gives scale 1, so x / scale is exact and the ties are visible
    x = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5] + [0.0] * 24)
    q = R.quantize(x, 8, 32)
    assert q.scales.item() == 1.0
    assert q.data[:8].tolist() == [127, 0, 2, 2, 0, -2, -2, 126]


def test_int4_nibble_layout():
    # scale 1 (absmax 7): element 2i -> low nibble of byte i, 2i+1 -> high nibble
    x = torch.tensor([7.0, -7.0, 1.0, -1.0, 0.0, 3.0] + [0.0] * 26)
    q = R.quantize(x, 4, 32)
    assert q.data.dtype == torch.uint8
    assert q.data[:3].tolist() == [0x97, 0xF1, 0x30]  # (7 | -7<<4), (1 | -1<<4), (0 | 3<<4)
    assert R.unpack_int4(q.data)[:6].tolist() == [7, -7, 1, -1, 0, 3]


def test_unpack_int4_sign_extends_every_nibble():
    data = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = R.unpack_int4(data).view(-1, 2)
    for byte in range(256):
        lo, hi = byte & 0xF, byte >> 4
        assert vals[byte].tolist() == [lo - 16 if lo >= 8 else lo, hi - 16 if hi >= 8 else hi]


def test_tail_padding_never_leaks():
    x = torch.full((40,), 5.0)
    q = R.quantize(x, 8, 32)
    assert q.data.numel() == 64 and q.data[40:].eq(0).all()
    assert R.dequantize(q).shape == (40,)
    # the padded tail of a non-finite block does not extend the output either
    x[39] = float("nan")
    assert R.dequantize(R.quantize(x, 8, 32)).shape == (40,)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("bits", [8, 4])
def test_nonfinite_block_is_nan_and_only_that_block(bad, bits):
    x = torch.randn(96)
    x[40] = bad
    q = R.quantize(x, bits, 32)
    assert torch.isnan(q.scales).tolist() == [False, True, False]
    vals = R.unpack_int4(q.data) if bits == 4 else q.data
    assert vals[32:64].eq(0).all()
    out = R.dequantize(q)
    assert torch.isnan(out[32:64]).all() and torch.isfinite(out[:32]).all()
    assert torch.isfinite(out[64:]).all()


def test_all_zero_block_has_zero_scale_and_codes():
    q = R.quantize(torch.zeros(64), 8, 32)
    assert q.scales.tolist() == [0.0, 0.0] and q.data.eq(0).all()
    assert R.dequantize(q).eq(0).all()


def test_subnormal_scale_is_stepped_up_so_the_bound_holds():
    # absmax = 190 * 2^-149: 190/127 = 1.496 rounds down to one subnormal step, which would clamp
    # 190 to 127 (error 63 steps). The format steps the scale up to 2 instead.
    x = torch.tensor([190 * TINY, 3 * TINY, -TINY] + [0.0] * 29)
    q = R.quantize(x, 8, 32)
    assert f32_bits(q.scales).tolist() == [2]
    assert q.data[:3].tolist() == [95, 2, 0]  # 1.5 -> 2, -0.5 -> 0 (ties to even)
    err = (x - R.dequantize(q)).abs()
    assert (err <= q.scales / 2).all()


def test_quotient_below_smallest_subnormal_keeps_the_block():
    # absmax / 127 < 2^-150 would round to a zero scale and lose the block
    x = torch.tensor([63 * TINY, -TINY] + [0.0] * 30)
    q = R.quantize(x, 8, 32)
    assert f32_bits(q.scales).tolist() == [1]
    assert R.dequantize(q)[:2].tolist() == x[:2].tolist()


def test_normal_scales_are_the_plain_quotient():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 1e-30
    for bits, qmax in ((8, 127), (4, 7)):
        q = R.quantize(x, bits, 64)
        expect = x.view(-1, 64).abs().amax(dim=1) / qmax
        assert torch.equal(f32_bits(q.scales), f32_bits(expect))


@pytest.mark.parametrize("bits", [8, 4])
def test_fp32_max_dequantizes_to_fp32_max_not_inf(bits):
    fmax = torch.finfo(torch.float32).max
    x = torch.tensor([fmax, -fmax, 1.0e38] + [0.0] * 29)
    out = R.dequantize(R.quantize(x, bits, 32))
    assert torch.isfinite(out).all()
    assert out[0].item() == fmax and out[1].item() == -fmax


def test_bf16_is_read_as_bf16():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q, qf = R.quantize(x, 8, 64), R.quantize(x.float(), 8, 64)
    assert torch.equal(q.data, qf.data) and torch.equal(q.scales, qf.scales)
    # reading the bits as fp16 would give a different payload
    assert not torch.equal(R.quantize(x.view(torch.float16), 8, 64).scales, q.scales)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block", [32, 256, 4096])
def test_roundtrip_error_within_half_a_scale(dtype, bits, block):
    g = torch.Generator().manual_seed(block + bits)
    n = 3 * block + 7
    x = (torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 3)).to(dtype)
    q = R.quantize(x, bits, block)
    scale = q.scales.repeat_interleave(block)[:n]
    for out_dtype in DTYPES:
        if out_dtype == torch.float16 and dtype != torch.float16:
            continue  # values may exceed fp16's range
        deq = R.dequantize(q, out_dtype)
        assert deq.dtype == out_dtype and deq.shape == (n,)
        err = (x.float() - deq.float()).abs()
        assert (err <= roundtrip_bound(scale, deq, out_dtype)).all()


def test_dequantize_sum_is_fp32_in_list_order():
    g = torch.Generator().manual_seed(3)
    parts = [R.quantize(torch.randn(300, generator=g) * 10**k, 8, 64) for k in range(4)]
    acc = torch.zeros(300)
    for p in parts:
        acc = acc + R.dequantize(p)
    assert torch.equal(R.dequantize_sum(parts), acc)
    assert torch.equal(R.dequantize_sum(parts, torch.bfloat16), acc.to(torch.bfloat16))
    req = R.dequantize_sum_requantize(parts, 4, 128)
    ref = R.quantize(acc, 4, 128)
    assert torch.equal(req.data, ref.data) and torch.equal(req.scales, ref.scales)
    assert (req.numel, req.bits, req.block_size) == (300, 4, 128)


def test_sum_overflow_marks_the_requantized_block():
    big = R.quantize(torch.full((32,), 3.0e38), 8, 32)
    s = R.dequantize_sum([big, big])
    assert torch.isinf(s).all()
    assert math.isnan(R.dequantize_sum_requantize([big, big], 8, 32).scales.item())


def test_nbytes_counts_data_and_scales():
    q = R.quantize(torch.randn(1000), 4, 64)  # 16 blocks
    assert q.nbytes() == 16 * 64 // 2 + 16 * 4
