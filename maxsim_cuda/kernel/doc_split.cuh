// Split documents: a call with fewer (query, document) pairs than the GPU holds CTAs, and
// long documents (LongDocStress: 128 pairs of up to 1024 rows on 132 SMs), leaves most SMs
// idle while each CTA streams a whole document. SplitDocs cuts every pair's document into
// `parts` contiguous row ranges (a multiple of the tile height each, sized from the pair's
// own length on the device), each its own step of the one forward kernel; a step writes
// its query rows' (max, argmax) instead of a score (finish_part), and merge_doc_parts
// merges the parts in order and sums the rows in increasing order, exactly as the unsplit
// epilogue does, so the answers are bitwise the same. Padded and packed surfaces (one
// query per step). Torch-free.
#pragma once

#include <cstdint>
#include <type_traits>

#include "epilogue.cuh"
#include "policies.cuh"
#include "scheduler.cuh"

namespace maxsim_cuda {
namespace kernel {

template <class Base>
struct SplitDocs {
  Base base;
  int64_t parts;      // steps per pair
  int64_t align;      // a part's rows are a multiple of this (the mainloop's tile height)
  int64_t width;      // partial rows kept per step: the most query rows a pair may have
  void* part_max;     // [pairs * parts, width] Acc
  int32_t* part_idx;  // [pairs * parts, width] document row (kNoIndex: none)

  __host__ __device__ int64_t steps() const { return base.steps() * parts; }
  __host__ __device__ int64_t query_rows() const { return base.query_rows(); }
  __host__ __device__ int max_segments() const { return 1; }

  using Ahead = typename Base::Ahead;
  __device__ __forceinline__ Ahead ahead(int64_t s) const { return base.ahead(div_nonneg(s, parts)); }

  // Part k of the pair's document: rows [k * R, (k + 1) * R), R = ceil(len / parts)
  // rounded up to `align`; the query block (qkey) stays, so consecutive parts reuse it.
  __device__ __forceinline__ StepDesc step(int64_t s, const Ahead& h) const {
    const int64_t pair = div_nonneg(s, parts), part = s - pair * parts;
    StepDesc d = base.step(pair, h);
    const int64_t rows = ((d.dlen + parts - 1) / parts + align - 1) / align * align;
    d.col0 = part * rows;
    d.doc_row0 += d.col0;
    d.dlen = clamp64(d.dlen - d.col0, 0, rows);
    d.out0 = s;
    return d;
  }
  __device__ __forceinline__ int64_t seg_qlen(const StepDesc& d, int k) const { return base.seg_qlen(d, k); }
};

template <class Policy>
struct IsSplitDocs : std::false_type {};
template <class Base>
struct IsSplitDocs<SplitDocs<Base>> : std::true_type {};

// finish_chunk's counterpart for a part: each query row's (max, argmax in document rows)
// of this chunk of the block, written to the step's partial row.
template <class Acc, int BM, int SLOTS, int THREADS, class Base>
__device__ __forceinline__ void finish_part(EpilogueSmem<Acc, BM, SLOTS>& sm, const StepDesc& d, int64_t chunk,
                                            const SplitDocs<Base>& sp, int tid = threadIdx.x) {
  __syncthreads();  // red_m / red_i written by the mainloop
  Acc* part_max = static_cast<Acc*>(sp.part_max);
  for (int r = tid; r < BM; r += THREADS) {
    Acc m = sm.red_m[r * SLOTS];
    int idx = sm.red_i[r * SLOTS];
#pragma unroll
    for (int k = 1; k < SLOTS; ++k) merge(m, idx, sm.red_m[r * SLOTS + k], sm.red_i[r * SLOTS + k]);
    const int64_t row = chunk * BM + r;
    if (row < sp.width) {
      part_max[d.out0 * sp.width + row] = m;
      sp.part_idx[d.out0 * sp.width + row] = idx == kNoIndex ? kNoIndex : idx + static_cast<int>(d.col0);
    }
  }
}

// One warp per pair: rows merged across the parts in part order (merge: lowest index on
// ties, the first NaN), argmax rows written like finish_chunk, and the valid rows' maxima
// summed in increasing row order (every lane adds the same values in the same order; lane
// 0 stores). A query longer than `width` (packed, with a max_q_len below its length: bad
// input) cannot be merged and scores NaN, like other bad pairs.
template <class Acc, class Base>
__global__ void merge_doc_parts(const SplitDocs<Base> sp, const EpilogueArgs ea) {
  const int lane = threadIdx.x % 32;
  const int64_t pair = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (pair >= sp.base.steps()) return;
  const StepDesc d = sp.base.step(pair, sp.base.ahead(pair));
  const bool bad = d.bad || d.qlen0 > sp.width;
  const int64_t qlen = bad ? 0 : d.qlen0;
  const bool matched = !bad && d.dlen > 0;
  const Acc* part_max = static_cast<const Acc*>(sp.part_max) + pair * sp.parts * sp.width;
  const int32_t* part_idx = sp.part_idx + pair * sp.parts * sp.width;
  const int64_t rows = ea.with_argmax && ea.width > qlen ? ea.width : qlen;
  Acc sum = Acc(0);
  for (int64_t i0 = 0; i0 < rows; i0 += 32) {
    const int64_t i = i0 + lane;
    Acc m = neg_inf<Acc>();
    int idx = kNoIndex;
    if (i < qlen) {
      for (int64_t k = 0; k < sp.parts; ++k) merge(m, idx, part_max[k * sp.width + i], part_idx[k * sp.width + i]);
    }
    if (ea.with_argmax && i < ea.width) {
      ea.argmax[d.out0 * ea.width + i] = (i < qlen && matched) ? (idx == kNoIndex ? 0 : idx) : -1;
    }
    for (int k = 0; k < 32 && i0 + k < qlen; ++k) sum += __shfl_sync(0xffffffffu, m, k);
  }
  if (lane == 0) static_cast<Acc*>(ea.scores)[d.out0] = bad ? quiet_nan<Acc>() : sum;
}

}  // namespace kernel
}  // namespace maxsim_cuda
