"""The block rotation ([Note: block rotation], [Note: GPU block rotation]) in the GPU kernels
against the PyTorch reference run on the CPU, byte for byte: the same inputs and rotation sizes as
the CPU kernels' tests (tests/unit/test_quant_rotation.py), so the reference, the CPU variants and
the GPU rotate bit-identically wherever each runs."""

import pytest
import torch

from zeropp_hier.quant import reference as R

from ..unit.test_quant_kernels import BITS, assert_payload_equal, assert_values_equal, lengths, torture_input
from ..unit.test_quant_rotation import rotations
from .test_cuda_kernels import (  # ops: the GPU kernels' fixture (the loaded ops, built with GPU kernels)
    DEV,
    _cpu,
    ops,  # noqa: F401
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [32, 128, 256])
def test_rotated_quantize_and_dequantize_match_reference(ops, dtype, block):  # noqa: F811
    for seed, n in enumerate(lengths(block)):
        x = torture_input(n, block, dtype, seed)  # NaN, Inf, near-max, subnormal blocks included
        xg = x.to(DEV)
        for r in rotations(block):
            for bits in BITS:
                want = R.quantize(x, bits, block, r)
                data, scales = ops.quantize(xg, bits, block, r)
                assert_payload_equal(_cpu(data), _cpu(scales), want)
                for out_dtype in (torch.float32, dtype):
                    got = ops.dequantize(data, scales, n, bits, block, out_dtype, r)
                    assert_values_equal(_cpu(got), R.dequantize(want, out_dtype, r))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("block", [32, 256])
def test_rotated_fused_sums_match_reference(ops, bits, block):  # noqa: F811
    k = 3
    for n in (1, block + 1, 3 * block - 5, 5000):
        for r in rotations(block):
            parts = [R.quantize(torture_input(n, block, torch.float32, n + j), bits, block, r) for j in range(k)]
            data = torch.stack([p.data for p in parts]).to(DEV)
            scales = torch.stack([p.scales for p in parts]).to(DEV)
            for out_dtype in (torch.float32, torch.bfloat16):
                got = ops.dequantize_sum(data, scales, n, bits, block, out_dtype, r)
                assert_values_equal(_cpu(got), R.dequantize_sum(parts, out_dtype, r))
            # same R and block, another R, no R, another block size
            for out_block, out_r in ((block, r), (block, 0), (block, 2), (64, 32), (1024, r)):
                for out_bits in BITS:
                    got_d, got_s = ops.dequantize_sum_requantize(
                        data, scales, n, bits, block, out_bits, out_block, r, out_r
                    )
                    want = R.dequantize_sum_requantize(parts, out_bits, out_block, r, out_r)
                    assert_payload_equal(_cpu(got_d), _cpu(got_s), want)
        # unrotated parts requantized with rotation
        parts = [R.quantize(torture_input(n, block, torch.float32, 7 * n + j), bits, block) for j in range(k)]
        data = torch.stack([p.data for p in parts]).to(DEV)
        scales = torch.stack([p.scales for p in parts]).to(DEV)
        got_d, got_s = ops.dequantize_sum_requantize(data, scales, n, bits, block, 4, block, 0, 32)
        assert_payload_equal(_cpu(got_d), _cpu(got_s), R.dequantize_sum_requantize(parts, 4, block, 0, 32))
