// K-streaming tensor-core mainloop (fp16/bf16, any dim; the forward uses it for dim > 256).
// Torch-free.
#pragma once

#include <cstdint>

#include "mainloop_mma.cuh"

namespace maxsim_cuda {
namespace kernel {

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
  __device__ __forceinline__ void compute_k(int stage, bool first, bool last, int cols_valid, int col_base,
                                            bool with_index) {
    if (first) zero_acc(acc);
    const uint32_t dbase = smem_addr(stages + size_t(stage) * (BN + BM) * KC);
    const uint32_t qbase = dbase + uint32_t(doc_elems() * sizeof(T));
    // A rows (wm * MT + mt) * 16 + (lane & 15): all congruent mod 8 across mt.
    const SwizzledFragment<T, KC> af(qbase, wm * MT * 16 + (lane & 15), lane >> 4);
    const auto bf = b_fragment<T, KC>(dbase, wn * NTW, lane);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(af.at(ks, mt * 16), qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3]);
      const auto a = [&](int mt) -> const uint32_t(&)[4] { return qa[mt]; };
      mma_kstep<T, KC>(acc, a, bf, ks);
    }
    if (!last) return;

    row_max.fold(acc, lane, wn, cols_valid, col_base, with_index);
  }

  __device__ __forceinline__ void reduce(float* red_m, int* red_i) { row_max.reduce(red_m, red_i, lane, wm, wn); }
};

}  // namespace kernel
}  // namespace maxsim_cuda
