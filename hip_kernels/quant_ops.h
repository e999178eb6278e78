// Torch-facing implementations of the zeropp_hier:: ops, registered in bindings.cpp.
//
// Each op validates its tensors (device, dtype, contiguity, sizes, block size; errors name the
// argument and the problem) and calls the raw-pointer backend in quant_api.h. The *_gpu
// variants exist only in builds against a CUDA or ROCm torch (ZEROPP_WITH_GPU).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <tuple>

namespace zqh {
namespace ops {

// rotate / out_rotate: R or 0, see [Note: block rotation] in zeropp_hier/quant/reference.py.
// x [n] fp32/fp16/bf16 -> (data [nblocks*B] int8 | [nblocks*B/2] uint8, scales [nblocks] fp32)
std::tuple<at::Tensor, at::Tensor> quantize_cpu(const at::Tensor& x, int64_t bits,
                                                int64_t block_size, int64_t rotate);
// data, scales as returned by quantize -> [numel] of dtype
at::Tensor dequantize_cpu(const at::Tensor& data, const at::Tensor& scales, int64_t numel,
                          int64_t bits, int64_t block_size, at::ScalarType dtype, int64_t rotate);
// data [k, bytes], scales [k, nblocks] (k stacked payloads) -> [numel] of dtype
at::Tensor dequantize_sum_cpu(const at::Tensor& data, const at::Tensor& scales, int64_t numel,
                              int64_t bits, int64_t block_size, at::ScalarType dtype,
                              int64_t rotate);
// data [k, bytes], scales [k, nblocks] -> quantize(sum) in (out_bits, out_block_size)
std::tuple<at::Tensor, at::Tensor> dequantize_sum_requantize_cpu(
    const at::Tensor& data, const at::Tensor& scales, int64_t numel, int64_t bits,
    int64_t block_size, int64_t out_bits, int64_t out_block_size, int64_t rotate,
    int64_t out_rotate);

#ifdef ZEROPP_WITH_GPU
std::tuple<at::Tensor, at::Tensor> quantize_gpu(const at::Tensor& x, int64_t bits,
                                                int64_t block_size, int64_t rotate);
at::Tensor dequantize_gpu(const at::Tensor& data, const at::Tensor& scales, int64_t numel,
                          int64_t bits, int64_t block_size, at::ScalarType dtype, int64_t rotate);
at::Tensor dequantize_sum_gpu(const at::Tensor& data, const at::Tensor& scales, int64_t numel,
                              int64_t bits, int64_t block_size, at::ScalarType dtype,
                              int64_t rotate);
std::tuple<at::Tensor, at::Tensor> dequantize_sum_requantize_gpu(
    const at::Tensor& data, const at::Tensor& scales, int64_t numel, int64_t bits,
    int64_t block_size, int64_t out_bits, int64_t out_block_size, int64_t rotate,
    int64_t out_rotate);
#endif

// Which device backends this build holds: "cpu", "cpu+hip" or "cpu+cuda".
std::string build_info();

// The CPU loops' instruction-set variant: "avx512", "avx2" or "default".
std::string cpu_isa();

}  // namespace ops
}  // namespace zqh
