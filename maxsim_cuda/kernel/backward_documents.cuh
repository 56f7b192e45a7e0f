// grad_documents: rows [j0, j0 + R) of one document are owned by one CTA; it scans the
// document's (pair, i) entries in increasing (pair, i) order, compacts the ones whose argmax
// falls in its rows (order-preserving ballot), and adds g_p * q_i into a float32 (float64
// for double) shared-memory accumulator, one column per thread. Torch-free.
#pragma once

#include <cstdint>

#include "backward_args.cuh"
#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

constexpr int kDThreads = 128;  // one column per thread per D chunk
// Document rows owned by one CTA pass (the host picks R <= kDRows per launch). Each CTA
// rescans all of its document's entries, so R trades scan work (small R, many CTAs) against
// the serial adds of one CTA's hits (large R): small batches want R = 16, big ones 64.
constexpr int kDRows = 64;
constexpr int kDInFlight = 16;  // gathers issued before their adds
// Entries a thread evaluates per batch: the ballot/scan and the three barriers of a batch
// are paid once per kDThreads * kDPerThread entries (ncu, DocDoc: the per-batch
// bookkeeping was about a quarter of the kernel's instructions at one entry a thread).
constexpr int kDPerThread = 4;
constexpr int kDBatch = kDThreads * kDPerThread;

// A compacted hit: its weight and the byte offset of its accumulator row in GradDSmem::acc,
// read together (one 8-byte shared load for float).
template <class Acc>
struct DocHit {
  Acc w;
  int acc_bytes;
};

template <class Acc>
struct GradDSmem {
  Acc acc[kDRows][kDThreads];
  DocHit<Acc> hit[kDBatch];
  int64_t hit_off[kDBatch];  // element offset of the query row (row * dim)
  int wcount[kDThreads / 32];
};

// Walks entries k, k + 1, ... of one document as (outer, inner) = (k / L, k % L) without a
// division per entry (L = Lq for contrastive, the argmax width for packed; unused for
// padded, where the entry is the row itself).
struct EntryCursor {
  int64_t outer, inner, L;
  __device__ __forceinline__ void seek(int64_t k, int64_t L_) {
    L = L_ > 0 ? L_ : 1;
    outer = div_nonneg(k, L);
    inner = k - outer * L;
  }
  __device__ __forceinline__ void next() {
    if (++inner == L) {
      inner = 0;
      ++outer;
    }
  }
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
  } else if (SURF == 3) {  // every row of the padded document is written (zeros past dlen)
    row0 = doc * a.Ld;
    rows_total = a.Ld;
    int64_t v;
    dlen = a.dlens.get(doc, v) ? clamp64(v, 0, a.Ld) : 0;
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
  const int64_t L = is_contrastive(SURF) ? a.Lq : a.W;
  // padded: the document's one query (b = doc / C), the same for every entry
  int64_t pad_qlen = 0, pad_qr0 = 0;
  if (SURF == 0) {
    const int64_t b = div_nonneg(doc, a.C);
    pad_qlen = query_len_padded(a, b);
    pad_qr0 = b * a.Lq;
  }

  const int R = a.rows_per_cta;
  for (int64_t j0 = int64_t(blockIdx.y) * R; j0 < rows_total; j0 += int64_t(gridDim.y) * R) {
    for (int64_t d0 = 0; d0 < a.dim; d0 += kDThreads) {
      const int64_t e = d0 + t;
#pragma unroll 8
      for (int j = 0; j < R; ++j) sm.acc[j][t] = Acc(0);
      for (int64_t base = 0; base < nentries; base += kDBatch) {
        // this thread evaluates entries k0 .. k0 + kDPerThread - 1 (consecutive: the argmax
        // reads of one thread share cache lines)
        const int64_t k0 = base + int64_t(t) * kDPerThread;
        EntryCursor cur{0, 0, 1};  // padded: the entry is the row itself
        if (SURF != 0) cur.seek(k0, L);
        bool hit[kDPerThread];
        int jl[kDPerThread];
        int64_t qoff[kDPerThread];
        Acc w[kDPerThread];
        int cnt = 0;
#pragma unroll
        for (int u = 0; u < kDPerThread; ++u) {
          const int64_t k = k0 + u;
          hit[u] = false;
          jl[u] = 0;
          qoff[u] = 0;
          w[u] = Acc(0);
          if (k < nentries) {
            int64_t p = -1, i = 0, qlen = 0, qr0 = 0;
            if (SURF == 0) {
              p = doc;
              i = k;
              qlen = pad_qlen;
              qr0 = pad_qr0;
            } else if (is_contrastive(SURF)) {
              const int64_t q = cur.outer;
              i = cur.inner;
              p = q * a.nd + doc;
              qlen = query_len_contrastive(a, q);
              qr0 = q * a.Lq;
            } else {
              const int64_t kk = cur.outer;
              i = cur.inner;
              int64_t pp, did, qid;
              if (a.pbd.get(kp0 + kk, pp) && pp >= 0 && pp < a.pairs && a.pdids.get(pp, did) && did == doc &&
                  a.pqids.get(pp, qid) && segment(a.qoffs, qid, a.nq, a.q_rows, qr0, qlen)) {
                p = pp;
              }
            }
            if (p >= 0 && i < qlen) {
              const int64_t am = __ldg(a.argmax + p * a.W + i);
              if (am >= 0 && am < dlen && am >= j0 && am < j0 + R) {
                hit[u] = true;
                jl[u] = static_cast<int>(am - j0);
                qoff[u] = (qr0 + i) * a.dim;
                w[u] = __ldg(a.g + p);
              }
            }
          }
          cnt += hit[u] ? 1 : 0;
          cur.next();
        }
        // Block-wide exclusive scan of the hit counts: hits keep increasing-k order.
        int incl = cnt;
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
          const int y = __shfl_up_sync(0xffffffffu, incl, o);
          incl += lane >= o ? y : 0;
        }
        if (lane == 31) sm.wcount[warp] = incl;
        __syncthreads();
        int pos = incl - cnt, total = 0;
#pragma unroll
        for (int ww = 0; ww < kDThreads / 32; ++ww) {
          pos += ww < warp ? sm.wcount[ww] : 0;
          total += sm.wcount[ww];
        }
#pragma unroll
        for (int u = 0; u < kDPerThread; ++u) {
          if (hit[u]) {
            sm.hit[pos] = DocHit<Acc>{w[u], jl[u] * kDThreads * int(sizeof(Acc))};
            sm.hit_off[pos] = qoff[u];
            ++pos;
          }
        }
        __syncthreads();
        if (e < a.dim) {
          const T* qe = a.q + e;
          char* my_col = reinterpret_cast<char*>(&sm.acc[0][t]);  // + acc_bytes: this column of row j
          const auto add = [&](const DocHit<Acc>& hh, Acc x) { *reinterpret_cast<Acc*>(my_col + hh.acc_bytes) += hh.w * x; };
          int h = 0;
          for (; h + kDInFlight <= total; h += kDInFlight) {  // gathers in flight, then adds in order
            Acc x[kDInFlight];
#pragma unroll
            for (int u = 0; u < kDInFlight; ++u) x[u] = to_acc<Acc>(qe[sm.hit_off[h + u]]);
#pragma unroll
            for (int u = 0; u < kDInFlight; ++u) add(sm.hit[h + u], x[u]);
          }
          for (; h < total; ++h) add(sm.hit[h], to_acc<Acc>(qe[sm.hit_off[h]]));
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

}  // namespace kernel
}  // namespace maxsim_cuda
