// What both backward kernels read: the plain arguments and the per-surface query lengths.
// Torch-free.
#pragma once

#include <cstdint>

#include "../launch.h"
#include "policies.cuh"

namespace maxsim_cuda {
namespace kernel {

template <class T, class Acc>
struct BwdArgs {
  const Acc* g;
  const T* q;
  const T* d;                // native documents
  const uint8_t* d_bytes;    // compressed documents (int8 / e4m3 values), else null
  const float* d_scales;     // compressed documents: one scale per row
  const int32_t* argmax;
  T* grad_q;
  T* grad_d;
  int64_t dim, W, pairs, q_rows, d_rows;
  int64_t nq, nd, C, Lq, Ld;  // nq: B / Nq / Nq / Nq; nd: B*C / Nb / Nd / Nb
  int rows_per_cta;           // R of the grad_documents kernels
  // grad_documents' hits binned by grid slot (backward_documents_binned.cuh), or null: a hit
  // is {weight, query row} in bins and its document row in bin_rows, document n's from
  // n * bin_stride, slot s's run of them at bin_start[n * bin_slots + s], bin_count[...] long.
  uint2* bins;
  int32_t* bin_rows;
  int32_t* bin_start;
  int32_t* bin_count;
  int64_t bin_stride;
  int bin_slots, bin_chunks;
  int32_t* bin_tally;  // [nd][bin_chunks][bin_slots]: hits of each chunk of entries a slot
  ResidualRef res;            // residual documents (d_bytes: their packed bucket ids)
  IndexView qlens, dlens, qoffs, doffs, pqids, pdids, pbq, qpo, pbd, dpo;
};

// ---------------- per-surface pair sources ----------------

// Padded: query b has pairs c = 0..C-1 (p = b*C + c); document p has the single pair p.
// Contrastive (documents packed or padded): query q has pairs n = 0..Nb-1 (p = q*Nb + n);
// document n has q = 0..Nq-1.
// Packed: CSR lists.

template <class T, class Acc>
__device__ __forceinline__ int64_t query_len_padded(const BwdArgs<T, Acc>& a, int64_t b) {
  int64_t v;
  return a.qlens.get(b, v) ? clamp64(v, 0, a.Lq) : 0;
}
template <class T, class Acc>
__device__ __forceinline__ int64_t query_len_contrastive(const BwdArgs<T, Acc>& a, int64_t q) {
  if (!a.qlens.present()) return a.Lq;
  int64_t v;
  return a.qlens.get(q, v) ? clamp64(v, 0, a.Lq) : 0;
}

}  // namespace kernel
}  // namespace maxsim_cuda
