// How documents are stored, as a policy of the tile loads: native (the queries' 16-bit or
// 32-bit type) or compressed, one byte per value (int8, or float8 e4m3fn) plus one float32
// scale per document row. A compressed tile stays one byte a value in shared memory; the
// consumer widens it on chip into mma B fragments (or floats for the FFMA and backward
// paths), and each similarity is multiplied by its row's scale before the max. Dequantised
// documents never reach global memory. Torch-free.
//
// Exactness: int8 values and e4m3 values are exact in fp16 and bf16, so the tensor-core
// products are exact and accumulate in fp32 as for 16-bit documents. The B fragments hold the
// values themselves, all normal numbers (e4m3's smallest, 2^-9, is a normal fp16), so nothing
// depends on how the tensor cores treat subnormal inputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../launch.h"
#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

template <DocFormat F>
struct DocTraits {  // kNative: the documents share the queries' type (Elem)
  static constexpr bool kCompressed = false;
};
template <>
struct DocTraits<DocFormat::kInt8> {
  static constexpr bool kCompressed = true;
};
template <>
struct DocTraits<DocFormat::kE4M3> {
  static constexpr bool kCompressed = true;
};
template <>
struct DocTraits<DocFormat::kResidual> {  // decoded into 16-bit tiles, not widened per fragment
  static constexpr bool kCompressed = false;
};
template <DocFormat F>
constexpr bool is_compressed() {
  return DocTraits<F>::kCompressed;
}

// Element type of the documents tensor a mainloop reads.
template <class T, DocFormat F>
using DocElem = std::conditional_t<F == DocFormat::kNative, T, uint8_t>;

// ---- ColBERTv2 residuals (DocFormat::kResidual) ----
//
// 8 dimensions of a row take nbits bytes of its packed bucket ids. `bits` holds them with the
// first byte in the top 8 bits; dimension j's field is the nbits bits after j * nbits of them,
// its bucket id those bits in reverse order (the codec stores each id lowest bit first).
__device__ __forceinline__ uint32_t residual_bucket(uint32_t bits, int j, int nbits) {
  const uint32_t field = (bits >> (32 - nbits * (j + 1))) & ((1u << nbits) - 1u);
  return __brev(field) >> (32 - nbits);
}

template <class T>
__device__ __forceinline__ float half_to_float(T x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}
template <class T>
__device__ __forceinline__ T float_to_half(float x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

// Shared-memory loads by address (the tiles are addressed as 32-bit shared pointers).
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 ld_shared_v2(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v));
}
__device__ __forceinline__ float2 ld_shared_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

// A bucket weight as float32, whatever dtype the codec keeps them in.
__device__ __forceinline__ float residual_weight(const ResidualRef& r, uint32_t bucket) {
  return r.weights_dtype == 1   ? __half2float(static_cast<const __half*>(r.weights)[bucket])
         : r.weights_dtype == 2 ? __bfloat162float(static_cast<const __nv_bfloat16*>(r.weights)[bucket])
                                : __ldg(static_cast<const float*>(r.weights) + bucket);
}

// One centroid element as float32, whatever dtype the codec keeps the centroids in (the FFMA
// path and the backward; the tensor-core path copies rows of the queries' dtype instead).
__device__ __forceinline__ float residual_centroid(const ResidualRef& r, int64_t at) {
  return r.centroids_dtype == 1   ? __half2float(__ldg(static_cast<const __half*>(r.centroids) + at))
         : r.centroids_dtype == 2 ? __bfloat162float(__ldg(static_cast<const __nv_bfloat16*>(r.centroids) + at))
                                  : __ldg(static_cast<const float*>(r.centroids) + at);
}

// Elements [at, at + 8) of the centroids as float32: 16-byte loads where the address allows
// (a view of a larger tensor may start anywhere), else element by element.
__device__ __forceinline__ void residual_centroid8(const ResidualRef& r, int64_t at, float (&c)[8]) {
  const bool wide = r.centroids_dtype == 0;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(r.centroids) + uintptr_t(at) * (wide ? 4u : 2u);
  if ((addr & 15u) != 0) {
#pragma unroll
    for (int j = 0; j < 8; ++j) c[j] = residual_centroid(r, at + j);
  } else if (wide) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(addr)), y = __ldg(reinterpret_cast<const float4*>(addr) + 1);
    c[0] = x.x, c[1] = x.y, c[2] = x.z, c[3] = x.w, c[4] = y.x, c[5] = y.y, c[6] = y.z, c[7] = y.w;
  } else {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(addr));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = r.centroids_dtype == 1 ? __half22float2(*reinterpret_cast<const __half2*>(&w[j]))
                                              : __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
      c[2 * j] = f.x, c[2 * j + 1] = f.y;
    }
  }
}

// The forward kernels decode two dimensions at a time: the 2 * nbits bits of a pair of
// consecutive dimensions, as they lie in the stream, index a table of 2**(2 * nbits) weight
// pairs (first dimension in the low half), built once per CTA by residual_pair_weights. The
// table absorbs the per-id bit reversal, so a pair costs a shift, a mask and one shared load.
__device__ __forceinline__ void residual_pair_weights(const ResidualRef& r, uint32_t entry, float& w0, float& w1) {
  const int nb = r.nbits;
  const uint32_t mask = (1u << nb) - 1u;
  w0 = residual_weight(r, __brev(entry >> nb) >> (32 - nb));
  w1 = residual_weight(r, __brev(entry & mask) >> (32 - nb));
}

// Whether every bucket weight is a value of T. Then c + w rounded once to T (a 16-bit add)
// equals the contract's float32 sum rounded to T: float32 carries at least 2p + 2 bits of
// T's p, so rounding twice cannot differ from rounding once (Figueroa), and a 16-bit add of
// the pair is exact in everything else (inf, NaN, subnormals, signed zeros).
template <class T>
__device__ __forceinline__ bool residual_weights_in(const ResidualRef& r) {
  bool in = true;
  for (int b = 0; b < (1 << r.nbits); ++b) {
    const float w = residual_weight(r, uint32_t(b));
    in = in && half_to_float(float_to_half<T>(w)) == w;
  }
  return in;
}

// A pair of 16-bit values of T (__half or __nv_bfloat16) in one 32-bit register.
template <class T>
struct Pair16 {
  using Vec = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  __device__ __forceinline__ static uint32_t bits(Vec v) { return *reinterpret_cast<const uint32_t*>(&v); }
  __device__ __forceinline__ static Vec vec(uint32_t c) { return *reinterpret_cast<const Vec*>(&c); }
  __device__ __forceinline__ static uint32_t add(uint32_t c, uint32_t w) { return bits(__hadd2(vec(c), vec(w))); }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    if constexpr (std::is_same_v<T, __half>) {
      return bits(__floats2half2_rn(lo, hi));
    } else {
      return bits(__floats2bfloat162_rn(lo, hi));
    }
  }
  __device__ __forceinline__ static float2 unpack(uint32_t c) {
    if constexpr (std::is_same_v<T, __half>) {
      return __half22float2(vec(c));
    } else {
      return __bfloat1622float2(vec(c));
    }
  }
};

// Adds the squares of a decoded chunk's four pairs to four running float32 sums.
template <class T>
__device__ __forceinline__ void add_squares(float (&ss)[4], const uint4& v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = Pair16<T>::unpack(w[i]);
    ss[i] = fmaf(f.y, f.y, fmaf(f.x, f.x, ss[i]));
  }
}

// One centroid pair (16-bit, in place) plus its weights: t = round_T(c + w) per element, by a
// 16-bit add when the weights are values of T (residual_weights_in), else in float32.
template <class T, bool kWeightsInT>
__device__ __forceinline__ uint32_t residual_add_pair(uint32_t c, uint32_t entry_addr) {
  if constexpr (kWeightsInT) {
    return Pair16<T>::add(c, ld_shared_u32(entry_addr));
  } else {
    const float2 w = ld_shared_f2(entry_addr);
    const float2 v = Pair16<T>::unpack(c);
    return Pair16<T>::pack(v.x + w.x, v.y + w.y);
  }
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ uint32_t lop3_select(uint32_t a, uint32_t b, uint32_t mask) {
  // (a & mask) | (b & ~mask)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;\n" : "=r"(d) : "r"(a), "r"(b), "r"(mask));
  return d;
}

// ---- one 32-bit word of four document bytes -> two mma B registers of 16-bit pairs ----
//
// Which bytes land in which register half is the format's k permutation; the query A
// fragments are loaded with the same one (PairBytes), so the dot products are unchanged:
//   int8, and e4m3 on sm_89+:  lo = (byte 0, byte 1), hi = (byte 2, byte 3)
//   e4m3 before sm_89:         lo = (byte 0, byte 2), hi = (byte 1, byte 3)
// sm_89+ widens e4m3 with cvt.rn.f16x2.e4m3x2 (one instruction a pair, NaN and subnormals
// exact); older chips by bit moves. Both are device code of the same arch's pass, so the
// documents' and the queries' permutations always agree.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define MAXSIM_E4M3_CVT 1
#else
#define MAXSIM_E4M3_CVT 0
#endif
template <DocFormat F>
struct PairBytes;
template <>
struct PairBytes<DocFormat::kInt8> {
  static constexpr int lo0 = 0, lo1 = 1, hi0 = 2, hi1 = 3;
};
template <>
struct PairBytes<DocFormat::kE4M3> {
  static constexpr int lo0 = 0, lo1 = MAXSIM_E4M3_CVT ? 1 : 2, hi0 = MAXSIM_E4M3_CVT ? 2 : 1, hi1 = 3;
};

// int8 -> fp16: byte x ^ 0x80 = x + 128 placed under the exponent byte 0x64 is the half
// 1024 + x + 128 (mantissa unit 1); one hsub2 of 1152 leaves x exactly.
__device__ __forceinline__ void int8x4_to_half2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t x = w ^ 0x80808080u;
  const uint32_t l = prmt(x, 0x64646464u, 0x4140u), h = prmt(x, 0x64646464u, 0x4342u);
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
  const __half2 lv = __hsub2(*reinterpret_cast<const __half2*>(&l), bias);
  const __half2 hv = __hsub2(*reinterpret_cast<const __half2*>(&h), bias);
  lo = *reinterpret_cast<const uint32_t*>(&lv);
  hi = *reinterpret_cast<const uint32_t*>(&hv);
}

// e4m3fn -> fp16 bits of value * 2^-8: sign to bit 15, the 7 exponent+mantissa bits to bits
// 7..13 (e4m3 subnormals become fp16 subnormals, exactly). NaN bytes (magnitude 0x7f) get a
// marker in bit 14 as well, which makes the half's exponent all ones with a nonzero mantissa:
// NaN. (mag + 1 carries into bit 7 only for mag == 0x7f.) The caller multiplies by 2^8.
__device__ __forceinline__ void e4m3x4_to_scaled_half2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t mag = w & 0x7f7f7f7fu;
  const uint32_t v = ((mag + 0x01010101u) & 0x80808080u) | mag;  // marker | magnitude per byte
  const uint32_t sign = w & 0x80808080u;
  constexpr uint32_t kField = 0x7f807f80u;  // bits 7..14 of each half
  hi = lop3_select(v >> 1, sign, kField);        // bytes 1, 3: already in each half's top byte
  lo = lop3_select(v << 7, sign << 8, kField);   // bytes 0, 2
}

__device__ __forceinline__ uint32_t hmul2_bits(uint32_t x, uint32_t y) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&x), *reinterpret_cast<const __half2*>(&y));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// e4m3fn -> fp16 values (see PairBytes for the byte order).
__device__ __forceinline__ void e4m3x4_to_half2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if MAXSIM_E4M3_CVT
  const unsigned short w_lo = static_cast<unsigned short>(w & 0xffffu), w_hi = static_cast<unsigned short>(w >> 16);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(lo) : "h"(w_lo));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(hi) : "h"(w_hi));
#else
  e4m3x4_to_scaled_half2x2(w, lo, hi);
  // x 2^8, exact (fp16 arithmetic keeps subnormal inputs; the result is normal)
  lo = hmul2_bits(lo, 0x5c005c00u);
  hi = hmul2_bits(hi, 0x5c005c00u);
#endif
}

__device__ __forceinline__ uint32_t half2_to_bf162_bits(uint32_t h) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);  // exact: <= 8 significant bits
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Four document bytes -> the two B registers (T pairs) of one k16 step (see PairBytes).
template <class T, DocFormat F>
__device__ __forceinline__ void widen_word(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (F == DocFormat::kInt8) {
    int8x4_to_half2x2(w, lo, hi);
  } else {
    e4m3x4_to_half2x2(w, lo, hi);
  }
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    lo = half2_to_bf162_bits(lo);
    hi = half2_to_bf162_bits(hi);
  }
}

// One byte -> its exact float value (the FFMA mainloop and the backward). e4m3: the bits
// moved under a float exponent give value * 2^-120 (subnormal for e4m3 subnormals; the
// kernels are compiled without flush-to-zero), and 2^120 is exact.
template <DocFormat F>
__device__ __forceinline__ float byte_to_float(uint32_t b) {
  if constexpr (F == DocFormat::kInt8) {
    return static_cast<float>(static_cast<int8_t>(b & 0xffu));
  } else {
    const uint32_t mag = b & 0x7fu;
    if (mag == 0x7fu) return __int_as_float(0x7fc00000);
    const float f = __int_as_float(static_cast<int>(((b & 0x80u) << 24) | (mag << 20)));
    return f * __int_as_float(0x7b800000);  // 2^120
  }
}

// ---- shared-memory tiles of 1-byte values (and the queries' K-chunks next to them) ----

// Largest cp.async piece (16, 8 or 4 bytes) that divides a row of `row_bytes` and keeps the
// base in `addr_bits` aligned; 0 = element by element.
__device__ __forceinline__ int copy_piece_bytes(int64_t row_bytes, uintptr_t addr_bits) {
  for (int g = 16; g >= 4; g /= 2) {
    if (row_bytes % g == 0 && (addr_bits & uintptr_t(g - 1)) == 0) return g;
  }
  return 0;
}

// Rows [row0, row0 + rows) x elements [kbase, kbase + ROW_BYTES / EB) of a row-major
// [*, dim] matrix of EB-byte elements into NROWS shared rows of ROW_BYTES, 16-byte chunk
// `ch` of row r stored at chunk Swz::chunk(r, ch); zeros beyond the valid rows and dim.
// Asynchronous unless piece == 0 (the caller commits and waits).
template <int EB, int NROWS, int ROW_BYTES, int THREADS, class Swz>
__device__ __noinline__ void load_rows_any(uint32_t base, const unsigned char* src0, int64_t row0, int64_t rows,
                                           int64_t kbase, int64_t dim, int piece) {
  constexpr int CH = ROW_BYTES / 16, PER_CH = 16 / EB;
  for (int c = threadIdx.x; c < NROWS * CH; c += THREADS) {
    const int r = c / CH, ch = c % CH;
    const uint32_t dst = base + uint32_t(r * ROW_BYTES + Swz::chunk(r, ch) * 16);
    const int64_t k0 = kbase + int64_t(ch) * PER_CH;
    if (r >= rows || k0 >= dim) {
      st_shared_zero16(dst);
      continue;
    }
    const unsigned char* src = src0 + ((row0 + r) * dim + k0) * EB;
    if (piece == 16) {
      cp_async_16(dst, src);
    } else if (piece == 8) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool in = k0 + h * (8 / EB) < dim;
        cp_async_ca_zfill<8>(dst + 8 * h, in ? src + 8 * h : src, in ? 8u : 0u);
      }
    } else if (piece == 4) {
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const bool in = k0 + h * (4 / EB) < dim;
        cp_async_ca_zfill<4>(dst + 4 * h, in ? src + 4 * h : src, in ? 4u : 0u);
      }
    } else {
      uint32_t v[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int e = 0; e < PER_CH; ++e) {
        if (k0 + e < dim) {
          const uint32_t x = EB == 1 ? uint32_t(__ldg(src + e))
                                     : uint32_t(__ldg(reinterpret_cast<const unsigned short*>(src) + e));
          v[(e * EB) / 4] |= x << (8 * ((e * EB) % 4));
        }
      }
      st_shared_v4(dst, make_uint4(v[0], v[1], v[2], v[3]));
    }
  }
}

template <int EB, int NROWS, int ROW_BYTES, int THREADS, class Swz>
__device__ __forceinline__ void load_rows(uint32_t base, const void* src_, int64_t row0, int64_t rows, int64_t kbase,
                                          int64_t dim, int piece) {
  constexpr int CH = ROW_BYTES / 16, PER_CH = 16 / EB;
  static_assert(ROW_BYTES % 16 == 0, "whole chunks");
  const unsigned char* src0 = static_cast<const unsigned char*>(src_);
  if constexpr (THREADS % CH == 0 && (NROWS * CH) % THREADS == 0) {
    if (piece == 16) {
      // A thread always copies the same chunk column: one predicate and one cp.async a piece.
      constexpr int RSTEP = THREADS / CH;
      const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
      const bool col_in = kbase + int64_t(ch) * PER_CH < dim;
      const unsigned char* src = src0 + ((row0 + r0) * dim + kbase + int64_t(ch) * PER_CH) * EB;
      const int64_t stride = int64_t(RSTEP) * dim * EB;
#pragma unroll
      for (int it = 0; it < NROWS / RSTEP; ++it) {
        const int r = r0 + it * RSTEP;
        const uint32_t d = base + uint32_t(r * ROW_BYTES + Swz::chunk(r, ch) * 16);
        cp_async_16_zfill(d, src + it * stride, (col_in && r < rows) ? 16u : 0u);
      }
      return;
    }
  }
  load_rows_any<EB, NROWS, ROW_BYTES, THREADS, Swz>(base, src0, row0, rows, kbase, dim, piece);
}

// The tile's row scales (NROWS floats at `base`, zeros past `rows` or without scales).
template <int NROWS, int THREADS>
__device__ __forceinline__ void load_scales(uint32_t base, const float* scales, int64_t row0, int rows) {
  for (int r = threadIdx.x; r < NROWS; r += THREADS) {
    const bool in = scales != nullptr && r < rows;
    cp_async_ca_zfill<4>(base + 4 * r, in ? scales + row0 + r : scales, in ? 4u : 0u);
  }
}

// Swizzles (16-byte chunk index per row) chosen for the consumers' shared loads:
// NoSwizzle: 64-byte rows read 16 bytes a lane (rows 2m, 2m+1 of a quarter-warp already
// fall in different bank groups). PairSwizzle: 128/256-byte rows read 16 bytes a lane:
// odd rows move to the other 64-byte half. WordSwizzle: 64-byte rows read 4 bytes a lane,
// 8 rows at once. QuadSwizzle: 128-byte query rows read 8 bytes a lane, 4 rows a half-warp.
struct NoSwizzle {
  __device__ __forceinline__ static int chunk(int, int ch) { return ch; }
};
struct PairSwizzle {
  __device__ __forceinline__ static int chunk(int r, int ch) { return ch ^ ((r & 1) << 2); }
};
struct WordSwizzle {
  __device__ __forceinline__ static int chunk(int r, int ch) { return ch ^ ((r >> 1) & 3); }
};
struct QuadSwizzle {
  __device__ __forceinline__ static int chunk(int r, int ch) { return ch ^ ((r & 3) << 1); }
};

// Multiplies each accumulator column (a document row of the tile) by its scale before the
// fold: a thread's columns are cols0 + nt * 8 + {0, 1} of the tile, scales at `scale_base`.
template <DocFormat F, int MT, int NT>
__device__ __forceinline__ void scale_columns(float (&acc)[MT][NT][4], uint32_t scale_base, int cols0) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float2 s = ld_shared_f2(scale_base + 4u * uint32_t(cols0 + nt * 8));
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      acc[mt][nt][0] *= s.x;
      acc[mt][nt][1] *= s.y;
      acc[mt][nt][2] *= s.x;
      acc[mt][nt][3] *= s.y;
    }
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
