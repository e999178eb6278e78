"""``quant.dequantize_columns`` against dequantizing whole rows and slicing, byte for byte
([Note: decoding a few columns] in zeropp_hier/quant/__init__.py): the gather decodes a small
bucket's columns this way at a large world, so any difference would change the weights."""

import pytest
import torch

from zeropp_hier import quant

ROWS = 6


def _rows(bits: int, block: int, row: int, scale_fill=None, seed: int = 0, device: str = "cpu"):
    """ROWS rows of ``row`` elements quantized with ``block``-blocks on ``device``: (data [R,
    bytes], scales [R, row / block], the payload)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS * row, generator=g) * torch.logspace(-3, 3, ROWS * row)
    q = quant.quantize(x.to(device), bits, block)
    scales = q.scales.clone()
    if scale_fill is not None:
        scales[1::2] = scale_fill  # every other block: the scale under test
    return q.data.view(ROWS, -1), scales.view(ROWS, -1), quant.Quantized(q.data, scales, q.numel, bits, block)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


DTYPES = [torch.float32, torch.bfloat16, torch.float16]
CASES = [
    (32, 32, (0, 1)),  # one value of a one-block row (a LayerNorm at 75,264 ranks)
    (32, 32, (3, 8)),  # an odd start: int4 reads half a byte on each side
    (256, 256, (5, 6)),
    (32, 128, (30, 70)),  # across two block boundaries: a scale per column
    (64, 256, (0, 256)),  # every column
]


def check_columns(device: str, dtype, bits: int, block: int, row: int, cols: tuple[int, int]) -> None:
    """Columns decoded by themselves on ``device`` against the whole rows decoded there (the
    compiled kernel where it exists) and sliced; the GPU lane runs it on CUDA."""
    data, scales, q = _rows(bits, block, row, device=device)
    whole = quant.dequantize(q, dtype).view(ROWS, row)
    a, b = cols
    got = quant.dequantize_columns(data, scales, bits, block, a, b, dtype)
    assert got.shape == (ROWS, b - a) and got.dtype == dtype and got.is_contiguous()
    assert got.device == whole.device
    assert torch.equal(_bits(got), _bits(whole[:, a:b].contiguous()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block,row,cols", CASES)
def test_columns_equal_whole_rows_sliced(dtype, bits, block, row, cols):
    check_columns("cpu", dtype, bits, block, row, cols)


@pytest.mark.parametrize("fill", [float("nan"), 3.0e38, float("inf")])
@pytest.mark.parametrize("bits", [8, 4])
def test_non_finite_and_saturating_scales_decode_as_the_kernels_do(fill, bits):
    """A NaN scale gives NaN; a scale whose product overflows saturates to the largest float, as
    the kernels do: the same values where the whole rows are decoded."""
    data, scales, q = _rows(bits, 32, 128, scale_fill=fill)
    whole = quant.dequantize(q, torch.float32).view(ROWS, 128)
    got = quant.dequantize_columns(data, scales, bits, 32, 20, 100, torch.float32)
    ref = whole[:, 20:100]
    assert torch.equal(got.isnan(), ref.isnan())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(ref))
    if fill != fill:  # NaN: at least one block of every other row is NaN
        assert got.isnan().any()
    else:
        finite = torch.nan_to_num(got, nan=0.0)
        assert finite.abs().max() > 1e38  # some product saturated, none became infinite
        assert not got.isinf().any()


def test_bad_arguments_are_refused_naming_them():
    data, scales, _ = _rows(8, 32, 32)
    with pytest.raises(Exception, match="bits"):
        quant.dequantize_columns(data, scales, 3, 32, 0, 1, torch.float32)
    with pytest.raises(Exception, match="dtype"):
        quant.dequantize_columns(data, scales, 8, 32, 0, 1, torch.int32)
