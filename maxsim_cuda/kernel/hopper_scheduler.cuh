// The sm_90a kernels' work: 64-row query blocks grouped into sets (one block per consumer
// warpgroup), steps (set, document) in set-major order, and the walk over a CTA's steps
// (contiguous ranges, or strided over the grid for the padded and packed surfaces). Torch-free.
#pragma once

#include <cstdint>

#include "epilogue.cuh"
#include "policies.cuh"
#include "scheduler.cuh"

namespace maxsim_cuda {
namespace kernel {

// 64-row query blocks. Lq <= 64: the policy's blocks of G stacked queries (nchunks = 1).
// Lq > 64: block b is chunk b % nchunks of query b / nchunks (G = 1); each chunk's row
// maxima sum into partial[(q * nchunks + c) * Nb + n] and sum_query_chunks adds a query's
// chunks in order.
template <class Policy>
struct HopperParams {
  Policy pol;          // built for 64-row blocks
  int64_t blocks;      // 64-row query blocks
  int64_t nchunks;     // blocks per query (1: the policy's stacked blocks)
  int64_t sets;        // sets of kConsumers consecutive blocks; steps are (set, document), set-major
  int kchunks;         // streamed shapes: 64-column K-chunks per tile (ceil(dim / 64))
  float* partial;      // nchunks > 1: [Nq * nchunks, Nb] chunk sums
  EpilogueArgs ep;
};

// First query row of block b.
template <class Policy>
__device__ __forceinline__ int64_t block_row0(const HopperParams<Policy>& hp, int64_t b) {
  if (hp.nchunks == 1) return b * hp.pol.G * hp.pol.Lq;
  const int64_t q = div_nonneg(b, hp.nchunks);
  return q * hp.pol.Lq + (b - q * hp.nchunks) * 64;
}

// The query of block b (the first of its stacked queries).
template <class Policy>
__device__ __forceinline__ int64_t block_query(const HopperParams<Policy>& hp, int64_t b) {
  return hp.nchunks == 1 ? b * hp.pol.G : div_nonneg(b, hp.nchunks);
}

// The steps (set, document) a CTA walks, set-major. Contiguous: the CTA's range of
// consecutive steps, so a set's blocks stay for a run of documents (no divide per step).
// Strided (the padded grid): steps blockIdx.x, + gridDim.x, ..., so the CTAs stream
// neighbouring documents at the same time (measured: the contiguous split's 132 separate
// streams reach ~72% of HBM bandwidth).
template <bool STRIDED>
struct StepWalk {
  int64_t s, end, set, n, Nb;
  __device__ __forceinline__ StepWalk(StepRange r, int64_t Nb_)
      : s(r.begin), end(r.end), set(div_nonneg(r.begin, Nb_)), n(0), Nb(Nb_) {
    n = s - set * Nb;
  }
  __device__ __forceinline__ bool more() const { return s < end; }
  __device__ __forceinline__ void next() {
    if (STRIDED) {
      s += gridDim.x;
      set = div_nonneg(s, Nb);
      n = s - set * Nb;
    } else {
      ++s;
      if (++n == Nb) {
        n = 0;
        ++set;
      }
    }
  }
};
// This CTA's steps: [begin, end) contiguous, or (strided) begin, begin + gridDim.x, ... < end.
template <bool STRIDED>
__device__ __forceinline__ StepRange walk_range(int64_t total) {
  return STRIDED ? StepRange{blockIdx.x, total} : cta_steps(total, gridDim.x, blockIdx.x);
}

}  // namespace kernel
}  // namespace maxsim_cuda
