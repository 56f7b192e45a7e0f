// The sm_90a kernels' epilogue for queries longer than one 64-row block: each chunk's argmax
// and ordered row sum into scratch, then a second kernel that adds a query's chunks in order.
// (A query of at most 64 rows takes the mma.sync kernels' finish_chunk directly.) Torch-free.
#pragma once

#include <cstdint>

#include "epilogue.cuh"
#include "hopper_pipeline.cuh"
#include "hopper_scheduler.cuh"

namespace maxsim_cuda {
namespace kernel {

// Epilogue of one 64-row chunk of a long query (all 128 threads of the warpgroup): argmax
// of its rows, and the ordered sum of its valid rows' maxima into hp.partial. finish_chunk
// with a chunk-sum destination could do this too, but its general row pass (stacked
// segments) costs registers: the 4-warpgroup shapes, capped at 96, then spill.
template <class Policy>
__device__ __forceinline__ void finish_query_chunk(EpilogueSmem<float, 64, 1>& sm, const HopperParams<Policy>& hp,
                                                   const StepDesc& d, int64_t q, int64_t c, int64_t n, int tid,
                                                   WarpgroupSync sync) {
  const EpilogueArgs& ea = hp.ep;
  sync();  // red_m / red_i written
  if (tid < 64) {
    const int64_t i = c * 64 + tid;
    const int idx = sm.red_i[tid];
    if (ea.with_argmax && i < ea.width) {
      const bool valid = i < d.qlen0 && !d.bad && d.dlen > 0;
      ea.argmax[d.out0 * ea.width + i] = valid ? (idx == kNoIndex ? 0 : idx) : -1;
    }
    sm.rowmax[tid] = sm.red_m[tid];
  }
  sync();
  if (tid == 0) {
    int64_t rows = d.qlen0 - c * 64;
    rows = rows < 0 ? 0 : (rows > 64 ? 64 : rows);
    const float sum = ordered_sum(sm.rowmax, rows, 0.f);
    hp.partial[(q * hp.nchunks + c) * hp.pol.Nb + n] = d.bad ? quiet_nan<float>() : sum;
  }
}

// scores[q, n] = the sum of query q's chunk sums against document n, chunk 0 first.
template <int = 0>
__global__ void sum_query_chunks(const float* partial, float* scores, int64_t nq, int64_t nb, int64_t nchunks) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= nq * nb) return;
  const int64_t q = k / nb, n = k - q * nb;
  const float* p = partial + q * nchunks * nb + n;
  float acc = 0.f;
  for (int64_t c = 0; c < nchunks; ++c) acc += p[c * nb];
  scores[k] = acc;
}

}  // namespace kernel
}  // namespace maxsim_cuda
