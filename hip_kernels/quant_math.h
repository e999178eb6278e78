// The block-quantization math, written once for every backend.
//
// Every function here is `__host__ __device__` when compiled by hipcc or nvcc and a plain
// inline function when compiled by a C++ compiler, so the HIP/CUDA kernels
// (quant_kernels.hip) and the OpenMP CPU loops (quant_cpu.cpp) evaluate the same expressions.
// The format and its rounding are defined by zeropp_hier/quant/reference.py, see
// [Note: quantization format] there; this header must give the same bits.
//
// [Note: bit-exact arithmetic]
// Agreement to the bit with the PyTorch reference needs IEEE-754 binary32 with
// round-to-nearest-even on every operation, no fused multiply-add, and denormals kept:
// - CUDA device code uses the explicitly rounded intrinsics (__fdiv_rn, __fmul_rn, __fadd_rn),
//   which nvcc never contracts or approximates; HIP device code (clang) uses plain operators
//   under `#pragma clang fp contract(off)` and needs IEEE division, which build.py and
//   check_compile.sh request (-fhip-fp32-correctly-rounded-divide-sqrt, also clang's default),
//   with denormals kept (-fno-gpu-flush-denormals-to-zero);
// - host code relies on the build flags (hip_kernels/build.py): -ffp-contract=off, never
//   -ffast-math (which would also link crtfastmath.o and flush denormals to zero);
// - conversions between fp32 and fp16/bf16 are done on the bits, not with hardware or library
//   conversions, so that subnormals, overflow and NaN are handled identically everywhere.
#pragma once

#include <stdint.h>
#include <string.h>  // memcpy, for the host's bit casts

#if defined(__CUDACC__) || defined(__HIPCC__)
#define QH_HD __host__ __device__ __forceinline__
#else
#define QH_HD inline
#endif

// True in the device pass of a GPU compile (both compilers also run a host pass).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define QH_DEVICE_PASS 1
#else
#define QH_DEVICE_PASS 0
#endif
// nvcc's device pass: its __f*_rn intrinsics are never contracted into FMAs. (HIP defines the
// same names as plain operators, so on AMD the pragma below does that job instead.)
#if defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define QH_NV_DEVICE 1
#else
#define QH_NV_DEVICE 0
#endif

#if defined(__clang__)
// hipcc defaults to -ffp-contract=fast; operations written below this line carry no
// "contract" flag, so a*b+c stays two roundings even if the build flags are forgotten.
#pragma clang fp contract(off)
#endif

namespace zqh {

// Storage types of the 16-bit floats: distinct structs so overloads can tell them apart. They
// have the size and alignment of uint16_t, so tensor memory is read through them directly.
struct half_bits {
  uint16_t x;
};
struct bf16_bits {
  uint16_t x;
};

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kExpMask = 0x7f800000u;  // also the bits of +Inf
constexpr uint32_t kFltMaxBits = 0x7f7fffffu;
constexpr uint32_t kFltMinBits = 0x00800000u;  // smallest normal fp32
constexpr uint32_t kQuietNanBits = 0x7fc00000u;

// ---- bit casts -------------------------------------------------------------------------

QH_HD uint32_t f32_bits(float v) {
#if QH_DEVICE_PASS
  return __float_as_uint(v);
#else
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
#endif
}

QH_HD float bits_f32(uint32_t u) {
#if QH_DEVICE_PASS
  return __uint_as_float(u);
#else
  float v;
  memcpy(&v, &u, sizeof(v));
  return v;
#endif
}

// c ? a : b without a branch: the operands are computed anyway, and a branch-free select lets
// the host compiler vectorise conversion loops (it may not speculate float operations that
// sit in branches, since they could trap).
QH_HD uint32_t select_u32(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - uint32_t(c);
  return (a & m) | (b & ~m);
}

// ---- correctly rounded fp32 operations (see [Note: bit-exact arithmetic]) ------------------

QH_HD float div_rn(float a, float b) {
#if QH_NV_DEVICE
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

QH_HD float mul_rn(float a, float b) {
#if QH_NV_DEVICE
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

QH_HD float add_rn(float a, float b) {
#if QH_NV_DEVICE
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

QH_HD float sub_rn(float a, float b) {
#if QH_NV_DEVICE
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// Round half to even for |v| <= 2^22, as torch.round does. Adding and subtracting 1.5 * 2^23
// moves the fraction bits out of the mantissa under the default rounding mode; unlike
// nearbyintf it is two plain additions, which vectorise on any x86-64 (no SSE4.1 needed).
QH_HD float round_half_even_small(float v) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return add_rn(add_rn(v, magic), -magic);
}

// ---- 16-bit float conversions (exact to fp32; round-to-nearest-even from fp32) -------------

QH_HD float to_f32(float v) { return v; }

QH_HD float to_f32(bf16_bits v) { return bits_f32(uint32_t(v.x) << 16); }

QH_HD float to_f32(half_bits v) {
  const uint32_t h = v.x;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  // Normal: rebias the exponent (15 -> 127). Inf/NaN: all-ones exponent, payload kept.
  // Zero/subnormal: the value is mant * 2^-24, exact in fp32.
  const uint32_t normal = sign | ((exp + 112u) << 23) | (mant << 13);
  const uint32_t special = sign | kExpMask | (mant << 13);
  const uint32_t subnormal = sign | f32_bits(mul_rn(float(mant), 5.9604644775390625e-8f));
  return bits_f32(select_u32(exp == 0x1fu, special, select_u32(exp == 0u, subnormal, normal)));
}

template <typename T>
QH_HD T from_f32(float v);

template <>
QH_HD float from_f32<float>(float v) {
  return v;
}

template <>
QH_HD bf16_bits from_f32<bf16_bits>(float v) {
  const uint32_t u = f32_bits(v);
  // Round to nearest even on the 16 dropped bits; a carry correctly bumps the exponent and
  // turns values past the largest bf16 into Inf. NaN becomes the canonical quiet NaN.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  bf16_bits out;
  out.x = uint16_t(select_u32((u & kAbsMask) > kExpMask, 0x7fc0u, rounded));
  return out;
}

template <>
QH_HD half_bits from_f32<half_bits>(float v) {
  const uint32_t u = f32_bits(v);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & kAbsMask;
  // Normal range [2^-14, 65520): rebias (127 -> 15) and round the 13 dropped bits to even.
  const uint32_t rebiased = a - (112u << 23);
  const uint32_t normal = (rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13;
  // Below 2^-14: adding 0.5f puts the value where one fp32 ulp is 2^-24, the fp16 subnormal
  // step, so the fp32 addition itself rounds to the fp16 grid (to even); the mantissa then
  // counts 2^-24 units (0x400 when it rounds up to the smallest normal, also correct).
  const uint32_t subnormal = f32_bits(add_rn(bits_f32(a), 0.5f)) - 0x3f000000u;
  // NaN -> quiet NaN; >= 65520 (the tie between 65504 and 2^16) -> Inf; >= 2^-14 normal.
  uint32_t h = select_u32(a >= 0x38800000u, normal, subnormal);
  h = select_u32(a >= 0x477ff000u, 0x7c00u, h);
  h = select_u32(a > kExpMask, 0x7e00u, h);
  half_bits out;
  out.x = uint16_t(sign | h);
  return out;
}

// ---- the block format --------------------------------------------------------------------

QH_HD int qmax_for_bits(int bits) { return bits == 4 ? 7 : 127; }

// |v| as bits: for non-negative floats the integer order of the bits is the numeric order, so
// the block's absmax is an integer max, and any NaN/Inf makes it >= kExpMask. One reduction
// finds both the scale and non-finite input.
QH_HD uint32_t abs_bits(float v) { return f32_bits(v) & kAbsMask; }

QH_HD bool absmax_is_finite(uint32_t absmax_bits) { return absmax_bits < kExpMask; }

// scale = absmax / qmax (fp32 division); NaN for a block holding NaN/Inf.
//
// A subnormal quotient has few significant bits, and rounding it down would leave
// absmax / scale above qmax + 1/2, so the largest values would clamp with an error beyond
// scale/2 (and a quotient below 2^-150 would round to 0 and lose the block). Such a scale is
// stepped up one ulp when it undershoots: then every |x| / scale <= qmax and the error bound
// |x - q*scale| <= scale/2 holds there too. Normal scales are the plain quotient.
QH_HD float block_scale(uint32_t absmax_bits, int qmax) {
  if (!absmax_is_finite(absmax_bits)) return bits_f32(kQuietNanBits);
  const float absmax = bits_f32(absmax_bits);
  const float q = float(qmax);
  float scale = div_rn(absmax, q);
  if (f32_bits(scale) < kFltMinBits && mul_rn(scale, q) < absmax) {
    scale = bits_f32(f32_bits(scale) + 1u);  // next float up; scale >= 0 here
  }
  return scale;
}

// q = clamp(round_half_even(x / scale), -qmax, qmax); 0 when the scale is 0 or NaN.
// Clamping before rounding gives the same integer (qmax is an integer) and keeps the
// argument of round_half_even_small in its valid range.
QH_HD int quantize_value(float x, float scale, int qmax) {
  if (!(scale > 0.0f)) return 0;
  const float q = float(qmax);
  float v = div_rn(x, scale);
  v = v > q ? q : v;
  v = v < -q ? -q : v;
  return int(round_half_even_small(v));
}

// x = float(q) * scale. The product can exceed FLT_MAX only by rounding (scale was rounded up
// from absmax/qmax near FLT_MAX); it saturates there instead of becoming Inf, so finite input
// never dequantizes to Inf. A NaN scale (non-finite block) gives NaN.
QH_HD float dequantize_value(int q, float scale) {
  const uint32_t u = f32_bits(mul_rn(float(q), scale));
  return bits_f32(select_u32((u & kAbsMask) == kExpMask, (u & 0x80000000u) | kFltMaxBits, u));
}

// Whether dequantize_value(q, scale) is the plain product for every code q of a `bits` payload
// (|q| <= 128 for int8, 8 for int4, malformed codes included): rounding is monotonic, so
// |float(q) * scale| <= |float(2^(bits-1)) * scale|, which is exact unless it overflows; when it
// is finite, no product saturates. False for a NaN or infinite scale. (The CPU kernels skip the
// saturation where it holds.)
QH_HD bool dequantize_is_plain_product(float scale, int bits) {
  return abs_bits(mul_rn(bits == 4 ? 8.0f : 128.0f, scale)) < kExpMask;
}

// int4: two's-complement nibbles, element 2i in the low nibble of byte i, 2i+1 in the high.
QH_HD uint8_t pack_int4(int lo, int hi) {
  return uint8_t((uint32_t(lo) & 0xfu) | ((uint32_t(hi) & 0xfu) << 4));
}

QH_HD int int4_low(uint8_t byte) { return int(int8_t(uint8_t(byte << 4))) >> 4; }

QH_HD int int4_high(uint8_t byte) { return int(int8_t(byte)) >> 4; }

// ---- block rotation ([Note: block rotation] in zeropp_hier/quant/reference.py) -------------

// R = 0 (off) or a power of two from 2 to the block size (so it divides the block size).
QH_HD bool valid_rotate(int64_t r, int64_t block_size) {
  return r == 0 || (r >= 2 && r <= block_size && (r & (r - 1)) == 0);
}

// float32(1 / sqrt(R)) for R = 2^k, 1 <= k <= 12, as bits: 2^(-k/2) for even k (exact), else
// float32(1/sqrt(2)) = 0x3f3504f3 scaled by 2^(-(k-1)/2) (a power of two changes no rounding).
QH_HD float hadamard_scale(int64_t r) {
  int k = 0;
  while ((int64_t(1) << k) < r) ++k;
  const uint32_t bits =
      (k & 1) ? 0x3f3504f3u - (uint32_t((k - 1) / 2) << 23) : (uint32_t(127 - k / 2) << 23);
  return bits_f32(bits);
}

// v [n] (n a multiple of r) in place: every group of r consecutive values times H_r / sqrt(r).
// The butterfly strides h = 1, 2, ..., r/2 in that order, each pair (a, b) -> (a + b, a - b),
// then one multiply by hadamard_scale(r); a stride's pairs are independent, so walking them
// across all groups at once (vectorisable for h >= the vector width) changes no bit. No
// multiply-add anywhere, so nothing can be contracted into an FMA.
QH_HD void hadamard_inplace(float* v, int64_t n, int64_t r) {
  if (r < 2) return;
  // h = 1 and 2 as their own loops over quads: the generic inner loop would be 1-2 long.
  for (int64_t i = 0; i < n; i += 2) {
    const float a = v[i], b = v[i + 1];
    v[i] = add_rn(a, b);
    v[i + 1] = sub_rn(a, b);
  }
  if (r >= 4) {
    for (int64_t i = 0; i < n; i += 4) {
      const float a0 = v[i], a1 = v[i + 1], b0 = v[i + 2], b1 = v[i + 3];
      v[i] = add_rn(a0, b0);
      v[i + 1] = add_rn(a1, b1);
      v[i + 2] = sub_rn(a0, b0);
      v[i + 3] = sub_rn(a1, b1);
    }
  }
  for (int64_t h = 4; h < r; h *= 2) {
    for (int64_t base = 0; base < n; base += 2 * h) {
      float* lo = v + base;
      float* hi = v + base + h;
      for (int64_t j = 0; j < h; ++j) {
        const float a = lo[j], b = hi[j];
        lo[j] = add_rn(a, b);
        hi[j] = sub_rn(a, b);
      }
    }
  }
  const float c = hadamard_scale(r);
  for (int64_t i = 0; i < n; ++i) v[i] = mul_rn(v[i], c);
}

// Block sizes are powers of two in [32, 4096]; 32 keeps int4 blocks whole bytes and the GPU
// reduction at least one wavefront half.
QH_HD bool valid_block_size(int64_t b) { return b >= 32 && b <= 4096 && (b & (b - 1)) == 0; }

QH_HD int64_t num_blocks(int64_t numel, int64_t block_size) {
  return (numel + block_size - 1) / block_size;
}

// Bytes of quantized data for `nblocks` blocks (padding included).
QH_HD int64_t data_bytes(int64_t nblocks, int64_t block_size, int bits) {
  return bits == 4 ? nblocks * block_size / 2 : nblocks * block_size;
}

}  // namespace zqh
