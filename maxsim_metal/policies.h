// Indexing policies of the Metal kernels (MSL): for pair p, which query and document rows
// it uses (docs/design.md), and for the backward, which pairs touch an owner's rows. The
// same four surfaces as maxsim_cpu/kernels.h and maxsim_cuda/kernel/policies.cuh (the two
// contrastive ones are one grid over offset or padded documents). Every
// index read is range-checked against its tensor, so bad values give a "not ok" pair
// (NaN score, argmax -1, no gradient) instead of an out-of-bounds access.
#pragma once

#include <metal_stdlib>

#include "params.h"

using namespace metal;

// Reads an int32 or int64 index buffer without a conversion launch (int64 as two
// little-endian words, so one buffer type serves both widths).
struct IndexView {
  device const int* ptr;
  long size;
  bool is64;
  bool present;

  bool get(long i, thread long& v) const {
    if (!present || i < 0 || i >= size) return false;
    if (is64) {
      const ulong lo = as_type<uint>(ptr[2 * i]), hi = as_type<uint>(ptr[2 * i + 1]);
      v = as_type<long>((hi << 32) | lo);
    } else {
      v = long(ptr[i]);
    }
    return true;
  }
};

inline IndexView index_view(constant MaxsimParams& prm, int k, device const int* ptr) {
  IndexView v;
  v.ptr = ptr;
  v.size = prm.index_size[k];
  v.is64 = prm.index_is64[k] != 0;
  v.present = prm.index_present[k] != 0;
  return v;
}

inline long clamp_len(long v, long hi) { return min(max(v, 0L), hi); }

// [offsets[k], offsets[k+1]) as (start, length); false when k or the range is invalid.
inline bool segment(IndexView offsets, long total_rows, long k, thread long& start,
                    thread long& len) {
  long a = 0, b = 0;
  if (k < 0 || !offsets.get(k, a) || !offsets.get(k + 1, b)) return false;
  if (a < 0 || b < a || b > total_rows) return false;
  start = a;
  len = b - a;
  return true;
}

struct PairSpec {
  bool ok;
  long qrow, qlen;  // first query row and valid rows
  long drow, dlen;  // same for the document
};

// Index buffer slots per surface (MaxsimParams::index_*[k] describes slot k):
//   padded:      0 query_lengths [B], 1 doc_lengths [B*C]
//   contrastive: 0 document_offsets [Nb+1], 1 query_lengths [Nq] (optional)
//   contrastive_padded: 0 document_lengths [Nb], 1 query_lengths [Nq] (optional)
//   packed:      0 query_offsets, 1 document_offsets, 2 pair_query_ids, 3 pair_document_ids
//   backward:    4 pairs_by_<owner>, 5 <owner>_pair_offsets (packed only)
constexpr bool is_contrastive(int surface) {
  return surface == kMaxsimContrastive || surface == kMaxsimContrastivePadded;
}

template <int kSurface> struct Policy {
  long B, C, Lq, Ld, Nb, Tq, Td;
  IndexView idx0, idx1, idx2, idx3;

  // contrastive document n: an offsets segment, or padded row block n with its length
  // clamped to [0, Ld] (as the CPU and CUDA backends do)
  bool contrastive_document(long n, thread long& row, thread long& len) const {
    if (kSurface == kMaxsimContrastive) return segment(idx0, Td, n, row, len);
    long v = 0;
    if (n < 0 || n >= Nb || !idx0.get(n, v)) return false;
    row = n * Ld;
    len = clamp_len(v, Ld);
    return true;
  }

  PairSpec pair(long p) const {
    PairSpec s;
    s.ok = true;
    if (kSurface == kMaxsimPadded) {
      long ql = 0, dl = 0;
      const long b = p / C;
      s.ok = idx0.get(b, ql) && idx1.get(p, dl);
      s.qrow = b * Lq;
      s.qlen = clamp_len(ql, Lq);
      s.drow = p * Ld;
      s.dlen = clamp_len(dl, Ld);
    } else if (is_contrastive(kSurface)) {
      const long q = p / Nb, n = p % Nb;
      long ql = Lq;
      if (idx1.present && !idx1.get(q, ql)) s.ok = false;
      s.qrow = q * Lq;
      s.qlen = clamp_len(ql, Lq);
      s.drow = 0;
      s.dlen = 0;
      s.ok = s.ok && contrastive_document(n, s.drow, s.dlen);
    } else {
      long qid = -1, did = -1;
      s.qrow = s.qlen = s.drow = s.dlen = 0;
      s.ok = idx2.get(p, qid) && idx3.get(p, did) && segment(idx0, Tq, qid, s.qrow, s.qlen) &&
             segment(idx1, Td, did, s.drow, s.dlen);
    }
    if (!s.ok) s.qlen = s.dlen = 0;
    return s;
  }
};

template <int kSurface>
inline Policy<kSurface> make_policy(constant MaxsimParams& prm, device const int* i0,
                                    device const int* i1, device const int* i2,
                                    device const int* i3) {
  Policy<kSurface> pol;
  pol.B = prm.B;
  pol.C = prm.C;
  pol.Lq = prm.Lq;
  pol.Ld = prm.Ld;
  pol.Nb = prm.Nb;
  pol.Tq = prm.Tq;
  pol.Td = prm.Td;
  pol.idx0 = index_view(prm, 0, i0);
  pol.idx1 = index_view(prm, 1, i1);
  pol.idx2 = index_view(prm, 2, i2);
  pol.idx3 = index_view(prm, 3, i3);
  return pol;
}

// Backward owners: owner o holds output rows [row0, row0 + nrows) and lists the pairs that
// may add to them, in the fixed order the sums use (the CPU backend's order).
enum OwnerKind { kStridedOwners = 0, kOffsetOwners = 1, kListedOwners = 2 };

struct Owners {
  int kind;
  long rows_per_owner;                // strided: owner o holds rows o*rows_per_owner ..
  long pairs_per_owner, pair_base_mul, pair_step;  // strided/offset: pair o*mul + t*step
  IndexView offsets;                  // offset/listed: the owner's row segment
  long total_rows;
  IndexView pairs_by, pair_offsets, pair_ids;  // listed: pairs_by[pair_offsets[o] + t]

  bool rows(long o, thread long& row0, thread long& nrows) const {
    if (kind == kStridedOwners) {
      row0 = o * rows_per_owner;
      nrows = rows_per_owner;
      return true;
    }
    return segment(offsets, total_rows, o, row0, nrows);
  }
  bool listed(long o, thread long& s, thread long& e) const {
    return pair_offsets.get(o, s) && pair_offsets.get(o + 1, e) && 0 <= s && s <= e &&
           e <= pairs_by.size;
  }
  long num_pairs(long o) const {
    if (kind != kListedOwners) return pairs_per_owner;
    long s = 0, e = 0;
    return listed(o, s, e) ? e - s : 0;
  }
  // -1 unless the listed pair really belongs to owner o
  long pair_at(long o, long t) const {
    if (kind != kListedOwners) return o * pair_base_mul + t * pair_step;
    long s = 0, e = 0, p = -1, id = -1;
    if (!listed(o, s, e) || !pairs_by.get(s + t, p) || !pair_ids.get(p, id) || id != o)
      return -1;
    return p;
  }
};

template <int kSurface, bool kToQuery>
inline Owners make_owners(constant MaxsimParams& prm, device const int* i0, device const int* i1,
                          device const int* i2, device const int* i3, device const int* i4,
                          device const int* i5) {
  Owners w;
  w.kind = kStridedOwners;
  w.rows_per_owner = w.pairs_per_owner = w.pair_base_mul = w.pair_step = 0;
  w.total_rows = kToQuery ? prm.Tq : prm.Td;
  w.offsets = index_view(prm, 0, i0);
  w.pairs_by = index_view(prm, 4, i4);
  w.pair_offsets = index_view(prm, 5, i5);
  w.pair_ids = index_view(prm, 2, i2);
  if (kSurface == kMaxsimPadded) {
    // query b: pairs b*C + c; document pair p: itself
    w.rows_per_owner = kToQuery ? prm.Lq : prm.Ld;
    w.pairs_per_owner = kToQuery ? prm.C : 1;
    w.pair_base_mul = kToQuery ? prm.C : 1;
    w.pair_step = 1;
  } else if (is_contrastive(kSurface)) {
    // query q: pairs q*Nb + n; document n (an offsets segment, or padded rows n*Ld ..):
    // pairs q*Nb + n over q
    if (kToQuery) {
      w.rows_per_owner = prm.Lq;
      w.pairs_per_owner = prm.Nb;
      w.pair_base_mul = prm.Nb;
      w.pair_step = 1;
    } else {
      if (kSurface == kMaxsimContrastive) w.kind = kOffsetOwners;
      w.rows_per_owner = prm.Ld;
      w.pairs_per_owner = prm.Nq;
      w.pair_base_mul = 1;
      w.pair_step = prm.Nb;
    }
  } else {
    w.kind = kListedOwners;
    w.offsets = index_view(prm, kToQuery ? 0 : 1, kToQuery ? i0 : i1);
    w.pair_ids = index_view(prm, kToQuery ? 2 : 3, kToQuery ? i2 : i3);
  }
  return w;
}
