// Torch-free MaxSim kernels for the CPU. One forward and one backward family; the
// three surfaces (padded / contrastive / packed) are indexing policies that say, for
// pair p, which query rows and document rows it uses (docs/design.md). Parallelism is
// injected as `parallel_for(begin, end, grain, fn(begin, end))` so this stays torch-free.
//
// Every pair is computed start to finish by one thread and every gradient row has one
// owner, so results are bitwise identical for any thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "maxsim_cpu/microkernel.h"

namespace maxsim_cpu {

// Reads an int32 or int64 index tensor without converting it.
struct IndexView {
  const void* data = nullptr;
  int64_t size = 0;
  bool is64 = true;
  int64_t operator[](int64_t i) const {
    return is64 ? static_cast<const int64_t*>(data)[i] : static_cast<const int32_t*>(data)[i];
  }
};

inline int64_t clamp_len(int64_t v, int64_t hi) { return std::min(std::max<int64_t>(v, 0), hi); }

// The rows a pair uses. A pair with out-of-range ids/offsets has ok == false: it gets a
// NaN score, argmax -1 and no gradient.
struct PairSpec {
  bool ok;
  int64_t qrow, qlen;  // first query row (rows of `dim` elements) and valid rows
  int64_t drow, dlen;  // same for the document
};

// ---------------------------------------------------------------------------------
// Policies

struct PaddedPolicy {  // queries [B,Lq,D], documents [B,C,Ld,D]
  int64_t B, C, Lq, Ld;
  IndexView query_lengths, doc_lengths;  // [B], [B*C]
  int64_t num_pairs() const { return B * C; }
  PairSpec pair(int64_t p) const {
    const int64_t b = p / C;
    return {true, b * Lq, clamp_len(query_lengths[b], Lq), p * Ld, clamp_len(doc_lengths[p], Ld)};
  }
};

// Where contrastive document n's rows are: cut from packed rows [T, D] by offsets [Nb+1],
// or row n of a padded [Nb, Ld, D] tensor with lengths [Nb].
struct OffsetDocuments {
  IndexView offsets;
  int64_t T;
  bool rows(int64_t n, int64_t* start, int64_t* len) const {
    const int64_t s = offsets[n], e = offsets[n + 1];
    *start = s;
    *len = e - s;
    return 0 <= s && s <= e && e <= T;
  }
};
struct PaddedDocuments {
  IndexView lengths;
  int64_t Ld;
  bool rows(int64_t n, int64_t* start, int64_t* len) const {
    *start = n * Ld;
    *len = clamp_len(lengths[n], Ld);
    return true;
  }
};

template <class Documents>
struct ContrastiveGrid {  // queries [Nq,Lq,D] against every document
  int64_t Nq, Nb, Lq;
  Documents documents;
  IndexView query_lengths;  // data == nullptr: every query has Lq rows
  int64_t num_pairs() const { return Nq * Nb; }
  PairSpec pair(int64_t p) const {
    const int64_t q = p / Nb, n = p % Nb;
    const int64_t qlen = query_lengths.data ? clamp_len(query_lengths[q], Lq) : Lq;
    int64_t start = 0, len = 0;
    const bool ok = documents.rows(n, &start, &len);
    return {ok, q * Lq, qlen, start, ok ? len : 0};
  }
};
using ContrastivePolicy = ContrastiveGrid<OffsetDocuments>;
using ContrastivePaddedPolicy = ContrastiveGrid<PaddedDocuments>;

struct PackedPolicy {  // queries [Tq,D] cut by offsets [Nq+1]; documents [Td,D] by [Nd+1]
  int64_t Tq, Td;
  IndexView query_offsets, document_offsets, pair_query_ids, pair_document_ids;
  int64_t num_pairs() const { return pair_query_ids.size; }
  static bool segment(const IndexView& offsets, int64_t total, int64_t id, int64_t* s,
                      int64_t* e) {
    if (id < 0 || id >= offsets.size - 1) return false;
    *s = offsets[id];
    *e = offsets[id + 1];
    return 0 <= *s && *s <= *e && *e <= total;
  }
  PairSpec pair(int64_t p) const {
    const int64_t qid = pair_query_ids[p], did = pair_document_ids[p];
    int64_t qs = 0, qe = 0, ds = 0, de = 0;
    const bool ok = segment(query_offsets, Tq, qid, &qs, &qe) &&
                    segment(document_offsets, Td, did, &ds, &de);
    if (!ok) return {false, 0, 0, 0, 0};
    return {true, qs, qe - qs, ds, de - ds};
  }
};

// ---------------------------------------------------------------------------------
// Forward

// Grows, never shrinks; 64-byte aligned by hand (aligned operator new needs macOS 10.13+).
template <class T> struct AlignedBuffer {
  std::unique_ptr<unsigned char[]> raw;
  T* data = nullptr;
  int64_t cap = 0;
  T* get(int64_t n) {
    if (n > cap) {
      raw.reset(new unsigned char[size_t(n) * sizeof(T) + 64]);
      const uintptr_t p = reinterpret_cast<uintptr_t>(raw.get());
      data = reinterpret_cast<T*>((p + 63) & ~uintptr_t(63));
      cap = n;
    }
    return data;
  }
};

inline void write_argmax_row(int32_t* row, int64_t width, int64_t n, const int32_t* arg) {
  if (!row) return;
  const int64_t m = std::min(n, width);
  for (int64_t i = 0; i < m; ++i) row[i] = arg[i];
  for (int64_t i = std::max<int64_t>(m, 0); i < width; ++i) row[i] = -1;
}

// Documents are swept in blocks that every query column chunk passes over while the
// block is still in cache: 8 KiB of floats at dim 128 (L1) when rows must first be widened
// into a buffer, 128 KiB (L2; the microkernel prefetches into L1) when they are read in place.
inline int64_t doc_block_rows(int64_t dim, int64_t bytes) {
  return std::max<int64_t>(16, (bytes / 4 / std::max<int64_t>(dim, 1)) / 8 * 8);
}

// ---------------------------------------------------------------------------------
// Document rows: where the forward and backward read them from. The documents' format is a
// policy of this load (docs/design.md): dense values (the queries' type, or int8 / e4m3 with
// one float32 scale per row) are widened; residual rows are decoded.

template <class DT>
struct DenseRows {
  const DT* values;
  const float* scales;  // compressed: one per row; else null
  int64_t dim;
  static constexpr bool kInPlace = std::is_same_v<DT, float>;
  // Widened: 16 rows at dim 128 (doc_block_rows' floor). 16 KiB blocks timed the same on a
  // 2-core AVX2 host (0.90-1.06x, 2026-11-29, tools/cpu_ab.py).
  static constexpr int64_t kBlockBytes = kInPlace ? 131072 : 4096;
  // Rows [r0, r0 + n) as floats (in place, or widened into buf) and their scales (or null).
  const float* load(int64_t r0, int64_t n, float* buf, float* /*scale_buf*/, const float** row_scales) const {
    *row_scales = scales ? scales + r0 : nullptr;
    if constexpr (kInPlace) {
      return values + r0 * dim;
    } else {
      widen(values + r0 * dim, buf, n * dim);
      return buf;
    }
  }
  // dst[k] += g * scale * v[k] (in that order of products); `tmp` unused.
  template <class Acc>
  void accumulate(int64_t row, Acc g, Acc* dst, float* /*tmp*/) const {
    const Acc ga = scales ? g * Acc(scales[row]) : g;
    const DT* src = values + row * dim;
    for (int64_t k = 0; k < dim; ++k) {
      if constexpr (std::is_same_v<DT, double>) {
        dst[k] += ga * src[k];
      } else {
        dst[k] += ga * Acc(to_float(src[k]));
      }
    }
  }
};

// ColBERTv2 residual rows (torch-ext/maxsim/_residual.py has the format): a row is
// t = round(centroid[code] + bucket_weights[bucket]) (summed in float32, rounded once to the
// queries' type), scored with the factor 1 / max(||t||, 1e-12) when normalising. A code out of
// range decodes to a NaN row (the op has already refused it where it can read values).
enum class Rounding { kFloat, kHalf, kBFloat16 };
enum class CentroidType { kFloat, kHalf, kBFloat16 };

struct ResidualRows {
  IndexView codes;
  const uint8_t* residuals;  // [rows, dim * nbits / 8]
  const void* centroids;     // [n_centroids, dim] of ctype
  CentroidType ctype;
  int64_t n_centroids;
  int nbits;
  bool normalize;
  Rounding rounding;
  int64_t dim;
  // Each byte value's bucket weights in dimension order, 8 / nbits of them (set_weights
  // builds it): a row's weights are one lookup a byte instead of a bit extraction and
  // reversal a dimension.
  float byte_weights[256][8];
  static constexpr bool kInPlace = false;
  static constexpr int64_t kBlockBytes = 4096;

  // weights: the 2**nbits bucket weights. Dimension k's bits start at bit position k * nbits
  // of the row's stream, a byte's most significant bit first; its bucket id has them lowest
  // bit first.
  void set_weights(const float* weights, int nbits_) {
    nbits = nbits_;
    const int per_byte = 8 / nbits;
    const unsigned mask = (1u << nbits) - 1u;
    for (unsigned byte = 0; byte < 256; ++byte) {
      for (int s = 0; s < 8; ++s) byte_weights[byte][s] = 0.f;
      for (int s = 0; s < per_byte; ++s) {
        const unsigned field = (byte >> (8 - (s + 1) * nbits)) & mask;  // stream bits, MSB first
        unsigned bucket = 0;
        for (int j = 0; j < nbits; ++j) bucket |= ((field >> (nbits - 1 - j)) & 1u) << j;
        byte_weights[byte][s] = weights[bucket];
      }
    }
  }

  // out[k] = round(centroid[k] + out[k]) with the centroid type and rounding fixed, so that
  // the loop has no switch in it.
  template <class Load, class Round>
  void add_centroid(const Load& load, const Round& round, float* out) const {
    for (int64_t k = 0; k < dim; ++k) out[k] = round(load(k) + out[k]);
  }
  template <class Load>
  void add_centroid(const Load& load, float* out) const {
    switch (rounding) {
      case Rounding::kHalf:  // the sums first, then one rounding pass (F16C where there is one)
        add_centroid(load, [](float v) { return v; }, out);
        return round_to_half(out, dim);
      case Rounding::kBFloat16:
        return add_centroid(load, [](float v) { return bf16_bits_to_float(float_to_bf16_bits(v)); }, out);
      default: return add_centroid(load, [](float v) { return v; }, out);
    }
  }

  // Row `row` into out[dim]; returns its factor.
  float decode(int64_t row, float* out) const {
    const int64_t c = codes[row];
    if (c < 0 || c >= n_centroids) {
      for (int64_t k = 0; k < dim; ++k) out[k] = std::numeric_limits<float>::quiet_NaN();
      return std::numeric_limits<float>::quiet_NaN();
    }
    const int per_byte = 8 / nbits;
    const uint8_t* bytes = residuals + row * (dim / per_byte);
    for (int64_t b = 0; b < dim / per_byte; ++b)
      std::memcpy(out + b * per_byte, byte_weights[bytes[b]], sizeof(float) * per_byte);
    switch (ctype) {
      case CentroidType::kHalf: {
        const uint16_t* cr = static_cast<const uint16_t*>(centroids) + c * dim;
        add_centroid([cr](int64_t k) { return half_bits_to_float(cr[k]); }, out);
        break;
      }
      case CentroidType::kBFloat16: {
        const uint16_t* cr = static_cast<const uint16_t*>(centroids) + c * dim;
        add_centroid([cr](int64_t k) { return bf16_bits_to_float(cr[k]); }, out);
        break;
      }
      default: {
        const float* cr = static_cast<const float*>(centroids) + c * dim;
        add_centroid([cr](int64_t k) { return cr[k]; }, out);
      }
    }
    if (!normalize) return 1.f;
    // Four chains (dim is a multiple of 8): a square of a float is exact in double, so only
    // the sums round, and a single chain was the decode's critical path.
    double part[4] = {0.0, 0.0, 0.0, 0.0};
    for (int64_t k = 0; k < dim; k += 4)
      for (int j = 0; j < 4; ++j) part[j] += double(out[k + j]) * double(out[k + j]);
    const double norm = std::sqrt((part[0] + part[1]) + (part[2] + part[3]));
    return float(1.0 / std::max(norm, 1e-12));
  }

  const float* load(int64_t r0, int64_t n, float* buf, float* scale_buf, const float** row_scales) const {
    for (int64_t i = 0; i < n; ++i) scale_buf[i] = decode(r0 + i, buf + i * dim);
    *row_scales = scale_buf;
    return buf;
  }

  template <class Acc>
  void accumulate(int64_t row, Acc g, Acc* dst, float* tmp) const {
    const Acc ga = g * Acc(decode(row, tmp));
    for (int64_t k = 0; k < dim; ++k) dst[k] += ga * Acc(tmp[k]);
  }
};

// Per-thread scratch of the float32 forward, reused across the pairs of a chunk.
struct ForwardScratch {
  AlignedBuffer<float> qT, best, doc, row, scale;
  AlignedBuffer<uint32_t> qT_pairs;
  AlignedBuffer<int32_t> arg;
  int64_t cached_row = -1, cached_len = -1;
};

// float32 / float16 / bfloat16 queries: float32 microkernel on widened data, or the bfloat16
// dot-product microkernel on the raw data where the CPU has one. Rows (DenseRows or
// ResidualRows above) gives the document rows as floats and their scales, if any, which
// multiply each similarity before the max.
template <class T, class Rows, class Policy, class ParallelFor>
void forward_f32(const Policy& pol, const T* queries, const Rows& docs, int64_t dim, float* scores,
                 int32_t* argmax, int64_t argmax_width, ParallelFor&& parallel_for) {
  bool bf16_dot = false;
  if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<Rows, DenseRows<T>>)
    bf16_dot = dim % 2 == 0 && has_bf16_dot();
  const int64_t block = doc_block_rows(dim, bf16_dot ? 131072 : Rows::kBlockBytes);
  parallel_for(int64_t(0), pol.num_pairs(), int64_t(1), [&](int64_t begin, int64_t end) {
    ForwardScratch w;
    const float inf = std::numeric_limits<float>::infinity();
    for (int64_t p = begin; p < end; ++p) {
      const PairSpec s = pol.pair(p);
      int32_t* arow = argmax ? argmax + p * argmax_width : nullptr;
      if (!s.ok || s.qlen == 0 || s.dlen == 0) {
        scores[p] = !s.ok ? std::numeric_limits<float>::quiet_NaN() : s.qlen == 0 ? 0.f : -inf;
        write_argmax_row(arow, argmax_width, 0, nullptr);
        continue;
      }
      // Query as columns [k][i], padded with zero columns to ldq (finite padding lanes);
      // rebuilt only when the pair's query differs from the previous pair's.
      const int64_t ldq = (s.qlen + kColumnQuantum - 1) / kColumnQuantum * kColumnQuantum;
      const int64_t kpairs = dim / 2;
      float* qT = bf16_dot ? nullptr : w.qT.get(std::max<int64_t>(dim * ldq, 1));
      uint32_t* qP = bf16_dot ? w.qT_pairs.get(std::max<int64_t>(kpairs * ldq, 1)) : nullptr;
      if (s.qrow != w.cached_row || s.qlen != w.cached_len) {
        if (bf16_dot) {
          const uint16_t* q = reinterpret_cast<const uint16_t*>(queries) + s.qrow * dim;
          std::fill(qP, qP + kpairs * ldq, 0u);
          for (int64_t i = 0; i < s.qlen; ++i, q += dim)
            for (int64_t k = 0; k < kpairs; ++k)
              qP[k * ldq + i] = uint32_t(q[2 * k]) | (uint32_t(q[2 * k + 1]) << 16);
        } else {
          float* row = w.row.get(std::max<int64_t>(dim, 1));
          std::fill(qT, qT + dim * ldq, 0.f);
          for (int64_t i = 0; i < s.qlen; ++i) {
            widen(queries + (s.qrow + i) * dim, row, dim);
            for (int64_t k = 0; k < dim; ++k) qT[k * ldq + i] = row[k];
          }
        }
        w.cached_row = s.qrow;
        w.cached_len = s.qlen;
      }
      float* best = w.best.get(ldq);
      int32_t* arg = w.arg.get(ldq);
      std::fill(best, best + ldq, -inf);
      std::fill(arg, arg + ldq, 0);  // all similarities -inf: index 0, as torch.max
      for (int64_t j0 = 0; j0 < s.dlen; j0 += block) {
        const int64_t n = std::min(block, s.dlen - j0);
        if constexpr (std::is_same_v<Rows, DenseRows<T>>) {
          if (bf16_dot) {
            const T* src = docs.values + (s.drow + j0) * dim;
            sweep_bf16({qP, ldq, ldq, kpairs, reinterpret_cast<const uint16_t*>(src), dim, n,
                        int32_t(j0), best, arg});
            continue;
          }
        }
        float* buf = Rows::kInPlace ? nullptr : w.doc.get(std::max<int64_t>(block * dim, 1));
        float* scale_buf = w.scale.get(block);
        const float* row_scales = nullptr;
        const float* rows = docs.load(s.drow + j0, n, buf, scale_buf, &row_scales);
        sweep({qT, ldq, ldq, dim, rows, dim, n, int32_t(j0), best, arg, row_scales});
      }
      float total = 0.f;
      for (int64_t i = 0; i < s.qlen; ++i) total += best[i];
      scores[p] = total;
      write_argmax_row(arow, argmax_width, s.qlen, arg);
    }
  });
}

// float64 (scores in float64 too, for gradcheck): accumulated in double, a plain loop.
template <class Policy, class ParallelFor>
void forward_f64(const Policy& pol, const double* queries, const double* documents,
                 int64_t dim, double* scores, int32_t* argmax, int64_t argmax_width,
                 ParallelFor&& parallel_for) {
  parallel_for(int64_t(0), pol.num_pairs(), int64_t(1), [&](int64_t begin, int64_t end) {
    std::vector<int32_t> arg;
    for (int64_t p = begin; p < end; ++p) {
      const PairSpec s = pol.pair(p);
      int32_t* arow = argmax ? argmax + p * argmax_width : nullptr;
      if (!s.ok || s.qlen == 0 || s.dlen == 0) {
        scores[p] = !s.ok ? std::numeric_limits<double>::quiet_NaN()
                    : s.qlen == 0 ? 0.0
                                  : -std::numeric_limits<double>::infinity();
        write_argmax_row(arow, argmax_width, 0, nullptr);
        continue;
      }
      arg.assign(size_t(s.qlen), 0);
      double total = 0.0;
      for (int64_t i = 0; i < s.qlen; ++i) {
        const double* q = queries + (s.qrow + i) * dim;
        double best = -std::numeric_limits<double>::infinity();
        // Four documents rows at a time: four independent sums instead of one chain.
        for (int64_t j0 = 0; j0 < s.dlen; j0 += 4) {
          const double* d[4];
          for (int r = 0; r < 4; ++r)
            d[r] = documents + (s.drow + std::min<int64_t>(j0 + r, s.dlen - 1)) * dim;
          double acc[4] = {0.0, 0.0, 0.0, 0.0};
          for (int64_t k = 0; k < dim; ++k)
            for (int r = 0; r < 4; ++r) acc[r] += q[k] * d[r][k];
          for (int r = 0; r < 4 && j0 + r < s.dlen; ++r) {
            if (acc[r] > best || (std::isnan(acc[r]) && !std::isnan(best))) {
              best = acc[r];
              arg[size_t(i)] = int32_t(j0 + r);
            }
          }
        }
        total += best;
      }
      scores[p] = total;
      write_argmax_row(arow, argmax_width, s.qlen, arg.data());
    }
  });
}

// ---------------------------------------------------------------------------------
// Backward: grad_q[i] += g_p * d[argmax_i], grad_d[argmax_i] += g_p * q_i.
//
// An owner (a query or a document segment) accumulates all its contributions into a
// private float32 (float64) buffer, pairs in the owner's listed order and rows in
// increasing i, then writes its output rows. Owners are independent, so they run in
// parallel; if segments could overlap (offsets not monotone) the owners run serially
// so the result is still race-free and deterministic.
//
// An Owners policy provides: count(), rows(o, &row0, &nrows) -> bool (false: no
// gradient), num_pairs(o), pair_at(o, t) -> pair index or -1, disjoint(), and
// tiles_output(): the owners' rows are exactly all rows of the output. Then `out` may
// be uninitialised and every owner stores all its rows (zeroing a large grad_documents
// first would cost as much as the backward itself); otherwise `out` starts at zero and
// owners add the rows they touched.

template <class T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

template <class T> inline typename AccOf<T>::type load_acc(T v) { return to_float(v); }
inline double load_acc(double v) { return v; }
template <class T> inline T store_acc(typename AccOf<T>::type v) { return from_float<T>(v); }
template <> inline double store_acc<double>(double v) { return v; }

// Compressed and residual documents (Rows other than DenseRows<T>) reach grad_queries only:
// grad_q[i] += g_p * scale[a] * v[a] (in that order of products; Rows::accumulate).
template <bool kToQuery, class T, class Rows, class Policy, class Owners, class ParallelFor>
void backward_owned(const Policy& pol, const Owners& owners,
                    const typename AccOf<T>::type* grad_scores,
                    const T* queries, const Rows& docs, int64_t dim,
                    const int32_t* argmax, int64_t argmax_width, T* out,
                    ParallelFor&& parallel_for) {
  static_assert(kToQuery || std::is_same_v<Rows, DenseRows<T>>, "compressed documents get no gradient");
  using Acc = typename AccOf<T>::type;
  const int64_t count = owners.count();
  const int64_t grain = owners.disjoint() ? 1 : std::max<int64_t>(count, 1);
  parallel_for(int64_t(0), count, grain, [&](int64_t begin, int64_t end) {
    std::vector<Acc> acc;
    std::vector<float> tmp(size_t(std::max<int64_t>(dim, 1)));
    for (int64_t o = begin; o < end; ++o) {
      int64_t row0 = 0, nrows = 0;
      if (!owners.rows(o, &row0, &nrows) || nrows == 0) continue;
      acc.assign(size_t(nrows * dim), Acc(0));
      bool touched = owners.tiles_output();  // must store even an all-zero owner
      const int64_t npairs = owners.num_pairs(o);
      for (int64_t t = 0; t < npairs; ++t) {
        const int64_t p = owners.pair_at(o, t);
        if (p < 0) continue;
        const PairSpec s = pol.pair(p);
        if (!s.ok) continue;
        // The pair must really use this owner's rows (guards inconsistent CSR inputs).
        if (kToQuery ? (s.qrow != row0 || s.qlen > nrows) : (s.drow != row0 || s.dlen > nrows))
          continue;
        const Acc g = Acc(grad_scores[p]);
        const int32_t* arow = argmax + p * argmax_width;
        const int64_t m = std::min(s.qlen, argmax_width);
        for (int64_t i = 0; i < m; ++i) {
          const int64_t a = arow[i];
          if (a < 0 || a >= s.dlen) continue;  // never trust argmax for bounds
          Acc* dst = acc.data() + (kToQuery ? i : a) * dim;
          if constexpr (kToQuery) {
            docs.accumulate(s.drow + a, g, dst, tmp.data());
          } else {
            const T* src = queries + (s.qrow + i) * dim;
            for (int64_t k = 0; k < dim; ++k) dst[k] += g * load_acc(src[k]);
          }
          touched = true;
        }
      }
      if (!touched) continue;
      T* dst = out + row0 * dim;
      if (owners.tiles_output()) {
        for (int64_t e = 0; e < nrows * dim; ++e) dst[e] = store_acc<T>(acc[size_t(e)]);
      } else {
        for (int64_t e = 0; e < nrows * dim; ++e)
          dst[e] = store_acc<T>(load_acc(dst[e]) + acc[size_t(e)]);
      }
    }
  });
}

// Owners with a fixed stride: owner o owns rows [o*L, o*L+L) and pairs
// o*pair_base_mul + t*step for t < n (padded queries: b*C + c; contrastive queries:
// q*Nb + n; padded contrastive documents: q*Nb + n over q).
struct StridedOwners {
  int64_t n_owners, rows_per_owner, pairs_per_owner, pair_base_mul, pair_step;
  int64_t count() const { return n_owners; }
  bool rows(int64_t o, int64_t* r0, int64_t* n) const {
    *r0 = o * rows_per_owner;
    *n = rows_per_owner;
    return true;
  }
  int64_t num_pairs(int64_t) const { return pairs_per_owner; }
  int64_t pair_at(int64_t o, int64_t t) const { return o * pair_base_mul + t * pair_step; }
  bool disjoint() const { return true; }
  bool tiles_output() const { return true; }
};

inline bool offsets_monotone(const IndexView& off) {
  for (int64_t i = 0; i + 1 < off.size; ++i)
    if (off[i] > off[i + 1]) return false;
  return true;
}

// Owners cut by an offsets array (contrastive documents: pairs q*Nb + n over q).
struct OffsetOwnersStrided {
  IndexView offsets;
  int64_t total_rows, pairs_per_owner, pair_step;
  bool monotone;
  int64_t count() const { return offsets.size - 1; }
  bool rows(int64_t o, int64_t* r0, int64_t* n) const {
    const int64_t s = offsets[o], e = offsets[o + 1];
    if (!(0 <= s && s <= e && e <= total_rows)) return false;
    *r0 = s;
    *n = e - s;
    return true;
  }
  int64_t num_pairs(int64_t) const { return pairs_per_owner; }
  int64_t pair_at(int64_t o, int64_t t) const { return o + t * pair_step; }
  bool disjoint() const { return monotone; }
  bool tiles_output() const { return false; }
};

// Packed owners: segment from offsets, pairs from a CSR (pairs_by_x, x_pair_offsets).
// pair_at returns -1 unless the listed pair really belongs to this owner.
struct PackedOwners {
  IndexView offsets;            // [N+1] row offsets
  int64_t total_rows;
  IndexView pairs_by, pair_offsets;  // [P], [N+1]
  IndexView pair_ids;           // pair_query_ids or pair_document_ids
  bool monotone;
  int64_t count() const { return std::min(offsets.size, pair_offsets.size) - 1; }
  bool rows(int64_t o, int64_t* r0, int64_t* n) const {
    int64_t e = 0;
    if (!PackedPolicy::segment(offsets, total_rows, o, r0, &e)) return false;
    *n = e - *r0;
    return true;
  }
  bool csr(int64_t o, int64_t* s, int64_t* e) const {
    *s = pair_offsets[o];
    *e = pair_offsets[o + 1];
    return 0 <= *s && *s <= *e && *e <= pairs_by.size;
  }
  int64_t num_pairs(int64_t o) const {
    int64_t s, e;
    return csr(o, &s, &e) ? e - s : 0;
  }
  int64_t pair_at(int64_t o, int64_t t) const {
    int64_t s, e;
    csr(o, &s, &e);
    const int64_t p = pairs_by[s + t];
    if (p < 0 || p >= pair_ids.size || pair_ids[p] != o) return -1;
    return p;
  }
  bool disjoint() const { return monotone; }
  bool tiles_output() const { return false; }
};

// ---------------------------------------------------------------------------------
// PLAID's centroid-only score: score(q, d) = sum_{i < qlen} max_j table[q, code_j, i], with
// table [Nq, n_centroids, Lq] = the query tokens' similarities to every centroid (computed
// once per query by the caller). Pairs are every query x every document (pair_query_ids
// null) or listed. A pair whose ids or offsets are out of range scores NaN; a code out of range
// makes its token's similarities NaN (the op refuses such codes first where it reads values).
struct CentroidPairs {
  int64_t Nq, Nb;
  IndexView query_lengths;  // data null: Lq each
  IndexView offsets;        // [Nb + 1] into codes
  IndexView pair_query_ids, pair_document_ids;  // data null: every query x every document
  int64_t num_pairs() const { return pair_query_ids.data ? pair_query_ids.size : Nq * Nb; }
};

template <class ParallelFor>
void centroid_scores(const CentroidPairs& pol, const float* table, int64_t n_centroids, int64_t Lq,
                     IndexView codes, float* scores, ParallelFor&& parallel_for) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  parallel_for(int64_t(0), pol.num_pairs(), int64_t(16), [&](int64_t begin, int64_t end) {
    std::vector<float> best(size_t(std::max<int64_t>(Lq, 1)));
    for (int64_t p = begin; p < end; ++p) {
      int64_t q = p / std::max<int64_t>(pol.Nb, 1), n = p % std::max<int64_t>(pol.Nb, 1);
      if (pol.pair_query_ids.data) {
        q = pol.pair_query_ids[p];
        n = pol.pair_document_ids[p];
        if (q < 0 || q >= pol.Nq || n < 0 || n >= pol.Nb) {
          scores[p] = nan;
          continue;
        }
      }
      const int64_t s = pol.offsets[n], e = pol.offsets[n + 1];
      if (!(0 <= s && s <= e && e <= codes.size)) {
        scores[p] = nan;
        continue;
      }
      const int64_t qlen = pol.query_lengths.data ? clamp_len(pol.query_lengths[q], Lq) : Lq;
      if (qlen == 0 || e == s) {
        scores[p] = qlen == 0 ? 0.f : -inf;
        continue;
      }
      std::fill(best.begin(), best.begin() + qlen, -inf);
      for (int64_t j = s; j < e; ++j) {
        const int64_t c = codes[j];
        if (c < 0 || c >= n_centroids) {
          std::fill(best.begin(), best.begin() + qlen, nan);
          break;
        }
        const float* row = table + (q * n_centroids + c) * Lq;
        for (int64_t i = 0; i < qlen; ++i) {
          const float x = row[i];
          if (x > best[size_t(i)] || (std::isnan(x) && !std::isnan(best[size_t(i)]))) best[size_t(i)] = x;
        }
      }
      float total = 0.f;
      for (int64_t i = 0; i < qlen; ++i) total += best[size_t(i)];
      scores[p] = total;
    }
  });
}

}  // namespace maxsim_cpu
