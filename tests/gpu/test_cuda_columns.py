"""``quant.dequantize_columns`` on the GPU against the GPU kernel's whole-row dequantize, byte
for byte ([Note: decoding a few columns] in zeropp_hier/quant/__init__.py): the gather decodes
a small bucket's columns this way on the device at a large world."""

import pytest

from ..unit.test_quant_columns import CASES, DTYPES, check_columns


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block,row,cols", CASES)
def test_columns_on_the_gpu_equal_its_kernel_on_whole_rows(dtype, bits, block, row, cols):
    check_columns("cuda", dtype, bits, block, row, cols)
