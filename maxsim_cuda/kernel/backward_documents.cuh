// grad_documents: rows [j0, j0 + R) of one document are owned by one CTA; it scans the
// document's (pair, i) entries in increasing (pair, i) order and compacts the ones whose
// argmax falls in its rows (order-preserving block scan). The adds g_p * q_i go into a
// float32 (float64 for double) shared-memory accumulator: warp w owns the rows j with
// j % kDWarps == w and a lane owns kDCols adjacent columns, so each warp walks the compacted
// hits in order, applies only its own rows' hits with one vector gather per hit, and every
// accumulator element still receives its adds in increasing entry order (deterministic,
// no atomics). Torch-free.
#pragma once

#include <cstdint>

#include "backward_args.cuh"
#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

constexpr int kDThreads = 128;
constexpr int kDWarps = kDThreads / 32;
// Columns per lane: a warp covers one 128-column chunk of a hit's query row with one
// 8-byte (16-bit types) gather per lane.
constexpr int kDCols = 4;
constexpr int kDChunk = 32 * kDCols;
// Document rows owned by one CTA pass (the host picks R <= kDRows per launch). Each CTA
// rescans all of its document's entries, so R trades scan work (small R, many CTAs) against
// the adds one CTA applies (large R).
constexpr int kDRows = 64;
constexpr int kDInFlight = 8;  // gathers a warp issues before their adds
// Entries a thread evaluates per batch: the scan and the three barriers of a batch are
// paid once per kDThreads * kDPerThread entries (ncu, DocDoc: the per-batch bookkeeping was
// about a quarter of the kernel's instructions at one entry a thread).
constexpr int kDPerThread = 4;
constexpr int kDBatch = kDThreads * kDPerThread;

// A compacted hit: its weight and its row in the CTA's window, read together.
template <class Acc>
struct DocHit {
  Acc w;
  int row;
};

template <class Acc>
struct GradDSmem {
  Acc acc[kDRows][kDChunk];
  DocHit<Acc> hit[kDBatch];
  int64_t hit_off[kDBatch];  // element offset of the query row (row * dim)
  int wcount[kDWarps];
};

// kDCols adjacent elements, loaded or stored as one vector where aligned.
template <class E>
struct alignas(kDCols * sizeof(E)) Quad {
  E v[kDCols];
};

// kDCols adjacent elements of a query row starting at `p`, raw (converted at the add, so
// the gathers of a group stay in flight together). VEC: the quad is aligned and all in
// range; otherwise element by element, zeros from `left` (elements left in the row) on.
template <bool VEC, class T>
__device__ __forceinline__ Quad<T> load_quad(const T* p, int64_t left) {
  if constexpr (VEC) {
    return *reinterpret_cast<const Quad<T>*>(p);
  } else {
    Quad<T> v;
#pragma unroll
    for (int c = 0; c < kDCols; ++c) v.v[c] = c < left ? p[c] : T{};
    return v;
  }
}

// One warp applies the batch's hits that fall in its rows (row % kDWarps == warp) to its
// lanes' columns [col, col + kDCols), in hit order. All lanes vote (also those past dim), so
// `mine` is warp-uniform and so is every branch on it.
template <bool VEC, class T, class Acc>
__device__ __forceinline__ void apply_hits(GradDSmem<Acc>& sm, int total, int warp, int lane, const T* q,
                                           int64_t col, int64_t dim) {
  const bool col_in = col < dim;
  const T* qcol = q + (col_in ? col : 0);
  const int64_t left = col_in ? dim - col : 0;
  Acc* acc_col = &sm.acc[0][lane * kDCols];
  for (int hb = 0; hb < total; hb += 32) {
    const int h = hb + lane;
    unsigned mine = __ballot_sync(0xffffffffu, h < total && sm.hit[h].row % kDWarps == warp);
    while (mine != 0u) {
      int idx[kDInFlight];
      Quad<T> raw[kDInFlight];
#pragma unroll
      for (int u = 0; u < kDInFlight; ++u) {  // the group's gathers first, branch-free
        idx[u] = mine != 0u ? hb + __ffs(mine) - 1 : -1;
        mine &= mine - 1u;
        const int64_t off = idx[u] >= 0 ? sm.hit_off[idx[u]] : 0;
        raw[u] = load_quad<VEC>(qcol + off, left);
      }
#pragma unroll
      for (int u = 0; u < kDInFlight; ++u) {  // then the adds, in hit order
        if (idx[u] >= 0 && col_in) {
          const DocHit<Acc> hh = sm.hit[idx[u]];
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
__global__ void __launch_bounds__(kDThreads, 4) grad_documents_kernel(const BwdArgs<T, Acc> a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<GradDSmem<Acc>*>(smem_raw);
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  // Vector gathers: every quad of a row is aligned when dim is a multiple of kDCols.
  const bool vec = a.dim % kDCols == 0 && reinterpret_cast<uintptr_t>(a.q) % sizeof(Quad<T>) == 0;
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
    for (int64_t d0 = 0; d0 < a.dim; d0 += kDChunk) {
      const int64_t col = d0 + lane * kDCols;
      for (int j = warp; j < R; j += kDWarps) *reinterpret_cast<Quad<Acc>*>(&sm.acc[j][lane * kDCols]) = Quad<Acc>{};
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
        for (int ww = 0; ww < kDWarps; ++ww) {
          pos += ww < warp ? sm.wcount[ww] : 0;
          total += sm.wcount[ww];
        }
#pragma unroll
        for (int u = 0; u < kDPerThread; ++u) {
          if (hit[u]) {
            sm.hit[pos] = DocHit<Acc>{w[u], jl[u]};
            sm.hit_off[pos] = qoff[u];
            ++pos;
          }
        }
        __syncthreads();
        if (vec) {
          apply_hits<true>(sm, total, warp, lane, a.q, col, a.dim);
        } else {
          apply_hits<false>(sm, total, warp, lane, a.q, col, a.dim);
        }
        __syncthreads();
      }
      // Each warp writes the rows it owns (its own adds: no barrier needed before).
      if (col < a.dim) {
        const int64_t nrows = rows_total - j0 < R ? rows_total - j0 : R;
        for (int j = warp; j < nrows; j += kDWarps) {
          T* out = a.grad_d + (row0 + j0 + j) * a.dim + col;
#pragma unroll
          for (int c = 0; c < kDCols; ++c) {
            if (col + c < a.dim) out[c] = from_acc<T, Acc>(sm.acc[j][lane * kDCols + c]);
          }
        }
      }
    }
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
