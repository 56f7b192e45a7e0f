// Tile helpers of the Metal kernels (MSL): the storage formats of embedding rows, staging
// rows into threadgroup memory as float (zero-filled past the valid rows and past `dim`, so
// the 8x8 products see zeros), and the running (max, argmax) with the semantics of
// docs/design.md. Metal compiles with fast math, which may fold isnan() and comparisons
// with infinities; so NaN is recognised by its bits and values are compared as
// order-preserving integers.
#pragma once

#include <metal_stdlib>

#include "params.h"
#include "policies.h"

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
// A format says what float a stored element (row, column) stands for and how a row's factor
// enters what is computed from it. Queries are always PlainFormat<T>; documents are
// PlainFormat<T> (the queries' type), compressed with one float32 scale per row (int8,
// symmetric, `char`; float8 e4m3fn, raw bytes decoded here: Metal has no fp8 type), or
// ColBERTv2 residuals (ResidualFormat<T>). The format is a template parameter of the one
// forward and the one backward kernel: it changes the tile load and where the factor is
// applied, nothing else, and nothing is ever decoded into device memory.
//
// scaled(x, values, docs, row) is x for plain documents and x * scales[row] for scaled ones. The
// forward applies it to each similarity before the running max (sim = scale_j * <q_i, v_j>,
// accumulated in float32 first, as the CPU backend does); the backward to the gradient
// weight (g_p * scale[a]), which then multiplies the widened row. Residual rows are
// normalised (kRowNorm): the forward sums their squares as it stages them and scales by
// 1 / ||t|| from threadgroup memory; the backward recomputes the norm of the winning row.

// What a format reads besides the values: per-row scales, or the residual codec.
struct DocumentExtras {
  long dim;
  device const float* scales;          // int8 / e4m3fn: one per document row
  IndexView codes;                     // residual: the centroid id of each row
  device const uchar* centroids;       // residual: [n_centroids, dim] of centroid_dtype
  device const uchar* bucket_weights;  // residual: [2**nbits] of weight_dtype
  long n_centroids;
  int nbits, normalize, centroid_dtype, weight_dtype;
};

inline DocumentExtras document_extras(constant MaxsimParams& prm, device const float* scales,
                                      device const int* codes, device const uchar* centroids,
                                      device const uchar* bucket_weights) {
  DocumentExtras x;
  x.dim = prm.dim;
  x.scales = scales;
  x.codes.ptr = codes;
  x.codes.size = prm.codes_size;
  x.codes.is64 = prm.codes_is64 != 0;
  x.codes.present = prm.codes_size > 0;
  x.centroids = centroids;
  x.bucket_weights = bucket_weights;
  x.n_centroids = prm.n_centroids;
  x.nbits = prm.nbits;
  x.normalize = prm.normalize;
  x.centroid_dtype = prm.centroid_dtype;
  x.weight_dtype = prm.weight_dtype;
  return x;
}

// e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
// (m * 2^-9), S.1111.111 is NaN, and there are no infinities. Exact in float.
inline float e4m3fn_to_float(uchar b) {
  const uint sign = uint(b & 0x80u) << 24, e = (uint(b) >> 3) & 15u, m = uint(b) & 7u;
  if (e == 15u && m == 7u) return as_type<float>(sign | 0x7fc00000u);
  if (e == 0u) return as_type<float>(sign | as_type<uint>(float(m) * 0.001953125f));
  return as_type<float>(sign | ((e + 120u) << 23) | (m << 20));  // rebias 7 -> 127
}

// Formats whose rows are not normalised: no per-row factor from the staged values.
struct UnnormalisedRows {
  enum { kRowNorm = 0 };
  static float factor(float, thread const DocumentExtras&) { return 1.0f; }
};

template <typename T> struct PlainFormat : UnnormalisedRows {
  typedef T element;
  static float widen(T v) { return float(v); }
  static float value(device const T* v, thread const DocumentExtras& x, long row, long col) {
    return widen(v[row * x.dim + col]);
  }
  static float scaled(float x, device const T*, thread const DocumentExtras&, long) { return x; }
};

struct Int8Format : UnnormalisedRows {
  typedef char element;  // MSL's char is signed
  static float widen(char v) { return float(v); }
  static float value(device const char* v, thread const DocumentExtras& x, long row, long col) {
    return widen(v[row * x.dim + col]);
  }
  static float scaled(float x, device const char*, thread const DocumentExtras& d, long row) {
    return x * d.scales[row];
  }
};

struct E4M3Format : UnnormalisedRows {
  typedef uchar element;  // the e4m3fn bits
  static float widen(uchar v) { return e4m3fn_to_float(v); }
  static float value(device const uchar* v, thread const DocumentExtras& x, long row, long col) {
    return widen(v[row * x.dim + col]);
  }
  static float scaled(float x, device const uchar*, thread const DocumentExtras& d, long row) {
    return x * d.scales[row];
  }
};

// Element i of a float32 / float16 / bfloat16 buffer whose type is a runtime flag.
inline float load_float(device const uchar* base, int type, long i) {
  if (type == kMaxsimFloat16) return float(reinterpret_cast<device const half*>(base)[i]);
  if (type == kMaxsimBFloat16) return float(reinterpret_cast<device const bfloat*>(base)[i]);
  return reinterpret_cast<device const float*>(base)[i];
}

// ColBERTv2 / PLAID residuals: row j is centroid codes[j] plus, per dimension, the bucket
// weight its nbits-bit bucket id selects; t = centroid + weight is summed in float32 and
// rounded once to the queries' type T (the CPU and CUDA backends' contract). The row's
// bits form one stream, dimension k at bits [k * nbits, (k + 1) * nbits), each byte filled
// from its most significant bit; the bucket id has its bits in the opposite order (lowest
// first), as colbert-ai packs them. A code outside [0, n_centroids) decodes to NaN.
template <typename T> struct ResidualFormat {
  typedef uchar element;  // the packed residual bytes, dim * nbits / 8 per row
  enum { kRowNorm = 1 };
  static float value(device const uchar* bytes, thread const DocumentExtras& x, long row, long col) {
    long code = -1;
    if (!x.codes.get(row, code) || code < 0 || code >= x.n_centroids) return nan_value();
    const long bit = col * x.nbits;
    const uint byte = uint(bytes[row * (x.dim * x.nbits / 8) + bit / 8]);
    const uint field = (byte >> uint(8 - int(bit % 8) - x.nbits)) & ((1u << uint(x.nbits)) - 1u);
    uint bucket = 0;
    for (int b = 0; b < x.nbits; ++b) bucket |= ((field >> uint(x.nbits - 1 - b)) & 1u) << uint(b);
    const float t = load_float(x.centroids, x.centroid_dtype, code * x.dim + col) +
                    load_float(x.bucket_weights, x.weight_dtype, long(bucket));
    return float(T(t));
  }
  // 1 / max(||t||, 1e-12) from the row's sum of squares (1 without normalisation)
  static float factor(float sumsq, thread const DocumentExtras& x) {
    return x.normalize ? precise::divide(1.0f, max(precise::sqrt(sumsq), 1e-12f)) : 1.0f;
  }
  // the backward's factor of one row: its norm recomputed (the forward's is long gone)
  static float scaled(float w, device const uchar* bytes, thread const DocumentExtras& x, long row) {
    if (!x.normalize) return w;
    float sumsq = 0.0f;
    for (long k = 0; k < x.dim; ++k) {
      const float t = value(bytes, x, row, k);
      sumsq += t * t;
    }
    return w * factor(sumsq, x);
  }
};

// tile[r][c] = row (row0 + r), column k0 + c of src as float, for r < rows, k0 + c < dim;
// zero elsewhere. kRows x kMaxsimDimChunk elements, spread over the threadgroup's threads.
template <int kRows, typename Format>
inline void stage_rows(threadgroup float* tile, device const typename Format::element* src,
                       thread const DocumentExtras& x, long row0, long rows, long k0, uint tid) {
  for (uint e = tid; e < uint(kRows * kMaxsimDimChunk); e += kMaxsimThreads) {
    const long r = e / kMaxsimDimChunk, c = k0 + e % kMaxsimDimChunk;
    tile[e] = (r < rows && c < x.dim) ? Format::value(src, x, row0 + r, c) : 0.0f;
  }
}
