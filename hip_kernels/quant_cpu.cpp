// CPU backend: OpenMP over ranges of blocks; the loops (quant_cpu_loops.h) call the shared math
// in quant_math.h and are compiled for several x86 instruction sets, the widest available
// picked at run time (ZEROPP_HIER_CPU_ISA=default|avx2|avx512 forces one, e.g. to test each).
//
// Built with -fopenmp -O3 -ffp-contract=off and without -ffast-math (hip_kernels/build.py);
// see [Note: bit-exact arithmetic] in quant_math.h. A thread stages one block in an fp32
// stack buffer, so the two passes over a block (absmax, then quantize) hit L1.
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>  // _mm256/_mm512_fmadd_ps in the rotation ([Note: CPU rotation layout])
#endif

#include "quant_api.h"
#include "quant_math.h"

namespace zqh {
namespace cpu {

constexpr int64_t kMaxBlock = 4096;
// The sums walk the data in chunks of this many elements: a multiple of every block size, so a
// chunk holds whole input blocks and whole output blocks, and its fp32 accumulator fits in L1.
constexpr int64_t kChunk = 4096;

// Entry points of one instruction-set variant; typed ones indexed by DType.
struct Loops {
  void (*quantize[3])(const void* x, int64_t numel, int bits, int64_t block_size, int64_t rotate,
                      int64_t b0, int64_t b1, uint8_t* data, float* scales);
  void (*dequantize[3])(const uint8_t* data, const float* scales, int64_t numel, int bits,
                        int64_t block_size, int64_t rotate, int64_t b0, int64_t b1, void* out);
  void (*sum[3])(const Parts& parts, int64_t c0, int64_t c1, void* out);
  void (*sum_requantize)(const Parts& parts, int out_bits, int64_t out_block_size, int64_t c0,
                         int64_t c1, uint8_t* out_data, float* out_scales);
};

}  // namespace cpu
}  // namespace zqh

#define ZQH_ISA isa_default
#define ZQH_VECW 0
#include "quant_cpu_loops.h"
#undef ZQH_VECW
#undef ZQH_ISA

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ZQH_X86_VARIANTS 1
// "fma" in the AVX2 list only for the rotation's explicit FMA with +-1 (an exact product, so one
// rounding as a + b or a - b; [Note: CPU rotation layout]); nothing else may contract, which
// -ffp-contract=off guarantees (hip_kernels/build.py; [Note: bit-exact arithmetic]).
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define ZQH_ISA isa_avx2
#define ZQH_VECW 8
#include "quant_cpu_loops.h"
#undef ZQH_VECW
#undef ZQH_ISA
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,avx512f,avx512bw,avx512vl,avx512dq")
#define ZQH_ISA isa_avx512
#define ZQH_VECW 16
#include "quant_cpu_loops.h"
#undef ZQH_VECW
#undef ZQH_ISA
#pragma GCC pop_options
#else
#define ZQH_X86_VARIANTS 0
#endif

namespace zqh {
namespace cpu {
namespace {

// Ranges per OpenMP thread are at least this many elements: below it the fork/join and the
// indirect call cost more than they save.
constexpr int64_t kMinRange = 16384;

enum class Isa { kDefault, kAvx2, kAvx512 };

Isa best_isa() {
#if ZQH_X86_VARIANTS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return Isa::kAvx512;
  }
  // every AVX2 CPU of Intel and AMD has FMA3; the variant asks for both (a CPU with AVX2 and
  // no FMA, if any exists, runs the baseline variant)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kDefault;
}

// The variant for this call: ZEROPP_HIER_CPU_ISA if set (and supported), else the widest.
Isa chosen_isa() {
  static const Isa best = best_isa();
  const char* forced = getenv("ZEROPP_HIER_CPU_ISA");
  if (forced == nullptr || forced[0] == '\0') return best;
  Isa want = Isa::kDefault;
  if (strcmp(forced, "avx512") == 0) want = Isa::kAvx512;
  if (strcmp(forced, "avx2") == 0) want = Isa::kAvx2;
  return int(want) <= int(best) ? want : best;
}

// [Note: one variant per CPU]
// Only the chosen variant's table is ever built. The table builders are compiled under their
// variant's target pragma, so even filling in the function pointers may use that variant's
// registers (GCC stores the table with zmm moves in the AVX-512 builder): a table built for
// every variant up front kills the process with SIGILL on any CPU without AVX-512. Each table
// is a function-local static, built on first use (thread-safe) and only in its own branch.
const Loops& loops() {
  switch (chosen_isa()) {
#if ZQH_X86_VARIANTS
    case Isa::kAvx512: {
      static const Loops table = isa_avx512::loops();
      return table;
    }
    case Isa::kAvx2: {
      static const Loops table = isa_avx2::loops();
      return table;
    }
#endif
    default: {
      static const Loops table = isa_default::loops();
      return table;
    }
  }
}

// Splits [0, count) into ranges of at least min_items and runs fn(begin, end) over OpenMP.
template <typename Fn>
void parallel_ranges(int64_t count, int64_t min_items, Fn fn) {
  const int64_t ranges = std::max<int64_t>(1, count / std::max<int64_t>(1, min_items));
  if (ranges == 1) {
    fn(int64_t(0), count);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < ranges; ++r) fn(count * r / ranges, count * (r + 1) / ranges);
}

}  // namespace

const char* isa_name() {
  switch (chosen_isa()) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "default";
  }
}

void quantize(const void* x, DType x_dtype, int64_t numel, int bits, int64_t block_size,
              int64_t rotate, void* data, float* scales) {
  const auto fn = loops().quantize[int(x_dtype)];
  uint8_t* bytes = static_cast<uint8_t*>(data);
  parallel_ranges(num_blocks(numel, block_size), kMinRange / block_size,
                  [&](int64_t b0, int64_t b1) {
                    fn(x, numel, bits, block_size, rotate, b0, b1, bytes, scales);
                  });
}

void dequantize(const void* data, const float* scales, int64_t numel, int bits, int64_t block_size,
                int64_t rotate, void* out, DType out_dtype) {
  const auto fn = loops().dequantize[int(out_dtype)];
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  parallel_ranges(num_blocks(numel, block_size), kMinRange / block_size,
                  [&](int64_t b0, int64_t b1) {
                    fn(bytes, scales, numel, bits, block_size, rotate, b0, b1, out);
                  });
}

void dequantize_sum(const Parts& parts, void* out, DType out_dtype) {
  const auto fn = loops().sum[int(out_dtype)];
  parallel_ranges(num_blocks(parts.numel, kChunk), kMinRange / kChunk,
                  [&](int64_t c0, int64_t c1) { fn(parts, c0, c1, out); });
}

void dequantize_sum_requantize(const Parts& parts, int out_bits, int64_t out_block_size,
                               void* out_data, float* out_scales) {
  const auto fn = loops().sum_requantize;
  const int64_t padded = num_blocks(parts.numel, out_block_size) * out_block_size;
  uint8_t* bytes = static_cast<uint8_t*>(out_data);
  parallel_ranges(num_blocks(padded, kChunk), kMinRange / kChunk, [&](int64_t c0, int64_t c1) {
    fn(parts, out_bits, out_block_size, c0, c1, bytes, out_scales);
  });
}

}  // namespace cpu
}  // namespace zqh
