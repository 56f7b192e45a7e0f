// Tile helpers of the Metal kernels (MSL): staging rows into threadgroup memory as float
// (zero-filled past the valid rows and past `dim`, so the 8x8 products see zeros), and the
// running (max, argmax) with the semantics of docs/design.md. Metal compiles with fast
// math, which may fold isnan() and comparisons with infinities; so NaN is recognised by its
// bits and values are compared as order-preserving integers.
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

// tile[r][c] = src[r][k0 + c] as float for r < rows, k0 + c < dim; zero elsewhere.
// kRows x kMaxsimDimChunk elements, spread over the threadgroup's threads.
template <int kRows, typename T>
inline void stage_rows(threadgroup float* tile, device const T* src, long rows, long dim, long k0,
                       uint tid) {
  for (uint e = tid; e < uint(kRows * kMaxsimDimChunk); e += kMaxsimThreads) {
    const long r = e / kMaxsimDimChunk, c = k0 + e % kMaxsimDimChunk;
    tile[e] = (r < rows && c < dim) ? float(src[r * dim + c]) : 0.0f;
  }
}
