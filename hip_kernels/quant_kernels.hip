// GPU backend (HIP, gfx90a first; the same file compiles with nvcc, see gpu_runtime.h).
//
// All arithmetic is the shared code in quant_math.h, so results match the CPU backend and the
// PyTorch reference bit for bit ([Note: bit-exact arithmetic] there). Layouts: see
// [Note: quantization format] in zeropp_hier/quant/reference.py.
//
// Kernels ([Note: GPU kernel layout]):
// - quantize_blocks: one group of 32 lanes per quantization block. Each lane loads 16-byte
//   chunks of the block, the group reduces the absmax bits with shuffles (one integer max also
//   detects NaN/Inf), then each lane quantizes its chunks and stores their codes as one word.
//   The values come from a Source: the input tensor (quantize), or the fp32 sum over k received
//   payloads (fused dequantize-sum-requantize), so the fused step never writes the sum.
// - dequantize_elems / dequantize_sum_elems: 8 consecutive elements per thread (one scale, one
//   8- or 4-byte load of codes per part, 16- or 32-byte stores), grid-stride.
//
// [Note: GPU kernel layout]
// The kernels are memory-bound, so what matters is bytes in flight per SM and wide accesses.
// The first version staged every value in shared memory, reduced with a __syncthreads() per
// step and loaded/stored one element per thread: on an H100 quantize reached 15-18% of a
// device-to-device copy's bandwidth and the fused requantize 5-10% (benchmarks/gpu/kernels.py).
// Now: 16-byte loads (dwordx4 on CDNA2, LDG.128 on Hopper), the block's chunks held in
// registers between the absmax and the quantize pass when they fit (blocks up to 512 values
// of the input, 256 for the fused requantize, whose sums need registers of their own; larger
// blocks are re-read, from cache), few enough registers per thread that 32-40 warps stay
// resident per SM (the fused kernel first took 104, which left 16), a shuffle reduction within
// the 32 lanes (no shared memory, no barrier), and codes stored a word at a time. The group is 32
// lanes on both vendors: a warp on NVIDIA, half a 64-wide wavefront on AMD (shuffles of width
// 32 stay within each half), so the same code serves MI250X. Vector accesses need 16-byte
// aligned inputs (8/4 bytes for codes): tensors at odd offsets take the element-wise path in the
// same kernels. Every element still goes through the quant_math.h functions, and the absmax is
// an integer max, so the order of the work changes no bit.
// Measured on the H100 at >= 64M elements, % of copy bandwidth: quantize 70-80% (fp32 input),
// 55-66% (bf16); dequantize 87-91% (fp32 output), 65-86% (bf16); dequantize_sum(k=4) 73-96%
// (fp32), 46-78% (bf16); the fused requantize 40-42% (int8) and 16-17% (int4). The last is not
// memory-bound: in elements per second it runs at the rate of its two halves one after the
// other (ncu: SM throughput 73-79%, DRAM 11-27%). Tried without gain: the division by the scale
// as a reciprocal with Markstein's correction, and int/float conversions off the quarter-rate
// pipe; both kept every bit, neither moved the fused kernel.
#include "gpu_runtime.h"
#include "quant_api.h"
#include "quant_math.h"

namespace zqh {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kLanes = 32;           // lanes per quantization block
constexpr int kPartBatch = 4;        // received parts whose loads are in flight together
constexpr int64_t kMaxGrid = 65535;  // grid-stride loops cover the rest

__device__ __forceinline__ uint32_t shfl_xor32(uint32_t v, int mask) {
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
  return uint32_t(__shfl_xor(int(v), mask, kLanes));
#else
  return __shfl_xor_sync(0xffffffffu, v, mask, kLanes);
#endif
}

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

// The 8 codes of elements e..e+7 (e a multiple of 8, inside the padded payload). `wide`: data is
// aligned for one 8-byte (int8) or 4-byte (int4) load.
__device__ __forceinline__ void load_codes8(const uint8_t* data, int bits, int64_t e, bool wide,
                                            int (&q)[8]) {
  if (bits == 8) {
    if (wide) {
      const uint2 w = *reinterpret_cast<const uint2*>(data + e);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        q[i] = int(int8_t(uint8_t(w.x >> (8 * i))));
        q[i + 4] = int(int8_t(uint8_t(w.y >> (8 * i))));
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i] = int(reinterpret_cast<const int8_t*>(data)[e + i]);
    }
  } else {
    uint32_t w;
    if (wide) {
      w = *reinterpret_cast<const uint32_t*>(data + (e >> 1));
    } else {
      const uint8_t* b = data + (e >> 1);
      w = uint32_t(b[0]) | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16) | (uint32_t(b[3]) << 24);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint8_t byte = uint8_t(w >> (8 * j));
      q[2 * j] = int4_low(byte);
      q[2 * j + 1] = int4_high(byte);
    }
  }
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

// Sums of elements e..e+7 over the parts, each in part order from +0.0 as sum_parts; 0 past
// numel (never the parts' padding, which is NaN in a non-finite block).
__device__ __forceinline__ void sum_parts8(const Parts& p, int log2_block, bool wide, int64_t e,
                                           float (&v)[8]) {
  if (e + 8 > p.numel) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = e + i < p.numel ? sum_parts(p, log2_block, e + i) : 0.0f;
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = 0.0f;
  const uint8_t* data = static_cast<const uint8_t*>(p.data);
  const int64_t sb = e >> log2_block;  // the 8 elements share one scale: B >= 32
  // The loads of kPartBatch parts are issued before any of them is summed: one at a time, each
  // part's load waited for the previous part's sum, and the fused requantize ran at a quarter
  // of its memory bandwidth on an H100 ([Note: GPU kernel layout]).
  if (!wide) {  // rows at odd offsets: byte loads, one part at a time
    for (int64_t k = 0; k < p.k; ++k) {
      int q[8];
      load_codes8(data + k * p.data_stride, p.bits, e, false, q);
      const float scale = p.scales[k * p.scale_stride + sb];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = add_rn(v[i], dequantize_value(q[i], scale));
    }
    return;
  }
  for (int64_t k0 = 0; k0 < p.k; k0 += kPartBatch) {
    uint2 raw[kPartBatch];  // the 8 codes of each part, undecoded (int4: .x only)
    float scale[kPartBatch];
#pragma unroll
    for (int j = 0; j < kPartBatch; ++j) {
      if (k0 + j < p.k) {
        const uint8_t* row = data + (k0 + j) * p.data_stride;
        raw[j] = p.bits == 8 ? *reinterpret_cast<const uint2*>(row + e)
                             : make_uint2(*reinterpret_cast<const uint32_t*>(row + (e >> 1)), 0u);
        scale[j] = p.scales[(k0 + j) * p.scale_stride + sb];
      }
    }
#pragma unroll
    for (int j = 0; j < kPartBatch; ++j) {
      if (k0 + j < p.k) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          int q;
          if (p.bits == 8) {
            q = int(int8_t(uint8_t((i < 4 ? raw[j].x : raw[j].y) >> (8 * (i % 4)))));
          } else {
            const uint8_t byte = uint8_t(raw[j].x >> (8 * (i / 2)));
            q = (i & 1) ? int4_high(byte) : int4_low(byte);
          }
          v[i] = add_rn(v[i], dequantize_value(q, scale[j]));
        }
      }
    }
  }
}

__host__ __device__ inline bool parts_wide(const Parts& p) {
  const uintptr_t need = p.bits == 8 ? 8 : 4;
  return (reinterpret_cast<uintptr_t>(p.data) % need) == 0 &&
         (uintptr_t(p.data_stride) % need) == 0;
}

// 16-byte chunk -> V floats, for the input dtypes.
__device__ __forceinline__ void unpack16(const uint4& w, float (&v)[4]) {
  v[0] = bits_f32(w.x);
  v[1] = bits_f32(w.y);
  v[2] = bits_f32(w.z);
  v[3] = bits_f32(w.w);
}
template <typename T>
__device__ __forceinline__ void unpack16(const uint4& w, float (&v)[8]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = to_f32(T{uint16_t(words[j] & 0xffffu)});
    v[2 * j + 1] = to_f32(T{uint16_t(words[j] >> 16)});
  }
}

template <typename T>
struct TensorSource {
  static constexpr int kVec = 16 / sizeof(T);
  // chunks per lane kept in registers between the two passes: 16 values, B <= 512
  static constexpr int kCache = sizeof(T) == 4 ? 4 : 2;
  const T* x;
  int64_t numel;
  bool wide;  // x is 16-byte aligned
  // elements e..e+kVec-1 (e a multiple of kVec); 0 past numel
  __device__ __forceinline__ void load(int64_t e, float (&v)[kVec]) const {
    if (wide && e + kVec <= numel) {
      const uint4 w = *reinterpret_cast<const uint4*>(x + e);
      if constexpr (sizeof(T) == 4) {
        unpack16(w, v);
      } else {
        unpack16<T>(w, v);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = e + i < numel ? to_f32(x[e + i]) : 0.0f;
    }
  }
};

struct PartsSumSource {
  static constexpr int kVec = 8;
  // one chunk (B <= 256 in registers): the sums need many registers of their own, and fewer
  // registers per thread mean more warps, which is what hides the latency of the k loads
  static constexpr int kCache = 1;
  Parts parts;
  int log2_block;
  bool wide;
  __device__ __forceinline__ void load(int64_t e, float (&v)[kVec]) const {
    sum_parts8(parts, log2_block, wide, e, v);
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

// The codes of V values at element e of a block (V = 4 or 8; e a multiple of V), one store.
// The payload is freshly allocated, so these word stores are aligned.
template <int V>
__device__ __forceinline__ void store_codes(uint8_t* data, int bits, int64_t e, const float (&v)[V],
                                            float scale, int qmax) {
  if (bits == 8) {
    uint32_t w[V / 4];
#pragma unroll
    for (int j = 0; j < V / 4; ++j) w[j] = 0;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      w[i / 4] |= uint32_t(uint8_t(int8_t(quantize_value(v[i], scale, qmax)))) << (8 * (i % 4));
    }
    if constexpr (V == 4) {
      *reinterpret_cast<uint32_t*>(data + e) = w[0];
    } else {
      *reinterpret_cast<uint2*>(data + e) = make_uint2(w[0], w[1]);
    }
  } else {
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < V / 2; ++j) {
      w |= uint32_t(pack_int4(quantize_value(v[2 * j], scale, qmax),
                              quantize_value(v[2 * j + 1], scale, qmax)))
           << (8 * j);
    }
    if constexpr (V == 4) {
      *reinterpret_cast<uint16_t*>(data + (e >> 1)) = uint16_t(w);
    } else {
      *reinterpret_cast<uint32_t*>(data + (e >> 1)) = w;
    }
  }
}

template <typename Source>
__global__ void __launch_bounds__(kThreads)
    quantize_blocks(Source src, int64_t nblocks, int bits, int block_size, uint8_t* data,
                    float* scales) {
  constexpr int V = Source::kVec;
  constexpr int kCache = Source::kCache;
  const int lane = threadIdx.x % kLanes;
  const int64_t per_grid = int64_t(gridDim.x) * (kThreads / kLanes);
  const int chunks = block_size / V;  // >= 4: B >= 32, V <= 8
  const int qmax = qmax_for_bits(bits);
  // b is the same for the 32 lanes of a group, so every lane reaches every shuffle.
  for (int64_t b = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / kLanes; b < nblocks;
       b += per_grid) {
    const int64_t base = b * block_size;
    uint32_t amax = 0;
    if (chunks <= kCache * kLanes) {
      float v[kCache][V];
#pragma unroll
      for (int j = 0; j < kCache; ++j) {
        const int c = lane + j * kLanes;
        if (c < chunks) {
          src.load(base + int64_t(c) * V, v[j]);
#pragma unroll
          for (int i = 0; i < V; ++i) amax = max(amax, abs_bits(v[j][i]));
        }
      }
#pragma unroll
      for (int m = kLanes / 2; m > 0; m >>= 1) amax = max(amax, shfl_xor32(amax, m));
      const float scale = block_scale(amax, qmax);
      if (lane == 0) scales[b] = scale;
#pragma unroll
      for (int j = 0; j < kCache; ++j) {
        const int c = lane + j * kLanes;
        if (c < chunks) store_codes<V>(data, bits, base + int64_t(c) * V, v[j], scale, qmax);
      }
    } else {
      for (int c = lane; c < chunks; c += kLanes) {
        float v[V];
        src.load(base + int64_t(c) * V, v);
#pragma unroll
        for (int i = 0; i < V; ++i) amax = max(amax, abs_bits(v[i]));
      }
#pragma unroll
      for (int m = kLanes / 2; m > 0; m >>= 1) amax = max(amax, shfl_xor32(amax, m));
      const float scale = block_scale(amax, qmax);
      if (lane == 0) scales[b] = scale;
      for (int c = lane; c < chunks; c += kLanes) {
        float v[V];
        src.load(base + int64_t(c) * V, v);  // again: the block was just read, so from cache
        store_codes<V>(data, bits, base + int64_t(c) * V, v, scale, qmax);
      }
    }
  }
}

// Stores 8 values at out[e..e+7] (e a multiple of 8): one 16-byte store of 16-bit values, two of
// fp32; element-wise at the tail. `out` is freshly allocated, so aligned.
template <typename T>
__device__ __forceinline__ void store8(T* out, int64_t e, int64_t numel, const float (&v)[8]) {
  if (e + 8 <= numel) {
    if constexpr (sizeof(T) == 4) {
      float4* o = reinterpret_cast<float4*>(out + e);
      o[0] = make_float4(v[0], v[1], v[2], v[3]);
      o[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = uint32_t(from_f32<T>(v[2 * j]).x) | (uint32_t(from_f32<T>(v[2 * j + 1]).x) << 16);
      }
      *reinterpret_cast<uint4*>(out + e) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (e + i < numel) out[e + i] = from_f32<T>(v[i]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dequantize_elems(const uint8_t* data, const float* scales, int64_t numel, int bits,
                     int log2_block, bool wide, T* out) {
  for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8; e < numel;
       e += int64_t(gridDim.x) * blockDim.x * 8) {
    int q[8];
    load_codes8(data, bits, e, wide, q);  // the payload is padded to whole blocks of >= 32
    const float scale = scales[e >> log2_block];
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = dequantize_value(q[i], scale);
    store8<T>(out, e, numel, v);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dequantize_sum_elems(Parts parts, int log2_block, bool wide, T* out) {
  for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8; e < parts.numel;
       e += int64_t(gridDim.x) * blockDim.x * 8) {
    float v[8];
    sum_parts8(parts, log2_block, wide, e, v);
    store8<T>(out, e, parts.numel, v);
  }
}

// [Note: GPU block rotation]
// The rotation ([Note: block rotation]) runs as its own pass over an fp32 buffer: quant_ops.cpp
// rotates a padded fp32 copy of the input before the quantize kernel, and rotates the fp32
// output of dequantize(_sum) back before the cast. One workgroup per tile of kRotTile values
// (a multiple of every R <= 4096) staged in shared memory; each butterfly stride is one pass of
// independent pairs (a + b, a - b) with a barrier between strides, then one multiply by
// hadamard_scale(R): the same operations in the same order as hadamard_inplace on the host, so
// the same bits. First version, not tuned: it costs two extra fp32 passes over memory; fusing it
// into the quantize kernel's registers (shuffles for strides within a lane group) is left to a
// session with a GPU to measure it on.
constexpr int kRotTile = 4096;

__global__ void __launch_bounds__(kThreads) hadamard_tiles(float* v, int64_t n, int r) {
  __shared__ float tile[kRotTile];
  const float c = hadamard_scale(r);
  for (int64_t t0 = int64_t(blockIdx.x) * kRotTile; t0 < n; t0 += int64_t(gridDim.x) * kRotTile) {
    const int len = int(n - t0 < kRotTile ? n - t0 : kRotTile);  // a multiple of r
    for (int i = threadIdx.x; i < len; i += kThreads) tile[i] = v[t0 + i];
    __syncthreads();
    for (int h = 1; h < r; h *= 2) {
      for (int p = threadIdx.x; p < len / 2; p += kThreads) {
        const int i = (p / h) * 2 * h + (p % h);  // the pair's lower index: bit h clear
        const float a = tile[i], b = tile[i + h];
        tile[i] = add_rn(a, b);
        tile[i + h] = sub_rn(a, b);
      }
      __syncthreads();
    }
    for (int i = threadIdx.x; i < len; i += kThreads) v[t0 + i] = mul_rn(tile[i], c);
    __syncthreads();  // the tile is reused by the next iteration
  }
}

const char* launch_status() {
  const hipError_t err = hipGetLastError();
  return err == hipSuccess ? nullptr : hipGetErrorString(err);
}

bool host_aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

template <typename Source>
const char* launch_quantize(const Source& src, int64_t numel, int bits, int64_t block_size,
                            void* data, float* scales, hipStream_t stream) {
  const int64_t nblocks = num_blocks(numel, block_size);
  quantize_blocks<Source>
      <<<dim3(unsigned(grid_for(nblocks, kThreads / kLanes))), dim3(kThreads), 0, stream>>>(
          src, nblocks, bits, int(block_size), static_cast<uint8_t*>(data), scales);
  return launch_status();
}

template <typename T>
const char* launch_quantize_tensor(const void* x, int64_t numel, int bits, int64_t block_size,
                                   void* data, float* scales, hipStream_t stream) {
  const TensorSource<T> src{static_cast<const T*>(x), numel, host_aligned(x, 16)};
  return launch_quantize(src, numel, bits, block_size, data, scales, stream);
}

template <typename T>
const char* launch_dequantize(const void* data, const float* scales, int64_t numel, int bits,
                              int64_t block_size, void* out, hipStream_t stream) {
  const bool wide = host_aligned(data, bits == 8 ? 8 : 4);
  dequantize_elems<T>
      <<<dim3(unsigned(grid_for((numel + 7) / 8, kThreads))), dim3(kThreads), 0, stream>>>(
          static_cast<const uint8_t*>(data), scales, numel, bits, log2_of(block_size), wide,
          static_cast<T*>(out));
  return launch_status();
}

template <typename T>
const char* launch_dequantize_sum(const Parts& parts, void* out, hipStream_t stream) {
  dequantize_sum_elems<T>
      <<<dim3(unsigned(grid_for((parts.numel + 7) / 8, kThreads))), dim3(kThreads), 0, stream>>>(
          parts, log2_of(parts.block_size), parts_wide(parts), static_cast<T*>(out));
  return launch_status();
}

}  // namespace

const char* hadamard(float* v, int64_t n, int64_t rotate, void* stream) {
  hadamard_tiles<<<dim3(unsigned(grid_for(n, kRotTile))), dim3(kThreads), 0,
                   static_cast<hipStream_t>(stream)>>>(v, n, int(rotate));
  return launch_status();
}

const char* quantize(const void* x, DType x_dtype, int64_t numel, int bits, int64_t block_size,
                     void* data, float* scales, void* stream) {
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (x_dtype) {
    case DType::kF32:
      return launch_quantize_tensor<float>(x, numel, bits, block_size, data, scales, s);
    case DType::kF16:
      return launch_quantize_tensor<half_bits>(x, numel, bits, block_size, data, scales, s);
    case DType::kBF16:
      return launch_quantize_tensor<bf16_bits>(x, numel, bits, block_size, data, scales, s);
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
  const PartsSumSource src{parts, log2_of(parts.block_size), parts_wide(parts)};
  return launch_quantize(src, parts.numel, out_bits, out_block_size, out_data, out_scales,
                         static_cast<hipStream_t>(stream));
}

}  // namespace gpu
}  // namespace zqh
