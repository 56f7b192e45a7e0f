// grad_queries: row (query, i) is owned by one warp, which adds g_p * d[argmax_p, i] over
// the query's pairs (padded c = 0..C-1, contrastive n = 0..Nb-1, packed through
// pairs_by_query / query_pair_offsets): kQSlots interleaved running sums in pair order,
// added in a fixed tree at the end. Compressed documents (F, doc_format.cuh): the weight is
// g_p * scale[row] and the row's bytes are widened to their exact values,
// grad_q[i] += (g_p * scale[a_i]) * v[a_i]. Residual documents: the row is decoded as the
// forward decodes it (centroid + bucket weights, rounded to T), the weight is g_p / ||row||.
// Torch-free.
#pragma once

#include <cstdint>

#include "backward_args.cuh"
#include "doc_format.cuh"
#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

// ---- residual rows (DocFormat::kResidual; see doc_format.cuh) ----

template <class T, class Acc>
__device__ __forceinline__ bool residual_code_of(const BwdArgs<T, Acc>& a, int64_t row, int64_t& code) {
  code = a.res.codes_is64 ? __ldg(static_cast<const long long*>(a.res.codes) + row)
                          : int64_t(__ldg(static_cast<const int*>(a.res.codes) + row));
  return code >= 0 && code < a.res.n_centroids;
}

// Elements [e, e + 8) of decoded row `row` (code valid, e a multiple of 8, e < dim) into
// out[0, 8): round_T(centroid + weight), the float32 sum rounded once (for float32 queries no
// rounding). kRowsOfT: the centroids are 16-bit rows of T on 16-byte boundaries (launch.h's
// residual_rows_of: one vector load a chunk); else any dtype, any address.
template <bool kRowsOfT, class T, class Acc>
__device__ __forceinline__ void residual_chunk(const BwdArgs<T, Acc>& a, int64_t row, int64_t code, int64_t e,
                                               T* out) {
  const int nbits = a.res.nbits;
  const uint8_t* src = a.d_bytes + row * (a.dim * nbits / 8) + e * nbits / 8;
  uint32_t bits = 0;
  for (int b = 0; b < nbits; ++b) bits |= uint32_t(__ldg(src + b)) << (24 - 8 * b);
  if constexpr (kRowsOfT) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(a.res.centroids) + code * a.dim + e));
    const T* el = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      out[j] = float_to_half<T>(half_to_float(el[j]) + residual_weight(a.res, residual_bucket(bits, j, nbits)));
  } else {
    float c[8];
    residual_centroid8(a.res, code * a.dim + e, c);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = from_acc<T, float>(c[j] + residual_weight(a.res, residual_bucket(bits, j, nbits)));
  }
}

// 1 / max(||row||, 1e-12) of the decoded row (1 without normalising; NaN for a bad code).
template <bool kRowsOfT, class T, class Acc>
__device__ __forceinline__ float residual_factor(const BwdArgs<T, Acc>& a, int64_t row) {
  int64_t code;
  if (!residual_code_of(a, row, code)) return __int_as_float(0x7fc00000);
  if (!a.res.normalize) return 1.f;
  float ss = 0.f;
  for (int64_t e = 0; e < a.dim; e += 8) {
    T el[8];
    residual_chunk<kRowsOfT>(a, row, code, e, el);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float v = to_acc<float>(el[j]);
      ss = fmaf(v, v, ss);
    }
  }
  return 1.f / fmaxf(sqrtf(ss), 1e-12f);
}

// For query row (query `qq`, row i) and its k-th pair: weight and the document row to
// gather (-1 when the entry contributes nothing).
template <int SURF, class T, class Acc, DocFormat F = DocFormat::kNative, bool kRowsOfT = false>
struct QuerySide {
  const BwdArgs<T, Acc>& a;
  int64_t qq, i;
  int64_t k0;  // packed: first index into pairs_by_query

  // No early returns: every read of a pair is independent of the other pairs' reads, so
  // the caller's unrolled loop keeps all of them in flight.
  __device__ __forceinline__ void get(int64_t k, Acc& w, int64_t& row) const {
    bool ok;
    int64_t p, drow0, dlen;
    if (SURF == 0) {
      p = qq * a.C + k;
      dlen = clamp64(a.dlens.fetch(p, ok), 0, a.Ld);
      drow0 = p * a.Ld;
    } else if (SURF == 3) {
      p = qq * a.nd + k;
      dlen = clamp64(a.dlens.fetch(k, ok), 0, a.Ld);
      drow0 = k * a.Ld;
    } else if (SURF == 1) {
      p = qq * a.nd + k;
      bool ok1;
      const int64_t o0 = a.doffs.fetch(k, ok), o1 = a.doffs.fetch(k + 1, ok1);
      ok = ok && ok1 && o0 >= 0 && o1 >= o0 && o1 <= a.d_rows;
      drow0 = o0;
      dlen = o1 - o0;
    } else {
      bool ok1, ok2, ok3, ok4;
      p = a.pbq.fetch(k0 + k, ok);
      ok = ok && p >= 0 && p < a.pairs;
      p = ok ? p : 0;
      const int64_t qid = a.pqids.fetch(p, ok1), did = a.pdids.fetch(p, ok2);
      ok = ok && ok1 && ok2 && qid == qq && did >= 0 && did < a.nd;
      const int64_t dc = ok ? did : 0;
      const int64_t o0 = a.doffs.fetch(dc, ok3), o1 = a.doffs.fetch(dc + 1, ok4);
      ok = ok && ok3 && ok4 && o0 >= 0 && o1 >= o0 && o1 <= a.d_rows;
      drow0 = o0;
      dlen = o1 - o0;
    }
    const int64_t am = __ldg(a.argmax + p * a.W + i);
    const Acc gw = __ldg(a.g + p);
    ok = ok && am >= 0 && am < dlen;
    row = ok ? drow0 + am : -1;
    if constexpr (is_compressed<F>()) {
      w = ok ? gw * Acc(__ldg(a.d_scales + row)) : Acc(0);
    } else if constexpr (F == DocFormat::kResidual) {
      w = ok ? gw * Acc(residual_factor<kRowsOfT>(a, row)) : Acc(0);
    } else {
      w = ok ? gw : Acc(0);
    }
  }
};

constexpr int kQWarps = 4;  // warps (query rows) per CTA
// A warp gathers kQSlots pairs at a time, kQLanes lanes each: lane (slot j, column group c)
// reads kQCols adjacent elements of its pair's document row, 16 bytes per load, so one
// load instruction moves 512 bytes for the warp. Slot j walks pairs j, j + kQSlots, ...;
// the slots' partial sums are added at the end in a fixed tree (deterministic). ncu, the
// one-pair-per-warp loop it replaces (8-byte loads, 8 rows in flight): long-scoreboard
// stalls 69%, L2 throughput 12% (BigColBERT).
constexpr int kQSlots = 4, kQLanes = 8, kQCols = 16;
constexpr int kQPass = kQLanes * kQCols;  // columns per pass over the pairs
// Pairs per slot gathered before their adds (device code only: it depends on the target).
// 16-bit rows on sm_90: 8, a slot's whole batch, 64 registers of row data in flight (the
// gathers wait on L2 latency; with 4, the second group's loads waited for the first group's
// adds: BigColBERT grad_queries 0.377 -> 0.350 ms on an H100); before sm_90 4, as 8 spills
// 4-8 bytes there. Wider rows fewer (32 registers); byte and residual rows 4 (their widening
// or decoding needs the registers: 8 spilled 4-120 bytes); residual rows decoded from centroids
// of any dtype and address 2 (their float32 staging: 4 spilled 4-116 bytes at sm_80 / sm_90a).
template <class DocT, DocFormat F, bool kRowsOfT>
__device__ constexpr int q_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kNative16 = 8;
#else
  constexpr int kNative16 = 4;
#endif
  if constexpr (F == DocFormat::kResidual) return kRowsOfT ? 4 : 2;
  return F != DocFormat::kNative ? 4 : (sizeof(DocT) <= 2 ? kNative16 : (sizeof(DocT) == 4 ? 2 : 1));
}

// kQCols elements of one row from `row + e` as raw 16-byte vectors (zeros past dim; element
// by element when the row is not 16-byte aligned).
template <class T>
struct RowSlice {
  static constexpr int kVecs = kQCols * sizeof(T) / 16;
  uint4 v[kVecs];
  __device__ __forceinline__ void load(const T* row, int64_t e, int64_t dim, bool vec_ok) {
    if (vec_ok && e + kQCols <= dim) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) v[k] = __ldg(reinterpret_cast<const uint4*>(row + e) + k);
    } else {
      T* el = reinterpret_cast<T*>(v);
#pragma unroll
      for (int k = 0; k < kQCols; ++k) el[k] = e + k < dim ? row[e + k] : T{};
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) v[k] = make_uint4(0u, 0u, 0u, 0u);
  }
  template <class Acc>
  __device__ __forceinline__ Acc at(int k) const {
    return to_acc<Acc>(reinterpret_cast<const T*>(v)[k]);
  }
};

// kQCols one-byte values of a compressed row: one 16-byte vector, widened per element.
template <DocFormat F>
struct RowBytes {
  uint4 v;
  __device__ __forceinline__ void load(const uint8_t* row, int64_t e, int64_t dim, bool vec_ok) {
    if (vec_ok && e + kQCols <= dim) {
      v = __ldg(reinterpret_cast<const uint4*>(row + e));
    } else {
      uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int k = 0; k < kQCols; ++k) {
        if (e + k < dim) w[k / 4] |= uint32_t(__ldg(row + e + k)) << (8 * (k % 4));
      }
      v = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  __device__ __forceinline__ void zero() { v = make_uint4(0u, 0u, 0u, 0u); }
  template <class Acc>
  __device__ __forceinline__ Acc at(int k) const {
    const uint32_t w = k < 4 ? v.x : (k < 8 ? v.y : (k < 12 ? v.z : v.w));
    return static_cast<Acc>(byte_to_float<F>((w >> (8 * (k % 4))) & 0xffu));
  }
};

// kQCols decoded values of a residual row (kQCols a multiple of 8, dim too): the slice of T,
// loaded by decoding instead of copying.
template <class T, bool kRowsOfT>
struct RowResidual : RowSlice<T> {
  template <class Acc>
  __device__ __forceinline__ void load(const BwdArgs<T, Acc>& a, int64_t row, int64_t e) {
    int64_t code;
    const bool ok = residual_code_of(a, row, code);
    T* el = reinterpret_cast<T*>(this->v);
#pragma unroll
    for (int k = 0; k < kQCols / 8; ++k) {
      const int64_t ek = e + k * 8;
      if (ok && ek < a.dim) {
        residual_chunk<kRowsOfT>(a, row, code, ek, el + 8 * k);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) el[8 * k + j] = T{};
      }
    }
  }
};

// kRowsOfT: residual documents only, see residual_chunk.
template <int SURF, class T, class Acc, DocFormat F = DocFormat::kNative, bool kRowsOfT = false>
__global__ void __launch_bounds__(kQWarps * 32, 4) grad_queries_kernel(const BwdArgs<T, Acc> a, int64_t rows) {
  using Row = std::conditional_t<F == DocFormat::kResidual, RowResidual<T, kRowsOfT>,
                                 std::conditional_t<is_compressed<F>(), RowBytes<F>, RowSlice<T>>>;
  using DocT = DocElem<T, F>;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kQWarps + threadIdx.x / 32;
  if (row >= rows) return;
  int64_t qq, i, qlen, out_row, npairs, k0 = 0;
  if (SURF == 0) {
    qq = row / a.Lq;
    i = row - qq * a.Lq;
    qlen = query_len_padded(a, qq);
    out_row = row;
    npairs = a.C;
  } else if (is_contrastive(SURF)) {
    qq = row / a.Lq;
    i = row - qq * a.Lq;
    qlen = query_len_contrastive(a, qq);
    out_row = row;
    npairs = a.nd;
  } else {
    qq = row / a.W;
    i = row - qq * a.W;
    int64_t q0, k1;
    if (!segment(a.qoffs, qq, a.nq, a.q_rows, q0, qlen)) return;  // rows stay zero
    if (i >= qlen) return;
    out_row = q0 + i;
    if (!a.qpo.get(qq, k0) || !a.qpo.get(qq + 1, k1) || k0 < 0 || k1 < k0 || k1 > a.pbq.size) {
      k0 = 0;
      npairs = 0;
    } else {
      npairs = k1 - k0;
    }
  }
  const bool live = i < qlen;
  const QuerySide<SURF, T, Acc, F, kRowsOfT> src{a, qq, i, k0};
  T* out = a.grad_q + out_row * a.dim;
  const int slot = lane / kQLanes, cgroup = lane % kQLanes;
  const DocT* docs;
  if constexpr (is_compressed<F>() || F == DocFormat::kResidual) {
    docs = a.d_bytes;
  } else {
    docs = a.d;
  }
  // 16-byte vectors need every row start 16-byte aligned
  const bool vec_ok = (a.dim * int64_t(sizeof(DocT))) % 16 == 0 && (reinterpret_cast<uintptr_t>(docs) & 15) == 0;
  for (int64_t e0 = 0; e0 < a.dim; e0 += kQPass) {
    const int64_t e = e0 + int64_t(cgroup) * kQCols;
    Acc acc[kQCols];
#pragma unroll
    for (int k = 0; k < kQCols; ++k) acc[k] = Acc(0);
    // 32 pairs a batch: lane l reads pair base + l's index data one batch ahead, then the
    // slots walk the batch, each gathering kQGroup rows before adding them.
    Acc my_w = Acc(0);
    int64_t my_row = -1;
    if (live && lane < npairs) src.get(lane, my_w, my_row);
    for (int64_t base = 0; live && base < npairs; base += 32) {
      Acc next_w = Acc(0);
      int64_t next_row = -1;
      if (base + 32 + lane < npairs) src.get(base + 32 + lane, next_w, next_row);
      const int n = npairs - base < 32 ? static_cast<int>(npairs - base) : 32;
      constexpr int kQGroup = q_group<DocT, F, kRowsOfT>();
      for (int g0 = 0; g0 < 32 / kQSlots; g0 += kQGroup) {
        Row x[kQGroup];
#pragma unroll
        for (int u = 0; u < kQGroup; ++u) {
          const int pl = (g0 + u) * kQSlots + slot;
          const int64_t row = __shfl_sync(0xffffffffu, my_row, pl);
          if (pl < n && row >= 0) {
            if constexpr (F == DocFormat::kResidual) {
              x[u].load(a, row, e);
            } else {
              x[u].load(docs + row * a.dim, e, a.dim, vec_ok);
            }
          } else {
            x[u].zero();
          }
        }
#pragma unroll
        for (int u = 0; u < kQGroup; ++u) {
          const int pl = (g0 + u) * kQSlots + slot;
          Acc w = __shfl_sync(0xffffffffu, my_w, pl);
          w = pl < n ? w : Acc(0);
#pragma unroll
          for (int k = 0; k < kQCols; ++k) acc[k] += w * x[u].template at<Acc>(k);
        }
      }
      my_w = next_w;
      my_row = next_row;
    }
    // (slot 0 + slot 1) + (slot 2 + slot 3): the same value on every lane.
#pragma unroll
    for (int k = 0; k < kQCols; ++k) {
      acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], kQLanes);
      acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], 2 * kQLanes);
    }
    if (slot == 0) {
#pragma unroll
      for (int k = 0; k < kQCols; ++k) {
        if (e + k < a.dim) out[e + k] = from_acc<T, Acc>(acc[k]);
      }
    }
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
