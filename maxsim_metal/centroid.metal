// PLAID's centroid-only score on Apple GPUs: every document token stands for its centroid, so
// with the query-centroid table [Nq, n_centroids, Lq] (float32, built by one matmul in the
// Python layer) score(q, n) = sum_i max_{j in n} table[q, codes[j], i]. One threadgroup per
// pair; thread t owns query rows t, t + 128, ...; the row maxima meet in threadgroup memory
// and thread 0 sums them in row order (the CPU backend's order, so the same bits on every
// run). Semantics of docs/residual.md: an empty query scores 0, an empty document -inf, and
// a bad pair id, offset or code NaN (never read out of bounds).
#include <metal_stdlib>

#include "params.h"
#include "policies.h"
#include "tiles.h"

using namespace metal;

// Index slots (MaxsimParams::index_*[k]): 0 document_offsets [Nb + 1], 1 query_lengths [Nq]
// (optional), 2 pair_query_ids and 3 pair_document_ids [P] (listed pairs only); the codes
// through codes_size / codes_is64.
template <bool kListed>
kernel void maxsim_centroid_scores(constant MaxsimParams& params [[buffer(0)]],
                                   device const float* table [[buffer(1)]],
                                   device const int* document_codes [[buffer(2)]],
                                   device const int* index0 [[buffer(3)]],
                                   device const int* index1 [[buffer(4)]],
                                   device const int* index2 [[buffer(5)]],
                                   device const int* index3 [[buffer(6)]],
                                   device float* scores [[buffer(7)]],
                                   threadgroup float* smem [[threadgroup(0)]],
                                   uint group [[threadgroup_position_in_grid]],
                                   uint tid [[thread_index_in_threadgroup]]) {
  const long p = long(group);
  if (p >= params.num_pairs) return;
  const IndexView offsets = index_view(params, 0, index0), query_lengths = index_view(params, 1, index1);
  IndexView codes;
  codes.ptr = document_codes;
  codes.size = params.codes_size;
  codes.is64 = params.codes_is64 != 0;
  codes.present = params.codes_size > 0;
  const long Lq = params.Lq, nc = params.n_centroids;

  long q = p / max(params.Nb, 1L), n = p % max(params.Nb, 1L);
  bool ok = true;
  if (kListed) {
    ok = index_view(params, 2, index2).get(p, q) && index_view(params, 3, index3).get(p, n) && q >= 0 &&
         q < params.Nq && n >= 0 && n < params.Nb;
  }
  long start = 0, len = 0, qlen = Lq;
  ok = ok && segment(offsets, params.codes_size, n, start, len);
  if (ok && query_lengths.present) {
    long v = 0;
    ok = query_lengths.get(q, v);
    qlen = clamp_len(v, Lq);
  }
  if (!ok || qlen == 0 || len == 0) {
    if (tid == 0) scores[p] = !ok ? nan_value() : (qlen == 0 ? 0.0f : minus_infinity());
    return;
  }

  device const float* rows = table + q * nc * Lq;  // rows[c * Lq + i]
  float total = 0.0f;  // thread 0's
  for (long i0 = 0; i0 < qlen; i0 += kMaxsimThreads) {
    const long i = i0 + tid;
    if (i < qlen) {
      Best best = no_best();  // the forward's running max: NaN wins, then the larger value
      for (long j = start; j < start + len; ++j) {
        long c = -1;
        if (!codes.get(j, c) || c < 0 || c >= nc) {
          best.value = nan_value();
          break;
        }
        Best x;
        x.value = rows[c * Lq + i];
        x.index = int(j - start);
        best = better(best, x);
      }
      smem[tid] = best.value;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0)
      for (long k = 0; k < min(long(kMaxsimThreads), qlen - i0); ++k) total += smem[k];
    threadgroup_barrier(mem_flags::mem_threadgroup);  // smem is rewritten by the next rows
  }
  if (tid == 0) scores[p] = total;
}

#define MAXSIM_CENTROIDS(name, listed) \
  template [[host_name(#name)]] [[kernel]] decltype(maxsim_centroid_scores<listed>) maxsim_centroid_scores<listed>;

// every query x every document, or the listed pairs (launch_plan.h picks)
MAXSIM_CENTROIDS(maxsim_centroid_scores_all, false)
MAXSIM_CENTROIDS(maxsim_centroid_scores_pairs, true)
