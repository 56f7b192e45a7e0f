// What both grad_documents kernels share: a document's entries and the quads a lane gathers.
// grad_documents row j of a document is the sum of g_p * q_i over the entries (pair p, query
// row i) whose argmax is j, added in increasing entry order by the row's one owner
// (deterministic, no atomics on values). Two kernels own rows that way:
//   backward_documents_scan.cuh: few entries a row (rerank, long documents): each batch's
//     hits compacted in entry order, every warp walking them for its own rows;
//   backward_documents_sorted.cuh: many entries a row (in-batch training): each batch's hits
//     sorted by row, each warp streaming its rows' run of them.
// backward.cuh picks one per call; both give the same bits. Torch-free.
#pragma once

#include <cstdint>

#include "backward_args.cuh"
#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

// Columns per lane: a warp covers one 128-column chunk of a hit's query row with one
// 8-byte (16-bit types) gather per lane.
constexpr int kDCols = 4;
constexpr int kDChunk = 32 * kDCols;

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

// A quad in the accumulator's type. bfloat16 to float32 is a shift of the bits: the two
// halves of a 32-bit pair widen with one operation each (a shift, a mask), where converting
// element by element extracted the high half first.
template <class T, class Acc>
__device__ __forceinline__ void quad_to_acc(const Quad<T>& v, Acc (&x)[kDCols]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && std::is_same_v<Acc, float>) {
    const uint2 bits = *reinterpret_cast<const uint2*>(&v);
    x[0] = __uint_as_float(bits.x << 16);
    x[1] = __uint_as_float(bits.x & 0xffff0000u);
    x[2] = __uint_as_float(bits.y << 16);
    x[3] = __uint_as_float(bits.y & 0xffff0000u);
  } else {
#pragma unroll
    for (int c = 0; c < kDCols; ++c) x[c] = to_acc<Acc>(v.v[c]);
  }
}

// Walks entries k, k + step, k + 2 step, ... of one document as (outer, inner) = (k / L,
// k % L) with one division (L = Lq for contrastive, the argmax width for packed; unused for
// padded, where the entry is the row itself).
struct EntryCursor {
  int64_t outer, inner, L, step_outer, step_inner;
  __device__ __forceinline__ void seek(int64_t k, int64_t L_, int step) {
    L = L_ > 0 ? L_ : 1;
    outer = div_nonneg(k, L);
    inner = k - outer * L;
    step_outer = step / L;
    step_inner = step - step_outer * L;
  }
  __device__ __forceinline__ void next() {
    inner += step_inner;
    outer += step_outer;
    if (inner >= L) {
      inner -= L;
      ++outer;
    }
  }
};

// One document's entries: how many, and for entry k which query row it names, with what
// weight, and where its argmax lands. Surface by surface:
//   padded (0): the entries are the rows i of the document's one query;
//   contrastive (1, 3): (query, i) over every query, pair p = query * nd + doc;
//   packed (2): (k-th pair of the document in pairs_by_document, i).
template <int SURF, class T, class Acc>
struct DocEntries {
  static constexpr bool kWalks = SURF != 0;  // entries are walked with an EntryCursor
  const BwdArgs<T, Acc>& a;
  int64_t doc, row0, rows_total, dlen, nentries, kp0, L;
  int64_t pad_qlen, pad_qr0;  // padded: the document's one query

  // False when the document's rows are not a valid segment (nothing is written then).
  __device__ __forceinline__ bool init(int64_t d) {
    doc = d;
    kp0 = 0;
    pad_qlen = pad_qr0 = 0;
    if (SURF == 0 || SURF == 3) {
      row0 = doc * a.Ld;
      rows_total = a.Ld;  // every row of the padded document is written (zeros past dlen)
      int64_t v;
      dlen = a.dlens.get(doc, v) ? clamp64(v, 0, a.Ld) : 0;
      nentries = SURF == 0 ? a.Lq : a.nq * a.Lq;
    } else {
      if (!segment(a.doffs, doc, a.nd, a.d_rows, row0, dlen)) return false;
      rows_total = dlen;
      if (SURF == 1) {
        nentries = a.nq * a.Lq;
      } else {
        int64_t kp1;
        if (!a.dpo.get(doc, kp0) || !a.dpo.get(doc + 1, kp1) || kp0 < 0 || kp1 < kp0 || kp1 > a.pbd.size) {
          kp0 = 0;
          nentries = 0;
        } else {
          nentries = (kp1 - kp0) * a.W;
        }
      }
    }
    L = is_contrastive(SURF) ? a.Lq : a.W;
    if (SURF == 0) {
      const int64_t b = div_nonneg(doc, a.C);
      pad_qlen = query_len_padded(a, b);
      pad_qr0 = b * a.Lq;
    }
    return true;
  }

  // Entry k at cursor `cur`: its row in the window [j0, j0 + R) (-1 when it has none), with
  // its weight and the query row it names (an index below q_rows) when it has one.
  __device__ __forceinline__ int window_row(int64_t k, const EntryCursor& cur, int64_t j0, int R, Acc& w,
                                            int64_t& qrow) const {
    int64_t p, i, qlen, qr0;
    bool ok = k < nentries;
    if (SURF == 2) {
      if (!ok) return -1;
      // (pair, query segment): a chain of dependent reads, checked as segment() does
      const int64_t kk = cur.outer;
      i = cur.inner;
      int64_t pp, did, qid;
      if (!(a.pbd.get(kp0 + kk, pp) && pp >= 0 && pp < a.pairs && a.pdids.get(pp, did) && did == doc &&
            a.pqids.get(pp, qid) && segment(a.qoffs, qid, a.nq, a.q_rows, qr0, qlen))) {
        return -1;
      }
      p = pp;
    } else {
      // Branch-free, so that the reads of a lane's entries are in flight together: an entry
      // past the end reads entry 0's pair (it exists when there are entries) and is dropped.
      int64_t q = 0;
      if (SURF == 0) {
        p = doc;
        i = ok ? k : 0;
        qlen = pad_qlen;
        qr0 = pad_qr0;
      } else {
        q = ok ? cur.outer : 0;
        i = ok ? cur.inner : 0;
        p = q * a.nd + doc;
        qr0 = q * a.Lq;
        qlen = a.Lq;
        if (a.qlens.present()) {
          bool okq;
          const int64_t v = a.qlens.fetch(q, okq);
          qlen = okq ? clamp64(v, 0, a.Lq) : 0;
        }
      }
    }
    const int64_t am = __ldg(a.argmax + p * a.W + i);
    w = __ldg(a.g + p);
    ok = ok && i < qlen && am >= 0 && am < dlen && am >= j0 && am < j0 + R;
    qrow = qr0 + i;
    return ok ? static_cast<int>(am - j0) : -1;
  }
};

// What both grad_documents kernels run around their work: CTA (document blockIdx.x, window
// blockIdx.y) visits its windows of R = a.rows_per_cta rows (strided by gridDim.y: segments
// longer than the average) and, in each, the 64-column chunks of dim; body(de, j0, col, vec)
// with this lane's first column and whether quads can be gathered as vectors (every quad
// of a row aligned: dim a multiple of kDCols, an aligned base). A document whose rows are not
// a valid segment is skipped: nothing is written.
template <int SURF, class T, class Acc, class Body>
__device__ __forceinline__ void for_each_window(const BwdArgs<T, Acc>& a, Body&& body) {
  const bool vec = a.dim % kDCols == 0 && reinterpret_cast<uintptr_t>(a.q) % sizeof(Quad<T>) == 0;
  DocEntries<SURF, T, Acc> de{a};
  if (!de.init(blockIdx.x)) return;
  const int R = a.rows_per_cta;
  for (int64_t j0 = int64_t(blockIdx.y) * R; j0 < de.rows_total; j0 += int64_t(gridDim.y) * R) {
    for (int64_t d0 = 0; d0 < a.dim; d0 += kDChunk) body(de, j0, d0 + (threadIdx.x % 32) * kDCols, vec);
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
