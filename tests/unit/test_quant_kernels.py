"""The compiled CPU kernels (zeropp_hier._C) against the PyTorch reference, byte for byte.

Needs the extension built (`pip install --no-build-isolation -e .`); without it these tests fail
rather than skip. Every instruction-set variant of the CPU loops is checked where this machine
runs it (ZEROPP_HIER_CPU_ISA selects one per call); a variant it cannot run skips, naming the
instruction set (marker ``cpu_isa``).
"""

import logging
import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from zeropp_hier import quant
from zeropp_hier.quant import _ext
from zeropp_hier.quant import reference as R

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
BITS = (8, 4)
# Set by tests/system/test_portability.py for its runs on an emulated CPU, where each instruction
# costs ~50x a native one: what an instruction set can break is a code path (one value, a partial
# block, whole blocks, a tail), and the shorter lengths take every one of them; the 5,000-value
# inputs only add more blocks of the same kind, so they run natively only.
EMULATED = os.environ.get("ZEROPP_HIER_TEST_EMULATED") == "1"


@pytest.fixture(scope="module")
def ops():
    st = _ext.status()
    assert st.loaded, (
        f"compiled kernels missing ({st.reason}); build them with `pip install --no-build-isolation -e .`"
    )
    assert quant.backend("cpu") == "cpu-ext"
    return torch.ops.zeropp_hier


# The CPU loop variants and what each needs beyond the floor; a variant this CPU cannot run
# skips, naming it, and carries the marker ``cpu_isa`` (``python -m pytest -m cpu_isa tests``
# on a CPU with AVX-512 runs them all; docs/usage.md lists the host-gated tests).
ISAS = {"default": None, "avx2": "AVX2 and FMA", "avx512": "AVX-512 (F, BW, VL, DQ)"}


def _runs_here(name: str) -> bool:
    """Whether this CPU runs the ``name`` variant (the kernels fall back to a narrower one)."""
    import os

    saved = os.environ.get("ZEROPP_HIER_CPU_ISA")
    try:
        os.environ["ZEROPP_HIER_CPU_ISA"] = name
        return torch.ops.zeropp_hier.cpu_isa() == name
    finally:
        if saved is None:
            os.environ.pop("ZEROPP_HIER_CPU_ISA", None)
        else:
            os.environ["ZEROPP_HIER_CPU_ISA"] = saved


@pytest.fixture(params=[pytest.param(n, marks=pytest.mark.cpu_isa) if needs else n for n, needs in ISAS.items()])
def isa(request, ops, monkeypatch):
    if not _runs_here(request.param):
        from zeropp_hier.detect.hardware import cpu_summary

        pytest.skip(
            f"the {request.param} kernel variant needs {ISAS[request.param]}, which this CPU lacks ({cpu_summary()})"
        )
    monkeypatch.setenv("ZEROPP_HIER_CPU_ISA", request.param)
    assert ops.cpu_isa() == request.param
    return request.param


# ---- inputs that exercise every branch of the format ---------------------------------------


def _regime_block(kind: int, b: int, dtype, g) -> torch.Tensor:
    """One block of b values of ``dtype`` in one of 9 regimes."""
    fi = torch.finfo(dtype)
    sign = torch.where(torch.rand(b, generator=g) < 0.5, -1.0, 1.0)
    if kind == 0:  # ordinary
        v = torch.randn(b, generator=g)
    elif kind == 1:  # all zero (with negative zeros)
        v = torch.zeros(b) * sign
    elif kind == 2:  # subnormals of the input dtype only
        steps = torch.randint(0, 300, (b,), generator=g).float()
        v = (steps * fi.smallest_normal * fi.eps * sign).to(dtype)
        return v
    elif kind == 3:  # near the dtype's max, the max itself included
        v = torch.rand(b, generator=g) * 0.1 + 0.9
        v = (v.double() * fi.max).clamp(max=fi.max).to(dtype) * sign.to(dtype)
        v[0] = fi.max
        return v
    elif kind == 4:  # one NaN
        v = torch.randn(b, generator=g)
        v[int(torch.randint(0, b, (1,), generator=g))] = float("nan")
    elif kind == 5:  # +-Inf
        v = torch.randn(b, generator=g)
        v[1], v[b - 1] = float("inf"), float("-inf")
    elif kind == 6:  # exact ties of x / scale (scale 1 for int8, absmax 127)
        v = torch.randint(-254, 255, (b,), generator=g).float() / 2
        v[0] = 127.0
    elif kind == 7:  # wide dynamic range inside one block
        v = torch.exp(torch.randn(b, generator=g) * 8).clamp(max=fi.max / 2) * sign
    else:  # tiny normal fp32 values whose scale is subnormal
        v = torch.randn(b, generator=g) * 1e-38
    return v.to(dtype)


def torture_input(n: int, block: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    blocks = [_regime_block((seed + i) % 9, block, dtype, g) for i in range(-(-n // block))]
    return torch.cat(blocks)[:n].clone() if blocks else torch.empty(0, dtype=dtype)


def lengths(block: int):
    return (0, 1, block - 1, block, block + 1, 9 * block + 3)


def sum_lengths(block: int) -> tuple[int, ...]:
    """The fused sums' input lengths: one value, a block and one, three blocks less a few, and
    natively 5,000 (many blocks of the small sizes, several of the largest output block)."""
    short = (1, block + 1, 3 * block - 5)
    return short if EMULATED else (*short, 5000)


def assert_payload_equal(got_data, got_scales, want: R.Quantized):
    assert got_data.dtype == want.data.dtype and got_data.shape == want.data.shape
    assert torch.equal(got_data, want.data)
    # scales compared as bits: NaN scales too
    assert torch.equal(got_scales.view(torch.int32), want.scales.view(torch.int32))


def assert_values_equal(got: torch.Tensor, want: torch.Tensor):
    """Same bits everywhere except the payload of NaNs, which the format leaves open."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    ints = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    assert torch.equal(got[~nan].view(ints[got.dtype]), want[~nan].view(ints[want.dtype]))


# ---- quantize / dequantize ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", BLOCKS)
def test_quantize_and_dequantize_match_reference(isa, ops, dtype, block):
    for seed, n in enumerate(lengths(block)):
        x = torture_input(n, block, dtype, seed)
        for bits in BITS:
            want = R.quantize(x, bits, block)
            data, scales = ops.quantize(x, bits, block)
            assert_payload_equal(data, scales, want)
            for out_dtype in DTYPES:
                assert_values_equal(
                    ops.dequantize(data, scales, n, bits, block, out_dtype), R.dequantize(want, out_dtype)
                )


def random_payload(bits: int) -> R.Quantized:
    """Every code and odd scales (subnormal, huge, NaN, negative zero), 5000 values, blocks of 64."""
    g = torch.Generator().manual_seed(bits)
    n, block = 5000, 64
    nb = -(-n // block)
    data = torch.randint(0, 256, (R.num_blocks(n, block) * block * bits // 8,), generator=g, dtype=torch.uint8)
    if bits == 8:
        data = data.view(torch.int8)
    scales = torch.randint(0, 2**31 - 1, (nb,), generator=g, dtype=torch.int32)
    scales = scales.view(torch.float32).clone()
    scales[:4] = torch.tensor([float("nan"), -0.0, 3.0e38, 1e-45])
    return R.Quantized(data, scales, n, bits, block)


@pytest.mark.parametrize("bits", BITS)
def test_random_bytes_dequantize_like_reference(isa, ops, bits):
    q = random_payload(bits)
    for out_dtype in DTYPES:
        got = ops.dequantize(q.data, q.scales, q.numel, bits, q.block_size, out_dtype)
        assert_values_equal(got, R.dequantize(q, out_dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", BITS)
def test_roundtrip_error_within_half_a_scale(ops, dtype, bits):
    block, n = 128, 20000
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 4)
    x = x.clamp(-6e4, 6e4).to(dtype)  # finite in every dtype
    q = quant.quantize(x, bits, block)
    assert not quant.nonfinite_blocks(q).any()
    scale = q.scales.repeat_interleave(block)[:n]
    for out_dtype in DTYPES:
        deq = quant.dequantize(q, out_dtype).float()
        # scale/2, plus fp32 rounding of x/scale and q*scale, plus rounding to out_dtype
        fi = torch.finfo(out_dtype)
        bound = scale * (0.5 + 2.0**-16) + deq.abs() * (2.0**-22 + fi.eps / 2) + fi.smallest_normal * fi.eps / 2
        assert ((x.float() - deq).abs() <= bound).all(), out_dtype


def test_nonfinite_blocks_are_reported(ops):
    x = torch.randn(10 * 64)
    x[70], x[300], x[639] = float("nan"), float("inf"), float("-inf")
    q = quant.quantize(x, 4, 64)
    flags = quant.nonfinite_blocks(q)
    assert flags.tolist() == [False, True, False, False, True, False, False, False, False, True]
    out = quant.dequantize(q)
    assert torch.isnan(out[64:128]).all() and torch.isfinite(out[:64]).all()


def test_public_api_flattens_non_contiguous_input(ops):
    x = torch.randn(64, 100)[:, ::3]
    q = quant.quantize(x, 8, 256)
    want = R.quantize(x, 8, 256)
    assert_payload_equal(q.data, q.scales, want)
    assert q.numel == x.numel()


# ---- fused dequantize-sum(-requantize) -----------------------------------------------------


def _parts(k: int, n: int, bits: int, block: int, seed: int):
    return [R.quantize(torture_input(n, block, torch.float32, seed * 31 + j), bits, block) for j in range(k)]


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("block", [32, 256, 4096])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_dequantize_sum_matches_reference(isa, ops, bits, block, k):
    for n in sum_lengths(block):
        parts = _parts(k, n, bits, block, seed=n + k)
        data = torch.stack([p.data for p in parts])
        scales = torch.stack([p.scales for p in parts])
        for out_dtype in DTYPES:
            assert_values_equal(
                ops.dequantize_sum(data, scales, n, bits, block, out_dtype), R.dequantize_sum(parts, out_dtype)
            )
        for out_bits in BITS:
            for out_block in (32, block, 1024):
                got_d, got_s = ops.dequantize_sum_requantize(data, scales, n, bits, block, out_bits, out_block)
                assert_payload_equal(got_d, got_s, R.dequantize_sum_requantize(parts, out_bits, out_block))


def test_fused_sum_reads_rows_of_a_receive_buffer_in_place(ops):
    # k payloads as rows of a wider buffer (row stride > payload bytes): viewed, not copied
    n, block, k = 1000, 64, 4
    parts = _parts(k, n, 8, block, seed=5)
    buf = torch.zeros(k, parts[0].data.numel() + 100, dtype=torch.int8)
    sbuf = torch.zeros(k, parts[0].scales.numel() + 3)
    for j, p in enumerate(parts):
        buf[j, : p.data.numel()] = p.data
        sbuf[j, : p.scales.numel()] = p.scales
    views = [
        R.Quantized(buf[j, : p.data.numel()], sbuf[j, : p.scales.numel()], n, 8, block) for j, p in enumerate(parts)
    ]
    stacked = quant._rows([v.data for v in views])
    assert stacked.data_ptr() == buf.data_ptr() and stacked.stride() == (buf.shape[1], 1)
    assert_values_equal(quant.dequantize_sum(views), R.dequantize_sum(parts))
    got = quant.dequantize_sum_requantize(views, 4, 256)
    assert_payload_equal(got.data, got.scales, R.dequantize_sum_requantize(parts, 4, 256))


def test_fused_sum_overflow_and_nan_propagate(ops):
    big = R.quantize(torch.full((64,), 3.0e38), 8, 32)
    nan = R.quantize(torch.tensor([1.0, float("nan")] + [0.0] * 62), 8, 32)
    # big + big overflows fp32 in both blocks; the NaN marks only its own block
    for parts, marked in (([big, big], [True, True]), ([big, nan], [True, False])):
        assert_values_equal(quant.dequantize_sum(parts), R.dequantize_sum(parts))
        got = quant.dequantize_sum_requantize(parts, 8, 32)
        assert quant.nonfinite_blocks(got).tolist() == marked
        assert_payload_equal(got.data, got.scales, R.dequantize_sum_requantize(parts, 8, 32))


# ---- argument checks ----------------------------------------------------------------------


def test_op_argument_errors_name_the_argument(ops):
    x = torch.randn(100)
    d, s = ops.quantize(x, 8, 64)
    cases = [
        (lambda: ops.quantize(x.int(), 8, 64), TypeError, "'x' must be float32"),
        (lambda: ops.quantize(torch.randn(200)[::2], 8, 64), ValueError, "'x' must be contiguous"),
        (lambda: ops.quantize(x, 3, 64), ValueError, "'bits' must be 8 or 4"),
        (lambda: ops.quantize(x, 8, 48), ValueError, "'block_size' must be a power of two"),
        (lambda: ops.quantize(x, 8, 8192), ValueError, "'block_size'"),
        (
            lambda: ops.dequantize(d.view(torch.uint8), s, 100, 8, 64, torch.float32),
            TypeError,
            "'data' must have dtype",
        ),
        (lambda: ops.dequantize(d, s.double(), 100, 8, 64, torch.float32), TypeError, "'scales' must have dtype"),
        (lambda: ops.dequantize(d, s, 200, 8, 64, torch.float32), ValueError, "'data' must hold 256 bytes"),
        (lambda: ops.dequantize(d, s, -1, 8, 64, torch.float32), ValueError, "'numel'"),
        (lambda: ops.dequantize(d, s, 100, 8, 64, torch.int32), TypeError, "'dtype'"),
        (lambda: ops.dequantize_sum(d, s, 100, 8, 64, torch.float32), ValueError, "'data' must be 2-D"),
        (
            lambda: ops.dequantize_sum(torch.stack([d, d]), s.view(1, -1), 100, 8, 64, torch.float32),
            ValueError,
            "'scales' must stack 2",
        ),
        (
            lambda: ops.dequantize_sum_requantize(d.view(1, -1), s.view(1, -1), 100, 8, 64, 8, 20),
            ValueError,
            "'out_block_size'",
        ),
    ]
    for call, exc, text in cases:
        with pytest.raises(exc, match=text):
            call()


def test_public_api_errors_are_typed_and_named():
    x = torch.randn(100)
    with pytest.raises(quant.QuantArgumentError, match="'block_size'"):
        quant.quantize(x, 8, 100)
    with pytest.raises(quant.QuantArgumentError, match="'bits'"):
        quant.quantize(x, 2, 64)
    with pytest.raises(quant.QuantDtypeError, match="'x'"):
        quant.quantize(x.long(), 8, 64)
    q = quant.quantize(x, 8, 64)
    with pytest.raises(quant.QuantDtypeError, match="'dtype'"):
        quant.dequantize(q, torch.int8)
    with pytest.raises(quant.QuantArgumentError, match=r"'q.data' must have shape \[256\]"):
        quant.dequantize(q._replace(numel=200))
    with pytest.raises(quant.QuantArgumentError, match=r"'parts\[1\]' has \(numel"):
        quant.dequantize_sum([q, quant.quantize(torch.randn(50), 8, 64)])
    with pytest.raises(quant.QuantArgumentError, match="'parts' must be a non-empty"):
        quant.dequantize_sum([])
    assert issubclass(quant.QuantArgumentError, ValueError)
    assert issubclass(quant.QuantDtypeError, TypeError)


# ---- fake implementations ------------------------------------------------------------------


def test_fake_impls_give_shapes_without_running(ops):
    with FakeTensorMode():
        x = torch.empty(1000, dtype=torch.bfloat16)
        d, s = ops.quantize(x, 4, 64)
        assert (d.shape, d.dtype, s.shape, s.dtype) == ((512,), torch.uint8, (16,), torch.float32)
        out = ops.dequantize(d, s, 1000, 4, 64, torch.float16)
        assert (out.shape, out.dtype) == ((1000,), torch.float16)
        dd, ss = torch.stack([d, d, d]), torch.stack([s, s, s])
        assert ops.dequantize_sum(dd, ss, 1000, 4, 64, torch.float32).shape == (1000,)
        rd, rs = ops.dequantize_sum_requantize(dd, ss, 1000, 4, 64, 8, 256)
        assert (rd.shape, rd.dtype, rs.shape) == ((1024,), torch.int8, (4,))
        with pytest.raises(ValueError, match="'block_size'"):
            ops.quantize(x, 4, 100)
    meta = ops.quantize(torch.empty(70, device="meta"), 8, 32)
    assert meta[0].shape == (96,) and meta[0].device.type == "meta"


def test_opcheck(ops):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, generator=g)
    d, s = ops.quantize(x, 8, 64)
    dd, ss = torch.stack([d, d]), torch.stack([s, s])
    checks = [
        (ops.quantize.default, (x, 8, 64)),
        (ops.quantize.default, (x.to(torch.bfloat16), 4, 32)),
        (ops.dequantize.default, (d, s, 300, 8, 64, torch.float16)),
        (ops.dequantize_sum.default, (dd, ss, 300, 8, 64, torch.bfloat16)),
        (ops.dequantize_sum_requantize.default, (dd, ss, 300, 8, 64, 4, 128)),
    ]
    for op, args in checks:
        torch.library.opcheck(op, args)


# ---- fallback ------------------------------------------------------------------------------


def test_missing_build_is_reported_with_the_fix():
    st = _ext.load("zeropp_hier._C_not_built")
    assert not st.loaded and "not built" in st.reason


def test_only_the_package_directory_serves_the_library(tmp_path, monkeypatch):
    # an editable install's finder answers for zeropp_hier.* from the tree it was installed from;
    # a library found that way was built from other sources and must not be loaded
    import importlib.machinery
    import importlib.util
    import sys

    elsewhere = tmp_path / ("_C_elsewhere" + importlib.machinery.EXTENSION_SUFFIXES[0])
    elsewhere.write_bytes(b"not a library")

    class OtherTree:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname == "zeropp_hier._C_elsewhere":
                return importlib.util.spec_from_file_location(fullname, elsewhere)
            return None

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, OtherTree])
    assert importlib.util.find_spec("zeropp_hier._C_elsewhere").origin == str(elsewhere)
    st = _ext.load("zeropp_hier._C_elsewhere")
    assert not st.loaded and "not built" in st.reason


def test_fallback_warns_once_and_matches(ops, caplog):
    # no kernels are registered for meta tensors: the reference serves them, after one warning
    _ext.warn_fallback.cache_clear()
    x = torch.empty(1000, device="meta")
    with caplog.at_level(logging.WARNING, logger="zeropp_hier.quant"):
        for _ in range(3):
            q = quant.quantize(x, 8, 64)
    assert q.data.shape == (1024,) and quant.backend("meta") == "reference"
    msgs = [r.getMessage() for r in caplog.records if r.name == "zeropp_hier.quant"]
    assert len(msgs) == 1
    assert "meta" in msgs[0] and "pip install --no-build-isolation -e ." in msgs[0]
