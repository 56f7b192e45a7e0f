// grad_queries: row (query, i) is owned by one warp, which adds g_p * d[argmax_p, i] over
// the query's pairs in increasing pair order (padded c = 0..C-1, contrastive n = 0..Nb-1,
// packed through pairs_by_query / query_pair_offsets). Torch-free.
#pragma once

#include <cstdint>

#include "backward_args.cuh"
#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

// For query row (query `qq`, row i) and its k-th pair: weight and the document row to
// gather (-1 when the entry contributes nothing).
template <int SURF, class T, class Acc>
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
    w = ok ? gw : Acc(0);
    row = ok ? drow0 + am : -1;
  }
};

constexpr int kQWarps = 4;  // warps (query rows) per CTA
constexpr int kQUnroll = 8;  // document rows gathered before their adds (16 measured slower: BigColBERT 1.07 -> 1.38 ms)

// Columns [e, e + 8 / sizeof(T)) of one row as Acc: one 8-byte load when the whole vector
// is in range and aligned, else element by element (zeros past dim).
template <class T, class Acc>
struct RowVec {
  static constexpr int N = 8 / sizeof(T);
  Acc x[N];
  __device__ __forceinline__ void load(const T* row, int64_t e, int64_t dim, bool vec_ok) {
    if (vec_ok && e + N <= dim) {
      const uint2 raw = __ldg(reinterpret_cast<const uint2*>(row + e));
      const T* el = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < N; ++k) x[k] = to_acc<Acc>(el[k]);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) x[k] = e + k < dim ? to_acc<Acc>(row[e + k]) : Acc(0);
    }
  }
};

template <int SURF, class T, class Acc>
__global__ void __launch_bounds__(kQWarps * 32, 4) grad_queries_kernel(const BwdArgs<T, Acc> a, int64_t rows) {
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
  const QuerySide<SURF, T, Acc> src{a, qq, i, k0};
  T* out = a.grad_q + out_row * a.dim;
  using V = RowVec<T, Acc>;
  constexpr int kPass = 32 * V::N;  // columns per pass: lane l holds [e0 + l * N, + N)
  // 8-byte vectors need every row start 8-byte aligned
  const bool vec_ok = (a.dim * int64_t(sizeof(T))) % 8 == 0 && (reinterpret_cast<uintptr_t>(a.d) & 7) == 0;
  for (int64_t e0 = 0; e0 < a.dim; e0 += kPass) {
    Acc acc[V::N];
#pragma unroll
    for (int k = 0; k < V::N; ++k) acc[k] = Acc(0);
    // 32 pairs at a time: lane l reads pair base + l's index data (all in flight at once),
    // then the warp walks the 32 in order, gathering each document row with vector loads.
    for (int64_t base = 0; live && base < npairs; base += 32) {
      Acc my_w = Acc(0);
      int64_t my_row = -1;
      if (base + lane < npairs) src.get(base + lane, my_w, my_row);
      const int n = npairs - base < 32 ? static_cast<int>(npairs - base) : 32;
      for (int u0 = 0; u0 < n; u0 += kQUnroll) {
        Acc w[kQUnroll];
        V x[kQUnroll];
#pragma unroll
        for (int u = 0; u < kQUnroll; ++u) {
          w[u] = __shfl_sync(0xffffffffu, my_w, (u0 + u) & 31);
          const int64_t row = __shfl_sync(0xffffffffu, my_row, (u0 + u) & 31);
          const bool use = u0 + u < n && row >= 0;
          w[u] = use ? w[u] : Acc(0);
          const T* r = a.d + (use ? row : 0) * a.dim;
          if (use) {
            x[u].load(r, e0 + int64_t(lane) * V::N, a.dim, vec_ok);
          } else {
#pragma unroll
            for (int k = 0; k < V::N; ++k) x[u].x[k] = Acc(0);
          }
        }
#pragma unroll
        for (int u = 0; u < kQUnroll; ++u)
#pragma unroll
          for (int k = 0; k < V::N; ++k) acc[k] += w[u] * x[u].x[k];
      }
    }
#pragma unroll
    for (int k = 0; k < V::N; ++k) {
      const int64_t e = e0 + int64_t(lane) * V::N + k;
      if (e < a.dim) out[e] = from_acc<T, Acc>(acc[k]);
    }
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
