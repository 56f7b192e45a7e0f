// SimtMainloop (float32/float64; half types with dim > 256 only through the experiment
// knob MAXSIM_CUDA_HALF_SIMT=1): the same tile stream and epilogue as the tensor-core
// mainloops, FFMA on [BM x KC] x [KC x BN] shared-memory chunks, accumulation in Acc
// (float, or double for double inputs): float32-accurate scores. Torch-free.
#pragma once

#include <cstdint>

#include "epilogue.cuh"
#include "policies.cuh"
#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

// SIMT FFMA mainloop: 256 threads as 16 x 16, each a TM x TN register tile.
template <class T, class Acc_, int BM_>
struct SimtMainloop {
  using Elem = T;
  using Acc = Acc_;
  static constexpr bool kPipelined = false;
  static constexpr int BM = BM_, BN = 64, kStages = 1;
  static constexpr int kThreads = 256, kMinBlocks = 1;
  static constexpr int TM = BM / 16, TN = BN / 16;
  static constexpr int KC = sizeof(Acc) == 8 ? 16 : 32;
  static constexpr int QP = BM + 4, DP = BN + 4;  // padded strides (16-byte aligned rows)
  static constexpr int kSlots = 1;

  static constexpr size_t smem_bytes() {
    return (size_t(KC) * QP + size_t(KC) * DP) * sizeof(Acc) + size_t(BM) * sizeof(int);
  }

  Acc* qs;       // [KC][QP]
  Acc* ds;       // [KC][DP]
  int* qvalid;   // [BM]
  const T* qbase;  // queries + global row of block row 0 of this chunk * dim
  int64_t dim;
  int tx, ty;
  Acc m[TM];
  int idx[TM];

  __device__ __forceinline__ void init(unsigned char* smem, int64_t dim_, const void*) {
    qs = reinterpret_cast<Acc*>(smem);
    ds = qs + KC * QP;
    qvalid = reinterpret_cast<int*>(ds + KC * DP);
    dim = dim_;
    tx = threadIdx.x % 16;
    ty = threadIdx.x / 16;
  }

  __device__ __forceinline__ void load_tile(int, const T*, int64_t, int) const {}

  __device__ __forceinline__ void load_query(const T* queries, const QueryRows& qr) {
    for (int r = threadIdx.x; r < BM; r += kThreads) qvalid[r] = qr.valid(r) ? 1 : 0;
    qbase = queries + qr.global_row(0) * dim;  // only dereferenced at valid rows
  }

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      m[r] = neg_inf<Acc>();
      idx[r] = kNoIndex;
    }
  }

  // (Always tracks the index: the SIMT path serves fp32/fp64, where the fold is not the cost.)
  __device__ __forceinline__ void compute(int, const T* docs, int64_t row0, int cols_valid, int col_base, bool) {
    Acc acc[TM][TN];
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int c = 0; c < TN; ++c) acc[r][c] = Acc(0);

    for (int64_t k0 = 0; k0 < dim; k0 += KC) {
      __syncthreads();  // previous chunk consumed (and qvalid written)
      for (int e = threadIdx.x; e < BM * KC; e += kThreads) {
        const int r = e / KC, kk = e % KC;
        const int64_t k = k0 + kk;
        qs[kk * QP + r] = (qvalid[r] && k < dim) ? to_acc<Acc>(qbase[int64_t(r) * dim + k]) : Acc(0);
      }
      for (int e = threadIdx.x; e < BN * KC; e += kThreads) {
        const int n = e / KC, kk = e % KC;
        const int64_t k = k0 + kk;
        ds[kk * DP + n] = (n < cols_valid && k < dim) ? to_acc<Acc>(docs[(row0 + n) * dim + k]) : Acc(0);
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < KC; ++kk) {
        Acc a[TM], b[TN];
#pragma unroll
        for (int r = 0; r < TM; ++r) a[r] = qs[kk * QP + ty * TM + r];
#pragma unroll
        for (int c = 0; c < TN; ++c) b[c] = ds[kk * DP + tx * TN + c];
#pragma unroll
        for (int r = 0; r < TM; ++r)
#pragma unroll
          for (int c = 0; c < TN; ++c) acc[r][c] = fma(a[r], b[c], acc[r][c]);
      }
    }
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        const int col = tx * TN + c;
        const Acc v = col < cols_valid ? acc[r][c] : neg_inf<Acc>();
        running_update(m[r], idx[r], v, col_base + col);
      }
  }

  __device__ __forceinline__ void reduce(Acc* red_m, int* red_i) {
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      merge_shfl(m[r], idx[r], 1);
      merge_shfl(m[r], idx[r], 2);
      merge_shfl(m[r], idx[r], 4);
      merge_shfl(m[r], idx[r], 8);
    }
    if (tx == 0) {
#pragma unroll
      for (int r = 0; r < TM; ++r) {
        red_m[ty * TM + r] = m[r];
        red_i[ty * TM + r] = idx[r];
      }
    }
  }
};

}  // namespace kernel
}  // namespace maxsim_cuda
