// Running max + argmax per query row, and the per-step epilogue: cross-thread merge
// (lowest index on ties, NaN wins with its lowest index, like torch.max), argmax rows
// written, per-pair score summed in increasing row order. Torch-free.
#pragma once

#include <climits>
#include <cstdint>

#include "policies.cuh"
#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

// "no index yet": loses every tie. A row that ends with it saw only -inf (or nothing).
constexpr int kNoIndex = INT_MAX;

// Scanning columns upwards inside one thread: strict '>' keeps the lowest index; the first
// NaN is kept once seen (m != m blocks later updates).
template <class Acc>
__device__ __forceinline__ void running_update(Acc& m, int& idx, Acc v, int j) {
  if (!(v <= m) && m == m) {
    m = v;
    idx = j;
  }
}

// Folds one tile row (a thread's N columns, local column ids `col` increasing with the
// index) into the running (m, idx) with the same result as N running_update calls, but
// with no serial dependency chain: a NaN-propagating max tree, then, only when the tile
// improves on m, the first column that reaches it (the first NaN when it is NaN), found by
// a predicated scan from the last column down (two instructions a column; a min tree over
// selected indices costs three). INDEX = false keeps the max only (inference without
// argmax): a NaN still sticks, since max.NaN propagates it.
template <int N, bool INDEX = true>
__device__ __forceinline__ void fold_tile(float& m, int& idx, const float (&v)[N], const int (&col)[N], int col_base) {
  static_assert((N & (N - 1)) == 0, "power of two");
  float t[N];
#pragma unroll
  for (int c = 0; c < N; ++c) t[c] = v[c];
#pragma unroll
  for (int s2 = 1; s2 < N; s2 *= 2)  // strides N/2, N/4, ..., 1 (constant trip count: unrolled)
#pragma unroll
    for (int c = 0; c < N / (2 * s2); ++c) t[c] = max_nan(t[c], t[c + N / (2 * s2)]);
  const float tmax = t[0];
  if constexpr (!INDEX) {
    m = max_nan(m, tmax);
  } else if (!(tmax <= m) && m == m) {
    int b = kNoIndex;
    if (tmax == tmax) {
#pragma unroll
      for (int c = N - 1; c >= 0; --c) b = v[c] == tmax ? col[c] : b;
    } else {
#pragma unroll
      for (int c = N - 1; c >= 0; --c) b = v[c] != v[c] ? col[c] : b;
    }
    m = tmax;
    idx = col_base + b;
  }
}

// Merge of two partial results over disjoint column sets (associative and commutative,
// so the merge tree shape never changes the answer).
template <class Acc>
__device__ __forceinline__ void merge(Acc& m, int& idx, Acc m2, int i2) {
  const bool n1 = m != m, n2 = m2 != m2;
  bool take;
  if (n1 || n2) {
    take = n2 && (!n1 || i2 < idx);
  } else {
    take = m2 > m || (m2 == m && i2 < idx);
  }
  if (take) {
    m = m2;
    idx = i2;
  }
}

template <class Acc>
__device__ __forceinline__ void merge_shfl(Acc& m, int& idx, int lane_mask) {
  const Acc m2 = __shfl_xor_sync(0xffffffffu, m, lane_mask);
  const int i2 = __shfl_xor_sync(0xffffffffu, idx, lane_mask);
  merge(m, idx, m2, i2);
}

// merge_shfl for the mainloops' lane reductions. A call without argmax (INDEX false: the
// folds kept no indexes) merges the maxima alone with a NaN-propagating max, the value the
// full merge gives, at a third of its instructions. A compile-time flag: callers write one
// loop nest per value (see ColumnMax::to_warp_parts in forward_hopper_bytes.cuh).
template <bool INDEX, class Acc>
__device__ __forceinline__ void merge_lanes(Acc& m, int& idx, int lane_mask) {
  if constexpr (INDEX) {
    merge_shfl(m, idx, lane_mask);
  } else {
    m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, lane_mask));
  }
}

// acc + v[0] + v[1] + ... + v[n-1], strictly in that order; loads batched 8 at a time so
// only the adds are serial.
template <class Acc>
__device__ __forceinline__ Acc ordered_sum(const Acc* v, int64_t n, Acc acc) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Acc x[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = v[i + k];
#pragma unroll
    for (int k = 0; k < 8; ++k) acc += x[k];
  }
  for (; i < n; ++i) acc += v[i];
  return acc;
}

struct EpilogueArgs {
  void* scores;
  int32_t* argmax;
  int64_t width;  // argmax row width
  bool with_argmax;
};

// Shared scratch of the epilogue.
template <class Acc, int BM, int SLOTS>
struct EpilogueSmem {
  Acc red_m[BM * SLOTS];
  int red_i[BM * SLOTS];
  Acc rowmax[BM];
  int64_t seg_qlen[BM];
};

struct CtaSync {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// Called by all THREADS threads (thread `tid`; `sync` is their barrier: the whole CTA, or
// one warpgroup in the warp-specialised kernel) after the last document tile of (step,
// chunk). `carry` (thread 0) continues the score sum across M-chunks of a long query, in
// increasing row order.
template <class Acc, int BM, int SLOTS, int THREADS, class Sync = CtaSync>
__device__ __forceinline__ void finish_chunk(EpilogueSmem<Acc, BM, SLOTS>& sm, const StepDesc& d,
                                             int64_t chunk, int64_t nchunks, Acc& carry,
                                             const EpilogueArgs& ea, int tid = threadIdx.x, Sync sync = {}) {
  sync();  // red_m / red_i written by the mainloop
  for (int r = tid; r < BM; r += THREADS) {
    Acc m = sm.red_m[r * SLOTS];
    int idx = sm.red_i[r * SLOTS];
#pragma unroll
    for (int k = 1; k < SLOTS; ++k) merge(m, idx, sm.red_m[r * SLOTS + k], sm.red_i[r * SLOTS + k]);
    const int64_t R = chunk * BM + r;
    int64_t s = 0, i = R, qlen = d.qlen0;
    if (d.nseg > 1) {
      s = div_nonneg(R, d.seg_stride);
      i = R - s * d.seg_stride;
      qlen = s < d.nseg ? sm.seg_qlen[s] : 0;
    }
    const bool in_seg = s < d.nseg;
    const bool valid = in_seg && i < qlen;
    if (ea.with_argmax && in_seg && i < ea.width) {
      const int out = (valid && !d.bad && d.dlen > 0) ? (idx == kNoIndex ? 0 : idx) : -1;
      ea.argmax[(d.out0 + s * d.out_stride) * ea.width + i] = out;
    }
    sm.rowmax[r] = m;
  }
  sync();
  Acc* scores = static_cast<Acc*>(ea.scores);
  const bool last = chunk + 1 == nchunks;
  if (d.nseg == 1) {
    if (tid == 0) {
      if (chunk == 0) carry = Acc(0);
      int64_t n = d.qlen0 - chunk * BM;
      n = n < BM ? n : BM;
      carry = ordered_sum(sm.rowmax, n, carry);
      if (last) scores[d.out0] = d.bad ? quiet_nan<Acc>() : carry;
    }
    if (last && ea.with_argmax) {
      for (int64_t i = nchunks * BM + tid; i < ea.width; i += THREADS) ea.argmax[d.out0 * ea.width + i] = -1;
    }
  } else {
    for (int s = tid; s < d.nseg; s += THREADS) {
      const Acc sum = ordered_sum(sm.rowmax + s * d.seg_stride, sm.seg_qlen[s], Acc(0));
      scores[d.out0 + s * d.out_stride] = d.bad ? quiet_nan<Acc>() : sum;
    }
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
