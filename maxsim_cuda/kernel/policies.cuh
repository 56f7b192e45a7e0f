// Indexing policies: for step s of a surface, which query rows and document rows it uses
// and where its outputs go. One kernel family runs all four; a surface is only a policy.
// A policy splits its index reads in two: ahead(s) issues the ones that depend only on s
// (the kernel calls it one step early, so their latency hides behind the current step's
// tiles) and step(s, ahead) does the rest.
// Torch-free. All offsets are 64-bit; every index read is range-checked, and every
// segment read from an offsets/ids tensor is checked against the tensor it indexes, so a
// bad value yields a "bad" step (NaN score, argmax -1) instead of an out-of-bounds access.
#pragma once

#include <cstdint>

#include "../launch.h"
#include "scheduler.cuh"

namespace maxsim_cuda {
namespace kernel {

// Width-aware view of an int32/int64 index tensor (no conversion launches needed).
struct IndexView {
  const void* ptr;
  int64_t size;
  int is64;

  IndexView() = default;
  __host__ __device__ explicit IndexView(const IndexRef& r) : ptr(r.ptr), size(r.size), is64(r.is64) {}

  __device__ __forceinline__ bool present() const { return ptr != nullptr; }
  __device__ __forceinline__ int64_t load(int64_t i) const {
    return is64 ? static_cast<int64_t>(__ldg(static_cast<const long long*>(ptr) + i))
                : static_cast<int64_t>(__ldg(static_cast<const int*>(ptr) + i));
  }
  // Branch-free read: 0 and ok=false when i is outside the tensor (a predicated load, so
  // callers can issue many independent reads before looking at any of them).
  __device__ __forceinline__ int64_t fetch(int64_t i, bool& ok) const {
    ok = ptr != nullptr && i >= 0 && i < size;
    return ok ? load(i) : 0;
  }
  // false when i is outside the tensor
  __device__ __forceinline__ bool get(int64_t i, int64_t& v) const {
    if (ptr == nullptr || i < 0 || i >= size) return false;
    v = load(i);
    return true;
  }
  // A read in two halves, for the sm_90a producer's reads a step ahead: issue() starts the
  // load, value() makes the int64 a step later. Each width loads into its own register:
  // merging the two predicated loads into one value (what load() and fetch() compile to)
  // is an instruction that reads the loaded register, and the warp waits for the load
  // there, at the read, before anything after it is issued.
  struct Pending {
    int64_t v64 = 0;
    int32_t v32 = 0;
    bool ok = false;  // i lay inside the tensor
  };
  __device__ __forceinline__ Pending issue(int64_t i) const {
    Pending r;
    r.ok = ptr != nullptr && i >= 0 && i < size;
    if (r.ok) {
      if (is64) {
        r.v64 = __ldg(static_cast<const long long*>(ptr) + i);
      } else {
        r.v32 = __ldg(static_cast<const int*>(ptr) + i);
      }
    }
    return r;
  }
  __device__ __forceinline__ int64_t value(const Pending& r) const { return is64 ? r.v64 : int64_t(r.v32); }
};

// What the sm_90a producer knows of a step once its reads are in: the document's rows, and
// on the strided grids the query's length (-1: unreadable, a bad pair) and, on pair grids,
// its first row. ok = false: a bad document or pair.
struct StepRows {
  int64_t row0 = 0, len = 0, qrow0 = 0;
  int32_t qlen = 0;
  bool ok = false;
};

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// Whether offsets a, b cut a segment [a, b) out of a tensor of `rows` rows; branch-free, for the
// checks of reads made a step ahead (segment() keeps its early returns: the mma.sync kernels
// compile differently with this form).
__device__ __forceinline__ bool segment_fits(int64_t a, int64_t b, int64_t rows) {
  return (a >= 0) & (b >= a) & (b <= rows);
}

// Reads segment [o0, o1) = offsets[k], offsets[k+1]; false if k or the range is invalid.
__device__ __forceinline__ bool segment(const IndexView& offs, int64_t k, int64_t nseg, int64_t rows,
                                        int64_t& o0, int64_t& len) {
  int64_t a, b;
  if (k < 0 || k >= nseg || !offs.get(k, a) || !offs.get(k + 1, b)) return false;
  if (a < 0 || b < a || b > rows) return false;
  o0 = a;
  len = b - a;
  return true;
}

// The (query id, document id) of pair p, by predicated reads issued together; ok = false
// when p lies outside either tensor. PackedPolicy reads them with fetch_pair_ids (each
// width's load merged into one value at once), PackedGrid in two halves (issue_ids, ids_of).
struct PairIds {
  int64_t qid, did;
  bool ok;
};
__device__ __forceinline__ PairIds fetch_pair_ids(const IndexView& pqids, const IndexView& pdids, int64_t p) {
  PairIds r;
  bool okq, okd;
  r.qid = pqids.fetch(p, okq);
  r.did = pdids.fetch(p, okd);
  r.ok = okq && okd;
  return r;
}

// What one step (a query block against one document) touches.
struct StepDesc {
  int64_t qkey;        // identity of the query block: consecutive steps with the same key reuse it
  int64_t q_row0;      // global query row of block row 0 (segments are stacked contiguously)
  int64_t seg_stride;  // rows per stacked segment (>= 1)
  int64_t qlen0;       // valid rows of segment 0 (used when nseg == 1)
  int64_t doc_row0;    // global document row of document row 0
  int64_t dlen;        // valid document rows
  int64_t out0;        // pair index of segment 0 (scores[out], argmax[out * width ...])
  int64_t out_stride;  // pair-index step between stacked segments
  int nseg;            // stacked query segments (contrastive may stack several queries)
  bool bad;            // ids/offsets out of range: NaN score, argmax -1
};

// padded: step s = b*C + c; one query per block.
struct PaddedPolicy {
  IndexView qlens, dlens;
  int64_t B, C, Lq, Ld;
  static constexpr bool kOneQueryPerStep = true;  // a step's block is one query (max_segments 1)

  __host__ __device__ int64_t steps() const { return B * C; }
  __host__ __device__ int64_t query_rows() const { return B * Lq; }
  __host__ __device__ int max_segments() const { return 1; }

  struct Ahead {
    int64_t ql, dl;
    bool okq, okd;
  };
  __device__ __forceinline__ Ahead ahead(int64_t s) const {
    Ahead h;
    h.ql = qlens.fetch(s / C, h.okq);
    h.dl = dlens.fetch(s, h.okd);
    return h;
  }

  __device__ __forceinline__ StepDesc step(int64_t s, const Ahead& h) const {
    StepDesc d;
    const int64_t b = s / C;
    const int64_t ql = h.ql, dl = h.dl;
    const bool okq = h.okq, okd = h.okd;
    d.qkey = b;
    d.q_row0 = b * Lq;
    d.seg_stride = Lq > 0 ? Lq : 1;
    d.qlen0 = okq ? clamp64(ql, 0, Lq) : 0;
    d.doc_row0 = s * Ld;
    d.dlen = okd ? clamp64(dl, 0, Ld) : 0;
    d.out0 = s;
    d.out_stride = 0;
    d.nseg = 1;
    d.bad = !(okq && okd);
    return d;
  }
  __device__ __forceinline__ int64_t seg_qlen(const StepDesc& d, int) const { return d.qlen0; }
};

// Where contrastive document n's rows are: a segment of packed rows cut by offsets, or row
// n of a padded [Nb, Ld, D] tensor holding clamp(lengths[n], 0, Ld) real rows.
// rows() reads and checks at once; issue_rows() / rows_of() are the same in two halves
// (IndexView::issue), for the sm_90a producer.
struct OffsetDocuments {
  IndexView doffs;
  int64_t Nb, T;
  __device__ __forceinline__ bool rows(int64_t n, int64_t& row0, int64_t& len) const {
    return segment(doffs, n, Nb, T, row0, len);
  }
  struct RowsRead {
    IndexView::Pending a, b;
    bool in_range;
  };
  __device__ __forceinline__ RowsRead issue_rows(int64_t n) const {
    const bool in_range = n >= 0 && n < Nb;
    return {doffs.issue(in_range ? n : -1), doffs.issue(in_range ? n + 1 : -1), in_range};
  }
  __device__ __forceinline__ bool rows_of(const RowsRead& r, int64_t& row0, int64_t& len) const {
    const int64_t a = doffs.value(r.a), b = doffs.value(r.b);
    if (!(r.in_range && r.a.ok && r.b.ok && segment_fits(a, b, T))) return false;
    row0 = a;
    len = b - a;
    return true;
  }
};
struct PaddedDocuments {
  IndexView dlens;
  int64_t Nb, Ld;
  __device__ __forceinline__ bool rows(int64_t n, int64_t& row0, int64_t& len) const {
    int64_t v;
    if (n < 0 || n >= Nb || !dlens.get(n, v)) return false;
    row0 = n * Ld;
    len = clamp64(v, 0, Ld);
    return true;
  }
  struct RowsRead {
    IndexView::Pending len;
    int64_t n;
    bool in_range;
  };
  __device__ __forceinline__ RowsRead issue_rows(int64_t n) const {
    const bool in_range = n >= 0 && n < Nb;
    return {dlens.issue(in_range ? n : -1), n, in_range};
  }
  __device__ __forceinline__ bool rows_of(const RowsRead& r, int64_t& row0, int64_t& len) const {
    if (!(r.in_range && r.len.ok)) return false;
    row0 = r.n * Ld;
    len = clamp64(dlens.value(r.len), 0, Ld);
    return true;
  }
};

// contrastive: G stacked queries (block qb) against document n; steps ordered so that the
// CTAs running together share documents (see GroupedOrder).
template <class Documents>
struct ContrastiveGrid {
  IndexView qlens;  // may be absent (every query has Lq rows)
  Documents docs;
  int64_t Nq, Nb, Lq;
  int G;  // queries stacked per block
  GroupedOrder order;
  static constexpr bool kOneQueryPerStep = false;  // G stacked queries (the forward kernel's prologue)
  static constexpr bool kStrided = false;  // the warp-specialised kernel's step walk (StepWalk)
  static constexpr bool kPairRows = false;  // see PackedGrid
  // Whole 128-row document tiles and 64-row query blocks: a tile past a document holds the
  // next document's rows, which come from L2 anyway (every query block reads them).
  static constexpr bool kBoundedLoads = false;

  __host__ __device__ int64_t steps() const { return order.nq_blocks * Nb; }
  __host__ __device__ int64_t query_rows() const { return Nq * Lq; }
  __host__ __device__ int max_segments() const { return G; }

  __device__ __forceinline__ int64_t qlen_of(int64_t q) const {
    if (!qlens.present()) return Lq;
    int64_t v;
    return qlens.get(q, v) ? clamp64(v, 0, Lq) : 0;
  }
  // The producer's read of step (q, n)'s document rows (every query sees the same documents),
  // issued a step ahead and checked a step later.
  using StepRead = typename Documents::RowsRead;
  __device__ __forceinline__ StepRead issue_step(int64_t, int64_t n) const { return docs.issue_rows(n); }
  __device__ __forceinline__ StepRows step_rows(const StepRead& r) const {
    StepRows s;
    s.ok = docs.rows_of(r, s.row0, s.len);
    return s;
  }

  struct Ahead {};  // the document read depends on the grouped order: nothing to split off
  __device__ __forceinline__ Ahead ahead(int64_t) const { return {}; }

  __device__ __forceinline__ StepDesc step(int64_t s, const Ahead&) const {
    int64_t qb, n;
    order.map(s, qb, n);
    return step_at(qb, n);
  }
  __device__ __forceinline__ StepDesc step_at(int64_t qb, int64_t n) const {
    int64_t o0 = 0, len = 0;
    const bool ok = docs.rows(n, o0, len);
    return step_at(qb, n, ok, o0, len, qlen_of(qb * G));
  }
  // The same from index values read elsewhere (the warp-specialised kernel's producer reads
  // the document rows; its consumers keep the first query's length per block).
  __device__ __forceinline__ StepDesc step_at(int64_t qb, int64_t n, bool ok, int64_t o0, int64_t len,
                                              int64_t qlen0) const {
    StepDesc d;
    const int64_t q0 = qb * G;
    const int64_t rem = Nq - q0;
    d.nseg = static_cast<int>(rem < G ? rem : G);
    d.qkey = qb;
    d.q_row0 = q0 * Lq;
    d.seg_stride = Lq > 0 ? Lq : 1;
    d.qlen0 = qlen0;
    d.doc_row0 = ok ? o0 : 0;
    d.dlen = ok ? len : 0;
    d.out0 = q0 * Nb + n;
    d.out_stride = Nb;
    d.bad = !ok;
    return d;
  }
  __device__ __forceinline__ int64_t seg_qlen(const StepDesc& d, int s) const {
    return qlen_of(d.qkey * G + s);
  }
};
using ContrastivePolicy = ContrastiveGrid<OffsetDocuments>;
using ContrastivePaddedPolicy = ContrastiveGrid<PaddedDocuments>;

// padded, in the contrastive grid's terms (the warp-specialised kernel walks (query block,
// document) steps): query q owns documents q * Nb .. q * Nb + Nb - 1 of the [B, C, Ld, D]
// tensor (Nq = B, Nb = C), one query per block (G = 1). Same answers as PaddedPolicy: a
// length that cannot be read makes the pair bad.
struct PaddedGrid {
  IndexView qlens, dlens;
  int64_t Nq, Nb, Lq, Ld;
  static constexpr int G = 1;
  static constexpr bool kStrided = true;
  // Rerank reads each document once, from HBM: the producer loads a document's last tile
  // and the query block in 32-row boxes up to their lengths, not the padding past them.
  static constexpr bool kBoundedLoads = true;
  static constexpr bool kPairRows = false;  // see PackedGrid

  // The producer's reads of step (q, n): document (q, n)'s length and query q's, issued a
  // step ahead and checked a step later. A length that cannot be read makes the pair bad
  // (ok = false, or qlen -1).
  struct StepRead {
    IndexView::Pending len, qlen;
    int64_t k;
    bool in_range;
  };
  __device__ __forceinline__ StepRead issue_step(int64_t q, int64_t n) const {
    const bool in_range = q >= 0 && q < Nq && n >= 0 && n < Nb;
    const int64_t k = q * Nb + n;
    return {dlens.issue(in_range ? k : -1), qlens.issue(q), k, in_range};
  }
  __device__ __forceinline__ StepRows step_rows(const StepRead& r) const {
    StepRows s;
    s.ok = r.in_range && r.len.ok;
    s.row0 = r.k * Ld;
    s.len = clamp64(dlens.value(r.len), 0, Ld);
    s.qlen = static_cast<int32_t>(r.qlen.ok ? clamp64(qlens.value(r.qlen), 0, Lq) : -1);
    return s;
  }
  __device__ __forceinline__ StepDesc step_at(int64_t q, int64_t n, bool ok, int64_t o0, int64_t len,
                                              int64_t qlen0) const {
    StepDesc d;
    d.nseg = 1;
    d.qkey = q;
    d.q_row0 = q * Lq;
    d.seg_stride = Lq > 0 ? Lq : 1;
    d.qlen0 = qlen0 < 0 ? 0 : qlen0;
    d.doc_row0 = ok ? o0 : 0;
    d.dlen = ok ? len : 0;
    d.out0 = q * Nb + n;
    d.out_stride = 0;
    d.bad = !ok || qlen0 < 0;
    return d;
  }
};

// packed, in the padded grid's terms: pair p plays a padded query with one document
// (Nq = P, Nb = 1, G = 1, Lq = max_q_len; a grid step is a pair, or a 64-row chunk of one).
// Its query's first row is data, so the kernel's producer reads the pair itself (kPairRows:
// the ids two steps ahead, both segments one step ahead) and loads the query boxes from
// there; the consumers get the query length in the TileInfo and read no index.
// A query longer than Lq (max_q_len understated; a GPU cannot check it before the launch)
// makes its pair bad: its rows past the block's chunks would be neither loaded nor summed.
struct PackedGrid {
  IndexView qoffs, doffs, pqids, pdids;
  int64_t Nq, Nb, Lq;  // pairs, 1, max_q_len
  int64_t q_segs, d_segs, Tq, Td;
  static constexpr int G = 1;
  static constexpr bool kStrided = true;
  static constexpr bool kBoundedLoads = true;
  static constexpr bool kPairRows = true;

  // Two reads per pair, a step apart in the producer: the ids (issued two steps ahead, made
  // values one step ahead), then the segments they name (issued one step ahead, checked at
  // the step). Each is IndexView::issue's two halves, so no read is waited for in the step
  // that issues it: the loads stay in flight while the producer issues the current step's tiles.
  struct IdsRead {
    IndexView::Pending qid, did;
  };
  __device__ __forceinline__ IdsRead issue_ids(int64_t p) const { return {pqids.issue(p), pdids.issue(p)}; }
  __device__ __forceinline__ PairIds ids_of(const IdsRead& r) const {
    return {pqids.value(r.qid), pdids.value(r.did), r.qid.ok && r.did.ok};
  }
  struct StepRead {
    IndexView::Pending qa, qb, da, db;
    PairIds id;
  };
  __device__ __forceinline__ StepRead issue_pair(const PairIds& id) const {
    return {qoffs.issue(id.qid), qoffs.issue(id.qid + 1), doffs.issue(id.did), doffs.issue(id.did + 1), id};
  }
  // The pair's query rows [qrow0, qrow0 + qlen) and document rows [row0, row0 + len); a bad
  // pair (the checks of segment(), and qlen <= Lq): ok = false and qlen -1.
  __device__ __forceinline__ StepRows step_rows(const StepRead& r) const {
    const int64_t qa = qoffs.value(r.qa), qb = qoffs.value(r.qb);
    const int64_t da = doffs.value(r.da), db = doffs.value(r.db);
    const bool okq = r.qa.ok & r.qb.ok & (r.id.qid < q_segs) & segment_fits(qa, qb, Tq) & (qb - qa <= Lq);
    const bool okd = r.da.ok & r.db.ok & (r.id.did < d_segs) & segment_fits(da, db, Td);
    StepRows s;
    s.ok = r.id.ok & okq & okd;
    s.qrow0 = qa;
    s.qlen = s.ok ? static_cast<int32_t>(qb - qa) : -1;
    s.row0 = da;
    s.len = db - da;
    return s;
  }
  // qlen0: the query's length, < 0 for a bad pair (the producer's reads say which).
  __device__ __forceinline__ StepDesc step_at(int64_t p, int64_t, bool ok, int64_t o0, int64_t len,
                                              int64_t qlen0) const {
    StepDesc d;
    d.nseg = 1;
    d.qkey = p;
    d.q_row0 = 0;  // unused: the producer loaded the query
    d.seg_stride = 1;
    d.qlen0 = qlen0 < 0 ? 0 : qlen0;
    d.doc_row0 = ok ? o0 : 0;
    d.dlen = ok ? len : 0;
    d.out0 = p;
    d.out_stride = 0;
    d.bad = !ok || qlen0 < 0;
    return d;
  }
};

// packed: step = pair p; the query block changes only when pair_query_ids changes.
struct PackedPolicy {
  IndexView qoffs, doffs, pqids, pdids;
  int64_t Nq, Nd, Tq, Td, P;
  static constexpr bool kOneQueryPerStep = true;

  __host__ __device__ int64_t steps() const { return P; }
  __host__ __device__ int64_t query_rows() const { return Tq; }
  __host__ __device__ int max_segments() const { return 1; }

  // the pair's ids: read one step early, so only the offsets read stays on the step's path
  using Ahead = PairIds;
  __device__ __forceinline__ Ahead ahead(int64_t p) const { return fetch_pair_ids(pqids, pdids, p); }

  __device__ __forceinline__ StepDesc step(int64_t p, const Ahead& h) const {
    StepDesc d;
    const int64_t qid = h.qid, did = h.did;
    int64_t q0 = 0, ql = 0, d0 = 0, dl = 0;
    bool ok = h.ok;
    ok = ok && segment(qoffs, qid, Nq, Tq, q0, ql);
    ok = ok && segment(doffs, did, Nd, Td, d0, dl);
    d.qkey = ok ? qid : -1;
    d.q_row0 = ok ? q0 : 0;
    d.qlen0 = ok ? ql : 0;
    d.seg_stride = d.qlen0 > 0 ? d.qlen0 : 1;
    d.doc_row0 = ok ? d0 : 0;
    d.dlen = ok ? dl : 0;
    d.out0 = p;
    d.out_stride = 0;
    d.nseg = 1;
    d.bad = !ok;
    return d;
  }
  __device__ __forceinline__ int64_t seg_qlen(const StepDesc& d, int) const { return d.qlen0; }
};

// Which rows of the current (step, chunk) block hold real query rows.
struct QueryRows {
  const StepDesc* d;
  const int64_t* seg_qlen;  // smem, valid when d->nseg > 1
  int64_t chunk;
  int bm;
  __device__ __forceinline__ bool valid(int r) const {
    const int64_t R = chunk * bm + r;
    if (d->nseg == 1) return R < d->qlen0;
    const int64_t s = R / d->seg_stride;
    return s < d->nseg && (R - s * d->seg_stride) < seg_qlen[s];
  }
  __device__ __forceinline__ int64_t global_row(int r) const { return d->q_row0 + chunk * bm + r; }
};

}  // namespace kernel
}  // namespace maxsim_cuda
