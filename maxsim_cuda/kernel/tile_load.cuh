// Producer-side copy shared by the tensor-core mainloops: a [rows x COLS] window of a
// row-major [*, dim] matrix into shared memory, 16-byte chunks XOR-swizzled by row (so
// ldmatrix reads are bank-conflict free), zeros beyond the valid rows and beyond dim (so
// padding adds exactly 0 to every dot product). Torch-free.
#pragma once

#include <cstdint>

#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

// Elements per cp.async piece: 8 (16 B), 4 (8 B) or 2 (4 B), the largest that divides dim
// and keeps every base in `addr_bits` aligned; 1 = scalar loads (odd dim, 2-byte bases).
template <class T>
__device__ __forceinline__ int copy_granularity(int64_t dim, uintptr_t addr_bits) {
  for (int g = 8; g >= 2; g /= 2) {
    if (dim % g == 0 && (addr_bits & uintptr_t(g * sizeof(T) - 1)) == 0) return g;
  }
  return 1;
}

// Byte address of 16-byte chunk `ch` of row `r` in a swizzled [* x COLS] region.
template <class T, int COLS>
__device__ __forceinline__ uint32_t swizzled(uint32_t base, int r, int ch) {
  return base + uint32_t(r * COLS + ((ch ^ (r & 7)) << 3)) * sizeof(T);
}

// Byte offsets of the 16-byte chunks a thread reads with ldmatrix from a swizzled
// [* x COLS] tile: chunk 2*ks + kh of rows r, r + 16, r + 32, ... (all congruent mod 8).
// Since kh < 2 and (r & 7) < 8, chunk (2ks + kh) ^ (r & 7) = 8*(ks / 4) + ((2*(ks % 4)) ^ x)
// with x = kh ^ (r & 7): four offsets per thread cover every k-step, so each ldmatrix is one
// add plus an immediate instead of a fresh swizzle computation.
template <class T, int COLS>
struct SwizzledFragment {
  uint32_t off[4];
  __device__ __forceinline__ SwizzledFragment(uint32_t base, int r, int kh) {
    const uint32_t row = base + uint32_t(r * COLS) * sizeof(T);
    const int x = kh ^ (r & 7);
#pragma unroll
    for (int j = 0; j < 4; ++j) off[j] = row + uint32_t(((2 * j) ^ x) << 4);
  }
  // Address of k-step ks for the row `rows_below` rows after r (a multiple of 8).
  __device__ __forceinline__ uint32_t at(int ks, int rows_below = 0) const {
    return off[ks & 3] + uint32_t((ks >> 2) * 128 + rows_below * COLS * int(sizeof(T)));
  }
};

// 16-byte pieces (dim % 8 == 0, 16-byte aligned bases), the common case. When THREADS is a
// multiple of the chunks per row, a thread always copies the same chunk column, so its
// shared-memory offsets and the global row stride are fixed: one predicate, one address add
// and one cp.async per piece. Pieces past `rows` or past dim are zero-filled by cp.async
// itself (src-size 0 reads nothing).
template <class T, int NROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_swizzled_16(uint32_t base, const T* src0, int64_t row0, int64_t rows,
                                                 int64_t kbase, int64_t dim) {
  constexpr int CH = COLS / 8;
  constexpr int RSTEP = THREADS / CH;  // rows between a thread's consecutive pieces
  static_assert(THREADS % CH == 0, "fixed chunk column per thread");
  const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
  const bool col_in = kbase + ch * 8 < dim;
  const T* src = src0 + (row0 + r0) * dim + kbase + ch * 8;
  const int64_t stride = RSTEP * dim;
  const uint32_t dst = base + uint32_t(r0 * COLS) * sizeof(T);
#pragma unroll
  for (int it = 0; it < NROWS / RSTEP; ++it) {
    const int r = r0 + it * RSTEP;
    const int sw = (RSTEP % 8 == 0) ? (r0 & 7) : (r & 7);
    const uint32_t d = dst + uint32_t(it * RSTEP * COLS) * sizeof(T) + uint32_t((ch ^ sw) << 4);
    cp_async_16_zfill(d, src + it * stride, (col_in && r < rows) ? 16u : 0u);
  }
}

// Any granularity, one piece at a time. Not inlined: odd dims and misaligned bases are rare,
// and inlining this into every pipeline stage of every kernel made the instruction cache
// miss (ncu: "no instruction" was 27% of the rerank kernel's stalls).
template <class T, int NROWS, int COLS, int THREADS>
__device__ __noinline__ void load_swizzled_any(uint32_t base, const T* src0, int64_t row0, int64_t rows,
                                               int64_t kbase, int64_t dim, int gran) {
  constexpr int CH = COLS / 8;  // 16-byte chunks per row
#pragma unroll
  for (int it = 0; it < (NROWS * CH) / THREADS; ++it) {
    const int c = threadIdx.x + it * THREADS;
    const int r = c / CH, ch = c % CH;
    const uint32_t dst = swizzled<T, COLS>(base, r, ch);
    const int64_t k0 = kbase + int64_t(ch) * 8;
    if (r >= rows || k0 >= dim) {
      st_shared_zero16(dst);
      continue;
    }
    const T* src = src0 + (row0 + r) * dim + k0;
    if (gran == 8) {
      cp_async_16(dst, src);
    } else if (gran == 4) {  // dim % 4 == 0: each 4-element piece is all in or all out
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool in = k0 + 4 * h < dim;
        cp_async_ca_zfill<8>(dst + 8 * h, in ? src + 4 * h : src, in ? 8u : 0u);
      }
    } else if (gran == 2) {
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const bool in = k0 + 2 * h < dim;
        cp_async_ca_zfill<4>(dst + 4 * h, in ? src + 2 * h : src, in ? 4u : 0u);
      }
    } else {
      uint16_t v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = (k0 + e < dim) ? ld_bits16(src + e) : uint16_t(0);
      st_shared_v4(dst, make_uint4(v[0] | (uint32_t(v[1]) << 16), v[2] | (uint32_t(v[3]) << 16),
                                   v[4] | (uint32_t(v[5]) << 16), v[6] | (uint32_t(v[7]) << 16)));
    }
  }
}

// Rows [row0, row0 + rows) x columns [kbase, kbase + COLS) of src into the swizzled
// [NROWS x COLS] region at `base`, spread over THREADS threads (asynchronous for gran > 1:
// the caller commits and waits).
template <class T, int NROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_swizzled(uint32_t base, const T* src0, int64_t row0, int64_t rows,
                                              int64_t kbase, int64_t dim, int gran) {
  constexpr int CH = COLS / 8;  // 16-byte chunks per row
  static_assert(COLS % 64 == 0, "the swizzle needs 8 chunks per row");
  static_assert((NROWS * CH) % THREADS == 0, "chunks per thread");
  if constexpr (THREADS % CH == 0) {
    if (gran == 8) {
      load_swizzled_16<T, NROWS, COLS, THREADS>(base, src0, row0, rows, kbase, dim);
      return;
    }
  }
  load_swizzled_any<T, NROWS, COLS, THREADS>(base, src0, row0, rows, kbase, dim, gran);
}

}  // namespace kernel
}  // namespace maxsim_cuda
