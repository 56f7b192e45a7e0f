// grad_documents for few entries a row (rerank, long documents; backward_documents.cuh says
// which kernel takes a call): rows [j0, j0 + R) of one document are owned by one CTA; it
// scans the document's entries in increasing order and compacts the ones whose argmax falls
// in its rows (order-preserving block scan). The adds g_p * q_i go into a float32 (float64
// for double) shared-memory accumulator: warp w owns the rows j with j % kScanWarps == w and
// a lane owns kDCols adjacent columns, so each warp walks the compacted hits in order and
// applies only its own rows' hits with one vector gather per hit. Torch-free.
#pragma once

#include <cstdint>

#include "backward_documents.cuh"

namespace maxsim_cuda {
namespace kernel {

constexpr int kScanThreads = 128;
constexpr int kScanWarps = kScanThreads / 32;
// Document rows owned by one CTA pass (the host picks R <= kScanRows per launch). Each CTA
// rescans all of its document's entries, so R trades scan work (small R, many CTAs) against
// the adds one CTA applies (large R).
constexpr int kScanRows = 64;
constexpr int kScanInFlight = 8;  // gathers a warp issues before their adds
// Entries a thread evaluates per batch: the scan and the three barriers of a batch are
// paid once per kScanThreads * kScanPerThread entries (ncu, DocDoc: the per-batch bookkeeping was
// about a quarter of the kernel's instructions at one entry a thread).
constexpr int kScanPerThread = 4;
constexpr int kScanBatch = kScanThreads * kScanPerThread;

// A compacted hit: its weight and its row in the CTA's window, read together.
template <class Acc>
struct ScanHit {
  Acc w;
  int row;
};

template <class Acc>
struct ScanSmem {
  Acc acc[kScanRows][kDChunk];
  ScanHit<Acc> hit[kScanBatch];
  int64_t hit_off[kScanBatch];  // element offset of the query row (row * dim)
  int wcount[kScanWarps];
};

// One warp applies the batch's hits that fall in its rows (row % kScanWarps == warp) to its
// lanes' columns [col, col + kDCols), in hit order. All lanes vote (also those past dim), so
// `mine` is warp-uniform and so is every branch on it.
template <bool VEC, class T, class Acc>
__device__ __forceinline__ void apply_scanned_hits(ScanSmem<Acc>& sm, int total, int warp, int lane, const T* q,
                                           int64_t col, int64_t dim) {
  const bool col_in = col < dim;
  const T* qcol = q + (col_in ? col : 0);
  const int64_t left = col_in ? dim - col : 0;
  Acc* acc_col = &sm.acc[0][lane * kDCols];
  for (int hb = 0; hb < total; hb += 32) {
    const int h = hb + lane;
    unsigned mine = __ballot_sync(0xffffffffu, h < total && sm.hit[h].row % kScanWarps == warp);
    while (mine != 0u) {
      int idx[kScanInFlight];
      Quad<T> raw[kScanInFlight];
#pragma unroll
      for (int u = 0; u < kScanInFlight; ++u) {  // the group's gathers first, branch-free
        idx[u] = mine != 0u ? hb + __ffs(mine) - 1 : -1;
        mine &= mine - 1u;
        const int64_t off = idx[u] >= 0 ? sm.hit_off[idx[u]] : 0;
        raw[u] = load_quad<VEC>(qcol + off, left);
      }
#pragma unroll
      for (int u = 0; u < kScanInFlight; ++u) {  // then the adds, in hit order
        if (idx[u] >= 0 && col_in) {
          const ScanHit<Acc> hh = sm.hit[idx[u]];
          auto& slot = *reinterpret_cast<Quad<Acc>*>(acc_col + hh.row * kDChunk);
          Quad<Acc> v = slot;
#pragma unroll
          for (int c = 0; c < kDCols; ++c) v.v[c] += hh.w * to_acc<Acc>(raw[u].v[c]);
          slot = v;
        }
      }
    }
  }
}

template <int SURF, class T, class Acc>
__global__ void __launch_bounds__(kScanThreads, 4) grad_documents_scan_kernel(const BwdArgs<T, Acc> a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<ScanSmem<Acc>*>(smem_raw);
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int R = a.rows_per_cta;
  for_each_window<SURF>(a, [&](const DocEntries<SURF, T, Acc>& de, int64_t j0, int64_t col, bool vec) {
    for (int j = warp; j < R; j += kScanWarps) *reinterpret_cast<Quad<Acc>*>(&sm.acc[j][lane * kDCols]) = Quad<Acc>{};
    for (int64_t base = 0; base < de.nentries; base += kScanBatch) {
      // this thread evaluates entries k0 .. k0 + kScanPerThread - 1 (consecutive: the argmax
      // reads of one thread share cache lines)
      const int64_t k0 = base + int64_t(t) * kScanPerThread;
      EntryCursor cur{0, 0, 1, 0, 0};  // padded: the entry is the row itself
      if (SURF != 0) cur.seek(k0, de.L, 1);
      bool hit[kScanPerThread];
      int jl[kScanPerThread];
      int64_t qrow[kScanPerThread];
      Acc w[kScanPerThread];
      int cnt = 0;
#pragma unroll
      for (int u = 0; u < kScanPerThread; ++u) {
        w[u] = Acc(0);
        qrow[u] = 0;
        jl[u] = de.window_row(k0 + u, cur, j0, R, w[u], qrow[u]);
        hit[u] = jl[u] >= 0;
        cnt += hit[u] ? 1 : 0;
        if (SURF != 0) cur.next();
      }
      // Block-wide exclusive scan of the hit counts: hits keep increasing-k order.
      const int incl = warp_inclusive_sum(cnt, lane);
      if (lane == 31) sm.wcount[warp] = incl;
      __syncthreads();
      int pos = incl - cnt, total = 0;
#pragma unroll
      for (int ww = 0; ww < kScanWarps; ++ww) {
        pos += ww < warp ? sm.wcount[ww] : 0;
        total += sm.wcount[ww];
      }
#pragma unroll
      for (int u = 0; u < kScanPerThread; ++u) {
        if (hit[u]) {
          sm.hit[pos] = ScanHit<Acc>{w[u], jl[u]};
          sm.hit_off[pos] = qrow[u] * a.dim;
          ++pos;
        }
      }
      __syncthreads();
      if (vec) {
        apply_scanned_hits<true>(sm, total, warp, lane, a.q, col, a.dim);
      } else {
        apply_scanned_hits<false>(sm, total, warp, lane, a.q, col, a.dim);
      }
      __syncthreads();
    }
    // Each warp writes the rows it owns (its own adds: no barrier needed before).
    if (col < a.dim) {
      const int64_t nrows = de.rows_total - j0 < R ? de.rows_total - j0 : R;
      for (int j = warp; j < nrows; j += kScanWarps) {
        T* out = a.grad_d + (de.row0 + j0 + j) * a.dim + col;
#pragma unroll
        for (int c = 0; c < kDCols; ++c) {
          if (col + c < a.dim) out[c] = from_acc<T, Acc>(sm.acc[j][lane * kDCols + c]);
        }
      }
    }
  });
}

}  // namespace kernel
}  // namespace maxsim_cuda
