// The CPU loops over a range of blocks, compiled once per instruction set.
//
// quant_cpu.cpp includes this file several times, each time inside a different
// `#pragma GCC target(...)` region and with ZQH_ISA naming a different namespace, so the same
// loops are vectorised for baseline x86-64 (SSE2), AVX2 and AVX-512 and the widest one the CPU
// has is picked at run time. All arithmetic is quant_math.h's (its inline functions are inlined
// into each variant); vector width changes no result ([Note: bit-exact arithmetic]).
// No include guard, on purpose. Expects kMaxBlock and kChunk to be defined, and ZQH_VECW (the
// variant's floats per vector for the rotation: 8 for AVX2, 16 for AVX-512, 0 for baseline).
#ifndef ZQH_ISA
#error "define ZQH_ISA (the namespace of this instruction-set variant) before including"
#endif

namespace zqh {
namespace cpu {
namespace ZQH_ISA {

// Loads block elements [0, len) as fp32 into buf, zero-pads [len, B); returns absmax bits.
template <typename T>
int32_t stage_block(const T* x, int64_t len, int64_t block_size, float* buf) {
  int32_t amax = 0;
  for (int64_t i = 0; i < len; ++i) {
    const float v = to_f32(x[i]);
    buf[i] = v;
    const int32_t a = int32_t(abs_bits(v));  // < 2^31: signed max vectorises everywhere
    amax = a > amax ? a : amax;
  }
  for (int64_t i = len; i < block_size; ++i) buf[i] = 0.0f;
  return amax;
}

inline int32_t absmax_of(const float* buf, int64_t len) {
  int32_t amax = 0;
  for (int64_t i = 0; i < len; ++i) {
    const int32_t a = int32_t(abs_bits(buf[i]));
    amax = a > amax ? a : amax;
  }
  return amax;
}

// [Note: CPU rotation layout]
// hadamard_inplace (quant_math.h) with the same two operands and operation for every output,
// laid out for SIMD (the order of independent pairs within a stride changes no bit):
// - up to 64 values of a group are transformed in registers (vectors of W = 8 floats for AVX2,
//   16 for AVX-512; GCC vector extensions): the strides below W inside each vector as
//   y = x[j ^ h] (one permute) plus x[j] times -1 where bit h of j is set, else +1, as one FMA
//   y + (+-1) * x (the product is exact, so the one rounding is that of the addition; an xor of
//   the sign and an add before AVX2 had FMA): x[j ^ h] + x[j] is a + b exactly (addition
//   commutes) and x[j ^ h] + (-x[j]) is a - b exactly; the strides from W to 32 between vectors;
//   the multiply by hadamard_scale(R) and the absmax folded into the last stride's pass; full
//   blocks read straight from the input, and dequantize's codes converted straight into the
//   vectors where no product can saturate (dequantize_is_plain_product: nearly every block);
// - R = 128: for AVX-512 one group of 8 vectors in registers; for AVX2 (16 registers) both
//   halves' 64 values through their strides, then met in the last stride (no pass of its own;
//   the compiler spills one half);
// - larger strides (R > 128) as contiguous half-group loops over the block, the last one
//   multiplying too.
// In the baseline (SSE2) variant, where such permutes compile to scalar code, and without
// GCC's vector extensions, it is hadamard_inplace itself. The first version (the scalar
// butterfly, one pass per stride) took 4-5x the time of quantize alone.

// inlined wherever used: out of line, GCC passed the vectors through memory and left the
// AVX state with vzeroupper at every call (AVX2 took twice AVX-512's time)
#if defined(__GNUC__)
#define ZQH_INLINE inline __attribute__((always_inline))
#else
#define ZQH_INLINE inline
#endif

#if defined(__GNUC__) && !defined(__clang__) && ZQH_VECW
constexpr int kW = ZQH_VECW;
typedef float vf __attribute__((vector_size(4 * kW)));
typedef int32_t vi __attribute__((vector_size(4 * kW)));
// the same vector at any float's address, for the loads and stores of a group: one unaligned
// vector move each (a memcpy of the whole array of vectors went through the stack in 16-byte
// pieces and general registers, most of AVX2's rotation time)
typedef float vf_mem __attribute__((vector_size(4 * kW), aligned(4), may_alias));

// one stride h < W inside a vector of W consecutive values (W-aligned in the group)
template <int H>
ZQH_INLINE vf stride_in_vector(vf x) {
  vi partner;
  for (int j = 0; j < kW; ++j) partner[j] = j ^ H;  // constants after unrolling
  const vf y = __builtin_shuffle(x, partner);
  // y + s * x with s = -1 where bit H of j is set, else +1, as one fused multiply-add: the
  // product by +-1 is exact, so the one rounding is that of y + x or y - x, bit for bit (no
  // rounded product is contracted); it saves a sign flip's xor (AVX-512F has the FMA; the AVX2
  // variant is compiled with "fma" and picked only where the CPU has it)
  vf s;
  for (int j = 0; j < kW; ++j) s[j] = (j & H) ? -1.0f : 1.0f;
#if ZQH_VECW == 16
  return (vf)_mm512_fmadd_ps((__m512)x, (__m512)s, (__m512)y);
#else
  return (vf)_mm256_fmadd_ps((__m256)x, (__m256)s, (__m256)y);
#endif
}

ZQH_INLINE int32_t max_lane(vi m) {
  int32_t out = 0;
  for (int i = 0; i < kW; ++i) out = m[i] > out ? m[i] : out;
  return out;
}

// Where a group's W * NV values come from, as fp32 vectors (exact conversions): an fp32 array or
// a 16-bit float array.
struct FromF32 {
  const float* p;
  template <int NV>
  ZQH_INLINE void get(int64_t i, vf (&x)[NV]) const {
    // straight into the vectors: through a staging array GCC copied 16 bytes at a time and
    // read 32, a failed store-to-load forward on every vector (AVX2 took 2.4x quantize alone)
    for (int k = 0; k < NV; ++k) x[k] = *reinterpret_cast<const vf_mem*>(p + i + kW * k);
  }
};

template <typename T>
struct FromNarrow {
  const T* p;
  template <int NV>
  ZQH_INLINE void get(int64_t i, vf (&x)[NV]) const {
    float staged[kW * NV];
    for (int k = 0; k < kW * NV; ++k) staged[k] = to_f32(p[i + k]);
    for (int k = 0; k < NV; ++k) x[k] = *reinterpret_cast<const vf_mem*>(staged + kW * k);
  }
};

// The codes of a payload block, dequantized: float(q) * scale, for a scale where that product
// never saturates (dequantize_is_plain_product), so it is dequantize_value's result with no
// select; read straight into the vectors (no fp32 copy of the block in memory).
typedef uint32_t vu __attribute__((vector_size(4 * kW)));

// W / 2 (Half) or W bytes at p, sign-extended to W int32 lanes (lanes past the bytes read
// unspecified). Intrinsics: GCC 12 turned __builtin_convertvector of a byte vector into one
// scalar load and insert per lane.
template <bool Half>
ZQH_INLINE vi widen_bytes(const void* p) {
  const __m128i* m = static_cast<const __m128i*>(p);
#if ZQH_VECW == 16
  const __m128i bytes = Half ? _mm_loadl_epi64(m) : _mm_loadu_si128(m);
  // the maskz form keeping every lane: the plain one reads _mm512_undefined_epi32, which GCC 12
  // warns may be used uninitialised
  return (vi)_mm512_maskz_cvtepi8_epi32(__mmask16(0xffff), bytes);
#else
  return (vi)_mm256_cvtepi8_epi32(Half ? _mm_loadu_si32(p) : _mm_loadl_epi64(m));
#endif
}

struct FromInt8 {
  const int8_t* q;
  float scale;
  template <int NV>
  ZQH_INLINE void get(int64_t i, vf (&x)[NV]) const {
    for (int k = 0; k < NV; ++k) {
      x[k] = __builtin_convertvector(widen_bytes<false>(q + i + kW * k), vf) * scale;
    }
  }
};

struct FromInt4 {
  const uint8_t* q;  // element i in byte i / 2 ([Note: quantization format])
  float scale;
  template <int NV>
  ZQH_INLINE void get(int64_t i, vf (&x)[NV]) const {
    const uint8_t* p = q + i / 2;
    vi pick_lo, pick_hi, shift;
    for (int j = 0; j < kW; ++j) {
      pick_lo[j] = j / 2;           // lanes 2m and 2m + 1 both take byte m (of the first W / 2)
      pick_hi[j] = kW / 2 + j / 2;  // (of the second W / 2)
      shift[j] = j & 1 ? 24 : 28;   // its high nibble, its low nibble, to the top bits
    }
    // the nibble in bits 28-31, then an arithmetic shift: int4_low / int4_high's value
    const auto decode = [&](vi bytes) {
      return __builtin_convertvector((vi)((vu)bytes << (vu)shift) >> 28, vf) * scale;
    };
    if constexpr (NV % 2 == 0) {  // W bytes for two vectors
      for (int k = 0; k < NV; k += 2) {
        const vi bytes = widen_bytes<false>(p + kW * k / 2);
        x[k] = decode(__builtin_shuffle(bytes, pick_lo));
        x[k + 1] = decode(__builtin_shuffle(bytes, pick_hi));
      }
    } else {  // W / 2 bytes (no more: the block's last may end the buffer)
      for (int k = 0; k < NV; ++k) {
        x[k] = decode(__builtin_shuffle(widen_bytes<true>(p + kW * k / 2), pick_lo));
      }
    }
  }
};

// W * NV values from src at i, through the strides below min(r, W * NV), in registers.
template <int NV, typename Src>
ZQH_INLINE void group_strides(const Src& src, int64_t i, int64_t r, vf (&x)[NV]) {
  src.template get<NV>(i, x);
  // NV > 1 only where r >= W * NV (see hadamard_block): then every stride below W * NV applies,
  // known at compile time, so the vectors stay in registers
  for (int k = 0; k < NV; ++k) {
    x[k] = stride_in_vector<1>(x[k]);
    if (NV > 1 || r > 2) x[k] = stride_in_vector<2>(x[k]);
    if (NV > 1 || r > 4) x[k] = stride_in_vector<4>(x[k]);
    if (kW == 16 && (NV > 1 || r > 8)) x[k] = stride_in_vector < kW == 16 ? 8 : 1 > (x[k]);
  }
  for (int s = 1; s < NV; s *= 2) {  // stride W * s: vector k with vector k + s
    for (int k = 0; k < NV; ++k) {
      if (k & s) continue;
      const vf a = x[k], b = x[k + s];
      x[k] = a + b;
      x[k + s] = a - b;
    }
  }
}

// The W * NV values at i through the strides below min(r, W * NV), stored to dst + i; when that
// is all of r, also scaled by c and their absmax bits folded into amax (as abs_bits: non-finite
// values give >= kExpMask).
template <int NV, typename Src>
ZQH_INLINE void group_in_registers(const Src& src, int64_t i, float* dst, int64_t r, float c,
                                   vi& amax) {
  vf x[NV];
  group_strides<NV>(src, i, r, x);
  if (r <= kW * NV) {
    // vector op scalar broadcasts the scalar (a lane-by-lane loop built the vector every time)
    for (int k = 0; k < NV; ++k) {
      x[k] = x[k] * c;
      const vi bits = (vi)x[k] & int32_t(kAbsMask);
      amax = amax > bits ? amax : bits;
    }
  }
  for (int k = 0; k < NV; ++k) *reinterpret_cast<vf_mem*>(dst + i + kW * k) = x[k];
}

// r == 2 * W * NV: both halves through the strides below W * NV, then met in the last stride,
// scaled by c, and stored once. Twice W * NV vectors are more than AVX2's 16 registers: the
// compiler spills half of them (a store to dst of the first half, to be reloaded, made GCC keep
// both that store and its own spill).
template <int NV, typename Src>
ZQH_INLINE void halves_in_registers(const Src& src, int64_t i, float* dst, int64_t r, float c,
                                    vi& amax) {
  constexpr int kHalf = kW * NV;
  vf lo[NV], hi[NV];
  group_strides<NV>(src, i, r, lo);
  group_strides<NV>(src, i + kHalf, r, hi);
  for (int k = 0; k < NV; ++k) {
    const vf sum = (lo[k] + hi[k]) * c, diff = (lo[k] - hi[k]) * c;
    *reinterpret_cast<vf_mem*>(dst + i + kW * k) = sum;
    *reinterpret_cast<vf_mem*>(dst + i + kHalf + kW * k) = diff;
    const vi s_bits = (vi)sum & int32_t(kAbsMask), d_bits = (vi)diff & int32_t(kAbsMask);
    amax = amax > s_bits ? amax : s_bits;
    amax = amax > d_bits ? amax : d_bits;
  }
}

// The values of src [n] (n a multiple of r and of W) -> dst [n] rotated; returns the absmax bits
// of dst. src may read dst (a group is read whole before it is written).
template <typename Src>
ZQH_INLINE int32_t hadamard_from(const Src& src, float* dst, int64_t n, int64_t r, float c) {
  vi amax = {};
  if (r <= kW) {
    for (int64_t i = 0; i < n; i += kW) group_in_registers<1>(src, i, dst, r, c, amax);
    return max_lane(amax);
  }
  if (r == 2 * kW) {
    for (int64_t i = 0; i < n; i += 2 * kW) group_in_registers<2>(src, i, dst, r, c, amax);
    return max_lane(amax);
  }
  if (r == 4 * kW) {
    for (int64_t i = 0; i < n; i += 4 * kW) group_in_registers<4>(src, i, dst, r, c, amax);
    return max_lane(amax);
  }
  if (kW == 8 && r == 64) {
    for (int64_t i = 0; i < n; i += 64) group_in_registers<64 / kW>(src, i, dst, r, c, amax);
    return max_lane(amax);
  }
  if (r == 128) {  // AVX2 (W = 8): two groups of 8 vectors; AVX-512: one group of 8 vectors
    if (kW == 8) {
      for (int64_t i = 0; i < n; i += 128) halves_in_registers<64 / kW>(src, i, dst, r, c, amax);
    } else {
      for (int64_t i = 0; i < n; i += 128) group_in_registers<128 / kW>(src, i, dst, r, c, amax);
    }
    return max_lane(amax);
  }
  for (int64_t i = 0; i < n; i += 64) group_in_registers<64 / kW>(src, i, dst, r, c, amax);
  int32_t m = 0;
  for (int64_t h = 64; h < r; h *= 2) {
    const bool last = 2 * h == r;
    for (int64_t base = 0; base < n; base += 2 * h) {
      float* lo = dst + base;
      float* hi = lo + h;
      if (last) {
        for (int64_t j = 0; j < h; ++j) {
          const float a = lo[j], b = hi[j];
          lo[j] = mul_rn(add_rn(a, b), c);
          hi[j] = mul_rn(sub_rn(a, b), c);
          const int32_t x0 = int32_t(abs_bits(lo[j])), x1 = int32_t(abs_bits(hi[j]));
          m = x0 > m ? x0 : m;
          m = x1 > m ? x1 : m;
        }
      } else {
        for (int64_t j = 0; j < h; ++j) {
          const float a = lo[j], b = hi[j];
          lo[j] = add_rn(a, b);
          hi[j] = sub_rn(a, b);
        }
      }
    }
  }
  return m;
}

// src [n] (fp32 or a 16-bit float) -> dst [n] rotated; returns the absmax bits of dst. c is
// hadamard_scale(r), computed once per call of the block loops (its loop over the exponent was
// about 40 instructions a block at R = 128).
template <typename T>
ZQH_INLINE int32_t hadamard_block(const T* src, float* dst, int64_t n, int64_t r, float c) {
  if constexpr (sizeof(T) == 4) {
    return hadamard_from(FromF32{src}, dst, n, r, c);
  } else {
    return hadamard_from(FromNarrow<T>{src}, dst, n, r, c);
  }
}

#else
template <typename T>
inline int32_t hadamard_block(const T* src, float* dst, int64_t n, int64_t r, float) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_f32(src[i]);
  hadamard_inplace(dst, n, r);
  return absmax_of(dst, n);
}
#endif

// Quantizes one staged block buf [B] into out (B int8, or B/2 int4 bytes); returns the scale.
inline float quantize_staged(const float* buf, int32_t amax, int bits, int64_t block_size,
                             uint8_t* out) {
  const int qmax = qmax_for_bits(bits);
  const float scale = block_scale(uint32_t(amax), qmax);
  if (!(scale > 0.0f)) {  // all-zero or non-finite block: q = 0, as quantize_value gives
    memset(out, 0, size_t(data_bytes(1, block_size, bits)));
    return scale;
  }
  if (bits == 8) {
    int8_t* q = reinterpret_cast<int8_t*>(out);
    for (int64_t i = 0; i < block_size; ++i) q[i] = int8_t(quantize_value(buf[i], scale, qmax));
  } else {
    for (int64_t j = 0; j < block_size / 2; ++j) {
      out[j] = pack_int4(quantize_value(buf[2 * j], scale, qmax),
                         quantize_value(buf[2 * j + 1], scale, qmax));
    }
  }
  return scale;
}

// Blocks [b0, b1) of x [numel] -> data, scales; rotate > 0: each block rotated in the staging
// buffer first, while it is in L1 ([Note: block rotation]).
template <typename T>
void quantize_blocks(const void* x, int64_t numel, int bits, int64_t block_size, int64_t rotate,
                     int64_t b0, int64_t b1, uint8_t* data, float* scales) {
  const T* xt = static_cast<const T*>(x);
  const int64_t block_bytes = data_bytes(1, block_size, bits);
  const float c = rotate ? hadamard_scale(rotate) : 0.0f;
  float buf[kMaxBlock];
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t start = b * block_size;
    const int64_t len = std::min(block_size, numel - start);
    int32_t amax;
    if (rotate && len == block_size) {  // straight from the input, rotated in registers
      amax = hadamard_block(xt + start, buf, block_size, rotate, c);
    } else {
      amax = stage_block(xt + start, len, block_size, buf);
      if (rotate) amax = hadamard_block<float>(buf, buf, block_size, rotate, c);
    }
    scales[b] = quantize_staged(buf, amax, bits, block_size, data + b * block_bytes);
  }
}

// One whole block (padding included) dequantized to fp32 in buf [B].
inline void dequantize_block_f32(const uint8_t* q, float scale, int bits, int64_t block_size,
                                 float* buf) {
  if (bits == 8) {
    const int8_t* q8 = reinterpret_cast<const int8_t*>(q);
    for (int64_t i = 0; i < block_size; ++i) buf[i] = dequantize_value(q8[i], scale);
  } else {
    for (int64_t j = 0; j < block_size / 2; ++j) {
      buf[2 * j] = dequantize_value(int4_low(q[j]), scale);
      buf[2 * j + 1] = dequantize_value(int4_high(q[j]), scale);
    }
  }
}

// One whole payload block dequantized and rotated back -> dst [B] (fp32; buf [B] is scratch,
// dst may be buf). Where no product can saturate, the codes go straight into the rotation's
// vectors; else dequantized to buf first, saturating as dequantize_value does.
ZQH_INLINE void dequantize_rotated(const uint8_t* q, float scale, int bits, int64_t block_size,
                                   int64_t rotate, float c, float* buf, float* dst) {
#if defined(__GNUC__) && !defined(__clang__) && ZQH_VECW
  if (dequantize_is_plain_product(scale, bits)) {
    if (bits == 8) {
      hadamard_from(FromInt8{reinterpret_cast<const int8_t*>(q), scale}, dst, block_size, rotate,
                    c);
    } else {
      hadamard_from(FromInt4{q, scale}, dst, block_size, rotate, c);
    }
    return;
  }
#endif
  dequantize_block_f32(q, scale, bits, block_size, buf);
  hadamard_block<float>(buf, dst, block_size, rotate, c);
}

// Blocks [b0, b1) of a payload -> out [numel]; rotate > 0: each whole block dequantized to fp32,
// rotated back, then its first elements cast.
template <typename T>
void dequantize_blocks(const uint8_t* data, const float* scales, int64_t numel, int bits,
                       int64_t block_size, int64_t rotate, int64_t b0, int64_t b1, void* out) {
  T* o = static_cast<T*>(out);
  const int64_t block_bytes = data_bytes(1, block_size, bits);
  const float c = rotate ? hadamard_scale(rotate) : 0.0f;
  float buf[kMaxBlock];
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t start = b * block_size;
    const int64_t len = std::min(block_size, numel - start);
    const uint8_t* q = data + b * block_bytes;
    const float scale = scales[b];
    T* ob = o + start;
    if (rotate) {
      float* dst = buf;
      if constexpr (sizeof(T) == 4) {
        if (len == block_size) dst = reinterpret_cast<float*>(ob);  // no copy pass
      }
      dequantize_rotated(q, scale, bits, block_size, rotate, c, buf, dst);  // inlined once
      if (dst == buf) {
        for (int64_t i = 0; i < len; ++i) ob[i] = from_f32<T>(buf[i]);
      }
      continue;
    }
    // value(code): dequantize_value, or the plain product where no code's product can
    // saturate (nearly every block), which GCC vectorises without the select (AVX2, callgrind:
    // int8 1.70 -> 1.05 instructions per element, int4 2.14 -> 1.47)
    const auto blockwise = [&](auto value) {
      if (bits == 8) {
        const int8_t* q8 = reinterpret_cast<const int8_t*>(q);
        for (int64_t i = 0; i < len; ++i) ob[i] = from_f32<T>(value(q8[i]));
      } else {
        const int64_t pairs = len / 2;
        for (int64_t j = 0; j < pairs; ++j) {
          ob[2 * j] = from_f32<T>(value(int4_low(q[j])));
          ob[2 * j + 1] = from_f32<T>(value(int4_high(q[j])));
        }
        if (len & 1) ob[len - 1] = from_f32<T>(value(int4_low(q[pairs])));
      }
    };
    if (dequantize_is_plain_product(scale, bits)) {
      blockwise([scale](int v) { return mul_rn(float(v), scale); });
    } else {
      blockwise([scale](int v) { return dequantize_value(v, scale); });
    }
  }
}

// acc [len] = sum over parts of elements [begin, begin + len), in part order from +0.0.
// begin is a multiple of kChunk, hence of the block size; begin + len <= numel, so a
// non-finite block's NaN padding never reaches the sum.
inline void sum_chunk(const Parts& parts, int64_t begin, int64_t len, float* acc) {
  for (int64_t i = 0; i < len; ++i) acc[i] = 0.0f;
  const int64_t bsz = parts.block_size;
  for (int64_t p = 0; p < parts.k; ++p) {
    const uint8_t* q = static_cast<const uint8_t*>(parts.data) + p * parts.data_stride;
    const float* scales = parts.scales + p * parts.scale_stride;
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
}

// Chunks [c0, c1) of the sum -> out [numel] of T. Rotated parts (parts.rotate > 0) are summed
// over whole blocks in the rotated domain, and the chunk's sum is rotated back once.
template <typename T>
void sum_chunks(const Parts& parts, int64_t c0, int64_t c1, void* out) {
  T* o = static_cast<T*>(out);
  float acc[kChunk];
  const float hc = parts.rotate ? hadamard_scale(parts.rotate) : 0.0f;
  const int64_t padded = num_blocks(parts.numel, parts.block_size) * parts.block_size;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t len = std::min(kChunk, parts.numel - begin);
    if (parts.rotate) {
      const int64_t span = std::min(kChunk, padded - begin);  // whole blocks
      sum_chunk(parts, begin, span, acc);
      if constexpr (sizeof(T) == 4) {
        if (len == span) {  // rotated straight into the output: no copy pass
          hadamard_block<float>(acc, reinterpret_cast<float*>(o + begin), span, parts.rotate, hc);
          continue;
        }
      }
      hadamard_block<float>(acc, acc, span, parts.rotate, hc);
    } else {
      sum_chunk(parts, begin, len, acc);
    }
    for (int64_t i = 0; i < len; ++i) o[begin + i] = from_f32<T>(acc[i]);
  }
}

// Chunks [c0, c1) of the padded output (nblocks_out * B_out elements) -> quantized sum.
// The accumulator past numel is 0: exactly the zero padding quantize() would add.
inline void sum_requantize_chunks(const Parts& parts, int out_bits, int64_t out_block_size,
                                  int64_t c0, int64_t c1, uint8_t* out_data, float* out_scales) {
  const int64_t padded = num_blocks(parts.numel, out_block_size) * out_block_size;
  const int64_t block_bytes = data_bytes(1, out_block_size, out_bits);
  float acc[kChunk];
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t span = std::min(kChunk, padded - begin);
    const int64_t real = std::min(span, parts.numel - begin);
    sum_chunk(parts, begin, real, acc);
    for (int64_t i = real; i < span; ++i) acc[i] = 0.0f;
    for (int64_t off = 0; off < span; off += out_block_size) {
      const int64_t b = (begin + off) / out_block_size;
      out_scales[b] = quantize_staged(acc + off, absmax_of(acc + off, out_block_size), out_bits,
                                      out_block_size, out_data + b * block_bytes);
    }
  }
}

// This variant's entry points, indexed by DType where typed.
inline Loops loops() {
  Loops l;
  l.quantize[0] = &quantize_blocks<float>;
  l.quantize[1] = &quantize_blocks<half_bits>;
  l.quantize[2] = &quantize_blocks<bf16_bits>;
  l.dequantize[0] = &dequantize_blocks<float>;
  l.dequantize[1] = &dequantize_blocks<half_bits>;
  l.dequantize[2] = &dequantize_blocks<bf16_bits>;
  l.sum[0] = &sum_chunks<float>;
  l.sum[1] = &sum_chunks<half_bits>;
  l.sum[2] = &sum_chunks<bf16_bits>;
  l.sum_requantize = &sum_requantize_chunks;
  return l;
}

}  // namespace ZQH_ISA
}  // namespace cpu
}  // namespace zqh

#undef ZQH_INLINE
