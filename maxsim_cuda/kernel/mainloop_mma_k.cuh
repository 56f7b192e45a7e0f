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
//
// Compressed documents (F, doc_format.cuh): a stage holds the document chunk at one byte a
// value (64-byte rows), the tile's BN row scales, then the query chunk in T. k is permuted
// inside every k16 step in both operands: lane (g, t4) reads the 4 bytes 16 * ks + 4 * t4
// of document row g for b0 / b1 (PairBytes) and the 4 matching query elements with one
// 8-byte shared load for a0 / a2 (a1 / a3: row g + 8). The row scales multiply the
// accumulators after the last K-chunk, before the fold.
template <class T, int BM_, int BN_, int WM, int WN, int KC_, int STAGES_, int MIN_BLOCKS_ = 1,
          DocFormat F = DocFormat::kNative>
struct MmaKMainloop {
  using Elem = T;
  using DocT = DocElem<T, F>;
  using Acc = float;
  static constexpr bool kPipelined = true;
  static constexpr bool kCompressed = is_compressed<F>();
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
  static_assert(!kCompressed || KC == 64, "compressed chunks are 64-byte rows (WordSwizzle)");

  // bytes of a stage before the query chunk: the document chunk (and its row scales)
  static constexpr size_t doc_bytes() {
    return kCompressed ? size_t(BN) * KC + size_t(BN) * sizeof(float) : size_t(BN) * KC * sizeof(T);
  }
  static constexpr size_t stage_bytes() { return doc_bytes() + size_t(BM) * KC * sizeof(T); }
  static constexpr size_t smem_bytes() { return kStages * stage_bytes(); }

  unsigned char* stages;
  const float* doc_scales;
  int64_t dim;
  int64_t q_rows;  // rows of the queries tensor (bounds of the query chunk loads)
  int gran;        // native: elements per cp.async piece (copy_granularity over both bases)
  int dpiece, qpiece;  // compressed: cp.async piece bytes of documents and queries
  int lane, wm, wn;
  float acc[MT][NT][4];
  MmaRowMax<MT, NT, NTW, WN, BN> row_max;

  __device__ __forceinline__ void init(unsigned char* smem, int64_t dim_, const void* docs, const void* queries,
                                       int64_t q_rows_, const float* scales = nullptr) {
    stages = smem;
    doc_scales = scales;
    dim = dim_;
    q_rows = q_rows_;
    if constexpr (kCompressed) {
      dpiece = copy_piece_bytes(dim, reinterpret_cast<uintptr_t>(docs));
      qpiece = copy_piece_bytes(dim * int64_t(sizeof(T)), reinterpret_cast<uintptr_t>(queries));
    } else {
      gran = copy_granularity<T>(dim, reinterpret_cast<uintptr_t>(docs) | reinterpret_cast<uintptr_t>(queries));
    }
    const int warp = threadIdx.x / 32;
    lane = threadIdx.x % 32;
    wm = warp % WM;
    wn = warp / WM;
  }

  __device__ __forceinline__ uint32_t stage_addr(int stage) const {
    return smem_addr(stages + size_t(stage) * stage_bytes());
  }

  // Producer: K-chunk kc of document rows [row0, row0 + rows) and of the query block whose
  // row 0 is global query row qrow0, into stage `stage`.
  __device__ __forceinline__ void load_chunk(int stage, const T* queries, const DocT* docs, int64_t qrow0,
                                             int64_t row0, int rows, int64_t kc) const {
    const uint32_t base = stage_addr(stage);
    const int64_t kbase = kc * KC;
    int64_t qr = q_rows - qrow0;
    qr = qr < 0 ? 0 : qr;
    if constexpr (kCompressed) {
      load_rows<1, BN, KC, kThreads, WordSwizzle>(base, docs, row0, rows, kbase, dim, dpiece);
      load_scales<BN, kThreads>(base + uint32_t(BN * KC), doc_scales, row0, rows);
      load_rows<int(sizeof(T)), BM, KC * int(sizeof(T)), kThreads, QuadSwizzle>(
          base + uint32_t(doc_bytes()), queries, qrow0, qr, kbase, dim, qpiece);
    } else {
      load_swizzled<T, BN, KC, kThreads>(base, docs, row0, rows, kbase, dim, gran);
      load_swizzled<T, BM, KC, kThreads>(base + uint32_t(doc_bytes()), queries, qrow0, qr, kbase, dim, gran);
    }
  }

  __device__ __forceinline__ void load_query(const T*, const QueryRows&) {}

  __device__ __forceinline__ void reset() { row_max.reset(); }

  // acc (+)= Qchunk * Dchunk^T; after the last K-chunk, fold (cols >= cols_valid masked).
  __device__ __forceinline__ void compute_k(int stage, bool first, bool last, int cols_valid, int col_base,
                                            bool with_index) {
    if (first) zero_acc(acc);
    const uint32_t dbase = stage_addr(stage);
    const uint32_t qbase = dbase + uint32_t(doc_bytes());
    if constexpr (kCompressed) {
      compute_compressed(dbase, qbase);
      if (!last) return;
      scale_columns<F>(acc, dbase + uint32_t(BN * KC), wn * NTW + 2 * (lane % 4));
    } else {
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
    }
    row_max.fold(acc, lane, wn, cols_valid, col_base, with_index);
  }

  __device__ __forceinline__ void compute_compressed(uint32_t dbase, uint32_t qbase) {
    using PB = PairBytes<F>;
    constexpr int QROW = KC * int(sizeof(T));  // bytes of a query chunk row
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = (wm * MT + mt) * 16 + g + 8 * h;
          const uint2 x = ld_shared_v2(qbase + uint32_t(r * QROW + QuadSwizzle::chunk(r, 2 * ks + (t4 >> 1)) * 16 +
                                                        8 * (t4 & 1)));
          const uint16_t e[4] = {uint16_t(x.x & 0xffffu), uint16_t(x.x >> 16), uint16_t(x.y & 0xffffu),
                                 uint16_t(x.y >> 16)};
          qa[mt][h] = e[PB::lo0] | (uint32_t(e[PB::lo1]) << 16);
          qa[mt][2 + h] = e[PB::hi0] | (uint32_t(e[PB::hi1]) << 16);
        }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int r = wn * NTW + nt * 8 + g;
        const uint32_t w = ld_shared_u32(dbase + uint32_t(r * KC + WordSwizzle::chunk(r, ks) * 16 + 4 * t4));
        uint32_t b0, b1;
        widen_word<T, F>(w, b0, b1);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) Mma16816<T>::run(acc[mt][nt], qa[mt], b0, b1);
      }
    }
  }

  __device__ __forceinline__ void reduce(float* red_m, int* red_i, bool index) {
    row_max.reduce(red_m, red_i, lane, wm, wn, index);
  }
};

}  // namespace kernel
}  // namespace maxsim_cuda
