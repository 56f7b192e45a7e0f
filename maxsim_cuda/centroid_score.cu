// PLAID's centroid-only score in two launches (launch.h): the query-centroid table, then the
// gather. Torch-free.
//
// The table is float32 with float32 accumulation in a fixed order, whatever the caller's matmul
// settings (a TF32 table would move scores by ~1e-3). A CTA takes 32 centroids of one query's
// 32-token chunk; lane l is query token i0 + l, so each warp writes whole 128-byte table rows.
//
// The gather is bound by its table reads: a document token costs one Lq-float row, 128 bytes at
// Lq 32, from L2 (or L1 where the row was read before). One CTA per pair; each warp takes
// blocks of 32 tokens, reads their 32 codes in one coalesced load, then issues the 32 row
// reads back to back (code u reaches every lane by a shuffle), so a warp has 32 reads in
// flight and no read waits on another. The next block's codes are read before this block's
// rows. Warps' maxima meet in shared memory; the per-token maxima are summed by a fixed
// shuffle tree (deterministic; max.NaN returns the canonical NaN, so even NaN bits repeat).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel/policies.cuh"
#include "kernel/primitives.cuh"
#include "launch.h"

namespace maxsim_cuda {
namespace kernel {

constexpr int kTableCentroids = 32, kTableDims = 64, kTableThreads = 256;
constexpr int kGatherWarps = 4;

template <class T>
__device__ __forceinline__ float load_float(const void* p, int64_t i) {
  return static_cast<float>(static_cast<const T*>(p)[i]);
}

// Block (query q, token chunk i0, centroids c0 .. c0 + 31); flattened into blockIdx.x so that
// no grid dimension limits Nq.
template <class TQ, class TC>
__global__ void __launch_bounds__(kTableThreads) centroid_table_kernel(const CentroidTableParams p) {
  __shared__ float qs[32][kTableDims + 1];  // +1: lane l reads row l, conflict-free
  __shared__ __align__(16) float cs[kTableCentroids][kTableDims];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // the launcher keeps the block count below 2**31, so 32-bit division splits it
  const unsigned cblocks = static_cast<unsigned>((p.n_centroids + kTableCentroids - 1) / kTableCentroids);
  const unsigned chunks = static_cast<unsigned>((p.lq + 31) / 32);
  const unsigned b = blockIdx.x;
  const int64_t c0 = static_cast<int64_t>(b % cblocks) * kTableCentroids;
  const int64_t i0 = static_cast<int64_t>(b / cblocks % chunks) * 32;
  const int64_t q = b / cblocks / chunks;
  constexpr int kPerWarp = kTableCentroids / (kTableThreads / 32);
  float acc[kPerWarp] = {};
  for (int64_t d0 = 0; d0 < p.dim; d0 += kTableDims) {
    for (int e = threadIdx.x; e < 32 * kTableDims; e += kTableThreads) {
      const int r = e / kTableDims, k = e % kTableDims;
      const bool in_d = d0 + k < p.dim;
      qs[r][k] = in_d && i0 + r < p.lq ? load_float<TQ>(p.queries, ((q * p.lq) + i0 + r) * p.dim + d0 + k) : 0.f;
      cs[r][k] = in_d && c0 + r < p.n_centroids ? load_float<TC>(p.centroids, (c0 + r) * p.dim + d0 + k)
                                                : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int k = 0; k < kTableDims; k += 4) {
      const float q0 = qs[lane][k], q1 = qs[lane][k + 1], q2 = qs[lane][k + 2], q3 = qs[lane][k + 3];
#pragma unroll
      for (int u = 0; u < kPerWarp; ++u) {
        const float4 c = *reinterpret_cast<const float4*>(&cs[warp * kPerWarp + u][k]);
        acc[u] = fmaf(q3, c.w, fmaf(q2, c.z, fmaf(q1, c.y, fmaf(q0, c.x, acc[u]))));
      }
    }
    __syncthreads();
  }
  if (i0 + lane >= p.lq) return;
#pragma unroll
  for (int u = 0; u < kPerWarp; ++u) {
    const int64_t c = c0 + warp * kPerWarp + u;
    if (c < p.n_centroids) p.table[(q * p.n_centroids + c) * p.lq + i0 + lane] = acc[u];
  }
}

__global__ void __launch_bounds__(kGatherWarps * 32, 8) centroid_score_kernel(const CentroidParams p) {
  __shared__ float red[kGatherWarps][32];
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
  // A lane's code as the row index it stands for: kAbsent past the document's end, kBad
  // outside [0, n_centroids) (the token scores NaN; nothing is read).
  constexpr int kAbsent = -1, kBad = -2;
  const auto row_of = [&](int64_t j) -> int {
    if (j >= e) return kAbsent;
    const int64_t c = codes.load(j);
    return c >= 0 && c < p.n_centroids ? static_cast<int>(c) : kBad;
  };
  const float* table = p.table + q * p.n_centroids * p.lq;
  constexpr int64_t kStride = kGatherWarps * 32;
  float total = 0.f;
  for (int64_t i0 = 0; i0 < qlen; i0 += 32) {
    const int64_t i = i0 + lane;
    const bool live = i < qlen;
    const float* column = table + (live ? i : 0);
    float best = -inf;
    int64_t j0 = s + warp * 32;
    int next = j0 < e ? row_of(j0 + lane) : kAbsent;
    for (; j0 < e; j0 += kStride) {
      const int row = next;
      next = j0 + kStride < e ? row_of(j0 + kStride + lane) : kAbsent;
#pragma unroll
      for (int u = 0; u < 32; ++u) {  // ptxas hoists the reads ahead of the folds
        const int r = __shfl_sync(0xffffffffu, row, u);
        best = max_nan(r >= 0 && live ? __ldg(column + static_cast<int64_t>(r) * p.lq) : (r == kBad ? nan : -inf),
                       best);
      }
    }
    red[warp][lane] = best;
    __syncthreads();
    if (warp == 0) {
      float m = red[0][lane];
#pragma unroll
      for (int w = 1; w < kGatherWarps; ++w) m = max_nan(red[w][lane], m);
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

cudaError_t launch_centroid_table(const CentroidTableParams& p) {
  if (p.num_queries <= 0 || p.lq <= 0 || p.n_centroids <= 0) return cudaSuccess;
  const int64_t blocks = p.num_queries * ((p.lq + 31) / 32) *
                         ((p.n_centroids + kernel::kTableCentroids - 1) / kernel::kTableCentroids);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const auto launch = [&](auto query_type) {
    using TQ = decltype(query_type);
    const auto go = [&](auto kernel) { kernel<<<static_cast<unsigned>(blocks), kernel::kTableThreads, 0, p.stream>>>(p); };
    switch (p.centroid_dtype) {
      case DType::kF16: return go(kernel::centroid_table_kernel<TQ, __half>);
      case DType::kBF16: return go(kernel::centroid_table_kernel<TQ, __nv_bfloat16>);
      case DType::kF32: return go(kernel::centroid_table_kernel<TQ, float>);
      case DType::kF64: return go(kernel::centroid_table_kernel<TQ, double>);
    }
  };
  switch (p.query_dtype) {
    case DType::kF16: launch(__half{}); break;
    case DType::kBF16: launch(__nv_bfloat16{}); break;
    case DType::kF32: launch(float{}); break;
    case DType::kF64: launch(double{}); break;
  }
  return cudaGetLastError();
}

cudaError_t launch_centroid_score(const CentroidParams& p) {
  if (p.pairs <= 0) return cudaSuccess;
  if (p.pairs > 0x7fffffff || p.n_centroids > 0x7fffffff) return cudaErrorInvalidValue;
  kernel::centroid_score_kernel<<<static_cast<unsigned>(p.pairs), kernel::kGatherWarps * 32, 0, p.stream>>>(p);
  return cudaGetLastError();
}

}  // namespace maxsim_cuda
