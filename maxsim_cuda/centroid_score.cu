// PLAID's centroid-only score (launch.h, CentroidParams): one CTA per pair. Its warps split the
// document's codes (warp w takes tokens w, w + 8, ...), lane l keeping the running max of query
// token i0 + l of a 32-token chunk; a token's 32 similarities are one 128-byte row of the table
// (laid out [Nq, n_centroids, Lq]), read from L2, eight tokens in flight a warp. The warps'
// maxima meet in shared memory (max is order-free: NaN wins either way) and the per-token
// maxima are summed by a fixed shuffle tree: deterministic. Torch-free.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel/policies.cuh"
#include "launch.h"

namespace maxsim_cuda {
namespace kernel {

constexpr int kCentroidWarps = 8, kCentroidUnroll = 8;

__device__ __forceinline__ float max_nan(float x, float best) {
  return (x > best || (x != x && best == best)) ? x : best;
}

__global__ void __launch_bounds__(kCentroidWarps * 32) centroid_score_kernel(const CentroidParams p) {
  __shared__ float red[kCentroidWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t pair = blockIdx.x;
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
  if (!ok || qlen == 0 || e == s) {  // uniform over the CTA
    if (threadIdx.x == 0) p.scores[pair] = !ok ? nan : (qlen == 0 ? 0.f : -inf);
    return;
  }
  const float* table = p.table + q * p.n_centroids * p.lq;
  float total = 0.f;
  for (int64_t i0 = 0; i0 < qlen; i0 += 32) {
    const int64_t i = i0 + lane;
    const bool live = i < qlen;
    float best = -inf;
    constexpr int kStride = kCentroidWarps * kCentroidUnroll;
    int64_t j = s + warp;
    for (; j + (kCentroidUnroll - 1) * kCentroidWarps < e; j += kStride) {
      int64_t c[kCentroidUnroll];
      float x[kCentroidUnroll];
#pragma unroll
      for (int u = 0; u < kCentroidUnroll; ++u) c[u] = codes.load(j + u * kCentroidWarps);
#pragma unroll
      for (int u = 0; u < kCentroidUnroll; ++u) {
        const bool in = c[u] >= 0 && c[u] < p.n_centroids;
        x[u] = !in ? nan : (live ? __ldg(table + c[u] * p.lq + i) : -inf);
      }
#pragma unroll
      for (int u = 0; u < kCentroidUnroll; ++u) best = max_nan(x[u], best);
    }
    for (; j < e; j += kCentroidWarps) {
      const int64_t c = codes.load(j);
      const bool in = c >= 0 && c < p.n_centroids;
      best = max_nan(!in ? nan : (live ? __ldg(table + c * p.lq + i) : -inf), best);
    }
    red[warp][lane] = best;
    __syncthreads();
    if (warp == 0) {
      float m = red[0][lane];
#pragma unroll
      for (int w = 1; w < kCentroidWarps; ++w) m = max_nan(red[w][lane], m);
      float part = live ? m : 0.f;
#pragma unroll
      for (int o = 16; o > 0; o /= 2) part += __shfl_xor_sync(0xffffffffu, part, o);
      total += part;
    }
    __syncthreads();  // red is rewritten by the next chunk
  }
  if (threadIdx.x == 0) p.scores[pair] = total;
}

}  // namespace kernel

cudaError_t launch_centroid_score(const CentroidParams& p) {
  if (p.pairs <= 0) return cudaSuccess;
  if (p.pairs > 0x7fffffff) return cudaErrorInvalidValue;
  kernel::centroid_score_kernel<<<static_cast<unsigned>(p.pairs), kernel::kCentroidWarps * 32, 0, p.stream>>>(p);
  return cudaGetLastError();
}

}  // namespace maxsim_cuda
