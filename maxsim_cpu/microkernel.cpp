// Per-ISA builds of the microkernels, chosen once at run time, so no -march flag is
// needed and one binary runs on any x86-64 and on arm64:
//   avx512 (+bf16)  microkernel_avx512.h (intrinsics; vdpbf16ps where the CPU has it)
//   avx2 / generic  microkernel_impl.h (GCC/Clang vector extensions; also arm64 NEON)
//
// Not target_clones: target_clones("avx2,fma") makes two clones (AVX2 without FMA and
// FMA without AVX2), and GCC lowers vector compares in an always_inline helper for the
// helper's own (baseline) target before inlining, which scalarised the epilogue. A
// target pragma around an included body puts every helper under the target.
#include "maxsim_cpu/microkernel.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#if defined(__x86_64__) && !defined(__APPLE__) && defined(__GNUC__)
#define MAXSIM_X86_DISPATCH 1
#include <immintrin.h>
#else
#define MAXSIM_X86_DISPATCH 0
#endif
#define MAXSIM_INLINE inline __attribute__((always_inline))

namespace maxsim_cpu {
namespace {

// Tile shapes: kR rows x kNV vectors of kW floats, sized to the register file.
namespace isa_generic {
#if defined(__aarch64__)
constexpr int kW = 4, kR = 6, kNV = 4;  // 24 of the 32 NEON registers
#else
constexpr int kW = 4, kR = 4, kNV = 2;  // 8 of the 16 SSE2 registers
#endif
#include "maxsim_cpu/microkernel_impl.h"
}  // namespace isa_generic

#if MAXSIM_X86_DISPATCH
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace isa_avx2 {
constexpr int kW = 8, kR = 6, kNV = 2;  // 12 of the 16 ymm registers
#include "maxsim_cpu/microkernel_impl.h"
// F16C converts 8 halves per instruction (the portable bit trick costs ~8).
void widen_half_f16c(const Half* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_bits_to_float(src[i].bits);
}
// x[i] to the nearest float16 and back, 8 at a time (round to nearest even, as the portable
// converter rounds).
void round_half_f16c(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
  for (; i < n; ++i) x[i] = half_bits_to_float(float_to_half_bits(x[i]));
}
// e4m3fn documents, 8 values at a time by the bit layout (e4m3_bits_to_float's three cases,
// bit for bit): magnitude bits m = b & 0x7f; m < 8 (exponent 0) is m * 2^-9, m == 0x7f NaN,
// else the float bits (m << 20) + (120 << 23); then the sign. A table lookup a value, the
// scalar way, cost more than the products it feeds (2026-11-29, 2-core AVX2 host).
void widen_e4m3_avx2(const Float8E4M3* src, float* dst, int64_t n) {
  const __m256i magnitude = _mm256_set1_epi32(0x7f), sign_bit = _mm256_set1_epi32(0x80),
                bias = _mm256_set1_epi32(120 << 23), eight = _mm256_set1_epi32(8),
                quiet_nan = _mm256_set1_epi32(0x7fc00000);
  const __m256 sub_scale = _mm256_set1_ps(0.001953125f);  // 2^-9
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
    const __m256i m = _mm256_and_si256(b, magnitude);
    const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(m, 20), bias);
    const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(m), sub_scale));
    __m256i bits = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(eight, m));
    bits = _mm256_blendv_epi8(bits, quiet_nan, _mm256_cmpeq_epi32(m, magnitude));
    bits = _mm256_or_si256(bits, _mm256_slli_epi32(_mm256_and_si256(b, sign_bit), 24));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(bits));
  }
  for (; i < n; ++i) dst[i] = e4m3_bits_to_float(src[i].bits);
}
}  // namespace isa_avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,fma")
#endif
namespace isa_avx512 {
constexpr bool kBf16 = false;
constexpr int kW = 8, kR = 6, kNV = 2;  // unused here: only the 16-bit widening is
#include "maxsim_cpu/microkernel_impl.h"
#include "maxsim_cpu/microkernel_avx512.h"
void sweep512_entry(const SweepArgs& a) {
  sweep512(a.qT, a.ldq, a.ncols, a.dim, a.doc, a.ldd, a.nrows, a.j0, a.best, a.arg, a.scale);
}
}  // namespace isa_avx512
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16")
#endif
namespace isa_avx512bf16 {
constexpr bool kBf16 = true;
#include "maxsim_cpu/microkernel_avx512.h"
void sweep_bf16_entry(const SweepBf16Args& a) {
  sweep512(a.qT, a.ldq, a.ncols, a.kpairs, a.doc, a.ldd, a.nrows, a.j0, a.best, a.arg);
}
}  // namespace isa_avx512bf16
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // MAXSIM_X86_DISPATCH

void round_half_portable(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = half_bits_to_float(float_to_half_bits(x[i]));
}

// A 256-entry table: one load a value, exact, NaN included.
void widen_e4m3_portable(const Float8E4M3* src, float* dst, int64_t n) {
  static const auto table = [] {
    struct Table { float v[256]; } t;
    for (int b = 0; b < 256; ++b) t.v[b] = e4m3_bits_to_float(uint8_t(b));
    return t;
  }();
  for (int64_t i = 0; i < n; ++i) dst[i] = table.v[src[i].bits];
}

struct Kernels {
  void (*sweep)(const SweepArgs&);
  void (*widen_half)(const Half*, float*, int64_t);
  void (*widen_bf16)(const BFloat16*, float*, int64_t);
  void (*sweep_bf16)(const SweepBf16Args&) = nullptr;
  void (*round_half)(float*, int64_t) = round_half_portable;
  void (*widen_e4m3)(const Float8E4M3*, float*, int64_t) = widen_e4m3_portable;
};

#define MAXSIM_KERNELS(ns) Kernels{ns::sweep_entry, ns::widen_half_entry, ns::widen_bf16_entry}

// MAXSIM_CPU_ISA=generic|avx2|avx512 caps the choice (to test the fallbacks on a big
// machine); it never selects more than the CPU has.
const Kernels& kernels() {
  static const Kernels k = [] {
    const char* env = std::getenv("MAXSIM_CPU_ISA");
    const std::string cap = env ? env : "";
#if MAXSIM_X86_DISPATCH
    __builtin_cpu_init();
    if (cap != "generic" && cap != "avx2" && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("f16c") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
      Kernels k{isa_avx512::sweep512_entry, isa_avx2::widen_half_f16c, isa_avx512::widen_bf16_entry};
      if (__builtin_cpu_supports("avx512bf16")) k.sweep_bf16 = isa_avx512bf16::sweep_bf16_entry;
      k.round_half = isa_avx2::round_half_f16c;
      k.widen_e4m3 = isa_avx2::widen_e4m3_avx2;
      return k;
    }
    if (cap != "generic" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
      Kernels k{isa_avx2::sweep_entry, isa_avx2::widen_half_f16c, isa_avx2::widen_bf16_entry};
      k.round_half = isa_avx2::round_half_f16c;
      k.widen_e4m3 = isa_avx2::widen_e4m3_avx2;
      return k;
    }
#endif
    return MAXSIM_KERNELS(isa_generic);
  }();
  return k;
}

}  // namespace

void sweep(const SweepArgs& a) {
  if (a.nrows <= 0 || a.ncols <= 0) return;
  kernels().sweep(a);
}

bool has_bf16_dot() { return kernels().sweep_bf16 != nullptr; }

void sweep_bf16(const SweepBf16Args& a) {
  if (a.nrows <= 0 || a.ncols <= 0) return;
  kernels().sweep_bf16(a);
}

void widen(const Half* src, float* dst, int64_t n) { kernels().widen_half(src, dst, n); }
void widen(const BFloat16* src, float* dst, int64_t n) { kernels().widen_bf16(src, dst, n); }
void widen(const Float8E4M3* src, float* dst, int64_t n) { kernels().widen_e4m3(src, dst, n); }
void round_to_half(float* x, int64_t n) { kernels().round_half(x, n); }

}  // namespace maxsim_cpu
