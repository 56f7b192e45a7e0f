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
};

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
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

// The (query id, document id) of pair p, by predicated reads (issued together, nothing
// waits for them here); ok = false when p lies outside either tensor. Both packed policies.
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
struct OffsetDocuments {
  IndexView doffs;
  int64_t Nb, T;
  __device__ __forceinline__ bool rows(int64_t n, int64_t& row0, int64_t& len) const {
    return segment(doffs, n, Nb, T, row0, len);
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
  // Rows of document n as query q sees it (every query sees the same documents).
  __device__ __forceinline__ bool doc_rows(int64_t, int64_t n, int64_t& row0, int64_t& len) const {
    return docs.rows(n, row0, len);
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

  __device__ __forceinline__ int64_t qlen_of(int64_t q) const {
    int64_t v;
    return qlens.get(q, v) ? clamp64(v, 0, Lq) : -1;  // -1: unreadable (a bad pair)
  }
  __device__ __forceinline__ bool doc_rows(int64_t q, int64_t n, int64_t& row0, int64_t& len) const {
    const int64_t k = q * Nb + n;
    int64_t v;
    if (q < 0 || q >= Nq || n < 0 || n >= Nb || !dlens.get(k, v)) return false;
    row0 = k * Ld;
    len = clamp64(v, 0, Ld);
    return true;
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

  // Two reads per pair, a step apart in the producer: the ids, then the segments they name.
  // Both are predicated loads and checks by select, so neither waits for its loads: they
  // stay in flight while the producer issues the current step's tiles.
  using Ids = PairIds;
  __device__ __forceinline__ Ids pair_ids(int64_t p) const { return fetch_pair_ids(pqids, pdids, p); }
  // The pair's query rows [q0, q0 + ql) and document rows [d0, d0 + dl); false for a bad
  // pair (the checks of segment(), and ql <= Lq).
  __device__ __forceinline__ bool pair_rows(const Ids& id, int64_t& q0, int64_t& ql, int64_t& d0,
                                            int64_t& dl) const {
    bool a, b, c, d;
    const int64_t qa = qoffs.fetch(id.qid, a), qb = qoffs.fetch(id.qid + 1, b);
    const int64_t da = doffs.fetch(id.did, c), db = doffs.fetch(id.did + 1, d);
    const bool okq = a & b & (id.qid < q_segs) & (qa >= 0) & (qb >= qa) & (qb <= Tq) & (qb - qa <= Lq);
    const bool okd = c & d & (id.did < d_segs) & (da >= 0) & (db >= da) & (db <= Td);
    q0 = qa;
    ql = qb - qa;
    d0 = da;
    dl = db - da;
    return id.ok & okq & okd;
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
