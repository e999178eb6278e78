// GPU backend (HIP, gfx90a first; the same file compiles with nvcc, see gpu_runtime.h).
//
// All arithmetic is the shared code in quant_math.h, so results match the CPU backend and the
// PyTorch reference bit for bit ([Note: bit-exact arithmetic] there). Layouts: see
// [Note: quantization format] in zeropp_hier/quant/reference.py.
//
// Kernels:
// - quantize_blocks: a 256-thread workgroup handles max(1, 256/B) quantization blocks; each
//   block's T = min(B, 256) threads stage its values in shared memory, reduce the absmax bits
//   (one integer max also detects NaN/Inf), then quantize from shared memory. The values come
//   from a Source: the input tensor (quantize), or the fp32 sum over k received payloads
//   (fused dequantize-sum-requantize), so the fused step never writes the sum to memory.
// - dequantize_elems / dequantize_sum_elems: one element per thread, grid-stride.
#include "gpu_runtime.h"
#include "quant_api.h"
#include "quant_math.h"

namespace zqh {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65535;  // grid-stride loops cover the rest

__device__ __forceinline__ int load_q(const uint8_t* data, int bits, int64_t e) {
  if (bits == 8) return int(reinterpret_cast<const int8_t*>(data)[e]);
  const uint8_t byte = data[e >> 1];
  return (e & 1) ? int4_high(byte) : int4_low(byte);
}

// Element e of a payload in fp32 (q * scale); blocks are powers of two, hence the shift.
__device__ __forceinline__ float load_dequantized(const uint8_t* data, const float* scales,
                                                  int bits, int log2_block, int64_t e) {
  return dequantize_value(load_q(data, bits, e), scales[e >> log2_block]);
}

// Sum over the k parts of element e, in part order from +0.0 (the reference's order).
__device__ __forceinline__ float sum_parts(const Parts& p, int log2_block, int64_t e) {
  const uint8_t* data = static_cast<const uint8_t*>(p.data);
  float acc = 0.0f;
  for (int64_t k = 0; k < p.k; ++k) {
    acc = add_rn(acc, load_dequantized(data + k * p.data_stride, p.scales + k * p.scale_stride,
                                       p.bits, log2_block, e));
  }
  return acc;
}

template <typename T>
struct TensorSource {
  const T* x;
  int64_t numel;
  __device__ float operator()(int64_t e) const { return e < numel ? to_f32(x[e]) : 0.0f; }
};

// Elements past numel are padding: 0, never the parts' padding (NaN in a non-finite block).
struct PartsSumSource {
  Parts parts;
  int log2_block;
  __device__ float operator()(int64_t e) const {
    return e < parts.numel ? sum_parts(parts, log2_block, e) : 0.0f;
  }
};

int log2_of(int64_t pow2) {
  int s = 0;
  while ((int64_t(1) << s) < pow2) ++s;
  return s;
}

int64_t grid_for(int64_t work_items, int64_t per_workgroup) {
  const int64_t g = (work_items + per_workgroup - 1) / per_workgroup;
  return g < 1 ? 1 : (g > kMaxGrid ? kMaxGrid : g);
}

// Dynamic shared memory: max(B, kThreads) floats, the staged values of the workgroup's blocks.
template <typename Source>
__global__ void quantize_blocks(Source src, int64_t nblocks, int bits, int block_size,
                                uint8_t* data, float* scales) {
  extern __shared__ float staged[];
  __shared__ uint32_t absmax[kThreads];
  const int per_block = block_size < kThreads ? block_size : kThreads;  // T threads per block
  const int groups = kThreads / per_block;
  const int g = threadIdx.x / per_block;
  const int t = threadIdx.x % per_block;
  const int qmax = qmax_for_bits(bits);
  float* vals = staged + g * block_size;
  // The loop bound depends only on blockIdx, so every thread reaches every __syncthreads.
  for (int64_t first = int64_t(blockIdx.x) * groups; first < nblocks;
       first += int64_t(gridDim.x) * groups) {
    const int64_t b = first + g;
    uint32_t amax = 0;
    if (b < nblocks) {
      for (int i = t; i < block_size; i += per_block) {
        const float v = src(b * block_size + i);
        vals[i] = v;
        const uint32_t a = abs_bits(v);
        amax = a > amax ? a : amax;
      }
    }
    absmax[threadIdx.x] = amax;
    __syncthreads();  // also publishes vals
    for (int s = per_block / 2; s > 0; s >>= 1) {
      if (t < s) {
        const uint32_t other = absmax[threadIdx.x + s];
        if (other > absmax[threadIdx.x]) absmax[threadIdx.x] = other;
      }
      __syncthreads();
    }
    if (b < nblocks) {
      const float scale = block_scale(absmax[g * per_block], qmax);
      if (t == 0) scales[b] = scale;
      if (bits == 8) {
        int8_t* q = reinterpret_cast<int8_t*>(data) + b * block_size;
        for (int i = t; i < block_size; i += per_block) {
          q[i] = int8_t(quantize_value(vals[i], scale, qmax));
        }
      } else {
        uint8_t* q = data + b * (block_size / 2);
        for (int j = t; j < block_size / 2; j += per_block) {
          q[j] = pack_int4(quantize_value(vals[2 * j], scale, qmax),
                           quantize_value(vals[2 * j + 1], scale, qmax));
        }
      }
    }
    __syncthreads();  // vals and absmax are reused by the next iteration
  }
}

template <typename T>
__global__ void dequantize_elems(const uint8_t* data, const float* scales, int64_t numel, int bits,
                                 int log2_block, T* out) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < numel;
       e += int64_t(gridDim.x) * blockDim.x) {
    out[e] = from_f32<T>(load_dequantized(data, scales, bits, log2_block, e));
  }
}

template <typename T>
__global__ void dequantize_sum_elems(Parts parts, int log2_block, T* out) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < parts.numel;
       e += int64_t(gridDim.x) * blockDim.x) {
    out[e] = from_f32<T>(sum_parts(parts, log2_block, e));
  }
}

const char* launch_status() {
  const hipError_t err = hipGetLastError();
  return err == hipSuccess ? nullptr : hipGetErrorString(err);
}

template <typename Source>
const char* launch_quantize(const Source& src, int64_t numel, int bits, int64_t block_size,
                            void* data, float* scales, hipStream_t stream) {
  const int64_t nblocks = num_blocks(numel, block_size);
  const int64_t groups = block_size < kThreads ? kThreads / block_size : 1;
  const size_t shmem = size_t(block_size < kThreads ? kThreads : block_size) * sizeof(float);
  quantize_blocks<Source>
      <<<dim3(unsigned(grid_for(nblocks, groups))), dim3(kThreads), shmem, stream>>>(
          src, nblocks, bits, int(block_size), static_cast<uint8_t*>(data), scales);
  return launch_status();
}

template <typename T>
const char* launch_dequantize(const void* data, const float* scales, int64_t numel, int bits,
                              int64_t block_size, void* out, hipStream_t stream) {
  dequantize_elems<T><<<dim3(unsigned(grid_for(numel, kThreads))), dim3(kThreads), 0, stream>>>(
      static_cast<const uint8_t*>(data), scales, numel, bits, log2_of(block_size),
      static_cast<T*>(out));
  return launch_status();
}

template <typename T>
const char* launch_dequantize_sum(const Parts& parts, void* out, hipStream_t stream) {
  dequantize_sum_elems<T>
      <<<dim3(unsigned(grid_for(parts.numel, kThreads))), dim3(kThreads), 0, stream>>>(
          parts, log2_of(parts.block_size), static_cast<T*>(out));
  return launch_status();
}

}  // namespace

const char* quantize(const void* x, DType x_dtype, int64_t numel, int bits, int64_t block_size,
                     void* data, float* scales, void* stream) {
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (x_dtype) {
    case DType::kF32:
      return launch_quantize(TensorSource<float>{static_cast<const float*>(x), numel}, numel, bits,
                             block_size, data, scales, s);
    case DType::kF16:
      return launch_quantize(TensorSource<half_bits>{static_cast<const half_bits*>(x), numel},
                             numel, bits, block_size, data, scales, s);
    case DType::kBF16:
      return launch_quantize(TensorSource<bf16_bits>{static_cast<const bf16_bits*>(x), numel},
                             numel, bits, block_size, data, scales, s);
  }
  return "zeropp_hier: unknown input dtype";
}

const char* dequantize(const void* data, const float* scales, int64_t numel, int bits,
                       int64_t block_size, void* out, DType out_dtype, void* stream) {
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (out_dtype) {
    case DType::kF32:
      return launch_dequantize<float>(data, scales, numel, bits, block_size, out, s);
    case DType::kF16:
      return launch_dequantize<half_bits>(data, scales, numel, bits, block_size, out, s);
    case DType::kBF16:
      return launch_dequantize<bf16_bits>(data, scales, numel, bits, block_size, out, s);
  }
  return "zeropp_hier: unknown output dtype";
}

const char* dequantize_sum(const Parts& parts, void* out, DType out_dtype, void* stream) {
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (out_dtype) {
    case DType::kF32:
      return launch_dequantize_sum<float>(parts, out, s);
    case DType::kF16:
      return launch_dequantize_sum<half_bits>(parts, out, s);
    case DType::kBF16:
      return launch_dequantize_sum<bf16_bits>(parts, out, s);
  }
  return "zeropp_hier: unknown output dtype";
}

const char* dequantize_sum_requantize(const Parts& parts, int out_bits, int64_t out_block_size,
                                      void* out_data, float* out_scales, void* stream) {
  return launch_quantize(PartsSumSource{parts, log2_of(parts.block_size)}, parts.numel, out_bits,
                         out_block_size, out_data, out_scales, static_cast<hipStream_t>(stream));
}

}  // namespace gpu
}  // namespace zqh
