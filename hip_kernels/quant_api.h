// Raw-pointer entry points of the quantization backends.
//
// Neither backend sees a torch type: quant_cpu.cpp is plain C++ with OpenMP and
// quant_kernels.hip compiles with hipcc or nvcc alone (hip_kernels/check_compile.sh), so both
// can be built and checked without PyTorch. quant_ops.cpp (torch-aware) validates tensors and
// calls these. All sizes are element counts unless named `bytes`. Layouts follow
// [Note: quantization format] in zeropp_hier/quant/reference.py.
#pragma once

#include <stdint.h>

namespace zqh {

enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// One stacked batch of k quantized payloads of the same shape, as received from k peers.
struct Parts {
  const void* data;      // [k, data_stride] int8 or uint8 (int4 pairs)
  int64_t data_stride;   // bytes between consecutive parts' data
  const float* scales;   // [k, scale_stride] fp32
  int64_t scale_stride;  // floats between consecutive parts' scales
  int64_t k;             // number of parts, >= 1
  int64_t numel;         // elements per part, before padding
  int bits;              // 8 or 4
  int64_t block_size;    // elements per scale
  int64_t rotate = 0;    // the parts' rotation size R, 0 = none ([Note: block rotation])
};

namespace cpu {

// The instruction-set variant the next call uses: "avx512", "avx2" or "default".
const char* isa_name();

// x [numel] -> data [nblocks*B (bits 8) or nblocks*B/2 (bits 4)], scales [nblocks];
// rotate: R or 0 ([Note: block rotation] in zeropp_hier/quant/reference.py)
void quantize(const void* x, DType x_dtype, int64_t numel, int bits, int64_t block_size,
              int64_t rotate, void* data, float* scales);

// data, scales as above -> out [numel] of out_dtype; rotate: the payload's R or 0
void dequantize(const void* data, const float* scales, int64_t numel, int bits, int64_t block_size,
                int64_t rotate, void* out, DType out_dtype);

// sum over parts in order 0..k-1, in fp32 -> out [numel] of out_dtype (rotated parts: summed in
// the rotated domain over whole blocks, rotated back once)
void dequantize_sum(const Parts& parts, void* out, DType out_dtype);

// quantize(sum over parts) -> out_data, out_scales in the (out_bits, out_block_size) format,
// unrotated parts (parts.rotate == 0; the ops compose the rotated cases, see quant_ops.cpp)
void dequantize_sum_requantize(const Parts& parts, int out_bits, int64_t out_block_size,
                               void* out_data, float* out_scales);

}  // namespace cpu

namespace gpu {

// Same contracts as zqh::cpu, on device pointers, enqueued on `stream` (a hipStream_t or
// cudaStream_t). Return nullptr on success, else the runtime's error string for the launch.
const char* quantize(const void* x, DType x_dtype, int64_t numel, int bits, int64_t block_size,
                     void* data, float* scales, void* stream);
const char* dequantize(const void* data, const float* scales, int64_t numel, int bits,
                       int64_t block_size, void* out, DType out_dtype, void* stream);
const char* dequantize_sum(const Parts& parts, void* out, DType out_dtype, void* stream);
const char* dequantize_sum_requantize(const Parts& parts, int out_bits, int64_t out_block_size,
                                      void* out_data, float* out_scales, void* stream);
// v [n] fp32 in place (n a multiple of rotate): every group of `rotate` values times
// H_R / sqrt(R), as hadamard_inplace in quant_math.h. The gpu:: kernels above ignore
// Parts::rotate; quant_ops.cpp composes the rotated ops from them and this.
const char* hadamard(float* v, int64_t n, int64_t rotate, void* stream);

}  // namespace gpu

}  // namespace zqh
