// MmaMainloop (fp16/bf16, dim <= KD <= 256): the query block lives in registers as
// mma.sync A fragments; document tiles [BN x KD] arrive in a multi-stage cp.async ring
// in shared memory (16-byte chunks XOR-swizzled by row, so ldmatrix is conflict-free),
// B fragments come from ldmatrix, S = Q D^T accumulates in fp32 and only updates the
// per-row running max/argmax; the [Lq, Ld] matrix never leaves registers.
// Warp (wm, wn) owns query rows [wm*MT*16, +MT*16) and tile columns [wn*BN/WN, +BN/WN).
// Also the warp-level pieces both tensor-core mainloops share (MmaRowMax, mma_kstep).
// Torch-free.
#pragma once

#include <cstdint>

#include "doc_format.cuh"
#include "epilogue.cuh"
#include "policies.cuh"
#include "primitives.cuh"
#include "tile_load.cuh"

namespace maxsim_cuda {
namespace kernel {

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
  // (all but a segment's last) take the unmasked path: no per-element select. Without
  // with_index (no argmax requested) only the max is kept: about a third of the work.
  // A narrower accumulator (NTU < NT 8-column blocks, cols_valid <= NTU * 8) folds the same way.
  template <int NTU = NT>
  __device__ __forceinline__ void fold(const float (&acc)[MT][NTU][4], int lane, int wn, int cols_valid,
                                       int col_base, bool with_index) {
    if (with_index) {
      if (cols_valid >= NTU * 8) {
        fold_masked<false, true, NTU>(acc, lane, wn, cols_valid, col_base);
      } else {
        fold_masked<true, true, NTU>(acc, lane, wn, cols_valid, col_base);
      }
    } else {
      if (cols_valid >= NTU * 8) {
        fold_masked<false, false, NTU>(acc, lane, wn, cols_valid, col_base);
      } else {
        fold_masked<true, false, NTU>(acc, lane, wn, cols_valid, col_base);
      }
    }
  }

  template <bool MASK, bool INDEX, int NTU = NT>
  __device__ __forceinline__ void fold_masked(const float (&acc)[MT][NTU][4], int lane, int wn, int cols_valid,
                                              int col_base) {
    static_assert(NTU <= NT && (NTU & (NTU - 1)) == 0, "NTU");
    const int t4 = lane % 4;
    int col[NTU * 2];
#pragma unroll
    for (int nt = 0; nt < NTU; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) col[nt * 2 + e] = nt * 8 + e;
    const int cbase = col_base + wn * NTW + 2 * t4;  // this thread's first column
    const int lim = cols_valid - (wn * NTW + 2 * t4);  // local columns below lim are valid
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[NTU * 2];
#pragma unroll
        for (int nt = 0; nt < NTU; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = acc[mt][nt][2 * h + e];
            v[nt * 2 + e] = (!MASK || col[nt * 2 + e] < lim) ? x : neg_inf<float>();
          }
        fold_tile<NTU * 2, INDEX>(m[mt * 2 + h], idx[mt * 2 + h], v, col, cbase);
      }
  }

  template <bool INDEX>
  __device__ __forceinline__ void merge_quads() {
#pragma unroll
    for (int k = 0; k < MT * 2; ++k) {
      merge_lanes<INDEX>(m[k], idx[k], 1);
      merge_lanes<INDEX>(m[k], idx[k], 2);
    }
  }

  // Quad shuffle (merge_lanes: the maxima alone without argmax), then one partial per
  // (row, wn) into shared memory.
  __device__ __forceinline__ void reduce(float* red_m, int* red_i, int lane, int wm, int wn, bool index) {
    index ? merge_quads<true>() : merge_quads<false>();
    const int g = lane / 4, t4 = lane % 4;
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

// Where this lane's ldmatrix.x4 reads B fragments of a swizzled [* x COLS] document tile
// at `base` whose warp slice starts at row first_row (a multiple of 8).
template <class T, int COLS>
__device__ __forceinline__ SwizzledFragment<T, COLS> b_fragment(uint32_t base, int first_row, int lane) {
  return SwizzledFragment<T, COLS>(base, first_row + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
}

// One 16-column k-step: B fragments by ldmatrix (addresses from b_fragment) for the warp's
// NT*8 tile rows, A fragments from a(mt).
template <class T, int COLS, int MT, int NT, class AFrag>
__device__ __forceinline__ void mma_kstep(float (&acc)[MT][NT][4], const AFrag& a, const SwizzledFragment<T, COLS>& bf,
                                          int ks) {
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint32_t b0, b1, b2, b3;
    ldmatrix_x4(bf.at(ks, np * 16), b0, b1, b2, b3);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      Mma16816<T>::run(acc[mt][2 * np], a(mt), b0, b1);
      Mma16816<T>::run(acc[mt][2 * np + 1], a(mt), b2, b3);
    }
  }
}

// F (doc_format.cuh) is the documents' format. Compressed tiles hold one byte a value
// (rows of KD bytes, 16-byte chunks swizzled for the reads below) and the tile's BN row
// scales after them. A lane widens B fragments from one 16-byte shared load per n8 tile and
// four k-steps: k is permuted consistently in both operands, so lane (g, t4)'s 16 bytes are
// columns 64 * kq + 16 * t4 + [0, 16) of document row g, k-step 4 * kq + j takes bytes
// 4j..4j+3 (PairBytes says which pair goes to b0 and b1), and the query A fragments are
// loaded with the same columns. The row scales multiply the accumulators before the fold.
//
// Residual documents (F = kResidual) are decoded rather than widened: the producer gathers each
// row's centroid into the 16-bit tile by its code and copies the row's packed bucket ids beside
// it; before the MMAs the CTA adds the bucket weights in place, a pair of dimensions at a time,
// sums each row's squares into its scale (decode_residual), and the tile is then read as a
// 16-bit one, the scales applied as for compressed tiles.
template <class T, int KD_, int BM_, int BN_, int WM, int WN, int STAGES_, int MIN_BLOCKS_ = 1,
          DocFormat F = DocFormat::kNative>
struct MmaMainloop {
  using Elem = T;
  using DocT = DocElem<T, F>;
  using Acc = float;
  static constexpr bool kPipelined = true;
  static constexpr bool kCompressed = is_compressed<F>();
  static constexpr bool kResidual = F == DocFormat::kResidual;
  static constexpr int KD = KD_, BM = BM_, BN = BN_, kStages = STAGES_;
  static constexpr int kWarps = WM * WN, kThreads = kWarps * 32, kMinBlocks = MIN_BLOCKS_;
  static constexpr int MT = BM / (16 * WM);
  static constexpr int NTW = BN / WN;  // columns per warp
  static constexpr int NT = NTW / 8;
  static constexpr int KS = KD / 16;
  static constexpr int kSlots = WN;
  static_assert(MT >= 1 && BM == MT * 16 * WM, "BM");
  static_assert(NT % 2 == 0, "NT must be even (ldmatrix.x4 loads two n8 tiles)");
  using Swz = std::conditional_t<(KD > 64), PairSwizzle, NoSwizzle>;  // compressed tiles

  // Residual stage: the 16-bit tile, BN row scales (1, or NaN for a code out of range), BN rows
  // of packed bucket ids (at most KD / 2 bytes: nbits <= 4). Then, once, the pair tables:
  // 2**(2 * nbits) <= 256 weight pairs as two T (kPairTableT) and as two float32 (kPairTableF).
  static constexpr int kTileBytes = BN * KD * int(sizeof(T));
  static constexpr int kResidualRowBytes = KD / 2;
  static constexpr int kPairTableT = 0, kPairTableF = 256 * 4, kPairTableBytes = 256 * 12;
  static constexpr size_t stage_bytes() {
    if constexpr (kResidual) return size_t(kTileBytes) + size_t(BN) * (4 + kResidualRowBytes);
    return kCompressed ? size_t(BN) * KD + size_t(BN) * sizeof(float) : size_t(BN) * KD * sizeof(T);
  }
  static constexpr size_t smem_bytes() { return kStages * stage_bytes() + (kResidual ? kPairTableBytes : 0); }

  unsigned char* tiles;
  const float* doc_scales;  // compressed: one per document row
  ResidualRef res;          // residual: the codec
  int res_bytes;            // residual: packed bytes per row (dim * nbits / 8)
  bool res_weights_in_t;    // residual: every bucket weight is a value of T (16-bit adds)
  int64_t dim;
  int gran;  // native: elements per cp.async piece (copy_granularity); compressed: bytes (copy_piece_bytes)
  int lane, wm, wn;
  uint32_t qa[MT][KS][4];
  MmaRowMax<MT, NT, NTW, WN, BN> row_max;

  __device__ __forceinline__ void init(unsigned char* smem, int64_t dim_, const void* docs,
                                       const float* scales = nullptr) {
    tiles = smem;
    doc_scales = scales;
    dim = dim_;
    if constexpr (kCompressed) {
      gran = copy_piece_bytes(dim, reinterpret_cast<uintptr_t>(docs));
    } else {
      gran = copy_granularity<T>(dim, reinterpret_cast<uintptr_t>(docs));
    }
    const int warp = threadIdx.x / 32;
    lane = threadIdx.x % 32;
    wm = warp % WM;
    wn = warp / WM;
  }

  // Residual documents: the codec, and the pair tables into shared memory (read after the main
  // loop's first barrier).
  __device__ __forceinline__ void bind_residual(const ResidualRef& r, const void* docs) {
    res = r;
    res_bytes = int(dim * r.nbits / 8);
    gran = copy_piece_bytes(res_bytes, reinterpret_cast<uintptr_t>(docs));
    res_weights_in_t = residual_weights_in<T>(r);
    unsigned char* tables = tiles + kStages * stage_bytes();
    // only the table decode_residual reads: T pairs when every weight is a value of T
    for (int e = threadIdx.x; e < (1 << (2 * r.nbits)); e += kThreads) {
      float w0, w1;
      residual_pair_weights(r, uint32_t(e), w0, w1);
      if (res_weights_in_t) {
        *reinterpret_cast<uint32_t*>(tables + kPairTableT + 4 * e) = Pair16<T>::pack(w0, w1);
      } else {
        *reinterpret_cast<float2*>(tables + kPairTableF + 8 * e) = make_float2(w0, w1);
      }
    }
  }

  // Producer, residual: centroid rows by code into the swizzled 16-bit tile (a code out of
  // range reads centroid 0 and its row's scale is NaN), the packed bucket ids beside it. A
  // thread keeps one chunk column and reads all its rows' codes before any copy, so the code
  // loads of a tile overlap (one round trip a tile, not one a row).
  __device__ __forceinline__ void load_residual_tile(uint32_t base, const uint8_t* docs, int64_t row0,
                                                     int rows) const {
    if (res.codes_is64) {
      load_residual_tile_as<long long>(base, docs, row0, rows);
    } else {
      load_residual_tile_as<int>(base, docs, row0, rows);
    }
  }
  template <class Code>
  __device__ __forceinline__ void load_residual_tile_as(uint32_t base, const uint8_t* docs, int64_t row0,
                                                        int rows) const {
    constexpr int CH = KD / 8, RSTEP = kThreads / CH, ITER = BN / RSTEP;
    static_assert(kThreads % CH == 0 && BN % RSTEP == 0, "a fixed chunk column per thread");
    const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
    const bool in_dim = ch * 8 < dim;
    // dim <= 256 here, so a centroid's offset is one 32 x 32 -> 64-bit multiply
    const T* cents = static_cast<const T*>(res.centroids) + ch * 8;
    const uint32_t row_elems = uint32_t(dim);
    const Code* codes = static_cast<const Code*>(res.codes) + row0 + r0;
    uint32_t code[ITER];
    bool ok[ITER];
#pragma unroll
    for (int it = 0; it < ITER; ++it) {
      const int64_t c = r0 + it * RSTEP < rows ? int64_t(__ldg(codes + it * RSTEP)) : int64_t(0);
      ok[it] = uint64_t(c) < uint64_t(res.n_centroids);
      code[it] = ok[it] ? uint32_t(c) : 0u;
    }
#pragma unroll
    for (int it = 0; it < ITER; ++it) {
      const int r = r0 + it * RSTEP;
      const uint32_t dst = swizzled<T, KD>(base, r, ch);
      if (r >= rows || !in_dim) {
        st_shared_zero16(dst);
      } else {
        cp_async_16(dst, cents + uint64_t(code[it]) * row_elems);
      }
      if (ch == 0) {  // the row's scale: NaN for a code out of range (the bad-id rule)
        const float scale = r >= rows ? 0.f : (ok[it] ? 1.f : __int_as_float(0x7fc00000));
        st_shared_f32(base + uint32_t(kTileBytes + 4 * r), scale);
      }
    }
    load_rows<1, BN, kResidualRowBytes, kThreads, NoSwizzle>(base + uint32_t(kTileBytes + BN * 4), docs, row0,
                                                             rows, 0, res_bytes, gran);
  }

  // The tile's rows [0, rows): bucket weights added in place, each row's scale times
  // 1 / max(||t||, 1e-12) when the codec normalises. A row is decoded by TPR = kThreads / BN
  // threads (adjacent lanes); in each 8-chunk group part p takes chunks p * S + [0, S), S = 8 /
  // TPR, so at every step the 8 lanes of a quarter-warp (S rows x TPR parts) touch 8 different
  // bank groups of the swizzled tile. nbits is a template parameter of the decode so that the
  // bit fields' positions are immediates.
  __device__ __forceinline__ void decode_residual(int stage, int rows) const {
    const bool in_t = res_weights_in_t;
    switch (res.nbits) {
      case 1: return in_t ? decode_residual_as<1, true>(stage, rows) : decode_residual_as<1, false>(stage, rows);
      case 2: return in_t ? decode_residual_as<2, true>(stage, rows) : decode_residual_as<2, false>(stage, rows);
      default: return in_t ? decode_residual_as<4, true>(stage, rows) : decode_residual_as<4, false>(stage, rows);
    }
  }
  template <int NB, bool kWeightsInT>
  __device__ __forceinline__ void decode_residual_as(int stage, int rows) const {
    constexpr int TPR = kThreads >= BN ? kThreads / BN : 1, RP = kThreads / TPR, S = 8 / TPR;
    static_assert(TPR <= 8 && (KD / 8) % TPR == 0, "a row's threads share a warp and its chunk groups");
    // A part's bucket ids in one group: S chunks of NB bytes, in whole words when there are
    // at least 4 bytes (then every field's position is an immediate), else inside one word.
    constexpr int PART_BYTES = S * NB, WORDS = PART_BYTES >= 4 ? PART_BYTES / 4 : 1;
    constexpr uint32_t kEntryBytes = kWeightsInT ? 4u : 8u;
    const uint32_t base = stage_addr(stage);
    const uint32_t tables = smem_addr(tiles + kStages * stage_bytes());
    const uint32_t table = tables + (kWeightsInT ? kPairTableT : kPairTableF);
    const int nch = int(dim / 8);
    const int part = threadIdx.x % TPR;
#pragma unroll 1
    for (int r0 = 0; r0 < BN; r0 += RP) {
      const int r = r0 + threadIdx.x / TPR;
      const uint32_t row = base + uint32_t(r * KD) * uint32_t(sizeof(T));
      const int x = (part * S) ^ (r & 7);  // the swizzled position of the part's chunk j is x ^ j
      const uint32_t bsrc = base + uint32_t(kTileBytes + BN * 4 + r * kResidualRowBytes + part * PART_BYTES);
      // bit offset of the part's first field within its (byte-reversed) word when it is not
      // word-aligned (PART_BYTES < 4)
      const int lead = PART_BYTES >= 4 ? 0 : 8 * int(bsrc & 3u);
      float ss[4] = {0.f, 0.f, 0.f, 0.f};  // one sum per pair of the chunk: four short chains
#pragma unroll
      for (int g = 0; g < KD / 64; ++g) {
        uint32_t w[WORDS];
#pragma unroll
        for (int k = 0; k < WORDS; ++k)  // first byte on top: fields read from the left
          w[k] = __byte_perm(ld_shared_u32((bsrc & ~3u) + uint32_t(g * 8 * NB + 4 * k)), 0u, 0x0123u);
#pragma unroll
        for (int j = 0; j < S; ++j) {
          const int ch = g * 8 + part * S + j;
          if (ch < nch && r < rows) {
            const uint32_t addr = row + uint32_t((g * 8 + (x ^ j)) << 4);
            uint4 v = ld_shared_v4(addr);
            const uint32_t word = w[(j * NB) / 4];
            const int top = 32 - 8 * ((j * NB) % 4) - lead;  // the chunk's first field starts below bit `top`
            uint32_t* pair = &v.x;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const uint32_t entry = (word >> (top - 2 * NB * (q + 1))) & ((1u << (2 * NB)) - 1u);
              pair[q] = residual_add_pair<T, kWeightsInT>(pair[q], table + kEntryBytes * entry);
            }
            st_shared_v4(addr, v);
            if (res.normalize) add_squares<T>(ss, v);
          }
        }
      }
      float sum = (ss[0] + ss[1]) + (ss[2] + ss[3]);
#pragma unroll
      for (int o = TPR / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (part == 0 && r < rows && res.normalize) {  // the producer left 1 or NaN there
        const uint32_t at = base + uint32_t(kTileBytes + 4 * r);
        st_shared_f32(at, ld_shared_f32(at) * (1.f / fmaxf(sqrtf(sum), 1e-12f)));
      }
    }
  }

  __device__ __forceinline__ uint32_t stage_addr(int stage) const {
    return smem_addr(tiles + size_t(stage) * stage_bytes());
  }

  // Producer: document rows [row0, row0 + rows) into stage `stage` (zero-filled beyond).
  __device__ __forceinline__ void load_tile(int stage, const DocT* docs, int64_t row0, int rows) const {
    if constexpr (kResidual) {
      load_residual_tile(stage_addr(stage), docs, row0, rows);
    } else if constexpr (kCompressed) {
      const uint32_t base = stage_addr(stage);
      load_rows<1, BN, KD, kThreads, Swz>(base, docs, row0, rows, 0, dim, gran);
      load_scales<BN, kThreads>(base + uint32_t(BN * KD), doc_scales, row0, rows);
    } else {
      load_swizzled<T, BN, KD, kThreads>(stage_addr(stage), docs, row0, rows, 0, dim, gran);
    }
  }

  // Query block rows of this chunk straight from global memory into A fragments. Each
  // fragment register holds columns (k, k + 1), k even: one 4-byte load when dim is even
  // and the base 4-byte aligned, else two 2-byte loads.
  __device__ __forceinline__ void load_query(const T* queries, const QueryRows& qr) {
    if constexpr (kCompressed) {
      load_query_permuted(queries, qr);
      return;
    }
    const int g = lane / 4, t4 = lane % 4;
    const bool pairs = dim % 2 == 0 && (reinterpret_cast<uintptr_t>(queries) & 3) == 0;
    if (pairs && dim >= KD) {
      load_query_full_width(queries, qr);
      return;
    }
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

  // The common case, every k-step inside dim and 4-byte pairs: a row's 2 * KS words at fixed
  // offsets from one pointer, one predicate a row. The general loop above checks every word
  // against dim, about 15 instructions a word (476 a warp at KD 128, BM 32: a third of what a
  // one-step CTA of SmallRerank executes, ncu on an H200, 2026-11-27).
  __device__ __forceinline__ void load_query_full_width(const T* queries, const QueryRows& qr) {
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (wm * MT + mt) * 16 + g + 8 * h;
        if (qr.valid(r)) {  // one branch a row, so that its loads share one address
          const unsigned int* p = reinterpret_cast<const unsigned int*>(queries + qr.global_row(r) * dim) + t4;
#pragma unroll
          for (int ks = 0; ks < KS; ++ks) {
            qa[mt][ks][h] = __ldg(p + ks * 8);
            qa[mt][ks][2 + h] = __ldg(p + ks * 8 + 4);
          }
        } else {
#pragma unroll
          for (int ks = 0; ks < KS; ++ks) qa[mt][ks][h] = qa[mt][ks][2 + h] = 0u;
        }
      }
  }

  // Compressed documents: the A fragments in the documents' k permutation. Lane t4 of row r
  // reads the 16 columns 64 * kq + 16 * t4 + [0, 16) (two 16-byte loads when they can be).
  __device__ __forceinline__ void load_query_permuted(const T* queries, const QueryRows& qr) {
    using PB = PairBytes<F>;
    const int g = lane / 4, t4 = lane % 4;
    const bool vec = dim % 8 == 0 && (reinterpret_cast<uintptr_t>(queries) & 15) == 0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (wm * MT + mt) * 16 + g + 8 * h;
        const bool v = qr.valid(r);
        const T* p = queries + (v ? qr.global_row(r) * dim : 0);
#pragma unroll
        for (int kq = 0; kq < KS / 4; ++kq) {
          const int64_t c0 = int64_t(kq) * 64 + 16 * t4;
          uint16_t e[16];
          if (vec) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int64_t c = c0 + 8 * half;
              const uint4 x = (v && c < dim) ? __ldg(reinterpret_cast<const uint4*>(p + c)) : make_uint4(0u, 0u, 0u, 0u);
              const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                e[8 * half + 2 * i] = uint16_t(w[i] & 0xffffu);
                e[8 * half + 2 * i + 1] = uint16_t(w[i] >> 16);
              }
            }
          } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) e[i] = (v && c0 + i < dim) ? ld_bits16(p + c0 + i) : uint16_t(0);
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint16_t* b = e + 4 * j;
            qa[mt][4 * kq + j][h] = b[PB::lo0] | (uint32_t(b[PB::lo1]) << 16);      // a0 / a1
            qa[mt][4 * kq + j][2 + h] = b[PB::hi0] | (uint32_t(b[PB::hi1]) << 16);  // a2 / a3
          }
        }
      }
  }

  __device__ __forceinline__ void reset() { row_max.reset(); }

  // S = Q * tile^T on tensor cores, then fold into the running max (cols >= cols_valid masked).
  __device__ __forceinline__ void compute(int stage, const DocT*, int64_t, int cols_valid, int col_base,
                                          bool with_index) {
    float acc[MT][NT][4];
    zero_acc(acc);
    if constexpr (kResidual) {
      decode_residual(stage, cols_valid);
      __syncthreads();  // every row decoded before any warp reads the tile
      compute_native(acc, stage);
      scale_columns<F>(acc, stage_addr(stage) + uint32_t(kTileBytes), wn * NTW + 2 * (lane % 4));
    } else if constexpr (kCompressed) {
      compute_compressed(acc, stage);
    } else {
      compute_native(acc, stage);
    }
    row_max.fold(acc, lane, wn, cols_valid, col_base, with_index);
  }

  // A 16-bit tile (native, or decoded residuals).
  __device__ __forceinline__ void compute_native(float (&acc)[MT][NT][4], int stage) const {
    const auto bf = b_fragment<T, KD>(stage_addr(stage), wn * NTW, lane);
    // All KS k-steps run (columns past dim are zeros in both operands): no branch in the
    // unrolled loop, so ldmatrix of step ks+1 can overlap the mma of step ks.
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const auto a = [&](int mt) -> const uint32_t(&)[4] { return qa[mt][ks]; };
      mma_kstep<T, KD>(acc, a, bf, ks);
    }
  }

  __device__ __forceinline__ void compute_compressed(float (&acc)[MT][NT][4], int stage) {
    const int g = lane / 4, t4 = lane % 4;
    const uint32_t base = stage_addr(stage);
#pragma unroll
    for (int kq = 0; kq < KS / 4; ++kq)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int r = wn * NTW + nt * 8 + g;
        const uint4 raw = ld_shared_v4(base + uint32_t(r * KD + Swz::chunk(r, 4 * kq + t4) * 16));
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b0, b1;
          widen_word<T, F>(w[j], b0, b1);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) Mma16816<T>::run(acc[mt][nt], qa[mt][4 * kq + j], b0, b1);
        }
      }
    scale_columns<F>(acc, base + uint32_t(BN * KD), wn * NTW + 2 * t4);
  }

  __device__ __forceinline__ void reduce(float* red_m, int* red_i, bool index) {
    row_max.reduce(red_m, red_i, lane, wm, wn, index);
  }
};

}  // namespace kernel
}  // namespace maxsim_cuda
