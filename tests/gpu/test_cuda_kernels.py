"""The GPU kernels (quant_kernels.hip, built by nvcc or hipcc into zeropp_hier._C) against the
PyTorch reference run on the CPU, byte for byte: data bytes, scale bits, dequantized bits.

The inputs are the CPU kernel tests' (tests/unit/test_quant_kernels.py): every dtype, int8 and
int4, every block size, lengths around block boundaries, and blocks of zeros, subnormals, values
near the dtype's max, NaN, ±Inf, exact rounding ties, wide dynamic range and subnormal scales.
"""

import pytest
import torch

from zeropp_hier import quant
from zeropp_hier.quant import _ext
from zeropp_hier.quant import reference as R

from ..unit.test_quant_kernels import (
    BITS,
    BLOCKS,
    DTYPES,
    _parts,
    assert_payload_equal,
    assert_values_equal,
    lengths,
    random_payload,
    torture_input,
)

DEV = "cuda"


def _cpu(t: torch.Tensor) -> torch.Tensor:
    assert t.device.type == "cuda", f"the kernel's output is on {t.device}, not the GPU"
    return t.cpu()


@pytest.fixture(scope="module")
def ops():
    st = _ext.status()
    assert st.loaded, f"compiled kernels missing ({st.reason})"
    assert st.build_info in ("cpu+cuda", "cpu+hip"), (
        f"the extension was built without GPU kernels ({st.build_info}); rebuild it with a CUDA/ROCm torch"
    )
    assert quant.backend(DEV) in ("cuda", "hip")
    return torch.ops.zeropp_hier


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", BLOCKS)
def test_quantize_and_dequantize_match_reference(ops, dtype, block):
    for seed, n in enumerate(lengths(block)):
        x = torture_input(n, block, dtype, seed)
        xg = x.to(DEV)
        for bits in BITS:
            want = R.quantize(x, bits, block)
            data, scales = ops.quantize(xg, bits, block)
            assert_payload_equal(_cpu(data), _cpu(scales), want)
            for out_dtype in DTYPES:
                got = ops.dequantize(data, scales, n, bits, block, out_dtype)
                assert_values_equal(_cpu(got), R.dequantize(want, out_dtype))


@pytest.mark.parametrize("bits", BITS)
def test_random_bytes_dequantize_like_reference(ops, bits):
    q = random_payload(bits)
    for out_dtype in DTYPES:
        got = ops.dequantize(q.data.to(DEV), q.scales.to(DEV), q.numel, bits, q.block_size, out_dtype)
        assert_values_equal(_cpu(got), R.dequantize(q, out_dtype))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("block", [32, 256, 4096])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_dequantize_sum_matches_reference(ops, bits, block, k):
    for n in (1, block + 1, 3 * block - 5, 5000):
        parts = _parts(k, n, bits, block, seed=n + k)
        data = torch.stack([p.data for p in parts]).to(DEV)
        scales = torch.stack([p.scales for p in parts]).to(DEV)
        for out_dtype in DTYPES:
            got = ops.dequantize_sum(data, scales, n, bits, block, out_dtype)
            assert_values_equal(_cpu(got), R.dequantize_sum(parts, out_dtype))
        for out_bits in BITS:
            for out_block in (32, block, 1024):
                got_d, got_s = ops.dequantize_sum_requantize(data, scales, n, bits, block, out_bits, out_block)
                assert_payload_equal(_cpu(got_d), _cpu(got_s), R.dequantize_sum_requantize(parts, out_bits, out_block))


def test_fused_sum_reads_rows_of_a_receive_buffer_in_place(ops):
    # rows of a wider device buffer (row stride > payload bytes): viewed, not copied
    n, block, k = 1000, 64, 4
    parts = _parts(k, n, 8, block, seed=5)
    buf = torch.zeros(k, parts[0].data.numel() + 100, dtype=torch.int8, device=DEV)
    sbuf = torch.zeros(k, parts[0].scales.numel() + 3, device=DEV)
    for j, p in enumerate(parts):
        buf[j, : p.data.numel()] = p.data.to(DEV)
        sbuf[j, : p.scales.numel()] = p.scales.to(DEV)
    views = [
        R.Quantized(buf[j, : p.data.numel()], sbuf[j, : p.scales.numel()], n, 8, block) for j, p in enumerate(parts)
    ]
    stacked = quant._rows([v.data for v in views])
    assert stacked.data_ptr() == buf.data_ptr() and stacked.stride() == (buf.shape[1], 1)
    assert_values_equal(_cpu(quant.dequantize_sum(views)), R.dequantize_sum(parts))
    got = quant.dequantize_sum_requantize(views, 4, 256)
    assert_payload_equal(_cpu(got.data), _cpu(got.scales), R.dequantize_sum_requantize(parts, 4, 256))


def test_fused_sum_overflow_and_nan_propagate(ops):
    big = R.quantize(torch.full((64,), 3.0e38), 8, 32)
    nan = R.quantize(torch.tensor([1.0, float("nan")] + [0.0] * 62), 8, 32)
    for parts, marked in (([big, big], [True, True]), ([big, nan], [True, False])):
        dev = [R.Quantized(p.data.to(DEV), p.scales.to(DEV), p.numel, p.bits, p.block_size) for p in parts]
        assert_values_equal(_cpu(quant.dequantize_sum(dev)), R.dequantize_sum(parts))
        got = quant.dequantize_sum_requantize(dev, 8, 32)
        assert quant.nonfinite_blocks(got).cpu().tolist() == marked
        assert_payload_equal(_cpu(got.data), _cpu(got.scales), R.dequantize_sum_requantize(parts, 8, 32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_inputs_match_the_cpu_kernels(ops, dtype):
    # past the grid cap (65535 workgroups of 256 threads): the grid-stride loops must cover the
    # rest. The CPU kernels are the yardstick here (byte-identical to the reference, tested in
    # the unit lane) because the reference is slow at this size.
    n = 40_000_017
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 3)).to(dtype)
    x[12345] = float("nan")
    for bits, block in ((8, 256), (4, 32), (8, 4096)):
        want_d, want_s = ops.quantize(x, bits, block)
        data, scales = ops.quantize(x.to(DEV), bits, block)
        assert torch.equal(_cpu(data), want_d)
        assert torch.equal(_cpu(scales).view(torch.int32), want_s.view(torch.int32))
        got = ops.dequantize(data, scales, n, bits, block, dtype)
        assert_values_equal(_cpu(got), ops.dequantize(want_d, want_s, n, bits, block, dtype))
        stacked_d, stacked_s = torch.stack([data, data]), torch.stack([scales, scales])
        sd, ss = ops.dequantize_sum_requantize(stacked_d, stacked_s, n, bits, block, 8, 256)
        wd, ws = ops.dequantize_sum_requantize(
            torch.stack([want_d, want_d]), torch.stack([want_s, want_s]), n, bits, block, 8, 256
        )
        assert torch.equal(_cpu(sd), wd) and torch.equal(_cpu(ss).view(torch.int32), ws.view(torch.int32))


def test_kernels_run_on_the_current_stream(ops):
    # the engine quantizes on its side stream: a kernel must be ordered after work queued on the
    # stream that is current when it is called, not on the default stream
    x = torch.randn(1 << 22, device=DEV)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = x * 2  # queued on the side stream
        data, scales = ops.quantize(y, 8, 256)
        back = ops.dequantize(data, scales, y.numel(), 8, 256, torch.float32)
    side.synchronize()
    want = R.quantize(y.cpu(), 8, 256)
    assert_payload_equal(data.cpu(), scales.cpu(), want)
    assert_values_equal(back.cpu(), R.dequantize(want, torch.float32))
