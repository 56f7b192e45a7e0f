// SimtMainloop (float32 / float64 queries, float or compressed documents; residual documents
// for any query dtype): the same tile stream and epilogue as the tensor-core mainloops, FFMA
// on [BM x KC] x [KC x BN] shared-memory chunks, accumulation in Acc (float, or double for
// double inputs): float32-accurate scores. Torch-free.
#pragma once

#include <cstdint>
#include <type_traits>

#include "doc_format.cuh"
#include "epilogue.cuh"
#include "policies.cuh"
#include "primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

// N consecutive shared-memory values into out, 16 bytes at a time where N allows (the
// caller keeps p aligned to the run's size).
template <int N, class A>
__device__ __forceinline__ void load_run(const A* p, A* out) {
  if constexpr (sizeof(A) == 4 && N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 v = reinterpret_cast<const float4*>(p)[i];
      out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
    }
  } else if constexpr (sizeof(A) == 4 && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float2 v = reinterpret_cast<const float2*>(p)[i];
      out[2 * i] = v.x, out[2 * i + 1] = v.y;
    }
  } else if constexpr (sizeof(A) == 8 && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const double2 v = reinterpret_cast<const double2*>(p)[i];
      out[2 * i] = v.x, out[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = p[i];
  }
}

// SIMT FFMA mainloop: 256 threads as 16 x 16 (128 as 8 x 16: kNarrowCta), each a TM x 8
// register tile. Compressed documents (F) are widened to their exact float values as they
// enter shared memory, and each similarity is multiplied by its row's scale before it meets
// the max.
//
// Residual documents (F = kResidual) take this path wherever the tensor-core decode does not
// apply: float32 queries, centroids of another dtype than the queries' or off 16-byte
// boundaries, dim > 256. A thread decodes 8 consecutive dimensions of two rows per K chunk
// (one vector load of the centroid, nbits bytes of bucket ids): t = round_T(centroid +
// weight), the float32 sum rounded once as the contract says. It reads its rows' codes once a
// tile and sums their squares across the chunks; after the last chunk the four threads of a
// row add theirs in a fixed order into its factor, 1 / max(||t||, 1e-12) (NaN for a code out
// of range, which reads centroid 0).
//
// Per k step a thread reads its TM query values and its 8 document values as 16-byte runs
// (two runs of four columns, tx * 4 and 64 + tx * 4, so that eight lanes' runs tile 128
// contiguous bytes: no bank conflict) for 8 * TM FMAs. The next K chunk's loads are issued
// before the current chunk's FMAs, so their latency hides under them, into the other of two
// shared-memory buffers: one barrier a chunk. Float documents with queries of the
// accumulator's type copy there by cp.async (kAsyncCopy); int8 / e4m3 documents with float32
// queries (kBytePieces) copy the queries so and widen the documents' bytes into the same
// layout after the FMAs (16 bytes a thread held across them); residual documents with float32
// queries decode before the FMAs and store into that layout after them (kResidualPieces), with
// 16-bit queries into a transposed chunk through registers, which keeps QL + DL values live.
template <class T, class Acc_, int BM_, DocFormat F = DocFormat::kNative>
struct SimtMainloop {
  using Elem = T;
  using DocT = DocElem<T, F>;
  using Acc = Acc_;
  static constexpr bool kPipelined = false;
  static constexpr bool kResidual = F == DocFormat::kResidual;
  static constexpr int BM = BM_, BN = 128, kStages = 1;
  static constexpr bool kAsyncCopy = F == DocFormat::kNative && std::is_same_v<T, Acc_>;
  // int8 / e4m3 documents with float32 queries: the same chunk layout, the queries by cp.async,
  // the documents' bytes by 16-byte loads into registers, widened into it after a chunk's FMAs
  // (chunks), so that every float32-query call runs the one piece loop. Against the
  // transposed chunk through registers (256 threads, a value a lane, H200, 2026-11-29, bitwise
  // equal): float32 + int8 HeavyRerank 0.57x, + e4m3 0.32x, contrastive 0.64-0.83x.
  static constexpr bool kBytePieces = is_compressed<F>() && std::is_same_v<T, float> && std::is_same_v<Acc_, float>;
  // Residual documents with float32 queries alike: decoded before a chunk's FMAs as before
  // (fetch_residual), held across them and stored into the pieces after them.
  static constexpr bool kResidualPieces = kResidual && std::is_same_v<T, float>;
  static constexpr bool kPieceLayout = kAsyncCopy || kBytePieces || kResidualPieces;
  // CTA shapes and CTAs an SM, all bitwise the same results (H200 A/B, 2026-11-28 and -29):
  // - The piece layout at 32 query rows (kNarrowCta): 128 threads, each a 4 x 8 tile, four
  //   CTAs an SM. A k step reads 12 values for 32 FMAs where a 2 x 8 tile read 10 for 16, so a
  //   chunk's shared-memory reads halve and fit under its FMAs; 0.63-0.81x the time of two
  //   256-thread CTAs on the padded / packed rows.
  // - Other shapes: 256 threads, TM x 8 tiles. Two CTAs an SM (128 registers a thread) where
  //   ptxas fits them without spilling: 32 query rows with float32 accumulators and one query a
  //   step (padded, packed: 2-bit residual 0.75-0.77x; float32 and int8 documents, 0.84x and
  //   0.70x then, are narrow CTAs since); 64 rows on the piece layout, one query a step:
  //   0.89-0.94x. The contrastive 64-row shapes spill 16 bytes even so and keep one CTA, as do
  //   the register path's contrastive shapes (20-170 bytes). run_forward launches one
  //   256-thread CTA an SM where that is sooner (shared_sm_ctas).
  // The sm_86 / sm_89 code keeps one 256-thread CTA (two narrow ones): at 128 registers ptxas
  // (CUDA 13.0) spills the float padded shape there (22 bytes), and those parts' gain is
  // unmeasured (the host's occupancy query finds what the target's code allows). The value
  // may differ between compilation passes: __launch_bounds__ is read by the device pass of
  // each target only.
  static constexpr bool kNarrowCta = kPieceLayout && sizeof(Acc_) == 4 && BM_ == 32;
  static constexpr int kThreads = kNarrowCta ? 128 : 256, kMinBlocks = 1;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 890)
  static constexpr bool kTwoCtasOnTarget = false;
#else
  static constexpr bool kTwoCtasOnTarget = true;
#endif
  // e4m3 widened by bit moves (the sm_80 code; sm_89 and up convert) needs more registers: at
  // 128 a thread ptxas (CUDA 13.0) spills the contrastive 32-row shapes 4 bytes, so their
  // CTAs run three an SM (the padded / packed ones fit).
  static constexpr bool kBitMoveBytes = kBytePieces && F == DocFormat::kE4M3 && !MAXSIM_E4M3_CVT;
  template <class Policy>
  static constexpr int min_blocks_for() {
    // the residual decode's 32 values a thread held across the FMAs need more than 128
    // registers: three CTAs (168)
    if (kNarrowCta) return kTwoCtasOnTarget ? (kResidual || (kBitMoveBytes && !Policy::kOneQueryPerStep) ? 3 : 4) : 2;
    if (!kTwoCtasOnTarget || sizeof(Acc_) != 4 || !Policy::kOneQueryPerStep) return kMinBlocks;
    return BM_ == 32 || (BM_ == 64 && kPieceLayout) ? 2 : kMinBlocks;
  }
  // One 16-byte piece (V k steps) of the cp.async chunk an iteration: unrolled by 2, ptxas
  // spills the narrow BM 32 shapes (26-74 bytes) and takes BM 128 to 254 registers.
  static constexpr int kPieceUnroll = 1;
  static constexpr int TM = BM / (kThreads / 16), TN = 8;
  static constexpr int KC = sizeof(Acc) == 8 ? 16 : 32;
  static constexpr int QP = BM + 4, DP = BN + 4;  // padded strides (16-byte aligned rows)
  static constexpr int kSlots = 1;
  static constexpr int QL = BM * KC / kThreads, DL = BN * KC / kThreads;  // prefetched values a thread
  // Two chunk buffers: the register path stores chunk c + 1 after chunk c's FMAs; the
  // asynchronous one has chunk c + 1 in flight under them (a third buffer, two in flight, was
  // slower: 2026-11-29).
  static constexpr int kChunkBuffers = 2;
  static_assert(BM * KC % kThreads == 0 && TN == 8 && BN == 16 * TN, "thread tile shape");

  // One chunk: through registers [KC][QP] then [KC][DP] (transposed: a k step's rows are
  // contiguous); by cp.async [BM][KC] then [BN][KC] in 16-byte pieces (below).
  static constexpr size_t kBuffer = kPieceLayout ? size_t(KC) * (BM + BN) : size_t(KC) * (QP + DP);

  // residual: after qvalid, the tile's row factors, then the 16 bucket weights
  static constexpr size_t kResidualBytes = kResidual ? size_t(BN) * 4 + 16 * 4 : 0;
  // residual: thread t decodes dimensions [8g, 8g + 8) of each chunk, g = t % 4, for its
  // kResSlots local rows res_row(u)
  static constexpr int kResRowStep = kThreads / (KC / 8), kResSlots = BN / kResRowStep;
  static_assert(!kResidual || (KC == 32 && BN % kResRowStep == 0 && DL == 8 * kResSlots), "residual thread map");
  // The local row of the thread's residual slot u: t / 4 + u * kResRowStep on the transposed
  // chunk (whose stash permutes dimensions instead); in pieces, the 8 lanes of a quarter warp
  // take two rows of neighbouring groups of 4 (piece positions XORed by 1 apart), so their
  // 16-byte stores of pieces 2 g + e (g = lane % 4) meet 8 positions.
  static __device__ __forceinline__ int res_row(int u) {
    if constexpr (kResidualPieces) {
      const int l = threadIdx.x % 32, p = int(threadIdx.x / 32) + u * (kThreads / 32);
      return 4 * (2 * p + (l / 4) % 2) + (l / 8) % 4;
    } else {
      return int(threadIdx.x / 4) + u * kResRowStep;
    }
  }
  // The piece layout: room to start the chunk buffers on a 128-byte boundary (ffma_pieces).
  static constexpr size_t kAlignSlack = kPieceLayout ? 112 : 0;
  static constexpr size_t smem_bytes() {
    return kAlignSlack + kChunkBuffers * kBuffer * sizeof(Acc) + size_t(BM) * sizeof(int) + kResidualBytes;
  }

  Acc* buf;      // kChunkBuffers chunk buffers
  int* qvalid;   // [BM]
  const T* qbase;  // queries + global row of block row 0 of this chunk * dim
  const float* doc_scales;  // compressed: one per document row
  float* row_factor;        // residual: [BN] 1 / ||t|| (1 without normalising; NaN: bad code)
  float* weight;            // residual: [2**nbits] bucket weights as float32
  ResidualRef res;          // residual: the codec
  int64_t res_bytes;        // residual: packed bytes per row (dim * nbits / 8)
  int64_t res_code[kResSlots];  // residual: the codes of the thread's rows (0 if out of range)
  bool res_ok[kResSlots];       // residual: code in range
  float res_ss[kResSlots];      // residual: the squares of the thread's dimensions of its rows
  int64_t dim;
  int tx, ty;
  Acc m[TM];
  int idx[TM];

  __device__ __forceinline__ void init(unsigned char* smem, int64_t dim_, const void*,
                                       const float* scales = nullptr) {
    doc_scales = scales;
    if constexpr (kAlignSlack > 0) smem += (128u - smem_addr(smem) % 128u) % 128u;  // smem is 16-byte aligned
    buf = reinterpret_cast<Acc*>(smem);
    qvalid = reinterpret_cast<int*>(buf + kChunkBuffers * kBuffer);
    row_factor = reinterpret_cast<float*>(qvalid + BM);
    weight = row_factor + BN;
    dim = dim_;
    tx = threadIdx.x % 16;
    ty = threadIdx.x / 16;
  }

  // Residual documents: the codec, and its bucket weights into shared memory (read after the
  // first tile's barrier).
  __device__ __forceinline__ void bind_residual(const ResidualRef& r, const void*) {
    res = r;
    res_bytes = dim * r.nbits / 8;
    for (int b = threadIdx.x; b < (1 << r.nbits); b += kThreads) weight[b] = residual_weight(r, uint32_t(b));
  }

  // The codes of the thread's rows of the tile at row0; their squares start at zero.
  __device__ __forceinline__ void start_residual_tile(int64_t row0, int cols_valid) {
#pragma unroll
    for (int u = 0; u < kResSlots; ++u) {
      const int r = res_row(u);
      int64_t code = 0;
      if (r < cols_valid) {
        code = res.codes_is64 ? int64_t(__ldg(static_cast<const long long*>(res.codes) + row0 + r))
                              : int64_t(__ldg(static_cast<const int*>(res.codes) + row0 + r));
      }
      res_ok[u] = code >= 0 && code < res.n_centroids;
      res_code[u] = res_ok[u] ? code : 0;
      res_ss[u] = 0.f;
    }
  }

  // Dimensions [k, k + 8) of the thread's rows (zeros past the valid rows and dim), as the
  // products take them, into dv[8u + j].
  __device__ __forceinline__ void fetch_residual(Acc (&dv)[DL], const uint8_t* docs, int64_t row0, int cols_valid,
                                                 int64_t k0) {
    const int nb = res.nbits;
    const int64_t k = k0 + 8 * (threadIdx.x % 4);
#pragma unroll
    for (int u = 0; u < kResSlots; ++u) {
      const int r = res_row(u);
      if (r < cols_valid && k < dim) {  // dim is a multiple of 8: the whole group is in
        float c[8];
        residual_centroid8(res, res_code[u] * dim + k, c);
        const uint8_t* ids = docs + (row0 + r) * res_bytes + k * nb / 8;
        uint32_t bits = 0;
        for (int b = 0; b < nb; ++b) bits |= uint32_t(__ldg(ids + b)) << (24 - 8 * b);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float t = to_acc<float>(from_acc<T, float>(c[j] + weight[residual_bucket(bits, j, nb)]));
          res_ss[u] = fmaf(t, t, res_ss[u]);
          dv[8 * u + j] = static_cast<Acc>(t);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) dv[8 * u + j] = Acc(0);
      }
    }
  }

  // After the tile's last chunk: each row's four partial sums of squares, in lane order, into
  // its factor (read after the caller's barrier).
  __device__ __forceinline__ void finish_residual_tile(int cols_valid) {
#pragma unroll
    for (int u = 0; u < kResSlots; ++u) {
      float ss = res_ss[u];
      ss += __shfl_xor_sync(0xffffffffu, ss, 1);
      ss += __shfl_xor_sync(0xffffffffu, ss, 2);
      const int r = res_row(u);
      if (threadIdx.x % 4 == 0) {
        row_factor[r] = r >= cols_valid ? 0.f
                        : !res_ok[u]    ? __int_as_float(0x7fc00000)
                        : res.normalize ? 1.f / fmaxf(sqrtf(ss), 1e-12f)
                                        : 1.f;
      }
    }
  }

  __device__ __forceinline__ void load_tile(int, const DocT*, int64_t, int) const {}

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
  __device__ __forceinline__ Acc doc_value(const DocT* docs, int64_t at) const {
    if constexpr (F == DocFormat::kNative) {
      return to_acc<Acc>(docs[at]);
    } else {
      return static_cast<Acc>(byte_to_float<F>(docs[at]));
    }
  }

  // Local column of the thread's c-th document value (increasing with c, as ties need).
  __device__ __forceinline__ int col_of(int c) const { return (c < 4 ? 0 : BN / 2) + tx * 4 + (c & 3); }

  // The K chunk at k0 of the query block and of the tile, into registers (element e of the
  // thread: row e / KC, column e % KC, so a warp reads whole 32-element row runs; the
  // element-wise copies take the same map). A thread's elements share one column and step
  // kRowStep rows at a time, so each stream is one base pointer and one 64-bit stride: with an
  // address per element (64-bit index arithmetic for each of QL + DL values) ptxas spilled the
  // widening compressed shape at sm_80 - sm_89.
  static constexpr int kRowStep = kThreads / KC;
  static_assert(kThreads % KC == 0, "a thread's elements share a column");
  static __device__ __forceinline__ int lane_row() { return int(threadIdx.x / KC); }
  static __device__ __forceinline__ int lane_col() { return int(threadIdx.x % KC); }
  __device__ __forceinline__ void fetch(Acc (&qv)[QL], Acc (&dv)[DL], const DocT* docs, int64_t row0,
                                        int cols_valid, int64_t k0) {
    const int r0 = lane_row();
    const int64_t k = k0 + lane_col();
    const bool k_in = k < dim;
    const int64_t step = int64_t(kRowStep) * dim;
    const T* q = qbase + int64_t(r0) * dim + k;  // dereferenced only at valid rows and k
#pragma unroll
    for (int i = 0; i < QL; ++i) qv[i] = (qvalid[r0 + i * kRowStep] && k_in) ? to_acc<Acc>(q[i * step]) : Acc(0);
    if constexpr (kResidual) {
      fetch_residual(dv, docs, row0, cols_valid, k0);
    } else {
      const int64_t d0 = (row0 + r0) * dim + k;
#pragma unroll
      for (int i = 0; i < DL; ++i) {
        dv[i] = (r0 + i * kRowStep < cols_valid && k_in) ? doc_value(docs, d0 + i * step) : Acc(0);
      }
    }
  }

  // Residual chunks hold dimension k of the chunk at row chunk_row(k) = 8 (j % 4) + 2 g + j / 4
  // (k = 8 g + j), the queries' chunk alike, so the products pair up as before in another
  // order. In dimension order the four threads of a row, which decode dimensions 8 g + j for
  // g = 0..3, stored to one bank (row stride DP = 4 mod 32); permuted, a warp's 32 stores of a
  // j meet 32 banks (8 g + 4 (j / 4) + r). Other formats keep dimension order.
  static __device__ __forceinline__ int chunk_row(int k) {
    if constexpr (kResidual) return 8 * (k % 4) + 2 * (k / 8) + (k % 8) / 4;
    return k;
  }
  __device__ __forceinline__ void stash(int b, const Acc (&qv)[QL], const Acc (&dv)[DL]) {
    Acc* qs = buf + b * kBuffer;
    Acc* ds = qs + KC * QP;
#pragma unroll
    for (int i = 0; i < QL; ++i) {
      const int e = threadIdx.x + i * kThreads;
      qs[chunk_row(e % KC) * QP + e / KC] = qv[i];
    }
    if constexpr (kResidual) {  // dv[8u + j]: dimension 8g + j of local row res_row(u) = r + u * kResRowStep
      const int g = threadIdx.x % 4, r = threadIdx.x / 4;
#pragma unroll
      for (int u = 0; u < kResSlots; ++u)
#pragma unroll
        for (int j = 0; j < 8; ++j) ds[chunk_row(8 * g + j) * DP + r + u * kResRowStep] = dv[8 * u + j];
    } else {
#pragma unroll
      for (int i = 0; i < DL; ++i) {
        const int e = threadIdx.x + i * kThreads;
        ds[(e % KC) * DP + e / KC] = dv[i];
      }
    }
  }

  // The piece layout: a chunk row (KC values, 128 bytes) is 8 pieces of 16 bytes (V values), piece j
  // of row r stored at position j ^ (r / 4) % 8 of the row. The copies then move whole
  // pieces: 8 lanes a row, one 128-byte line and 32 banks each (a quarter of the instructions
  // and of the shared-memory wavefronts that 4-byte copies into the transposed chunk took:
  // four a copy, by the counters of 2026-11-29). The products read a piece of V k of a row per
  // 16-byte load: the document rows a quarter warp reads (4 tx + c, tx = 0..7) sit at 8
  // different positions, so those loads are conflict-free too. Against 4-byte copies into a
  // transposed chunk (H200, 2026-11-29): float32 reranks 0.79-0.86x, contrastive 0.89-0.91x,
  // float64 0.58x, bitwise equal; dim 102 (value by value) 1.01x.
  static constexpr int V = 16 / int(sizeof(Acc)), kPieces = KC / V;
  static_assert(!kPieceLayout || (kPieces == 8 && kThreads % kPieces == 0), "a chunk row is 8 pieces");
  static constexpr int kPieceRowStep = kThreads / kPieces;  // rows between a thread's pieces
  static __device__ __forceinline__ int piece_at(int row, int j) { return j ^ ((row / 4) % 8); }
  static __device__ __forceinline__ uint32_t piece_offset(int row, int j) {
    return uint32_t((row * kPieces + piece_at(row, j)) * 16);
  }

  // The K chunk at k0 of the query block and of the tile straight into buffer b (zeros past
  // the valid rows and dim: nothing read): whole pieces where every row starts on 16 bytes
  // (dim a multiple of V, both bases aligned), else value by value into the same places.
  __device__ __forceinline__ void copy_chunk(int b, const DocT* docs, int64_t row0, int cols_valid, int64_t k0) {
    const uint32_t qs = smem_addr(buf + b * kBuffer), ds = qs + uint32_t(BM * KC * sizeof(Acc));
    const uintptr_t bases = reinterpret_cast<uintptr_t>(qbase) | (kAsyncCopy ? reinterpret_cast<uintptr_t>(docs) : 0);
    const bool whole = dim % V == 0 && bases % 16 == 0;
    if (whole) {
      copy_pieces(qs, ds, docs, row0, cols_valid, k0);
    } else {
      copy_values(qs, ds, docs, row0, cols_valid, k0);
    }
  }

  __device__ __forceinline__ void copy_pieces(uint32_t qs, uint32_t ds, const DocT* docs, int64_t row0,
                                              int cols_valid, int64_t k0) const {
    static_assert(BM % kPieceRowStep == 0 && BN % kPieceRowStep == 0, "whole rows of pieces");
    const int r0 = threadIdx.x / kPieces, j = threadIdx.x % kPieces;
    const int64_t k = k0 + int64_t(j) * V;
    const bool k_in = k < dim;  // dim % V == 0: a piece is all in or all out
    const int64_t step = int64_t(kPieceRowStep) * dim;
    const T* q = qbase + int64_t(r0) * dim + k;
#pragma unroll
    for (int i = 0; i < BM / kPieceRowStep; ++i) {
      const int r = r0 + i * kPieceRowStep;
      cp_async_16_zfill(qs + piece_offset(r, j), q + i * step, qvalid[r] && k_in ? 16u : 0u);
    }
    if constexpr (kAsyncCopy) {
      const DocT* d = docs + (row0 + r0) * dim + k;
#pragma unroll
      for (int i = 0; i < BN / kPieceRowStep; ++i) {
        const int r = r0 + i * kPieceRowStep;
        cp_async_16_zfill(ds + piece_offset(r, j), d + i * step, r < cols_valid && k_in ? 16u : 0u);
      }
    }
  }

  __device__ __forceinline__ void copy_values(uint32_t qs, uint32_t ds, const DocT* docs, int64_t row0,
                                              int cols_valid, int64_t k0) const {
    const int r0 = lane_row(), kk = lane_col();
    const int64_t k = k0 + kk;
    const bool k_in = k < dim;
    const int64_t step = int64_t(kRowStep) * dim;
    const uint32_t within = uint32_t((kk % V) * sizeof(Acc));
    const T* q = qbase + int64_t(r0) * dim + k;
#pragma unroll
    for (int i = 0; i < QL; ++i) {
      const int r = r0 + i * kRowStep;
      cp_async_ca_zfill<sizeof(Acc)>(qs + piece_offset(r, kk / V) + within, q + i * step,
                                     qvalid[r] && k_in ? uint32_t(sizeof(Acc)) : 0u);
    }
    if constexpr (kAsyncCopy) {
      const DocT* d = docs + (row0 + r0) * dim + k;
#pragma unroll
      for (int i = 0; i < DL; ++i) {
        const int r = r0 + i * kRowStep;
        cp_async_ca_zfill<sizeof(Acc)>(ds + piece_offset(r, kk / V) + within, d + i * step,
                                       r < cols_valid && k_in ? uint32_t(sizeof(Acc)) : 0u);
      }
    }
  }

  // kBytePieces: a chunk row of a document is 32 bytes, two 16-byte halves (4 pieces each once
  // widened). 16-byte unit u of thread t (lane l of warp w) is half l % 2 of row
  // 16 v + 4 ((l / 2) % 4) + l / 8, v = w + u * warps: a warp's load takes 16 whole row runs,
  // and the 8 lanes of a quarter warp store to rows of 4 different groups at both halves, 8
  // different piece positions: conflict-free.
  static constexpr int kByteUnits = BN * KC / 16 / kThreads;
  static_assert(!kBytePieces || (KC == 32 && kByteUnits * kThreads * 16 == BN * KC), "byte units");
  static __device__ __forceinline__ int byte_unit_row(int u) {
    const int l = threadIdx.x % 32, v = threadIdx.x / 32 + u * (kThreads / 32);
    return 16 * v + 4 * ((l / 2) % 4) + l / 8;
  }
  __device__ __forceinline__ void fetch_bytes(uint4 (&v)[kByteUnits], const uint8_t* docs, int64_t row0,
                                              int cols_valid, int64_t k0, bool whole) const {
    const int64_t k = k0 + 16 * (threadIdx.x % 2);
#pragma unroll
    for (int u = 0; u < kByteUnits; ++u) {
      const int r = byte_unit_row(u);
      const uint8_t* p = docs + (row0 + r) * dim + k;  // dereferenced only in bounds
      v[u] = make_uint4(0u, 0u, 0u, 0u);
      if (r < cols_valid && k < dim) {
        if (whole) {
          v[u] = __ldg(reinterpret_cast<const uint4*>(p));
        } else {
          uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            if (k + i < dim) w[i / 4] |= uint32_t(__ldg(p + i)) << (8 * (i % 4));
          }
          v[u] = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
  }
  // Four document bytes -> their exact float values, in order.
  static __device__ __forceinline__ float4 widen4(uint32_t w) {
    if constexpr (F == DocFormat::kInt8) {
      // byte ^ 0x80 = value + 128 under the exponent of 2^23: one PRMT and one FADD a value
      const uint32_t x = w ^ 0x80808080u;
      constexpr float kBias = 8388736.0f;  // 2^23 + 128
      return make_float4(__uint_as_float(prmt(x, 0x4b000000u, 0x7540u)) - kBias,
                         __uint_as_float(prmt(x, 0x4b000000u, 0x7541u)) - kBias,
                         __uint_as_float(prmt(x, 0x4b000000u, 0x7542u)) - kBias,
                         __uint_as_float(prmt(x, 0x4b000000u, 0x7543u)) - kBias);
    } else {
#if MAXSIM_E4M3_CVT
      uint32_t lo, hi;  // (byte 0, byte 1), (byte 2, byte 3) on these chips (PairBytes)
      e4m3x4_to_half2x2(w, lo, hi);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
      return make_float4(a.x, a.y, b.x, b.y);
#else
      return make_float4(byte_to_float<F>(w), byte_to_float<F>(w >> 8), byte_to_float<F>(w >> 16),
                         byte_to_float<F>(w >> 24));
#endif
    }
  }
  // The fetched bytes widened into buffer b's document pieces.
  __device__ __forceinline__ void stash_bytes(int b, const uint4 (&v)[kByteUnits]) const {
    float4* ds = reinterpret_cast<float4*>(buf + b * kBuffer + BM * KC);
    const int h = threadIdx.x % 2;
#pragma unroll
    for (int u = 0; u < kByteUnits; ++u) {
      const int r = byte_unit_row(u);
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int p = 0; p < 4; ++p) ds[piece_offset(r, 4 * h + p) / 16] = widen4(w[p]);
    }
  }

  // 16 bytes of shared memory as V values.
  static __device__ __forceinline__ void load_piece(uint32_t addr, Acc (&out)[V]) {
    if constexpr (sizeof(Acc) == 4) {
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(out[0]), "=f"(out[1]), "=f"(out[2]), "=f"(out[3]) : "r"(addr));
    } else {
      asm volatile("ld.shared.v2.f64 {%0, %1}, [%2];\n" : "=d"(out[0]), "=d"(out[1]) : "r"(addr));
    }
  }

  // One cp.async chunk's products from buffer b into acc: per piece, the thread's TM query rows
  // and 8 document rows, then its V k steps in order. Piece j of row r sits at byte
  // (row start + 16 s) ^ 16 j, s = (r / 4) % 8: a row starts on a multiple of 128 bytes (the
  // buffers are aligned to it: init), so the XOR only touches the piece bits. Rows of one group
  // of 4 share s, so a piece costs one XOR for the thread's document rows (col_of(c) / 4 % 8 ==
  // tx % 8 for every c) and one a group of its query rows; the other rows are immediate offsets.
  __device__ __forceinline__ void ffma_pieces(Acc (&acc)[TM][TN], int b) const {
    static_assert(TM % 4 == 0 || 4 % TM == 0, "a thread's query rows fill whole groups of 4 or lie in one");
    constexpr int kGroups = (TM + 3) / 4;
    constexpr uint32_t kRowBytes = KC * sizeof(Acc);
    static_assert(kRowBytes == 128 && kBuffer * sizeof(Acc) % 128 == 0, "rows on 128-byte boundaries");
    const uint32_t qs = smem_addr(buf + b * kBuffer), ds = qs + BM * kRowBytes;
    uint32_t qrow[kGroups];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int r = ty * TM + 4 * g;
      qrow[g] = qs + uint32_t(r) * kRowBytes + uint32_t(piece_at(r, 0)) * 16;
    }
    const uint32_t drow = ds + uint32_t(tx * 4) * kRowBytes + uint32_t(piece_at(tx * 4, 0)) * 16;
#pragma unroll kPieceUnroll
    for (int j = 0; j < kPieces; ++j) {
      const uint32_t x = uint32_t(j) * 16;
      Acc a[TM][V], d[TN][V];
#pragma unroll
      for (int r = 0; r < TM; ++r) load_piece((qrow[r / 4] ^ x) + uint32_t(r % 4) * kRowBytes, a[r]);
      const uint32_t dj = drow ^ x;
#pragma unroll
      for (int c = 0; c < TN; ++c) load_piece(dj + uint32_t((c < 4 ? 0 : BN / 2) + (c & 3)) * kRowBytes, d[c]);
#pragma unroll
      for (int kq = 0; kq < V; ++kq)
#pragma unroll
        for (int r = 0; r < TM; ++r)
#pragma unroll
          for (int c = 0; c < TN; ++c) acc[r][c] = fma(a[r][kq], d[c][kq], acc[r][c]);
    }
  }

  // One register-path chunk's products from buffer b into acc.
  __device__ __forceinline__ void ffma_chunk(Acc (&acc)[TM][TN], int b) const {
    const Acc* qs = buf + b * kBuffer;
    const Acc* ds = qs + KC * QP;
#pragma unroll 4
    for (int kk = 0; kk < KC; ++kk) {
      Acc a[TM], b8[TN];
      load_run<TM>(qs + kk * QP + ty * TM, a);
      load_run<4>(ds + kk * DP + tx * 4, b8);
      load_run<4>(ds + kk * DP + BN / 2 + tx * 4, b8 + 4);
#pragma unroll
      for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) acc[r][c] = fma(a[r], b8[c], acc[r][c]);
    }
  }

  // kResidualPieces: the decoded values of the thread's slots into buffer b's pieces (dimensions
  // 8 g .. 8 g + 7 of a row are its pieces 2 g and 2 g + 1).
  __device__ __forceinline__ void stash_residual_pieces(int b, const Acc (&dv)[DL]) const {
    float4* ds = reinterpret_cast<float4*>(buf + b * kBuffer + BM * KC);
    const int g = threadIdx.x % 4;
#pragma unroll
    for (int u = 0; u < kResSlots; ++u) {
      const int r = res_row(u);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const Acc* x = dv + 8 * u + 4 * e;
        ds[piece_offset(r, 2 * g + e) / 16] = make_float4(x[0], x[1], x[2], x[3]);
      }
    }
  }

  // What a thread holds of the next chunk across this chunk's FMAs: on the register path its
  // query and document values; on the pieces, 16-byte units of document bytes or decoded
  // residual values (the queries, and float documents, travel by cp.async and hold nothing).
  struct HeldChunk {
    Acc qv[kPieceLayout ? 1 : QL];
    Acc dv[kPieceLayout && !kResidualPieces ? 1 : DL];
    uint4 bytes[kBytePieces ? kByteUnits : 1];
  };
  // Chunk k0's values that travel through registers (zeros past the rows and dim).
  __device__ __forceinline__ void fetch_held(HeldChunk& h, const DocT* docs, int64_t row0, int cols_valid, int64_t k0,
                                             bool whole_bytes) {
    if constexpr (kResidualPieces) {
      fetch_residual(h.dv, docs, row0, cols_valid, k0);
    } else if constexpr (kBytePieces) {
      fetch_bytes(h.bytes, docs, row0, cols_valid, k0, whole_bytes);
    } else if constexpr (!kPieceLayout) {
      fetch(h.qv, h.dv, docs, row0, cols_valid, k0);
    }
  }
  __device__ __forceinline__ void stash_held(int b, const HeldChunk& h) {
    if constexpr (kResidualPieces) {
      stash_residual_pieces(b, h.dv);
    } else if constexpr (kBytePieces) {
      stash_bytes(b, h.bytes);
    } else if constexpr (!kPieceLayout) {
      stash(b, h.qv, h.dv);
    }
  }
  static __device__ __forceinline__ void commit_copies() {
    if constexpr (kPieceLayout) cp_async_commit();
  }
  static __device__ __forceinline__ void wait_copies() {
    if constexpr (kPieceLayout) cp_async_wait<0>();
  }

  // The tile's chunks, two buffers. At chunk c (in buffer b), once its copies have landed and
  // every thread is past chunk c - 1's FMAs (the barrier): chunk c + 1's loads (copies into the
  // buffer chunk c - 1 used; the rest into registers), chunk c's FMAs, then what the registers
  // hold of chunk c + 1 into its buffer (nothing is held across the loop's back edge: holding it
  // there spilled the residual contrastive shape). One commit group a chunk, empty past the
  // last, so wait<0> always means chunk c. The caller's next barrier orders the last chunk's
  // reads before the next tile's loads.
  __device__ __forceinline__ void chunks(Acc (&acc)[TM][TN], const DocT* docs, int64_t row0, int cols_valid) {
    bool whole_bytes = false;
    if constexpr (kBytePieces) whole_bytes = dim % 16 == 0 && reinterpret_cast<uintptr_t>(docs) % 16 == 0;
    HeldChunk h;
    fetch_held(h, docs, row0, cols_valid, 0, whole_bytes);
    if constexpr (kPieceLayout) {
      if (dim > 0) copy_chunk(0, docs, row0, cols_valid, 0);
    }
    commit_copies();
    stash_held(0, h);
    int b = 0;
    for (int64_t k0 = 0; k0 < dim; k0 += KC, b ^= 1) {
      wait_copies();
      __syncthreads();
      const bool more = k0 + KC < dim;
      if (more) {
        fetch_held(h, docs, row0, cols_valid, k0 + KC, whole_bytes);
        if constexpr (kPieceLayout) copy_chunk(b ^ 1, docs, row0, cols_valid, k0 + KC);
      }
      commit_copies();
      if constexpr (kPieceLayout) {
        ffma_pieces(acc, b);
      } else {
        ffma_chunk(acc, b);
      }
      if (more) stash_held(b ^ 1, h);
    }
  }

  __device__ __forceinline__ void compute(int, const DocT* docs, int64_t row0, int cols_valid, int col_base, bool) {
    Acc acc[TM][TN];
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int c = 0; c < TN; ++c) acc[r][c] = Acc(0);

    // (no barrier first: the kernel's barrier before compute() already has the previous tile's
    // buffers consumed and qvalid written)
    if constexpr (kResidual) start_residual_tile(row0, cols_valid);
    chunks(acc, docs, row0, cols_valid);
    if constexpr (kResidual) {
      finish_residual_tile(cols_valid);
      __syncthreads();
    }
    Acc scale[TN];
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      const int col = col_of(c);
      if constexpr (is_compressed<F>()) {
        scale[c] = (doc_scales != nullptr && col < cols_valid) ? Acc(__ldg(doc_scales + row0 + col)) : Acc(0);
      } else if constexpr (kResidual) {
        scale[c] = col < cols_valid ? Acc(row_factor[col]) : Acc(0);
      } else {
        scale[c] = Acc(1);
      }
    }
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        const int col = col_of(c);
        const Acc s = (is_compressed<F>() || kResidual) ? acc[r][c] * scale[c] : acc[r][c];
        const Acc v = col < cols_valid ? s : neg_inf<Acc>();
        running_update(m[r], idx[r], v, col_base + col);
      }
  }

  template <bool INDEX>
  __device__ __forceinline__ void merge_rows() {
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int o = 1; o < 16; o *= 2) merge_lanes<INDEX>(m[r], idx[r], o);
  }

  // The 16 lanes of a row (merge_lanes: the maxima alone without argmax), then one partial
  // per row into shared memory.
  __device__ __forceinline__ void reduce(Acc* red_m, int* red_i, bool index) {
    index ? merge_rows<true>() : merge_rows<false>();
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
