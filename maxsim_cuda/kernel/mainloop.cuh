// Mainloops: what a CTA does with one document tile.
//
// MmaMainloop (fp16/bf16, dim <= KD <= 256): the query block lives in registers as
// mma.sync A fragments; document tiles [BN x KD] arrive in a multi-stage cp.async ring
// in shared memory (16-byte chunks XOR-swizzled by row, so ldmatrix is conflict-free),
// B fragments come from ldmatrix, S = Q D^T accumulates in fp32 and only updates the
// per-row running max/argmax; the [Lq, Ld] matrix never leaves registers.
// Warp (wm, wn) owns query rows [wm*MT*16, +MT*16) and tile columns [wn*BN/WN, +BN/WN).
//
// SimtMainloop (float32/float64; half types with dim > 256 only through the experiment
// knob MAXSIM_CUDA_HALF_SIMT=1): the same tile stream and
// epilogue, FFMA on [BM x KC] x [KC x BN] shared-memory chunks, accumulation in Acc
// (float, or double for double inputs): float32-accurate scores.
// Torch-free.
#pragma once

#include <cstdint>

#include "epilogue.cuh"
#include "policies.cuh"
#include "primitives.cuh"
#include "tile_load.cuh"

namespace maxsim_cuda {
namespace kernel {

// Which rows of the current (step, chunk) block hold real query rows.
struct QueryRows {
  const StepDesc* d;
  const int64_t* seg_qlen;  // smem, valid when d->nseg > 1
  int64_t chunk;
  int bm;
  __device__ __forceinline__ bool valid(int r) const {
    const int64_t R = chunk * bm + r;
    if (d->nseg == 1) return R < d->qlen0;
    const int64_t s = R / d->seg_stride;
    return s < d->nseg && (R - s * d->seg_stride) < seg_qlen[s];
  }
  __device__ __forceinline__ int64_t global_row(int r) const { return d->q_row0 + chunk * bm + r; }
};

// Running (max, argmax) of the query rows a warp holds in mma.sync m16n8 accumulator
// layout (rows (mt, h), columns nt*8 + 2*(lane%4) + e of the warp's slice): the part of the
// epilogue both tensor-core mainloops share.
template <int MT, int NT, int NTW, int WN, int BN>
struct MmaRowMax {
  float m[MT * 2];
  int idx[MT * 2];

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int k = 0; k < MT * 2; ++k) {
      m[k] = neg_inf<float>();
      idx[k] = kNoIndex;
    }
  }

  // Fold one [rows x BN] accumulator tile in; columns >= cols_valid are masked. Full tiles
  // (all but a segment's last) take the unmasked path: no per-element select.
  __device__ __forceinline__ void fold(const float (&acc)[MT][NT][4], int lane, int wn, int cols_valid,
                                       int col_base) {
    if (cols_valid >= BN) {
      fold_masked<false>(acc, lane, wn, cols_valid, col_base);
    } else {
      fold_masked<true>(acc, lane, wn, cols_valid, col_base);
    }
  }

  template <bool MASK>
  __device__ __forceinline__ void fold_masked(const float (&acc)[MT][NT][4], int lane, int wn, int cols_valid,
                                              int col_base) {
    const int t4 = lane % 4;
    int col[NT * 2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) col[nt * 2 + e] = nt * 8 + e;
    const int cbase = col_base + wn * NTW + 2 * t4;  // this thread's first column
    const int lim = cols_valid - (wn * NTW + 2 * t4);  // local columns below lim are valid
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[NT * 2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = acc[mt][nt][2 * h + e];
            v[nt * 2 + e] = (!MASK || col[nt * 2 + e] < lim) ? x : neg_inf<float>();
          }
        fold_tile(m[mt * 2 + h], idx[mt * 2 + h], v, col, cbase);
      }
  }

  // Quad shuffle, then one partial per (row, wn) into shared memory.
  __device__ __forceinline__ void reduce(float* red_m, int* red_i, int lane, int wm, int wn) {
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int k = 0; k < MT * 2; ++k) {
      merge_shfl(m[k], idx[k], 1);
      merge_shfl(m[k], idx[k], 2);
    }
    if (t4 == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = (wm * MT + mt) * 16 + g + 8 * h;
          red_m[row * WN + wn] = m[mt * 2 + h];
          red_i[row * WN + wn] = idx[mt * 2 + h];
        }
    }
  }
};

// Warp-level tensor-core steps both mma mainloops share: a warp owns an [MT*16 x NT*8]
// fp32 accumulator tile in mma.sync m16n8 layout.
template <int MT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}

// One 16-column k-step: B fragments by ldmatrix from the swizzled [* x COLS] document tile
// at `base` (tile rows first_row .. first_row + NT*8), A fragments from a(mt).
template <class T, int COLS, int MT, int NT, class AFrag>
__device__ __forceinline__ void mma_kstep(float (&acc)[MT][NT][4], const AFrag& a, uint32_t base, int ks, int first_row,
                                          int lane) {
  const int kh = (lane >> 3) & 1;
  const int nrow = (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint32_t b0, b1, b2, b3;
    ldmatrix_x4(swizzled<T, COLS>(base, first_row + np * 16 + nrow, ks * 2 + kh), b0, b1, b2, b3);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      Mma16816<T>::run(acc[mt][2 * np], a(mt), b0, b1);
      Mma16816<T>::run(acc[mt][2 * np + 1], a(mt), b2, b3);
    }
  }
}

template <class T, int KD_, int BM_, int BN_, int WM, int WN, int STAGES_, int MIN_BLOCKS_ = 1>
struct MmaMainloop {
  using Elem = T;
  using Acc = float;
  static constexpr bool kPipelined = true;
  static constexpr int KD = KD_, BM = BM_, BN = BN_, kStages = STAGES_;
  static constexpr int kWarps = WM * WN, kThreads = kWarps * 32, kMinBlocks = MIN_BLOCKS_;
  static constexpr int MT = BM / (16 * WM);
  static constexpr int NTW = BN / WN;  // columns per warp
  static constexpr int NT = NTW / 8;
  static constexpr int KS = KD / 16;
  static constexpr int kSlots = WN;
  static_assert(MT >= 1 && BM == MT * 16 * WM, "BM");
  static_assert(NT % 2 == 0, "NT must be even (ldmatrix.x4 loads two n8 tiles)");

  static constexpr size_t stage_bytes() { return size_t(BN) * KD * sizeof(T); }
  static constexpr size_t smem_bytes() { return kStages * stage_bytes(); }

  T* tiles;
  int64_t dim;
  int gran;  // elements per cp.async piece (copy_granularity)
  int lane, wm, wn;
  uint32_t qa[MT][KS][4];
  MmaRowMax<MT, NT, NTW, WN, BN> row_max;

  __device__ __forceinline__ void init(unsigned char* smem, int64_t dim_, const void* docs) {
    tiles = reinterpret_cast<T*>(smem);
    dim = dim_;
    gran = copy_granularity<T>(dim, reinterpret_cast<uintptr_t>(docs));
    const int warp = threadIdx.x / 32;
    lane = threadIdx.x % 32;
    wm = warp % WM;
    wn = warp / WM;
  }

  // Producer: document rows [row0, row0 + rows) into stage `stage` (zero-filled beyond).
  __device__ __forceinline__ void load_tile(int stage, const T* docs, int64_t row0, int rows) const {
    load_swizzled<T, BN, KD, kThreads>(smem_addr(tiles + size_t(stage) * BN * KD), docs, row0, rows, 0, dim, gran);
  }

  // Query block rows of this chunk straight from global memory into A fragments. Each
  // fragment register holds columns (k, k + 1), k even: one 4-byte load when dim is even
  // and the base 4-byte aligned, else two 2-byte loads.
  __device__ __forceinline__ void load_query(const T* queries, const QueryRows& qr) {
    const int g = lane / 4, t4 = lane % 4;
    const bool pairs = dim % 2 == 0 && (reinterpret_cast<uintptr_t>(queries) & 3) == 0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int r_lo = (wm * MT + mt) * 16 + g, r_hi = r_lo + 8;
      const bool v_lo = qr.valid(r_lo), v_hi = qr.valid(r_hi);
      const T* p_lo = queries + (v_lo ? qr.global_row(r_lo) * dim : 0);
      const T* p_hi = queries + (v_hi ? qr.global_row(r_hi) * dim : 0);
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t f[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const bool v = (q & 1) ? v_hi : v_lo;
          const T* p = (q & 1) ? p_hi : p_lo;
          const int64_t k = int64_t(ks) * 16 + 2 * t4 + ((q & 2) ? 8 : 0);
          if (pairs) {
            f[q] = (v && k < dim) ? __ldg(reinterpret_cast<const unsigned int*>(p + k)) : 0u;
          } else {
            const uint16_t e0 = (v && k < dim) ? ld_bits16(p + k) : uint16_t(0);
            const uint16_t e1 = (v && k + 1 < dim) ? ld_bits16(p + k + 1) : uint16_t(0);
            f[q] = e0 | (uint32_t(e1) << 16);
          }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) qa[mt][ks][q] = f[q];
      }
    }
  }

  __device__ __forceinline__ void reset() { row_max.reset(); }

  // S = Q * tile^T on tensor cores, then fold into the running max (cols >= cols_valid masked).
  __device__ __forceinline__ void compute(int stage, const T*, int64_t, int cols_valid, int col_base) {
    float acc[MT][NT][4];
    zero_acc(acc);
    const uint32_t base = smem_addr(tiles + size_t(stage) * BN * KD);
    // All KS k-steps run (columns past dim are zeros in both operands): no branch in the
    // unrolled loop, so ldmatrix of step ks+1 can overlap the mma of step ks.
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const auto a = [&](int mt) -> const uint32_t(&)[4] { return qa[mt][ks]; };
      mma_kstep<T, KD>(acc, a, base, ks, wn * NTW, lane);
    }
    row_max.fold(acc, lane, wn, cols_valid, col_base);
  }

  __device__ __forceinline__ void reduce(float* red_m, int* red_i) { row_max.reduce(red_m, red_i, lane, wm, wn); }
};

// MmaKMainloop (fp16/bf16, any dim; used for dim > 256): the K-streaming variant of
// MmaMainloop. A pipeline stage holds one K-chunk (KC columns) of a document tile
// [BN x KC] AND the matching K-chunk of the query block [BM x KC], both brought in by
// cp.async (16-byte chunks XOR-swizzled by row); A fragments come from ldmatrix per
// k-step (nothing of the query lives in registers), B fragments as in MmaMainloop.
// The forward kernel walks ceil(dim / KC) K-chunks per document tile (TileStream with
// KSPLIT); the fp32 mma accumulators persist across them and only after the last K-chunk
// is the tile folded into the running max/argmax. Columns past dim are zero-filled in
// both operands (so they add exactly 0); query rows past the queries tensor are
// zero-filled (rows the policy marks invalid are still loaded when in bounds: their
// results never reach an output). The query chunk is re-read per document tile (from L2).
template <class T, int BM_, int BN_, int WM, int WN, int KC_, int STAGES_, int MIN_BLOCKS_ = 1>
struct MmaKMainloop {
  using Elem = T;
  using Acc = float;
  static constexpr bool kPipelined = true;
  static constexpr int kKChunk = KC_;  // marks a K-streaming mainloop (see KSplit)
  static constexpr int KC = KC_, BM = BM_, BN = BN_, kStages = STAGES_;
  static constexpr int kWarps = WM * WN, kThreads = kWarps * 32, kMinBlocks = MIN_BLOCKS_;
  static constexpr int MT = BM / (16 * WM);
  static constexpr int NTW = BN / WN;
  static constexpr int NT = NTW / 8;
  static constexpr int KS = KC / 16;
  static constexpr int kSlots = WN;
  static_assert(MT >= 1 && BM == MT * 16 * WM, "BM");
  static_assert(NT % 2 == 0, "NT must be even (ldmatrix.x4 loads two n8 tiles)");

  static constexpr size_t doc_elems() { return size_t(BN) * KC; }
  static constexpr size_t stage_bytes() { return size_t(BN + BM) * KC * sizeof(T); }
  static constexpr size_t smem_bytes() { return kStages * stage_bytes(); }

  T* stages;
  int64_t dim;
  int64_t q_rows;  // rows of the queries tensor (bounds of the query chunk loads)
  int gran;  // elements per cp.async piece (copy_granularity over both bases)
  int lane, wm, wn;
  float acc[MT][NT][4];
  MmaRowMax<MT, NT, NTW, WN, BN> row_max;

  __device__ __forceinline__ void init(unsigned char* smem, int64_t dim_, const void* docs, const void* queries,
                                       int64_t q_rows_) {
    stages = reinterpret_cast<T*>(smem);
    dim = dim_;
    q_rows = q_rows_;
    gran = copy_granularity<T>(dim, reinterpret_cast<uintptr_t>(docs) | reinterpret_cast<uintptr_t>(queries));
    const int warp = threadIdx.x / 32;
    lane = threadIdx.x % 32;
    wm = warp % WM;
    wn = warp / WM;
  }

  // Producer: K-chunk kc of document rows [row0, row0 + rows) and of the query block whose
  // row 0 is global query row qrow0, into stage `stage`.
  __device__ __forceinline__ void load_chunk(int stage, const T* queries, const T* docs, int64_t qrow0,
                                             int64_t row0, int rows, int64_t kc) const {
    const uint32_t base = smem_addr(stages + size_t(stage) * (BN + BM) * KC);
    const int64_t kbase = kc * KC;
    load_swizzled<T, BN, KC, kThreads>(base, docs, row0, rows, kbase, dim, gran);
    int64_t qr = q_rows - qrow0;
    qr = qr < 0 ? 0 : qr;
    load_swizzled<T, BM, KC, kThreads>(base + uint32_t(doc_elems() * sizeof(T)), queries, qrow0, qr, kbase, dim,
                                       gran);
  }

  __device__ __forceinline__ void load_query(const T*, const QueryRows&) {}

  __device__ __forceinline__ void reset() { row_max.reset(); }

  // acc (+)= Qchunk * Dchunk^T; after the last K-chunk, fold (cols >= cols_valid masked).
  __device__ __forceinline__ void compute_k(int stage, bool first, bool last, int cols_valid, int col_base) {
    if (first) zero_acc(acc);
    const uint32_t dbase = smem_addr(stages + size_t(stage) * (BN + BM) * KC);
    const uint32_t qbase = dbase + uint32_t(doc_elems() * sizeof(T));
    const int arow = lane & 15, akh = lane >> 4;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r = (wm * MT + mt) * 16 + arow;
        ldmatrix_x4(swizzled<T, KC>(qbase, r, ks * 2 + akh), qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3]);
      }
      const auto a = [&](int mt) -> const uint32_t(&)[4] { return qa[mt]; };
      mma_kstep<T, KC>(acc, a, dbase, ks, wn * NTW, lane);
    }
    if (!last) return;

    row_max.fold(acc, lane, wn, cols_valid, col_base);
  }

  __device__ __forceinline__ void reduce(float* red_m, int* red_i) { row_max.reduce(red_m, red_i, lane, wm, wn); }
};

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

  __device__ __forceinline__ void compute(int, const T* docs, int64_t row0, int cols_valid, int col_base) {
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
