// Host side of the sm_90a kernels: the tensor maps (encoded through the runtime's driver entry
// point, no libcuda link, cached per thread), the checks that decide whether a call takes an
// sm_90a kernel, the 64-row block count, and the launch the three kernels share (occupancy,
// persistent grid, the long queries' chunk scratch). Torch-free.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "../launch.h"
#include "hopper_epilogue.cuh"
#include "hopper_pipeline.cuh"
#include "hopper_primitives.cuh"
#include "hopper_scheduler.cuh"
#include "scheduler.cuh"
#include "scratch.cuh"

namespace maxsim_cuda {
namespace kernel {

// Comparisons only: MAXSIM_CUDA_FORCE_MMA_SYNC=1 keeps the mma.sync kernels on sm_90a.
// Read on every call (one getenv) so one process can time both paths.
inline bool force_mma_sync() {
  const char* e = std::getenv("MAXSIM_CUDA_FORCE_MMA_SYNC");
  return e != nullptr && e[0] == '1';
}

// Consecutive steps a CTA takes at a time on the shapes that keep a query across steps
// (StepWalk<true>): a padded query's candidates, or a pair list's consecutive pairs of one
// query, share one query load. `knob` (MAXSIM_CUDA_HOPPER_RUN for the 16-bit resident shapes,
// MAXSIM_CUDA_HOPPER_BYTES_RUN for the byte kernel) forces another run length, read per call.
constexpr int64_t kHopperQueryRun = 4;
inline int64_t hopper_query_run(const char* knob) {
  const char* e = std::getenv(knob);
  if (e != nullptr && e[0] >= '1' && e[0] <= '9') return std::atoi(e);
  return kHopperQueryRun;
}

using TensorMapEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                          const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                          CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                          CUtensorMapFloatOOBfill);

inline TensorMapEncodeTiled tensor_map_encoder() {
  static const TensorMapEncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else  // the unversioned query (gone in CUDA 13) on older toolkits
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess) return TensorMapEncodeTiled(nullptr);
    return reinterpret_cast<TensorMapEncodeTiled>(f);
  }();
  return fn;
}

// A tensor map: `type` elements of `elem_bytes`, rank 2 ([rows x dim] row-major, boxes of
// box_rows x box_cols, 128-byte swizzle) or rank 1 (rows == 0: a vector of dim, boxes of
// box_cols, no swizzle); zeros outside. false when the driver refuses it.
struct MapKey {
  const void* base = nullptr;
  int64_t rows = 0, dim = 0;
  int box_rows = 0, box_cols = 0, type = -1;
  bool operator==(const MapKey& o) const {
    return base == o.base && rows == o.rows && dim == o.dim && box_rows == o.box_rows && box_cols == o.box_cols &&
           type == o.type;
  }
};
inline bool encode_map(CUtensorMap& map, const MapKey& k, int elem_bytes) {
  const TensorMapEncodeTiled encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const auto type = static_cast<CUtensorMapDataType>(k.type);
  const cuuint32_t elem_strides[2] = {1u, 1u};
  if (k.rows == 0) {  // the driver wants a strides array even at rank 1 (it reads none of it)
    const cuuint64_t dims[1] = {cuuint64_t(k.dim)};
    const cuuint64_t strides[1] = {cuuint64_t(k.dim) * elem_bytes};
    const cuuint32_t box[1] = {cuuint32_t(k.box_cols)};
    return encode(&map, type, 1, const_cast<void*>(k.base), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  }
  const cuuint64_t dims[2] = {cuuint64_t(k.dim), cuuint64_t(k.rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k.dim) * elem_bytes};
  const cuuint32_t box[2] = {cuuint32_t(k.box_cols), cuuint32_t(k.box_rows)};
  return encode(&map, type, 2, const_cast<void*>(k.base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// encode_map through a small per-thread cache: an inference loop or a training step passes
// the same tensors (or tensors at the same addresses) call after call, and the map depends
// only on the address, the extents, the box and the type. 16 entries: a loop alternating
// float16, bfloat16 and compressed calls holds 3 + 3 + 4 maps.
inline bool cached_map(CUtensorMap& map, const MapKey& key, int elem_bytes) {
  struct Entry {
    MapKey key;
    CUtensorMap map;
  };
  constexpr int kEntries = 16;
  thread_local Entry cache[kEntries];
  thread_local int next = 0;
  for (const Entry& e : cache) {
    if (e.key == key) {
      map = e.map;
      return true;
    }
  }
  if (!encode_map(map, key, elem_bytes)) return false;
  Entry& e = cache[next];
  next = (next + 1) % kEntries;
  e.key = key;
  e.map = map;
  return true;
}

// [rows x dim] row-major 16-bit matrix in boxes of box_rows x 64 columns.
template <class T>
bool rows_map(CUtensorMap& map, const void* base, int64_t rows, int64_t dim, int box_rows) {
  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return cached_map(map, MapKey{base, rows, dim, box_rows, 64, static_cast<int>(type)}, 2);
}
// [rows x dim] bytes in boxes of box_rows x 128 bytes.
inline bool byte_rows_map(CUtensorMap& map, const void* base, int64_t rows, int64_t dim, int box_rows) {
  return cached_map(map, MapKey{base, rows, dim, box_rows, 128, static_cast<int>(CU_TENSOR_MAP_DATA_TYPE_UINT8)}, 1);
}
// A float32 vector of n in boxes of `box`.
inline bool scales_map(CUtensorMap& map, const float* base, int64_t n, int box) {
  return cached_map(map, MapKey{base, 0, n, 0, box, static_cast<int>(CU_TENSOR_MAP_DATA_TYPE_FLOAT32)}, 4);
}

// The call as this kernel's grids see it: packed pairs are padded queries of one document
// each (Nq = P, Lq = max_q_len; see PackedGrid).
inline ForwardParams hopper_view(const ForwardParams& p) {
  if (p.surface != Surface::kPacked) return p;
  ForwardParams v = p;
  v.num_queries = p.pairs;
  v.cands = 1;
  v.lq = p.max_q_len;
  return v;
}

// Whether the Hopper kernel takes this call (else the caller runs the mma.sync kernels).
// Contrastive: dim <= 128 runs the resident shapes, anything wider the streamed ones;
// padded and packed: the streamed shape at any dim. Packed needs max_q_len >= 1 (it sizes
// the grid's blocks); a max_q_len that adds 64-row chunks beyond the query tensor's rows is
// left to the mma.sync kernels too, since every pair would walk ceil(max_q_len / 64) chunks,
// most without rows. (One short query, max_q_len 32 over 20 rows: one chunk either way; its
// 32-row TMA box reaches past the tensor, and TMA fills those rows with zeros.)
// The checks every sm_90a kernel shares; hopper_applies adds this kernel's own (16-bit
// documents), forward_hopper_bytes.cuh and forward_hopper_widen.cuh theirs (compressed ones).
inline bool hopper_call_fits(const ForwardParams& p) {
  constexpr int64_t kCoordLimit = (int64_t(1) << 31) - 256;  // TMA coordinates are int32
  const bool packed = p.surface == Surface::kPacked;
  const int64_t lq = packed ? p.max_q_len : p.lq;
  const bool chunks_fit = !packed || (lq + 63) / 64 <= (p.q_rows + 63) / 64;
  return lq >= 1 && chunks_fit && p.dim >= 8 && p.dim % 8 == 0 && p.dim < kCoordLimit &&
         p.num_queries > 0 && p.num_docs > 0 && p.q_rows > 0 && p.d_rows > 0 && p.q_rows < kCoordLimit &&
         p.d_rows < kCoordLimit && reinterpret_cast<uintptr_t>(p.queries) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.documents) % 16 == 0 && !force_mma_sync() &&
         wgmma_compiled_for_current_device();
}
inline bool hopper_applies(const ForwardParams& p) {
  return p.doc_format == DocFormat::kNative && hopper_call_fits(p);
}

// 64-row query blocks of a call (hopper_view's terms): the contrastive policy's blocks of
// 64 / Lq stacked queries (make_contrastive(p, 64)), padded and packed: one query (pair) a
// block; for Lq > 64, ceil(Lq / 64) chunks of every query.
struct HopperBlocks {
  int64_t blocks, nchunks;
};
inline HopperBlocks hopper_blocks(const ForwardParams& p) {
  if (p.lq > 64) {
    const int64_t nchunks = (p.lq + 63) / 64;
    return {p.num_queries * nchunks, nchunks};
  }
  int64_t g = is_contrastive(static_cast<int>(p.surface)) ? 64 / p.lq : 1;
  if (g > p.num_queries) g = p.num_queries;
  if (g < 1) g = 1;
  return {(p.num_queries + g - 1) / g, 1};
}

// Rows of an average document: padded, the padded length; else the packed rows per document.
inline int64_t average_doc_rows(const ForwardParams& p) {
  if (p.surface == Surface::kPadded) return p.ld;
  return p.num_docs > 0 ? p.d_rows / p.num_docs : 0;
}

// Padded and packed calls whose average document is shorter than this stay on the mma.sync
// kernels unless the rule below takes them. H100, 2026-11-23,
// GPU time per call, mma.sync / this kernel's streamed shape: SmallRerank (Ld
// 180) full 9.2 / 9.4 us, ragged 8.0 / 8.8; Rerank (Ld 180) full 36.1 / 31.7, ragged 26.4 /
// 28.6; SmallRerankPacked 8.9 / 10.1, HeavyRerankPacked (average ~160 rows) 57.9 / 62.7.
// From 256 rows on this kernel wins or ties (HeavyRerank full 81.4 / 75.7, ragged 56.6 /
// 56.8; LongDocStress 16.1 / 10.6, LongDocStressPacked 16.8 / 10.8; ColPaliRerank ragged
// 67.8 / 64.6, ColPaliRerankPacked 70.3 / 66.0), and at dim > 128 at every length
// (RerankD256..1024 8-13% faster).
constexpr int64_t kHopperMinDocRows = 256;

// At dim <= 128 the resident strided shape (forward_configs.cuh, run_strided_hopper) also
// beats the mma.sync kernels on shorter documents, given steps enough to fill the grid several
// times: H100, 2026-11-27, GPU time mma.sync / resident, us: Rerank (Ld 180, 1,600 steps) full
// 33.3 / 29.9, ragged 24.2 / 24.0; RerankPacked 25.6 / 23.4; HeavyRerankPacked (~160 rows on
// average) 57.6 / 51.8; but SmallRerank (320 steps) 6.8 / 7.9, SmallRerankPacked 7.2 / 7.9.
// At dim 64 the same: Rerank full 16.4 / 14.8, ragged 14.7 / 13.9, RerankPacked 16.4 / 14.8,
// HeavyRerankPacked 35.9 / 31.4, SmallRerank full 5.9 / 6.6. RerankPacked's documents average
// ~112 rows, which the first threshold here (150) left to mma.sync although the resident shape
// wins there too (dim 128: 25.6 / 23.4; dim 64: 16.4 / 14.8): so 100.
constexpr int64_t kHopperResidentMinDocRows = 100;
constexpr int64_t kHopperResidentMinStepsPerSm = 4;

// Steps of a padded or packed call on the strided grids (one per 64-row query block and
// document).
inline int64_t hopper_strided_steps(const ForwardParams& p) {
  return hopper_blocks(hopper_view(p)).blocks * (p.surface == Surface::kPadded ? p.cands : 1);
}

// Query buffers of the resident strided shape at three CTAs an SM (64-row tiles, 16 KB slots
// of 64 rows x 128 columns, so 64 < dim <= 128) where a call takes it, 0 where it does not.
// Documents of kHopperMinDocRows and more on average keep two CTAs' 32 KB slots (LongDocStress:
// 128 steps of 1,024 rows, which want the bytes in flight).
// 1 (three 16 KB slots): calls of at most three steps an SM, a step a CTA in one wave. Above two
// an SM (SmallRerank, 320 steps on 132 SMs) two CTAs an SM take two waves; below, the first
// 64-row tile lands sooner than a 128-row one and a 180-row document pads to 192 rows, not 256
// (H200, 2026-11-30: 32 x 1 / 2 / 5 at Ld 180 forced 4.14 / 4.16 / 4.98 us against the
// default's 4.76 / 4.76 / 5.64).
// 2 (two slots): calls of three to six steps an SM, whose CTAs take runs of consecutive steps, a
// query loaded once a run and the next run's query while the last step of a run is scored. The
// one-buffer shape reloads a query each step behind the consumers' release of the buffer, so at
// two steps a CTA it lost to two CTAs an SM (H200, 2026-11-30, 32 x 20 at Ld 180: 11.41 us
// against 10.08; late-interaction-kernels 8.69).
// MAXSIM_CUDA_HOPPER_PADDED_CTAS and MAXSIM_CUDA_HOPPER_QUERY_BUFS (run_strided_hopper)
// override it.
inline int hopper_three_cta_query_bufs(const ForwardParams& p) {
  const int64_t steps = hopper_strided_steps(p), sms = p.num_sms > 0 ? p.num_sms : 1;
  if (p.dim <= 64 || p.dim > 128 || steps > 6 * sms) return 0;
  if (steps > 3 * sms) return average_doc_rows(p) < kHopperMinDocRows ? 2 : 0;
  return steps > 2 * sms || average_doc_rows(p) < kHopperMinDocRows ? 1 : 0;
}
// Three-CTA calls take the sm_90a kernel from this many rows a document on average (one query
// buffer: H200, 2026-11-30, 32 x 10 at Ld 64 / 32: 4.46 / 4.35 us three CTAs forced against
// mma.sync's 5.09 / 5.36), or, with two, from the other shapes' kHopperResidentMinDocRows.
constexpr int64_t kHopperThreeCtasMinDocRows = 32;

// The strided shape at 128 < dim <= 256 where no knob picks one (run_strided_hopper). H200,
// 2026-11-30, B 32, Lq 32, dim 256, us, default (streamed, two CTAs) / streamed three CTAs /
// resident one CTA with two query buffers (`benchmarks/results/
// h200_probe_wide_resident256_0b45d27.json`): C 10 at Ld 180 (320 steps) 10.88 / 8.44 / 10.64;
// C 50 at Ld 180 44.12 / 42.62 / 41.20, at Ld 300 67.68 / 68.55 / 65.43, at Ld 1,024 202.62 /
// 215.93 / 213.33. Steps that two CTAs an SM cannot take in one wave but three can take three;
// many steps of documents under kHopperWideResidentMaxRows read each query once a run; long
// documents stream. Calls that fit one wave at two CTAs stay there: three CTAs' smaller rings
// made C 1 and C 5 at Ld 180 (32 and 160 steps) 1.13x and 1.17x slower (2026-11-30, ab on
// 3fa996f, `benchmarks/results/h200_ab_wide_rule_first_tile_ahead_3fa996f.json`).
enum class WideShape { kStreamed, kStreamedThreeCtas, kResidentRuns };
// At most this many columns, the many-step calls under kHopperWideResidentMaxRows stream at
// three CTAs an SM too: the resident shape's 256 columns are a quarter (dim 192) or more zero
// fill there (H200, 2026-11-30, B 32, C 50, Lq 32, us, resident one CTA / streamed three CTAs:
// dim 160 at Ld 180 / 256 34.98 / 33.64, 48.84 / 43.08; dim 192 35.01 / 34.18, 48.23 /
// 44.53; dim 224 36.04 / 41.32, 48.39 / 55.12; `benchmarks/results/
// h200_probe_wide_dims_128_256_58f2f63.json`).
constexpr int64_t kHopperWideThreeCtasMaxDim = 192;
constexpr int64_t kHopperWideResidentMaxRows = 512;
inline WideShape hopper_wide_shape(const ForwardParams& p) {
  const int64_t steps = hopper_strided_steps(p), sms = p.num_sms > 0 ? p.num_sms : 1;
  if (p.dim <= 128 || p.dim > 256 || steps <= 2 * sms) return WideShape::kStreamed;
  if (steps <= 3 * sms) return WideShape::kStreamedThreeCtas;
  if (average_doc_rows(p) >= kHopperWideResidentMaxRows) return WideShape::kStreamed;
  return p.dim <= kHopperWideThreeCtasMaxDim ? WideShape::kStreamedThreeCtas : WideShape::kResidentRuns;
}

// Whether this kernel is wanted for the call's surface and shape (contrastive: always).
// MAXSIM_CUDA_HOPPER_PADDED / MAXSIM_CUDA_HOPPER_PACKED = 1 take it for every padded /
// packed call it can run, 0 for none (read per call: tests and comparisons).
inline bool hopper_wanted(const ForwardParams& p) {
  if (p.doc_format != DocFormat::kNative) return false;  // see hopper_applies
  if (is_contrastive(static_cast<int>(p.surface))) return true;
  const char* e = std::getenv(p.surface == Surface::kPacked ? "MAXSIM_CUDA_HOPPER_PACKED" : "MAXSIM_CUDA_HOPPER_PADDED");
  if (e != nullptr && (e[0] == '0' || e[0] == '1')) return e[0] == '1';
  if (p.dim > 128 || average_doc_rows(p) >= kHopperMinDocRows) return true;
  const int three_cta_bufs = hopper_three_cta_query_bufs(p);
  if (three_cta_bufs == 1) return average_doc_rows(p) >= kHopperThreeCtasMinDocRows;
  if (average_doc_rows(p) < kHopperResidentMinDocRows) return false;
  return three_cta_bufs == 2 || hopper_strided_steps(p) >= kHopperResidentMinStepsPerSm * p.num_sms;
}

// dim > 128 on sm_90a: the dispatcher sends these calls to the K-streaming launcher
// (launch_forward_mma_k), which tries the streamed shapes first.
inline bool hopper_streamed_wanted(const ForwardParams& p) {
  return p.dim > 128 && hopper_wanted(p) && hopper_applies(p);
}

// Whether the producers signal the next grid after their last load (true) or let it launch at
// their CTA's exit. An early signal lets the next call's CTAs become resident while this grid's
// last CTAs still run, on whichever SMs have room at that moment; with a grid of one to ~1.75
// CTAs an SM, the SMs holding two of this grid's CTAs are full then, so the next grid lands
// doubled on the others and leaves SMs idle at its end (tools/device/pdl_placement.cu: 14-49 of
// 132 SMs idle, 1.3-1.9x the time a call at 135-192 CTAs; signalled at exit, none idle and
// 2-5% faster than without PDL). That costs more than the early launch saves only when a step
// is long (rows of 768+: C 5 / Ld 1,024 16.6 us with the early signal, 11.0 without PDL; at
// Ld <= 512 the early signal gains at every C measured; maxsim_cuda/NOTES.md, "Long documents
// at five to six candidates").
constexpr int64_t kLateSignalMinDocRows = 768;
inline bool signal_dependents_early(const ForwardParams& p, int64_t ctas) {
  const bool crowded_band = ctas > p.num_sms && 4 * ctas < 7 * int64_t(p.num_sms);
  return !(crowded_band && average_doc_rows(p) >= kLateSignalMinDocRows);
}

// The launch the sm_90a kernels share (maps: their tensor maps, passed on as kernel
// arguments; the kernel is a template argument: the occupancy cache below is per kernel).
// run: on a strided walk, about how many consecutive steps a CTA takes at a time (1: every
// step a grid apart).
template <class Shape, auto kKernel, class Policy, class... Maps>
cudaError_t launch_hopper(const ForwardParams& p, const Policy& pol, const EpilogueArgs& ep, bool& ran, int64_t run,
                          const Maps&... maps) {
  const auto kern = kKernel;
  static_assert(Shape::BM == 64, "hopper_blocks counts 64-row blocks");
  const HopperBlocks hb = hopper_blocks(p);
  HopperParams<Policy> hp;
  hp.pol = pol;
  hp.nchunks = hb.nchunks;
  hp.blocks = hb.blocks;
  hp.kchunks = static_cast<int>((p.dim + 63) / 64);
  // Set-major steps: a CTA keeps its query set across a contiguous run of documents, and
  // the CTAs on different sets stream the same documents at about the same time (L2 reuse
  // when the documents do not fit in L2).
  hp.sets = (hp.blocks + Shape::kConsumers - 1) / Shape::kConsumers;
  hp.partial = nullptr;
  hp.ep = ep;
  const int64_t steps = hp.sets * pol.Nb;
  if (steps <= 0) {
    ran = true;
    return cudaSuccess;
  }
  constexpr size_t smem = HopperSmem<Shape>::bytes();
  // sm_90: 228 KB of shared memory per SM, 1 KB of it reserved per resident CTA
  static_assert(Shape::kCtasPerSm * (smem + 1024) <= 228 * 1024, "the planned CTAs per SM do not fit");
  int occ = 1;  // the shape's plan, or fewer if the device says so
  cudaError_t err = resident_ctas<kKernel>(Shape::kThreads, smem, Shape::kCtasPerSm, occ);
  if (err != cudaSuccess) return err;
  const int64_t ctas = plan_ctas(steps, p.num_sms, occ);
  // runs of one step: ceil(steps / ctas) rounds; else the rounds nearest to runs of `run`
  int64_t rounds = run <= 1 ? (steps + ctas - 1) / ctas : (steps + ctas * run / 2) / (ctas * run);
  if (rounds < 1) rounds = 1;
  hp.runs = strided_runs(steps, ctas, rounds);
  // Long queries' chunk sums: stream-ordered scratch (capturable in a CUDA graph).
  const size_t partial_bytes = hp.nchunks > 1 ? size_t(hp.blocks) * size_t(pol.Nb) * sizeof(float) : 0;
  if (partial_bytes > 0) {
    err = scratch_alloc(reinterpret_cast<void**>(&hp.partial), partial_bytes, p.stream);
    if (err != cudaSuccess) return err;
  }
  hp.signal_early = signal_dependents_early(p, ctas);
  ran = true;
  err = launch_programmatic<kKernel>(static_cast<unsigned>(ctas), Shape::kThreads, smem, p.stream, hp, maps...);
  if (partial_bytes > 0) {
    if (err == cudaSuccess) {
      const int64_t pairs = pol.Nq * pol.Nb;
      sum_query_chunks<><<<static_cast<unsigned>((pairs + 255) / 256), 256, 0, p.stream>>>(
          hp.partial, static_cast<float*>(ep.scores), pol.Nq, pol.Nb, hp.nchunks);
      err = cudaGetLastError();
    }
    const cudaError_t ferr = cudaFreeAsync(hp.partial, p.stream);
    if (err == cudaSuccess) err = ferr;
  }
  return err;
}

}  // namespace kernel
}  // namespace maxsim_cuda
