// Torch-free building blocks of the CPU kernels: element storage types and the
// similarity/max microkernels (defined in microkernel.cpp, which compiles them once per
// instruction set and picks one on first use).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace maxsim_cpu {

// 16-bit storage types that do not drag in ATen; layout-identical to at::Half /
// at::BFloat16 so tensor data can be reinterpreted in place.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Exact for every half including subnormals/inf/NaN, and branch-free so the row
// converters vectorise (F. Giesen's magic-multiply conversion).
inline float half_bits_to_float(uint16_t h) {
  float f = bits_to_float(uint32_t(h & 0x7fffu) << 13) * bits_to_float((254u - 15u) << 23);
  uint32_t u = float_to_bits(f);
  if (f >= bits_to_float((127u + 16u) << 23)) u |= 255u << 23;  // was inf/NaN
  return bits_to_float(u | (uint32_t(h & 0x8000u) << 16));
}

// Round-to-nearest-even, overflow to inf, NaN stays NaN (matches torch's casts).
inline uint16_t float_to_half_bits(float value) {
  uint32_t x = float_to_bits(value);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t out;
  if (x >= (143u << 23)) {                       // >= 65536, inf or NaN
    out = x > (255u << 23) ? 0x7e00u : 0x7c00u;
  } else if (x < (113u << 23)) {                 // result is subnormal or zero
    // Adding 0.5 lets the FPU do the rounding shift into the subnormal range.
    const uint32_t magic = 126u << 23;
    out = float_to_bits(bits_to_float(x) + bits_to_float(magic)) - magic;
  } else {
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += (uint32_t(15 - 127) << 23) + 0xfffu + mant_odd;
    out = x >> 13;
  }
  return uint16_t(out | (sign >> 16));
}

inline float bf16_bits_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16_bits(float value) {
  const uint32_t x = float_to_bits(value);
  if (std::isnan(value)) return uint16_t((x >> 16) | 0x40u);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float to_float(float v) { return v; }
inline float to_float(Half v) { return half_bits_to_float(v.bits); }
inline float to_float(BFloat16 v) { return bf16_bits_to_float(v.bits); }

// Compressed document storage (docs/design.md, "Compressed documents"): int8 values and
// float8 e4m3fn values, each token scaled by its own float32 factor. Both widen exactly.
struct Float8E4M3 {
  uint8_t bits;
};

// e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, S.1111.111 is NaN.
inline float e4m3_bits_to_float(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24, e = (b >> 3) & 15u, m = b & 7u;
  if (e == 15u && m == 7u) return bits_to_float(sign | 0x7fc00000u);
  if (e == 0u) return bits_to_float(sign | float_to_bits(float(m) * 0.001953125f));  // m * 2^-9
  return bits_to_float(sign | ((e + 120u) << 23) | (m << 20));
}

inline float to_float(int8_t v) { return float(v); }
inline float to_float(Float8E4M3 v) { return e4m3_bits_to_float(v.bits); }

template <class T> inline T from_float(float v);
template <> inline float from_float<float>(float v) { return v; }
template <> inline Half from_float<Half>(float v) { return Half{float_to_half_bits(v)}; }
template <> inline BFloat16 from_float<BFloat16>(float v) { return BFloat16{float_to_bf16_bits(v)}; }

// Widen n elements to float32 (vectorised per instruction set in microkernel.cpp).
void widen(const Half* src, float* dst, int64_t n);
void widen(const BFloat16* src, float* dst, int64_t n);
inline void widen(const float* src, float* dst, int64_t n) {
  if (n > 0) std::memcpy(dst, src, size_t(n) * sizeof(float));
}
inline void widen(const int8_t* src, float* dst, int64_t n) {  // the compiler vectorises it
  for (int64_t i = 0; i < n; ++i) dst[i] = float(src[i]);
}
void widen(const Float8E4M3* src, float* dst, int64_t n);

// Running max over document rows, one lane per query token.
//   qT     [dim][ldq] float32, the query transposed; columns [0, ncols) are swept,
//          ncols a multiple of 16 and qT/best/arg 64-byte aligned with ldq % 16 == 0
//   doc    nrows document rows of `dim` floats, ldd floats apart
//   best/arg [ncols] running maximum and its document index, updated in place with
//          document indices j0 + r (strict > keeps the lowest index; NaN wins)
//   scale  null, or [nrows] per-row factors: each similarity of row r is multiplied by
//          scale[r] before it meets the max (compressed documents)
struct SweepArgs {
  const float* qT;
  int64_t ldq;
  int64_t ncols;
  int64_t dim;
  const float* doc;
  int64_t ldd;
  int64_t nrows;
  int32_t j0;
  float* best;
  int32_t* arg;
  const float* scale = nullptr;
};
void sweep(const SweepArgs& a);

// bfloat16 variant (AVX512_BF16 only; check has_bf16_dot()): qT holds the query as
// bfloat16 pairs, element 2k in the low half of dword [k][i]; doc rows are bfloat16,
// ldd elements apart; kpairs = dim / 2 (dim must be even).
struct SweepBf16Args {
  const uint32_t* qT;
  int64_t ldq;
  int64_t ncols;
  int64_t kpairs;
  const uint16_t* doc;
  int64_t ldd;
  int64_t nrows;
  int32_t j0;
  float* best;
  int32_t* arg;
};
bool has_bf16_dot();
void sweep_bf16(const SweepBf16Args& a);

// x[i] = the float16 nearest x[i] (round to nearest even), as a float; F16C where the CPU has it.
void round_to_half(float* x, int64_t n);

// Rows of qT are padded to this many columns (one 512-bit vector of floats).
constexpr int64_t kColumnQuantum = 16;

}  // namespace maxsim_cpu
