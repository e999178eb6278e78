// CPU backend: OpenMP loops over blocks calling the shared math in quant_math.h.
//
// Built with -fopenmp -O3 -ffp-contract=off and without -ffast-math (hip_kernels/build.py);
// see [Note: bit-exact arithmetic] in quant_math.h. Each thread works on whole blocks (or
// whole 4096-element chunks for the sums), staging one block in an fp32 stack buffer, so the
// two passes over a block (absmax, then quantize) hit L1 and the loops vectorise.
#include <string.h>

#include <algorithm>

#include "quant_api.h"
#include "quant_math.h"

namespace zqh {
namespace cpu {
namespace {

constexpr int64_t kMaxBlock = 4096;
// The sums walk the data in chunks of this many elements: a multiple of every block size, so a
// chunk holds whole input blocks and whole output blocks, and its fp32 accumulator fits in L1.
constexpr int64_t kChunk = 4096;
// Below this many blocks the OpenMP fork/join costs more than it saves.
constexpr int64_t kMinParallelBlocks = 16;

// Loads block elements [0, len) as fp32 into buf, zero-pads [len, B); returns absmax bits.
template <typename T>
uint32_t stage_block(const T* x, int64_t len, int64_t block_size, float* buf) {
  uint32_t amax = 0;
  for (int64_t i = 0; i < len; ++i) {
    const float v = to_f32(x[i]);
    buf[i] = v;
    amax = std::max(amax, abs_bits(v));
  }
  for (int64_t i = len; i < block_size; ++i) buf[i] = 0.0f;
  return amax;
}

uint32_t absmax_of(const float* buf, int64_t len) {
  uint32_t amax = 0;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, abs_bits(buf[i]));
  return amax;
}

// Quantizes one staged block buf [B] into out (B int8, or B/2 int4 bytes); returns the scale.
float quantize_staged(const float* buf, uint32_t amax, int bits, int64_t block_size, void* out) {
  const int qmax = qmax_for_bits(bits);
  const float scale = block_scale(amax, qmax);
  if (!(scale > 0.0f)) {  // all-zero or non-finite block: q = 0 (quantize_value agrees)
    memset(out, 0, size_t(data_bytes(1, block_size, bits)));
    return scale;
  }
  if (bits == 8) {
    int8_t* q = static_cast<int8_t*>(out);
    for (int64_t i = 0; i < block_size; ++i) q[i] = int8_t(quantize_value(buf[i], scale, qmax));
  } else {
    uint8_t* q = static_cast<uint8_t*>(out);
    for (int64_t j = 0; j < block_size / 2; ++j) {
      q[j] = pack_int4(quantize_value(buf[2 * j], scale, qmax),
                       quantize_value(buf[2 * j + 1], scale, qmax));
    }
  }
  return scale;
}

template <typename T>
void quantize_typed(const T* x, int64_t numel, int bits, int64_t block_size, void* data,
                    float* scales) {
  const int64_t nblocks = num_blocks(numel, block_size);
  uint8_t* bytes = static_cast<uint8_t*>(data);
  const int64_t block_bytes = data_bytes(1, block_size, bits);
#pragma omp parallel if (nblocks >= kMinParallelBlocks)
  {
    float buf[kMaxBlock];
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t start = b * block_size;
      const int64_t len = std::min(block_size, numel - start);
      const uint32_t amax = stage_block(x + start, len, block_size, buf);
      scales[b] = quantize_staged(buf, amax, bits, block_size, bytes + b * block_bytes);
    }
  }
}

// Dequantizes elements [0, len) of one block into out.
template <typename T>
void dequantize_block(const uint8_t* q, int bits, float scale, int64_t len, T* out) {
  if (bits == 8) {
    const int8_t* q8 = reinterpret_cast<const int8_t*>(q);
    for (int64_t i = 0; i < len; ++i) out[i] = from_f32<T>(dequantize_value(q8[i], scale));
  } else {
    const int64_t pairs = len / 2;
    for (int64_t j = 0; j < pairs; ++j) {
      out[2 * j] = from_f32<T>(dequantize_value(int4_low(q[j]), scale));
      out[2 * j + 1] = from_f32<T>(dequantize_value(int4_high(q[j]), scale));
    }
    if (len & 1) out[len - 1] = from_f32<T>(dequantize_value(int4_low(q[pairs]), scale));
  }
}

template <typename T>
void dequantize_typed(const void* data, const float* scales, int64_t numel, int bits,
                      int64_t block_size, T* out) {
  const int64_t nblocks = num_blocks(numel, block_size);
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  const int64_t block_bytes = data_bytes(1, block_size, bits);
#pragma omp parallel for schedule(static) if (nblocks >= kMinParallelBlocks)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t start = b * block_size;
    dequantize_block(bytes + b * block_bytes, bits, scales[b],
                     std::min(block_size, numel - start), out + start);
  }
}

// acc[i] += dequantized element (begin + i) of part p, for i in [0, len); begin is a multiple
// of kChunk, hence of the block size. Elements past numel are never read, so a non-finite
// block's NaN padding cannot reach the sum.
void accumulate_part(const Parts& parts, int64_t p, int64_t begin, int64_t len, float* acc) {
  const uint8_t* q = static_cast<const uint8_t*>(parts.data) + p * parts.data_stride;
  const float* scales = parts.scales + p * parts.scale_stride;
  const int64_t bsz = parts.block_size;
  for (int64_t off = 0; off < len; off += bsz) {
    const int64_t e0 = begin + off;  // first element of this block
    const float scale = scales[e0 / bsz];
    const int64_t n = std::min(bsz, len - off);
    float* a = acc + off;
    if (parts.bits == 8) {
      const int8_t* q8 = reinterpret_cast<const int8_t*>(q) + e0;
      for (int64_t i = 0; i < n; ++i) a[i] = add_rn(a[i], dequantize_value(q8[i], scale));
    } else {
      const uint8_t* q4 = q + e0 / 2;
      const int64_t pairs = n / 2;
      for (int64_t j = 0; j < pairs; ++j) {
        a[2 * j] = add_rn(a[2 * j], dequantize_value(int4_low(q4[j]), scale));
        a[2 * j + 1] = add_rn(a[2 * j + 1], dequantize_value(int4_high(q4[j]), scale));
      }
      if (n & 1) a[n - 1] = add_rn(a[n - 1], dequantize_value(int4_low(q4[pairs]), scale));
    }
  }
}

// acc [kChunk] = sum over parts of elements [begin, begin + len), in part order, from +0.0.
void sum_chunk(const Parts& parts, int64_t begin, int64_t len, float* acc) {
  for (int64_t i = 0; i < len; ++i) acc[i] = 0.0f;
  for (int64_t p = 0; p < parts.k; ++p) accumulate_part(parts, p, begin, len, acc);
}

template <typename T>
void dequantize_sum_typed(const Parts& parts, T* out) {
  const int64_t nchunks = num_blocks(parts.numel, kChunk);
#pragma omp parallel if (nchunks > 1)
  {
    float acc[kChunk];
#pragma omp for schedule(static)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t begin = c * kChunk;
      const int64_t len = std::min(kChunk, parts.numel - begin);
      sum_chunk(parts, begin, len, acc);
      for (int64_t i = 0; i < len; ++i) out[begin + i] = from_f32<T>(acc[i]);
    }
  }
}

}  // namespace

void quantize(const void* x, DType x_dtype, int64_t numel, int bits, int64_t block_size,
              void* data, float* scales) {
  switch (x_dtype) {
    case DType::kF32:
      return quantize_typed(static_cast<const float*>(x), numel, bits, block_size, data, scales);
    case DType::kF16:
      return quantize_typed(static_cast<const half_bits*>(x), numel, bits, block_size, data,
                            scales);
    case DType::kBF16:
      return quantize_typed(static_cast<const bf16_bits*>(x), numel, bits, block_size, data,
                            scales);
  }
}

void dequantize(const void* data, const float* scales, int64_t numel, int bits,
                int64_t block_size, void* out, DType out_dtype) {
  switch (out_dtype) {
    case DType::kF32:
      return dequantize_typed(data, scales, numel, bits, block_size, static_cast<float*>(out));
    case DType::kF16:
      return dequantize_typed(data, scales, numel, bits, block_size,
                              static_cast<half_bits*>(out));
    case DType::kBF16:
      return dequantize_typed(data, scales, numel, bits, block_size,
                              static_cast<bf16_bits*>(out));
  }
}

void dequantize_sum(const Parts& parts, void* out, DType out_dtype) {
  switch (out_dtype) {
    case DType::kF32:
      return dequantize_sum_typed(parts, static_cast<float*>(out));
    case DType::kF16:
      return dequantize_sum_typed(parts, static_cast<half_bits*>(out));
    case DType::kBF16:
      return dequantize_sum_typed(parts, static_cast<bf16_bits*>(out));
  }
}

void dequantize_sum_requantize(const Parts& parts, int out_bits, int64_t out_block_size,
                               void* out_data, float* out_scales) {
  // Chunks cover the padded output, nblocks_out * B_out elements; the accumulator beyond
  // numel stays 0, which is exactly the zero padding quantize() would add.
  const int64_t nblocks_out = num_blocks(parts.numel, out_block_size);
  const int64_t padded = nblocks_out * out_block_size;
  const int64_t nchunks = num_blocks(padded, kChunk);
  const int64_t block_bytes = data_bytes(1, out_block_size, out_bits);
  uint8_t* bytes = static_cast<uint8_t*>(out_data);
#pragma omp parallel if (nchunks > 1)
  {
    float acc[kChunk];
#pragma omp for schedule(static)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t begin = c * kChunk;
      const int64_t span = std::min(kChunk, padded - begin);
      sum_chunk(parts, begin, std::max<int64_t>(0, std::min(span, parts.numel - begin)), acc);
      for (int64_t i = std::max<int64_t>(0, parts.numel - begin); i < span; ++i) acc[i] = 0.0f;
      for (int64_t off = 0; off < span; off += out_block_size) {
        const int64_t b = (begin + off) / out_block_size;
        const uint32_t amax = absmax_of(acc + off, out_block_size);
        out_scales[b] =
            quantize_staged(acc + off, amax, out_bits, out_block_size, bytes + b * block_bytes);
      }
    }
  }
}

}  // namespace cpu
}  // namespace zqh
