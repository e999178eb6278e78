// Validation, allocation and backend dispatch for the zeropp_hier:: ops (see quant_ops.h).
//
// Argument errors are raised with TORCH_CHECK_VALUE / TORCH_CHECK_TYPE, which surface in Python
// as ValueError / TypeError; every message starts with the op and names the argument.
#include "quant_ops.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "quant_api.h"
#include "quant_math.h"

#ifdef ZEROPP_WITH_GPU
// c10's headers, not ATen/cuda/CUDAContext.h: they need only the CUDA runtime (no cuBLAS or
// cuSPARSE headers), and torch's hipify maps them to their ROCm twins.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zqh {
namespace ops {
namespace {

enum class Where { kCpu, kGpu };

DType float_dtype(const char* op, const char* arg, at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    default:
      TORCH_CHECK_TYPE(false, op, ": argument '", arg,
                       "' must be float32, float16 or bfloat16, got ", t);
  }
  return DType::kF32;  // unreachable: TORCH_CHECK_TYPE(false, ...) throws
}

void check_bits(const char* op, const char* arg, int64_t bits) {
  TORCH_CHECK_VALUE(bits == 8 || bits == 4, op, ": argument '", arg, "' must be 8 or 4, got ",
                    bits);
}

void check_block_size(const char* op, const char* arg, int64_t block_size) {
  TORCH_CHECK_VALUE(valid_block_size(block_size), op, ": argument '", arg,
                    "' must be a power of two from 32 to 4096, got ", block_size);
}

void check_rotate(const char* op, const char* arg, int64_t rotate, int64_t block_size) {
  TORCH_CHECK_VALUE(valid_rotate(rotate, block_size), op, ": argument '", arg,
                    "' must be 0 (off) or a power of two from 2 to the block size ", block_size,
                    ", got ", rotate);
}

int64_t padded_numel(int64_t numel, int64_t block_size) {
  return num_blocks(numel, block_size) * block_size;
}

void check_device(const char* op, const char* arg, const at::Tensor& t, Where where,
                  const at::Device& device) {
  if (where == Where::kCpu) {
    TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": argument '", arg,
                      "' must be on the CPU like the other arguments, got ", t.device());
  } else {
    TORCH_CHECK_VALUE(t.device() == device, op, ": argument '", arg, "' must be on ", device,
                      " like the other arguments, got ", t.device());
  }
}

void check_dtype(const char* op, const char* arg, const at::Tensor& t, at::ScalarType want,
                 const char* why) {
  TORCH_CHECK_TYPE(t.scalar_type() == want, op, ": argument '", arg, "' must have dtype ", want,
                   why, ", got ", t.scalar_type());
}

// The quantized payload of a single tensor (stacked == false): data [bytes], scales [nblocks];
// of k stacked tensors (stacked == true): data [k, bytes], scales [k, nblocks], rows
// contiguous (the rows may be views into a larger receive buffer). Returns the Parts view.
Parts check_payload(const char* op, const at::Tensor& data, const at::Tensor& scales, int64_t numel,
                    int64_t bits, int64_t block_size, Where where, bool stacked) {
  check_bits(op, "bits", bits);
  check_block_size(op, "block_size", block_size);
  TORCH_CHECK_VALUE(numel >= 0, op, ": argument 'numel' must be >= 0, got ", numel);
  const at::Device device = data.device();
  check_device(op, "data", data, where, device);
  check_device(op, "scales", scales, where, device);
  check_dtype(op, "data", data, bits == 8 ? at::kChar : at::kByte,
              bits == 8 ? " (int8) for bits=8" : " (uint8 nibble pairs) for bits=4");
  check_dtype(op, "scales", scales, at::kFloat, "");

  const int64_t rank = stacked ? 2 : 1;
  TORCH_CHECK_VALUE(data.dim() == rank, op, ": argument 'data' must be ",
                    stacked ? "2-D [k, bytes]" : "1-D", ", got shape ", data.sizes());
  TORCH_CHECK_VALUE(scales.dim() == rank, op, ": argument 'scales' must be ",
                    stacked ? "2-D [k, nblocks]" : "1-D", ", got shape ", scales.sizes());
  TORCH_CHECK_VALUE(data.stride(rank - 1) == 1, op,
                    ": argument 'data' must be contiguous along its last dim, got strides ",
                    data.strides());
  TORCH_CHECK_VALUE(scales.stride(rank - 1) == 1, op,
                    ": argument 'scales' must be contiguous along its last dim, got strides ",
                    scales.strides());

  const int64_t nblocks = num_blocks(numel, block_size);
  const int64_t bytes = data_bytes(nblocks, block_size, int(bits));
  TORCH_CHECK_VALUE(data.size(rank - 1) == bytes, op, ": argument 'data' must hold ", bytes,
                    " bytes per payload for numel=", numel, ", bits=", bits,
                    ", block_size=", block_size, ", got ", data.size(rank - 1));
  TORCH_CHECK_VALUE(scales.size(rank - 1) == nblocks, op, ": argument 'scales' must hold ", nblocks,
                    " blocks per payload for numel=", numel, ", block_size=", block_size, ", got ",
                    scales.size(rank - 1));
  const int64_t k = stacked ? data.size(0) : 1;
  if (stacked) {
    TORCH_CHECK_VALUE(k >= 1, op, ": argument 'data' must stack at least one payload, got 0");
    TORCH_CHECK_VALUE(scales.size(0) == k, op, ": argument 'scales' must stack ", k,
                      " payloads like 'data', got ", scales.size(0));
  }
  Parts parts;
  parts.data = data.data_ptr();
  parts.data_stride = stacked ? data.stride(0) : bytes;
  parts.scales = scales.data_ptr<float>();
  parts.scale_stride = stacked ? scales.stride(0) : nblocks;
  parts.k = k;
  parts.numel = numel;
  parts.bits = int(bits);
  parts.block_size = block_size;
  return parts;
}

std::tuple<at::Tensor, at::Tensor> empty_payload(const at::TensorOptions& like, int64_t numel,
                                                 int64_t bits, int64_t block_size) {
  const int64_t nblocks = num_blocks(numel, block_size);
  at::Tensor data = at::empty({data_bytes(nblocks, block_size, int(bits))},
                              like.dtype(bits == 8 ? at::kChar : at::kByte));
  at::Tensor scales = at::empty({nblocks}, like.dtype(at::kFloat));
  return {data, scales};
}

#ifdef ZEROPP_WITH_GPU
void* current_stream(const at::Device& device) {
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}

void check_launch(const char* op, const char* error) {
  TORCH_CHECK(error == nullptr, op, ": kernel launch failed: ", error);
}
#endif

std::tuple<at::Tensor, at::Tensor> quantize_on(Where where, const at::Tensor& x, int64_t bits,
                                               int64_t block_size, int64_t rotate) {
  const char* op = "zeropp_hier.quantize";
  check_device(op, "x", x, where, x.device());
  const DType dtype = float_dtype(op, "x", x.scalar_type());
  TORCH_CHECK_VALUE(x.is_contiguous(), op, ": argument 'x' must be contiguous, got strides ",
                    x.strides());
  check_bits(op, "bits", bits);
  check_block_size(op, "block_size", block_size);
  check_rotate(op, "rotate", rotate, block_size);
  auto [data, scales] = empty_payload(x.options(), x.numel(), bits, block_size);
  if (x.numel() == 0) return {data, scales};
  if (where == Where::kCpu) {
    cpu::quantize(x.data_ptr(), dtype, x.numel(), int(bits), block_size, rotate, data.data_ptr(),
                  scales.data_ptr<float>());
  }
#ifdef ZEROPP_WITH_GPU
  else if (rotate == 0) {
    const c10::cuda::CUDAGuard guard(x.device());
    check_launch(
        op, gpu::quantize(x.data_ptr(), dtype, x.numel(), int(bits), block_size, data.data_ptr(),
                          scales.data_ptr<float>(), current_stream(x.device())));
  } else {  // a rotated, zero-padded fp32 copy, quantized as a whole ([Note: GPU block rotation])
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t padded = padded_numel(x.numel(), block_size);
    at::Tensor tmp = at::zeros({padded}, x.options().dtype(at::kFloat));
    tmp.narrow(0, 0, x.numel()).copy_(x.view(-1));  // fp16/bf16 -> fp32 is exact
    void* stream = current_stream(x.device());
    check_launch(op, gpu::hadamard(tmp.data_ptr<float>(), padded, rotate, stream));
    check_launch(op, gpu::quantize(tmp.data_ptr(), DType::kF32, padded, int(bits), block_size,
                                   data.data_ptr(), scales.data_ptr<float>(), stream));
  }
#endif
  return {data, scales};
}

#ifdef ZEROPP_WITH_GPU
// The fp32 [padded] values (still rotated) from `launch`, rotated back, cut to numel and cast.
template <typename Launch>
at::Tensor unrotate_gpu(const char* op, const at::Tensor& like, int64_t numel, int64_t padded,
                        int64_t rotate, at::ScalarType dtype, Launch launch) {
  const c10::cuda::CUDAGuard guard(like.device());
  at::Tensor tmp = at::empty({padded}, like.options().dtype(at::kFloat));
  void* stream = current_stream(like.device());
  check_launch(op, launch(tmp.data_ptr<float>(), stream));
  check_launch(op, gpu::hadamard(tmp.data_ptr<float>(), padded, rotate, stream));
  return tmp.narrow(0, 0, numel).to(dtype).contiguous();
}
#endif

at::Tensor dequantize_on(Where where, const at::Tensor& data, const at::Tensor& scales,
                         int64_t numel, int64_t bits, int64_t block_size, at::ScalarType dtype,
                         int64_t rotate) {
  const char* op = "zeropp_hier.dequantize";
  const Parts p = check_payload(op, data, scales, numel, bits, block_size, where, false);
  const DType out_dtype = float_dtype(op, "dtype", dtype);
  check_rotate(op, "rotate", rotate, block_size);
  at::Tensor out = at::empty({numel}, data.options().dtype(dtype));
  if (numel == 0) return out;
  if (where == Where::kCpu) {
    cpu::dequantize(p.data, p.scales, numel, p.bits, block_size, rotate, out.data_ptr(), out_dtype);
  }
#ifdef ZEROPP_WITH_GPU
  else if (rotate != 0) {
    const int64_t padded = padded_numel(numel, block_size);
    return unrotate_gpu(op, data, numel, padded, rotate, dtype, [&](float* tmp, void* stream) {
      return gpu::dequantize(p.data, p.scales, padded, p.bits, block_size, tmp, DType::kF32,
                             stream);
    });
  } else {
    const c10::cuda::CUDAGuard guard(data.device());
    check_launch(op, gpu::dequantize(p.data, p.scales, numel, p.bits, block_size, out.data_ptr(),
                                     out_dtype, current_stream(data.device())));
  }
#endif
  return out;
}

at::Tensor dequantize_sum_on(Where where, const at::Tensor& data, const at::Tensor& scales,
                             int64_t numel, int64_t bits, int64_t block_size, at::ScalarType dtype,
                             int64_t rotate) {
  const char* op = "zeropp_hier.dequantize_sum";
  Parts p = check_payload(op, data, scales, numel, bits, block_size, where, true);
  const DType out_dtype = float_dtype(op, "dtype", dtype);
  check_rotate(op, "rotate", rotate, block_size);
  p.rotate = rotate;
  at::Tensor out = at::empty({numel}, data.options().dtype(dtype));
  if (numel == 0) return out;
  if (where == Where::kCpu) {
    cpu::dequantize_sum(p, out.data_ptr(), out_dtype);
  }
#ifdef ZEROPP_WITH_GPU
  else if (rotate != 0) {  // the plain sum over whole blocks is the rotated-domain sum
    Parts whole = p;
    whole.numel = padded_numel(numel, block_size);
    whole.rotate = 0;
    return unrotate_gpu(op, data, numel, whole.numel, rotate, dtype, [&](float* tmp, void* s) {
      return gpu::dequantize_sum(whole, tmp, DType::kF32, s);
    });
  } else {
    const c10::cuda::CUDAGuard guard(data.device());
    check_launch(op,
                 gpu::dequantize_sum(p, out.data_ptr(), out_dtype, current_stream(data.device())));
  }
#endif
  return out;
}

// With rotation ([Note: block rotation]): the same R and block size on both sides quantize the
// rotated-domain sum over whole blocks directly (the unrotated fused step with numel = padded
// length); any other pair is the composition the reference defines: the de-rotated fp32 sum,
// quantized with out_rotate.
std::tuple<at::Tensor, at::Tensor> dequantize_sum_requantize_on(
    Where where, const at::Tensor& data, const at::Tensor& scales, int64_t numel, int64_t bits,
    int64_t block_size, int64_t out_bits, int64_t out_block_size, int64_t rotate,
    int64_t out_rotate) {
  const char* op = "zeropp_hier.dequantize_sum_requantize";
  Parts p = check_payload(op, data, scales, numel, bits, block_size, where, true);
  check_bits(op, "out_bits", out_bits);
  check_block_size(op, "out_block_size", out_block_size);
  check_rotate(op, "rotate", rotate, block_size);
  check_rotate(op, "out_rotate", out_rotate, out_block_size);
  if (rotate != 0 || out_rotate != 0) {
    if (rotate != out_rotate || block_size != out_block_size) {
      const at::Tensor sum =
          dequantize_sum_on(where, data, scales, numel, bits, block_size, at::kFloat, rotate);
      return quantize_on(where, sum, out_bits, out_block_size, out_rotate);
    }
    p.numel = padded_numel(numel, block_size);  // same payload shapes: same block size
  }
  auto [out_data, out_scales] = empty_payload(data.options(), numel, out_bits, out_block_size);
  if (numel == 0) return {out_data, out_scales};
  if (where == Where::kCpu) {
    cpu::dequantize_sum_requantize(p, int(out_bits), out_block_size, out_data.data_ptr(),
                                   out_scales.data_ptr<float>());
  }
#ifdef ZEROPP_WITH_GPU
  else {
    const c10::cuda::CUDAGuard guard(data.device());
    check_launch(op, gpu::dequantize_sum_requantize(
                         p, int(out_bits), out_block_size, out_data.data_ptr(),
                         out_scales.data_ptr<float>(), current_stream(data.device())));
  }
#endif
  return {out_data, out_scales};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> quantize_cpu(const at::Tensor& x, int64_t bits,
                                                int64_t block_size, int64_t rotate) {
  return quantize_on(Where::kCpu, x, bits, block_size, rotate);
}

at::Tensor dequantize_cpu(const at::Tensor& data, const at::Tensor& scales, int64_t numel,
                          int64_t bits, int64_t block_size, at::ScalarType dtype, int64_t rotate) {
  return dequantize_on(Where::kCpu, data, scales, numel, bits, block_size, dtype, rotate);
}

at::Tensor dequantize_sum_cpu(const at::Tensor& data, const at::Tensor& scales, int64_t numel,
                              int64_t bits, int64_t block_size, at::ScalarType dtype,
                              int64_t rotate) {
  return dequantize_sum_on(Where::kCpu, data, scales, numel, bits, block_size, dtype, rotate);
}

std::tuple<at::Tensor, at::Tensor> dequantize_sum_requantize_cpu(
    const at::Tensor& data, const at::Tensor& scales, int64_t numel, int64_t bits,
    int64_t block_size, int64_t out_bits, int64_t out_block_size, int64_t rotate,
    int64_t out_rotate) {
  return dequantize_sum_requantize_on(Where::kCpu, data, scales, numel, bits, block_size, out_bits,
                                      out_block_size, rotate, out_rotate);
}

#ifdef ZEROPP_WITH_GPU
std::tuple<at::Tensor, at::Tensor> quantize_gpu(const at::Tensor& x, int64_t bits,
                                                int64_t block_size, int64_t rotate) {
  return quantize_on(Where::kGpu, x, bits, block_size, rotate);
}

at::Tensor dequantize_gpu(const at::Tensor& data, const at::Tensor& scales, int64_t numel,
                          int64_t bits, int64_t block_size, at::ScalarType dtype, int64_t rotate) {
  return dequantize_on(Where::kGpu, data, scales, numel, bits, block_size, dtype, rotate);
}

at::Tensor dequantize_sum_gpu(const at::Tensor& data, const at::Tensor& scales, int64_t numel,
                              int64_t bits, int64_t block_size, at::ScalarType dtype,
                              int64_t rotate) {
  return dequantize_sum_on(Where::kGpu, data, scales, numel, bits, block_size, dtype, rotate);
}

std::tuple<at::Tensor, at::Tensor> dequantize_sum_requantize_gpu(
    const at::Tensor& data, const at::Tensor& scales, int64_t numel, int64_t bits,
    int64_t block_size, int64_t out_bits, int64_t out_block_size, int64_t rotate,
    int64_t out_rotate) {
  return dequantize_sum_requantize_on(Where::kGpu, data, scales, numel, bits, block_size, out_bits,
                                      out_block_size, rotate, out_rotate);
}
#endif

std::string build_info() {
#if defined(ZEROPP_WITH_GPU) && defined(ZEROPP_GPU_HIP)
  return "cpu+hip";
#elif defined(ZEROPP_WITH_GPU)
  return "cpu+cuda";
#else
  return "cpu";
#endif
}

std::string cpu_isa() { return cpu::isa_name(); }

}  // namespace ops
}  // namespace zqh
