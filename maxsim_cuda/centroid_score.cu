// PLAID's centroid-only score (launch.h, CentroidParams): one warp per pair, lane l keeping the
// running max of query tokens i0 + l of a 32-token chunk over the document's codes; a token's
// 32 similarities are one 128-byte row of the table (laid out [Nq, n_centroids, Lq]), read from
// L2. The per-token maxima are summed by a fixed shuffle tree: deterministic. Torch-free.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel/policies.cuh"
#include "launch.h"

namespace maxsim_cuda {
namespace kernel {

constexpr int kCentroidWarps = 8;

__global__ void __launch_bounds__(kCentroidWarps * 32) centroid_score_kernel(const CentroidParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t pair = int64_t(blockIdx.x) * kCentroidWarps + threadIdx.x / 32;
  if (pair >= p.pairs) return;
  const IndexView codes(p.codes), offs(p.doc_offsets), qlens(p.query_lengths);
  const IndexView pq(p.pair_query_ids), pd(p.pair_doc_ids);
  const float nan = __int_as_float(0x7fc00000), inf = __int_as_float(0x7f800000);
  int64_t q = p.num_docs > 0 ? pair / p.num_docs : 0, n = p.num_docs > 0 ? pair % p.num_docs : 0;
  bool ok = true, ok1 = true;
  if (pq.present()) {
    q = pq.fetch(pair, ok);
    n = pd.fetch(pair, ok1);
    ok = ok && ok1 && q >= 0 && q < p.num_queries && n >= 0 && n < p.num_docs;
  }
  const int64_t s = ok ? offs.fetch(n, ok1) : 0;
  ok = ok && ok1;
  const int64_t e = ok ? offs.fetch(n + 1, ok1) : 0;
  ok = ok && ok1 && s >= 0 && s <= e && e <= p.codes.size;
  int64_t qlen = p.lq;
  if (ok && qlens.present()) {
    const int64_t v = qlens.fetch(q, ok1);
    qlen = !ok1 ? 0 : (v < 0 ? 0 : (v > p.lq ? p.lq : v));
  }
  float result;
  if (!ok) {
    result = nan;
  } else if (qlen == 0 || e == s) {
    result = qlen == 0 ? 0.f : -inf;
  } else {
    const float* table = p.table + q * p.n_centroids * p.lq;
    float total = 0.f;
    for (int64_t i0 = 0; i0 < qlen; i0 += 32) {
      const int64_t i = i0 + lane;
      const bool live = i < qlen;
      float best = -inf;
      int64_t j = s;
      // four tokens in flight: their codes, then their table rows
      for (; j + 4 <= e; j += 4) {
        int64_t c[4];
        float x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) c[u] = codes.load(j + u);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const bool in = c[u] >= 0 && c[u] < p.n_centroids;
          x[u] = !in ? nan : (live ? __ldg(table + c[u] * p.lq + i) : -inf);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) best = (x[u] > best || (x[u] != x[u] && best == best)) ? x[u] : best;
      }
      for (; j < e; ++j) {
        const int64_t c = codes.load(j);
        const bool in = c >= 0 && c < p.n_centroids;
        const float x = !in ? nan : (live ? __ldg(table + c * p.lq + i) : -inf);
        best = (x > best || (x != x && best == best)) ? x : best;
      }
      float part = live ? best : 0.f;
#pragma unroll
      for (int o = 16; o > 0; o /= 2) part += __shfl_xor_sync(0xffffffffu, part, o);
      total += part;
    }
    result = total;
  }
  if (lane == 0) p.scores[pair] = result;
}

}  // namespace kernel

cudaError_t launch_centroid_score(const CentroidParams& p) {
  if (p.pairs <= 0) return cudaSuccess;
  const int64_t blocks = (p.pairs + kernel::kCentroidWarps - 1) / kernel::kCentroidWarps;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  kernel::centroid_score_kernel<<<static_cast<unsigned>(blocks), kernel::kCentroidWarps * 32, 0, p.stream>>>(p);
  return cudaGetLastError();
}

}  // namespace maxsim_cuda
