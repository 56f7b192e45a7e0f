// Argmax-driven backward. Destination-owned and deterministic, no floating-point atomics:
//   grad_q row (query, i): one warp owns it and adds g_p * d[argmax_p,i] over the query's
//     pairs in increasing pair order (padded c = 0..C-1, contrastive n = 0..Nb-1, packed
//     through pairs_by_query / query_pair_offsets);
//   grad_d rows [j0, j0+RJ) of one document: one CTA owns them; it scans the document's
//     (pair, i) entries in increasing (pair, i) order, compacts the ones whose argmax falls
//     in its rows (order-preserving ballot), and adds g_p * q_i into a float32 (float64 for
//     double) shared-memory accumulator, one column per thread.
// Entries with argmax < 0 or >= dlen, rows i >= qlen, and pairs whose ids/offsets are out
// of range are skipped. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../launch.h"
#include "policies.cuh"
#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

template <class T, class Acc>
struct BwdArgs {
  const Acc* g;
  const T* q;
  const T* d;
  const int32_t* argmax;
  T* grad_q;
  T* grad_d;
  int64_t dim, W, pairs, q_rows, d_rows;
  int64_t nq, nd, C, Lq, Ld;  // nq: B / Nq / Nq; nd: B*C / Nb / Nd
  int rows_per_cta;           // R of grad_documents_kernel, <= kDRows
  IndexView qlens, dlens, qoffs, doffs, pqids, pdids, pbq, qpo, pbd, dpo;
};

// ---------------- per-surface pair sources ----------------

// Padded: query b has pairs c = 0..C-1 (p = b*C + c); document p has the single pair p.
// Contrastive: query q has pairs n = 0..Nb-1 (p = q*Nb + n); document n has q = 0..Nq-1.
// Packed: CSR lists.

template <class T, class Acc>
__device__ __forceinline__ int64_t query_len_padded(const BwdArgs<T, Acc>& a, int64_t b) {
  int64_t v;
  return a.qlens.get(b, v) ? clamp64(v, 0, a.Lq) : 0;
}
template <class T, class Acc>
__device__ __forceinline__ int64_t query_len_contrastive(const BwdArgs<T, Acc>& a, int64_t q) {
  if (!a.qlens.present()) return a.Lq;
  int64_t v;
  return a.qlens.get(q, v) ? clamp64(v, 0, a.Lq) : 0;
}

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
constexpr int kQVecs = 1;   // 8-byte vectors per lane per pass over D (a pass covers 256 / sizeof(T) columns)
constexpr int kQUnroll = 8; // document rows gathered before their adds

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
  } else if (SURF == 1) {
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
  constexpr int kPass = 32 * kQVecs * V::N;  // columns per pass
  // 8-byte vectors need every row start 8-byte aligned
  const bool vec_ok = (a.dim * int64_t(sizeof(T))) % 8 == 0 && (reinterpret_cast<uintptr_t>(a.d) & 7) == 0;
  for (int64_t e0 = 0; e0 < a.dim; e0 += kPass) {
    Acc acc[kQVecs][V::N];
#pragma unroll
    for (int v = 0; v < kQVecs; ++v)
#pragma unroll
      for (int k = 0; k < V::N; ++k) acc[v][k] = Acc(0);
    // 32 pairs at a time: lane l reads pair base + l's index data (all in flight at once),
    // then the warp walks the 32 in order, gathering each document row with vector loads.
    for (int64_t base = 0; live && base < npairs; base += 32) {
      Acc my_w = Acc(0);
      int64_t my_row = -1;
      if (base + lane < npairs) src.get(base + lane, my_w, my_row);
      const int n = npairs - base < 32 ? static_cast<int>(npairs - base) : 32;
      for (int u0 = 0; u0 < n; u0 += kQUnroll) {
        Acc w[kQUnroll];
        V x[kQUnroll][kQVecs];
#pragma unroll
        for (int u = 0; u < kQUnroll; ++u) {
          w[u] = __shfl_sync(0xffffffffu, my_w, (u0 + u) & 31);
          const int64_t row = __shfl_sync(0xffffffffu, my_row, (u0 + u) & 31);
          const bool use = u0 + u < n && row >= 0;
          w[u] = use ? w[u] : Acc(0);
          const T* r = a.d + (use ? row : 0) * a.dim;
#pragma unroll
          for (int v = 0; v < kQVecs; ++v) {
            const int64_t e = e0 + (int64_t(v) * 32 + lane) * V::N;
            if (use) {
              x[u][v].load(r, e, a.dim, vec_ok);
            } else {
#pragma unroll
              for (int k = 0; k < V::N; ++k) x[u][v].x[k] = Acc(0);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kQUnroll; ++u)
#pragma unroll
          for (int v = 0; v < kQVecs; ++v)
#pragma unroll
            for (int k = 0; k < V::N; ++k) acc[v][k] += w[u] * x[u][v].x[k];
      }
    }
#pragma unroll
    for (int v = 0; v < kQVecs; ++v)
#pragma unroll
      for (int k = 0; k < V::N; ++k) {
        const int64_t e = e0 + (int64_t(v) * 32 + lane) * V::N + k;
        if (e < a.dim) out[e] = from_acc<T, Acc>(acc[v][k]);
      }
  }
}

constexpr int kDThreads = 128;  // one column per thread per D chunk
// Document rows owned by one CTA pass (the host picks R <= kDRows per launch). Each CTA
// rescans all of its document's entries, so R trades scan work (small R, many CTAs) against
// the serial adds of one CTA's hits (large R): small batches want R = 16, big ones 64.
constexpr int kDRows = 64;
constexpr int kDInFlight = 16;  // gathers issued before their adds

template <class Acc>
struct GradDSmem {
  Acc acc[kDRows][kDThreads];
  Acc hit_w[kDThreads];
  int64_t hit_row[kDThreads];
  int hit_j[kDThreads];
  int wcount[kDThreads / 32];
};

template <int SURF, class T, class Acc>
__global__ void __launch_bounds__(kDThreads) grad_documents_kernel(const BwdArgs<T, Acc> a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<GradDSmem<Acc>*>(smem_raw);
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t doc = blockIdx.x;

  int64_t row0, rows_total, dlen, nentries, kp0 = 0;
  if (SURF == 0) {
    row0 = doc * a.Ld;
    rows_total = a.Ld;
    int64_t v;
    dlen = a.dlens.get(doc, v) ? clamp64(v, 0, a.Ld) : 0;
    nentries = a.Lq;
  } else if (SURF == 1) {
    if (!segment(a.doffs, doc, a.nd, a.d_rows, row0, dlen)) return;
    rows_total = dlen;
    nentries = a.nq * a.Lq;
  } else {
    if (!segment(a.doffs, doc, a.nd, a.d_rows, row0, dlen)) return;
    rows_total = dlen;
    int64_t kp1;
    if (!a.dpo.get(doc, kp0) || !a.dpo.get(doc + 1, kp1) || kp0 < 0 || kp1 < kp0 || kp1 > a.pbd.size) {
      kp0 = 0;
      nentries = 0;
    } else {
      nentries = (kp1 - kp0) * a.W;
    }
  }

  const int R = a.rows_per_cta;
  for (int64_t j0 = int64_t(blockIdx.y) * R; j0 < rows_total; j0 += int64_t(gridDim.y) * R) {
    for (int64_t d0 = 0; d0 < a.dim; d0 += kDThreads) {
      const int64_t e = d0 + t;
#pragma unroll 8
      for (int j = 0; j < R; ++j) sm.acc[j][t] = Acc(0);
      for (int64_t base = 0; base < nentries; base += kDThreads) {
        // evaluate entry k = base + t
        const int64_t k = base + t;
        bool hit = false;
        int jl = 0;
        int64_t qrow = 0;
        Acc w = Acc(0);
        if (k < nentries) {
          int64_t p = -1, i = 0, qlen = 0, qr0 = 0;
          if (SURF == 0) {
            p = doc;
            i = k;
            const int64_t b = doc / a.C;
            qlen = query_len_padded(a, b);
            qr0 = b * a.Lq;
          } else if (SURF == 1) {
            const int64_t q = k / a.Lq;
            i = k - q * a.Lq;
            p = q * a.nd + doc;
            qlen = query_len_contrastive(a, q);
            qr0 = q * a.Lq;
          } else {
            const int64_t kk = k / a.W;
            i = k - kk * a.W;
            int64_t pp, did, qid;
            if (a.pbd.get(kp0 + kk, pp) && pp >= 0 && pp < a.pairs && a.pdids.get(pp, did) && did == doc &&
                a.pqids.get(pp, qid) && segment(a.qoffs, qid, a.nq, a.q_rows, qr0, qlen)) {
              p = pp;
            }
          }
          if (p >= 0 && i < qlen) {
            const int64_t am = __ldg(a.argmax + p * a.W + i);
            if (am >= 0 && am < dlen && am >= j0 && am < j0 + R) {
              hit = true;
              jl = static_cast<int>(am - j0);
              qrow = qr0 + i;
              w = __ldg(a.g + p);
            }
          }
        }
        const unsigned bal = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) sm.wcount[warp] = __popc(bal);
        __syncthreads();
        int off = 0, total = 0;
#pragma unroll
        for (int ww = 0; ww < kDThreads / 32; ++ww) {
          off += ww < warp ? sm.wcount[ww] : 0;
          total += sm.wcount[ww];
        }
        if (hit) {
          const int pos = off + __popc(bal & ((1u << lane) - 1u));
          sm.hit_j[pos] = jl;
          sm.hit_row[pos] = qrow;
          sm.hit_w[pos] = w;
        }
        __syncthreads();
        if (e < a.dim) {
          int h = 0;
          for (; h + kDInFlight <= total; h += kDInFlight) {  // gathers in flight, then adds in order
            Acc x[kDInFlight];
#pragma unroll
            for (int u = 0; u < kDInFlight; ++u) x[u] = to_acc<Acc>(a.q[sm.hit_row[h + u] * a.dim + e]);
#pragma unroll
            for (int u = 0; u < kDInFlight; ++u) sm.acc[sm.hit_j[h + u]][t] += sm.hit_w[h + u] * x[u];
          }
          for (; h < total; ++h) sm.acc[sm.hit_j[h]][t] += sm.hit_w[h] * to_acc<Acc>(a.q[sm.hit_row[h] * a.dim + e]);
        }
        __syncthreads();
      }
      if (e < a.dim) {
        const int64_t nrows = rows_total - j0 < R ? rows_total - j0 : R;
        for (int j = 0; j < nrows; ++j) a.grad_d[(row0 + j0 + j) * a.dim + e] = from_acc<T, Acc>(sm.acc[j][t]);
      }
    }
  }
}

template <class T, class Acc, int SURF>
cudaError_t run_backward(const BackwardParams& p) {
  BwdArgs<T, Acc> a;
  a.g = static_cast<const Acc*>(p.grad_scores);
  a.q = static_cast<const T*>(p.queries);
  a.d = static_cast<const T*>(p.documents);
  a.argmax = p.argmax;
  a.grad_q = static_cast<T*>(p.grad_queries);
  a.grad_d = static_cast<T*>(p.grad_documents);
  a.dim = p.dim;
  a.W = p.argmax_width;
  a.pairs = p.pairs;
  a.q_rows = p.q_rows;
  a.d_rows = p.d_rows;
  a.nq = p.num_queries;
  a.nd = SURF == 0 ? p.num_queries * p.cands : p.num_docs;
  a.C = p.cands;
  a.Lq = p.lq;
  a.Ld = p.ld;
  a.qlens = IndexView(p.query_lengths);
  a.dlens = IndexView(p.doc_lengths);
  a.qoffs = IndexView(p.query_offsets);
  a.doffs = IndexView(p.doc_offsets);
  a.pqids = IndexView(p.pair_query_ids);
  a.pdids = IndexView(p.pair_doc_ids);
  a.pbq = IndexView(p.pairs_by_query);
  a.qpo = IndexView(p.query_pair_offsets);
  a.pbd = IndexView(p.pairs_by_document);
  a.dpo = IndexView(p.document_pair_offsets);

  if (p.grad_queries != nullptr) {
    const int64_t rows = SURF == 2 ? a.nq * a.W : a.nq * a.Lq;
    if (rows > 0) {
      const int64_t blocks = (rows + kQWarps - 1) / kQWarps;
      grad_queries_kernel<SURF, T, Acc><<<static_cast<unsigned>(blocks), kQWarps * 32, 0, p.stream>>>(a, rows);
      cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
  }
  if (p.grad_documents != nullptr && a.nd > 0) {
    const int64_t rows = SURF == 0 ? a.Ld : a.d_rows / a.nd + 1;  // per document (average)
    // Small batches: too few documents to fill the GPU, so split each into 16-row owners.
    a.rows_per_cta = a.nd * ((rows + 15) / 16) <= 4 * int64_t(p.num_sms) ? 16 : kDRows;
    int64_t ychunks = (rows + a.rows_per_cta - 1) / a.rows_per_cta;
    if (SURF != 0 && ychunks > 256) ychunks = 256;
    if (ychunks < 1) ychunks = 1;
    if (ychunks > 65535) ychunks = 65535;
    constexpr size_t smem = sizeof(GradDSmem<Acc>);
    auto kern = grad_documents_kernel<SURF, T, Acc>;
    static bool configured[64] = {false};
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (smem > 48 * 1024 && !configured[dev & 63]) {
      err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess) return err;
      configured[dev & 63] = true;
    }
    if (a.nd > 0x7fffffff) return cudaErrorInvalidValue;
    dim3 grid(static_cast<unsigned>(a.nd), static_cast<unsigned>(ychunks));
    kern<<<grid, kDThreads, smem, p.stream>>>(a);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

template <class T, class Acc>
cudaError_t launch_backward_typed(const BackwardParams& p) {
  switch (p.surface) {
    case Surface::kPadded: return run_backward<T, Acc, 0>(p);
    case Surface::kContrastive: return run_backward<T, Acc, 1>(p);
    default: return run_backward<T, Acc, 2>(p);
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
