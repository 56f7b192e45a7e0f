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

// The strided walk's runs (StepWalk<true>): `count` runs of consecutive steps, run c holding
// per_run steps and one more for c < extra. Made on the host (strided_runs).
struct StridedRuns {
  int64_t count, per_run, extra;
};
// steps cut into ctas * rounds runs (rounds >= 1).
inline StridedRuns strided_runs(int64_t steps, int64_t ctas, int64_t rounds) {
  StridedRuns r;
  r.count = ctas * rounds;
  r.per_run = steps / r.count;
  r.extra = steps - r.per_run * r.count;
  return r;
}

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
  StridedRuns runs;    // strided walks: their runs of steps (StepWalk<true>)
  int kchunks;         // streamed shapes: 64-column K-chunks per tile (ceil(dim / 64))
  float* partial;      // nchunks > 1: [Nq * nchunks, Nb] chunk sums
  EpilogueArgs ep;
  bool signal_early;   // the producer lets the next grid launch after its last load (else at exit)
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
// Strided (the padded and packed grids): the steps are cut into gridDim * rounds runs of
// consecutive steps, of equal length to within one step (run c holds total / runs steps, one
// more for c < total % runs), and CTA b walks runs b, b + gridDim, ...: the CTAs stream neighbouring
// documents at the same time (measured: the contiguous split's 132 separate streams reach
// ~72% of HBM bandwidth), and a CTA meets the same query for a run's consecutive documents.
// rounds = ceil(total / gridDim) makes every run one step: steps blockIdx, + gridDim, ...
template <bool STRIDED>
struct StepWalk;

template <>
struct StepWalk<false> {
  int64_t s, end, set, n, Nb;
  __device__ __forceinline__ StepWalk(StepRange r, int64_t Nb_, const StridedRuns& /*runs*/)
      : s(r.begin), end(r.end), set(div_nonneg(r.begin, Nb_)), n(0), Nb(Nb_) {
    n = s - set * Nb;
  }
  __device__ __forceinline__ bool more() const { return s < end; }
  __device__ __forceinline__ void next() {
    ++s;
    if (++n == Nb) {
      n = 0;
      ++set;
    }
  }
};

template <>
struct StepWalk<true> {
  int64_t s, end, set, n, Nb;  // end: the end of the current run
  int64_t run;                 // this CTA's current run
  const StridedRuns& runs;     // the kernel's parameter (no registers of its own)
  __device__ __forceinline__ StepWalk(StepRange r, int64_t Nb_, const StridedRuns& runs_)
      : s(0), end(0), set(0), n(0), Nb(Nb_), run(r.begin), runs(runs_) {
    enter();
  }
  __device__ __forceinline__ bool more() const { return s < end; }
  __device__ __forceinline__ void next() {
    if (++s == end) {
      run += gridDim.x;
      if (run >= runs.count) return;  // s == end: more() is false
      enter();
    } else if (++n == Nb) {
      n = 0;
      ++set;
    }
  }

 private:
  __device__ __forceinline__ void enter() {
    s = run * runs.per_run + (run < runs.extra ? run : runs.extra);
    end = s + runs.per_run + (run < runs.extra ? 1 : 0);
    set = div_nonneg(s, Nb);
    n = s - set * Nb;
  }
};
// This CTA's steps: [begin, end) contiguous, or (strided) its first run and the step total.
template <bool STRIDED>
__device__ __forceinline__ StepRange walk_range(int64_t total) {
  return STRIDED ? StepRange{blockIdx.x, total} : cta_steps(total, gridDim.x, blockIdx.x);
}

}  // namespace kernel
}  // namespace maxsim_cuda
