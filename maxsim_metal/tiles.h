// Tile helpers of the Metal kernels (MSL): the storage formats of embedding rows, staging
// rows into threadgroup memory as float (zero-filled past the valid rows and past `dim`, so
// the 8x8 products see zeros), and the running (max, argmax) with the semantics of
// docs/design.md. Metal compiles with fast math, which may fold isnan() and comparisons
// with infinities; so NaN is recognised by its bits and values are compared as
// order-preserving integers.
#pragma once

#include <metal_stdlib>

#include "params.h"

using namespace metal;

inline bool is_nan_bits(float x) { return (as_type<uint>(x) & 0x7fffffffu) > 0x7f800000u; }

// Integer with the order of the (non-NaN) floats; -0 and +0 map to the same key.
inline int order_key(float x) {
  const int b = as_type<int>(x);
  if ((b & 0x7fffffff) == 0) return 0;
  return b >= 0 ? b : b ^ 0x7fffffff;
}

inline float nan_value() { return as_type<float>(0x7fc00000u); }
inline float minus_infinity() { return as_type<float>(0xff800000u); }

// A candidate maximum of one query row: its value and document index.
struct Best {
  float value;
  int index;
};

// The empty candidate: loses to every real one, -inf included.
inline Best no_best() {
  Best b;
  b.value = minus_infinity();
  b.index = 0x7fffffff;
  return b;
}

// Whether x replaces b: NaN wins (the first NaN), otherwise the larger value, and on
// equal values the lower index.
inline bool beats(Best x, Best b) {
  const bool xn = is_nan_bits(x.value), bn = is_nan_bits(b.value);
  if (xn || bn) return xn && (!bn || x.index < b.index);
  const int kx = order_key(x.value), kb = order_key(b.value);
  return kx > kb || (kx == kb && x.index < b.index);
}

inline Best better(Best a, Best b) { return beats(b, a) ? b : a; }

// All lanes of a simdgroup call this; partner is lane ^ mask.
inline Best shuffle_better(Best a, ushort mask) {
  Best o;
  o.value = simd_shuffle_xor(a.value, mask);
  o.index = simd_shuffle_xor(a.index, mask);
  return better(a, o);
}

// ---- storage formats of embedding rows --------------------------------------------------
// A format says how one stored element becomes the float the tiles hold and how a row's
// float32 scale enters what is computed from it. Queries are always PlainFormat<T>;
// documents are PlainFormat<T> (the queries' type) or compressed: int8 (symmetric, `char`)
// or float8 e4m3fn (raw bytes, decoded here: Metal has no fp8 type), each row with its own
// scale. The format is a template parameter of the one forward and the one backward
// kernel: it changes the tile load and where the scale is applied, nothing else, and
// nothing is ever dequantised into device memory.
//
// scaled(x, scales, row) is x for unscaled formats and x * scales[row] otherwise. The
// forward applies it to each similarity before the running max (sim = scale_j * <q_i, v_j>,
// accumulated in float32 first, as the CPU backend does); the backward to the gradient
// weight (g_p * scale[a]), which then multiplies the widened row.

// e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
// (m * 2^-9), S.1111.111 is NaN, and there are no infinities. Exact in float.
inline float e4m3fn_to_float(uchar b) {
  const uint sign = uint(b & 0x80u) << 24, e = (uint(b) >> 3) & 15u, m = uint(b) & 7u;
  if (e == 15u && m == 7u) return as_type<float>(sign | 0x7fc00000u);
  if (e == 0u) return as_type<float>(sign | as_type<uint>(float(m) * 0.001953125f));
  return as_type<float>(sign | ((e + 120u) << 23) | (m << 20));  // rebias 7 -> 127
}

template <typename T> struct PlainFormat {
  typedef T element;
  static float widen(T v) { return float(v); }
  static float scaled(float x, device const float*, long) { return x; }
};

struct Int8Format {
  typedef char element;  // MSL's char is signed
  static float widen(char v) { return float(v); }
  static float scaled(float x, device const float* scales, long row) { return x * scales[row]; }
};

struct E4M3Format {
  typedef uchar element;  // the e4m3fn bits
  static float widen(uchar v) { return e4m3fn_to_float(v); }
  static float scaled(float x, device const float* scales, long row) { return x * scales[row]; }
};

// tile[r][c] = src[r][k0 + c] widened to float for r < rows, k0 + c < dim; zero elsewhere.
// kRows x kMaxsimDimChunk elements, spread over the threadgroup's threads.
template <int kRows, typename Format>
inline void stage_rows(threadgroup float* tile, device const typename Format::element* src,
                       long rows, long dim, long k0, uint tid) {
  for (uint e = tid; e < uint(kRows * kMaxsimDimChunk); e += kMaxsimThreads) {
    const long r = e / kMaxsimDimChunk, c = k0 + e % kMaxsimDimChunk;
    tile[e] = (r < rows && c < dim) ? Format::widen(src[r * dim + c]) : 0.0f;
  }
}
