// PLAID's centroid-only score (launch.h): the query-centroid table, then the gather. Torch-free.
//
// The table is float32 with float32 accumulation whatever the caller's matmul settings (a TF32
// table moves scores by ~1e-3). 16-bit inputs of one dtype go to cuBLAS from ops.cpp; this
// file's table kernel serves the rest: a CTA takes 32 centroids of one query's 32-token chunk,
// lane l being query token i0 + l, so each warp writes whole rows.
//
// The gather reads one row of Lq floats (128 bytes at Lq 32) a document token, from L2 (or
// L1 where an earlier token read it); what bounds it is the chain of dependent reads each
// pair waits on (its offsets, then its codes, then its rows), not the bytes. One CTA per
// pair: the CTA first stages the document's codes as row indices in shared memory, all of a
// thread's code reads in flight at once (one round trip for up to kCodeChunk tokens); then
// each warp takes blocks of 32 tokens and issues a block's row reads back to back, so that
// none waits on another. Where rows are 16-byte aligned and Lq is a multiple of 4, a lane
// reads a float4 (four rows per warp instruction, eight a block). Warps' maxima meet in
// shared memory; the per-token maxima are summed by a fixed shuffle tree (deterministic;
// max.NaN returns the canonical NaN, so even NaN bits repeat).
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
// Codes staged a chunk at a time (a document of up to kCodeChunk tokens is read once).
constexpr int kCodeChunk = 1024;
// A row index that stands for no token (past the document's end), or for a bad code (outside
// [0, n_centroids): the token scores NaN and nothing is read).
constexpr int kAbsent = -1, kBad = -2;

template <class T>
__device__ __forceinline__ float load_float(const void* p, int64_t i) {
  return to_acc<float>(static_cast<const T*>(p)[i]);
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
    if (c < p.n_centroids) p.table[(c * p.num_queries + q) * p.lq + i0 + lane] = acc[u];
  }
}

template <bool kVec, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 32 / kWarps) centroid_score_kernel(const CentroidParams p) {
  constexpr int kThreads = kWarps * 32;
  __shared__ float red[kWarps][32];
  __shared__ int rows[kCodeChunk];  // the staged codes as row indices (kAbsent / kBad)
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
  // Stage codes c0 .. c0 + kCodeChunk as row indices: all of a thread's reads are issued
  // before any is stored, so the chunk costs one round trip to memory.
  const auto stage = [&](int64_t c0) {
    constexpr int kPer = kCodeChunk / kThreads;
    int r[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int64_t j = c0 + threadIdx.x + u * kThreads;
      const int64_t c = j < e ? codes.load(j) : 0;
      r[u] = j >= e ? kAbsent : (c >= 0 && c < p.n_centroids ? static_cast<int>(c) : kBad);
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) rows[threadIdx.x + u * kThreads] = r[u];
    __syncthreads();
  };
  const bool one_chunk = e - s <= kCodeChunk;  // staged once for every query chunk
  if (one_chunk) stage(s);
  const float* table = p.table + q * p.query_stride;
  float total = 0.f;
  for (int64_t i0 = 0; i0 < qlen; i0 += 32) {
    const int64_t i = i0 + lane;
    const bool live = i < qlen;
    // Lane (g, h) = (lane / 8, lane % 8) of the float4 path reads query tokens i0 + 4h ..
    // 4h + 3 of rows 4u + g: four 128-byte rows per warp instruction, eight a block.
    const int g = lane / 8, h = lane % 8;
    const int64_t i4 = i0 + 4 * h;
    const bool live4 = i4 < qlen;  // the tokens past qlen in a live float4 are cut below
    const float* column = table + (live ? i : 0);
    float best = -inf;
    float4 b4 = make_float4(-inf, -inf, -inf, -inf);
    for (int64_t c0 = s; c0 < e; c0 += kCodeChunk) {
      if (!one_chunk) {
        __syncthreads();  // the last chunk's rows are read
        stage(c0);
      }
      // a warp's blocks of 32 staged rows: their reads issued back to back, none waiting
      // on another (ptxas hoists them ahead of the folds)
      for (int b = warp * 32; b < kCodeChunk && c0 + b < e; b += kThreads) {
        if constexpr (kVec) {
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const int r = rows[b + 4 * u + g];
            const float f = r == kBad ? nan : -inf;
            const float4 x =
                r >= 0 && live4
                    ? __ldg(reinterpret_cast<const float4*>(table + static_cast<int64_t>(r) * p.row_stride + i4))
                    : make_float4(f, f, f, f);
            b4 = make_float4(max_nan(x.x, b4.x), max_nan(x.y, b4.y), max_nan(x.z, b4.z), max_nan(x.w, b4.w));
          }
        } else {
#pragma unroll
          for (int u = 0; u < 32; ++u) {
            const int r = rows[b + u];
            best = max_nan(r >= 0 && live ? __ldg(column + static_cast<int64_t>(r) * p.row_stride)
                                          : (r == kBad ? nan : -inf), best);
          }
        }
      }
    }
    if constexpr (kVec) {
#pragma unroll
      for (int o = 8; o < 32; o *= 2) {
        b4.x = max_nan(__shfl_xor_sync(0xffffffffu, b4.x, o), b4.x);
        b4.y = max_nan(__shfl_xor_sync(0xffffffffu, b4.y, o), b4.y);
        b4.z = max_nan(__shfl_xor_sync(0xffffffffu, b4.z, o), b4.z);
        b4.w = max_nan(__shfl_xor_sync(0xffffffffu, b4.w, o), b4.w);
      }
      // token i0 + l sits in lane l / 4's component l % 4
      const float* b = &b4.x;
      const int src = lane / 4, k = lane % 4;
      float pick[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) pick[c] = __shfl_sync(0xffffffffu, b[c], src);
      best = pick[0];
#pragma unroll
      for (int c = 1; c < 4; ++c) best = k == c ? pick[c] : best;
    }
    red[warp][lane] = best;
    __syncthreads();
    if (warp == 0) {
      float m = red[0][lane];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) m = max_nan(red[w][lane], m);
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
  // whole float4s of a row: rows and queries 16-byte aligned, Lq a multiple of 4
  const bool vec = reinterpret_cast<uintptr_t>(p.table) % 16 == 0 && p.row_stride % 4 == 0 &&
                   p.query_stride % 4 == 0 && p.lq % 4 == 0;
  // Four warps a pair: eight (one wave fewer per SM, a shorter chain of row reads per warp)
  // measured 1.1-1.5x slower on an H200 but for 100-pair calls (0.85x).
  // Eight CTAs an SM at 64 registers: twelve (40 registers, fewer reads in flight a warp)
  // measured 1.1-1.7x slower on an H200.
  const auto kernel = vec ? kernel::centroid_score_kernel<true, kernel::kGatherWarps>
                          : kernel::centroid_score_kernel<false, kernel::kGatherWarps>;
  kernel<<<static_cast<unsigned>(p.pairs), kernel::kGatherWarps * 32, 0, p.stream>>>(p);
  return cudaGetLastError();
}

}  // namespace maxsim_cuda
