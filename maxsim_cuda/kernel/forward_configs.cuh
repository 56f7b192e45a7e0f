// Block shapes of the forward kernel and the launchers that pick one per call (dtype, dim,
// query block rows, surface, device limits, experiment knobs). Each launcher is explicitly
// instantiated per (dtype, surface) in its own small .cu file so builds parallelise.
// Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../launch.h"
#include "doc_format.cuh"
#include "forward_hopper.cuh"
#include "forward_hopper_bytes.cuh"
#include "forward_hopper_widen.cuh"
#include "forward_kernel.cuh"

namespace maxsim_cuda {
namespace kernel {

// Tensor-core configs: <KD, BM> -> warp layout. KD=256 uses 32-row document tiles so every
// config stays at 64 KB of pipeline (fits sm_86/sm_89's 99 KB, 3 CTAs/SM on sm_90).
template <class T, int KD, int BM>
struct MmaConfig;
// Rerank shapes are HBM-bound: registers are capped so 3 (BM=32) / 2 (BM=64) CTAs fit per
// SM, keeping 3 x 3 (2 x 3) document tiles in flight (KD=256 would spill: no cap).
// RerankWide (KD <= 128, long documents): 8 warps (2 x 4, each 16 rows x 16 columns),
// 6 stages, 2 CTAs/SM: more warps to hide latency and 2 x 5 tiles in flight.
template <class T, int KD>
struct MmaConfig<T, KD, 32> { using type = MmaMainloop<T, KD, 32, (KD > 128 ? 32 : 64), 2, 2, 4, (KD > 128 ? 1 : 3)>; };
template <class T, int KD>
struct RerankWide { using type = MmaMainloop<T, KD, 32, 64, 2, 4, 6, 2>; };
template <class T, int KD>
struct MmaConfig<T, KD, 64> { using type = MmaMainloop<T, KD, 64, (KD > 128 ? 32 : 64), 4, 2, 4, (KD > 128 ? 1 : 2)>; };
template <class T, int KD>
struct MmaConfig<T, KD, 128> {
  using type = typename std::conditional<(KD > 128), MmaMainloop<T, KD, 128, 32, 8, 1, 4>,
                                         MmaMainloop<T, KD, 128, 64, 4, 1, 4>>::type;
};

// Contrastive (tensor-core bound) block shape for KD <= 128 once there are >= 256 stacked
// query rows: 256 rows, 8 warps x 32 rows (each document tile feeds twice the rows of the
// 128-row shape; measured 3-8% faster on the contrastive workloads). (An 8 warps x 16 rows,
// 2 CTAs/SM shape was tried too: slower, and it spills at 128 registers.)
template <class T, int KD>
struct ContrastiveWide { using type = MmaMainloop<T, KD, 256, 64, 8, 1, 4>; };

// Explicitly instantiated per (dtype, surface) in forward_<dtype>_<surface>.cu.
// sm_90a contrastive shapes (forward_hopper.cuh): 128-row document tiles; 4 or 5 stages at
// dim <= 128, 8 at dim <= 64; one CTA per SM. More consumer warpgroups keep the tensor cores
// busier (H100, graph replay, 4 / 3 / 2 warpgroups: BigColBERT forward 1.05 / 1.17 / 1.46
// ms, DocDoc 1.84 / 1.93 / 2.30, ColBERTCorpus 1.07 / 1.34 / 1.50, the 32-query training
// steps 12-25 / 14-34 / 18-31 us), so the most that leave at most a fifth of the last
// sets' block slots idle (ColPaliCorpus' 4 blocks: four; 6 blocks: three).
// MAXSIM_CUDA_HOPPER_CONSUMERS=2|3|4 overrides (read per call, for experiments).
inline int hopper_consumers(const ForwardParams& p) {
  const char* e = std::getenv("MAXSIM_CUDA_HOPPER_CONSUMERS");
  if (e != nullptr && (e[0] == '2' || e[0] == '3' || e[0] == '4')) return e[0] - '0';
  const int64_t blocks = hopper_blocks(p).blocks;
  for (int c = 4; c > 2; --c) {
    const int64_t sets = (blocks + c - 1) / c;
    if (blocks * 5 >= sets * c * 4) return c;
  }
  return 2;
}
// Resident shapes (dim <= 128; instantiated with launch_forward_mma).
template <class T, int SURF>
cudaError_t launch_contrastive_hopper(const ForwardParams& p, bool& ran) {
  using Policy = std::conditional_t<SURF == 1, ContrastivePolicy, ContrastivePaddedPolicy>;
  const Policy pol = make_contrastive<Policy>(p, 64);
  const EpilogueArgs ep = make_args<T>(p).ep;
  const int consumers = hopper_consumers(p);
  if (consumers == 4) {
    return p.dim <= 64 ? run_forward_hopper<T, HopperShape<64, 8, 4>>(p, pol, ep, ran)
                       : run_forward_hopper<T, HopperShape<128, 4, 4>>(p, pol, ep, ran);
  }
  if (consumers == 2) {
    return p.dim <= 64 ? run_forward_hopper<T, HopperShape<64, 8, 2>>(p, pol, ep, ran)
                       : run_forward_hopper<T, HopperShape<128, 5, 2>>(p, pol, ep, ran);
  }
  return p.dim <= 64 ? run_forward_hopper<T, HopperShape<64, 8, 3>>(p, pol, ep, ran)
                     : run_forward_hopper<T, HopperShape<128, 5, 3>>(p, pol, ep, ran);
}
// Streamed shapes (dim > 128; instantiated with launch_forward_mma_k): a slot is C x 8 KB of
// query chunks plus a 16 KB document chunk, so 5 / 6 slots (200 / 192 KB) for 3 / 2
// consumers. Four would need more than the 96 registers a thread gets at 17 warps (spills).
template <class T, int SURF>
cudaError_t launch_contrastive_hopper_streamed(const ForwardParams& p, bool& ran) {
  using Policy = std::conditional_t<SURF == 1, ContrastivePolicy, ContrastivePaddedPolicy>;
  const Policy pol = make_contrastive<Policy>(p, 64);
  const EpilogueArgs ep = make_args<T>(p).ep;
  if (hopper_consumers(p) == 2) return run_forward_hopper<T, HopperShape<64, 6, 2, true>>(p, pol, ep, ran);
  return run_forward_hopper<T, HopperShape<64, 5, 3, true>>(p, pol, ep, ran);
}

// Padded (rerank) on sm_90a: one consumer warpgroup per CTA, each step its own query and
// document, steps strided over the CTAs in runs (PaddedGrid::kStrided), documents loaded only
// up to their lengths (PaddedGrid::kBoundedLoads). Two shapes. Streamed (any dim; dim > 128
// always): every ring slot carries its query chunk (8 KB reserved, 4 KB loaded for Lq <= 32)
// beside a 16 KB document chunk. Resident (dim <= 128): two 16 KB query buffers and
// 32 KB whole-tile slots (below; at dim <= 64, 8 KB buffers and 16 KB slots). Either way 128 KB or more of documents are in flight per SM: one
// CTA with 8 streamed / 5 resident slots, or two CTAs with 4 / 2 each. Two (the default)
// keep two steps' MMAs, folds and epilogues going per SM, so one CTA's epilogue overlaps the
// other's MMAs, and a call of few steps (SmallRerank: 320) spreads over twice the CTAs.
inline PaddedGrid make_padded_grid(const ForwardParams& p) {
  return PaddedGrid{IndexView(p.query_lengths), IndexView(p.doc_lengths), p.num_queries, p.cands, p.lq, p.ld};
}
// The strided grids' two shapes (padded, and packed as its twin).
// MAXSIM_CUDA_HOPPER_PADDED_CTAS=1|2|3 picks (read per call, for experiments).
// Resident (dim <= 128, the default): whole-tile slots and two query buffers that the
// producer fills a step ahead, so a step's query is loaded once (once for a run of a padded
// query's candidates, hopper_query_run) instead of beside every K-chunk, and its load
// overlaps the previous step. H100, 2026-11-27, GPU time streamed / resident, us: Rerank full
// 32.8 / 29.9, ragged 28.0 / 24.0, HeavyRerank full 74.8 / 73.4, ragged 55.1 / 53.8,
// RerankPacked 30.0 / 23.4, HeavyRerankPacked 62.5 / 51.8, LongDocStressPacked 10.1 / 9.8.
// At dim <= 64 (H100, 2026-11-27, the same workloads at dim 64, streamed / resident, us):
// HeavyRerank full 41.7 / 41.6, ragged 36.4 / 31.4, HeavyRerankPacked 42.6 / 31.4, Rerank full
// 18.6 / 14.8, ragged 16.9 / 13.9, RerankPacked 17.7 / 14.8, LongDocStress 7.1 / 6.6,
// ColPaliRerank full 50.5 / 48.8. MAXSIM_CUDA_HOPPER_RESIDENT=0 forces the streamed shape at
// dim <= 128 (read per call; 1, the default, is accepted too).
// Three CTAs an SM (64 < dim <= 128, resident; hopper_three_cta_query_bufs): 64-row tiles in three 16 KB
// slots and one 16 KB query buffer (64 KB a CTA), for calls of at most three steps an SM, which
// then run in one wave of one step a CTA, a whole 180-row document in flight at once; one
// query buffer, since a CTA meets one query. MAXSIM_CUDA_HOPPER_PADDED_CTAS=3 forces it; at dim >
// 128 the knob picks the streamed shape at 64-row tiles, three CTAs an SM (four 16 KB slots
// of an 8 KB query chunk and an 8 KB document chunk): more CTAs streaming at once, as
// late-interaction-kernels runs four an SM on the wide full reranks it leads. Calls of 3-6 steps
// an SM take the same tiles in two slots with two query buffers,
// so that a CTA's runs of steps load a query once a run, the next one while a run ends;
// MAXSIM_CUDA_HOPPER_QUERY_BUFS=2 picks that shape where the knob forces three CTAs.
template <class T, class Grid>
cudaError_t run_strided_hopper(const ForwardParams& p, const Grid& pol, bool& ran) {
  const EpilogueArgs ep = make_args<T>(p).ep;
  const char* e = std::getenv("MAXSIM_CUDA_HOPPER_PADDED_CTAS");
  const bool one_cta = e != nullptr && e[0] == '1';
  const char* r = std::getenv("MAXSIM_CUDA_HOPPER_RESIDENT");
  const bool streamed = r != nullptr && r[0] == '0';
  if (!streamed && p.dim <= 128) {
    if (p.dim <= 64) {
      return one_cta ? run_forward_hopper<T, HopperShape<64, 10, 1, false, 1, 2>>(p, pol, ep, ran)
                     : run_forward_hopper<T, HopperShape<64, 4, 1, false, 2, 2>>(p, pol, ep, ran);
    }
    const char* qb = std::getenv("MAXSIM_CUDA_HOPPER_QUERY_BUFS");
    const int three_cta_bufs = e == nullptr || e[0] < '1' || e[0] > '3' ? hopper_three_cta_query_bufs(p)
                               : e[0] != '3'                           ? 0
                               : qb != nullptr && qb[0] == '2'         ? 2
                                                                       : 1;
    if (three_cta_bufs == 2) return run_forward_hopper<T, HopperShape<128, 2, 1, false, 3, 2, 64>>(p, pol, ep, ran);
    if (three_cta_bufs == 1) return run_forward_hopper<T, HopperShape<128, 3, 1, false, 3, 1, 64>>(p, pol, ep, ran);
    return one_cta ? run_forward_hopper<T, HopperShape<128, 5, 1, false, 1, 2>>(p, pol, ep, ran)
                   : run_forward_hopper<T, HopperShape<128, 2, 1, false, 2, 2>>(p, pol, ep, ran);
  }
  // 128 < dim <= 256: the resident shape at 256 columns reads a step's query once instead of
  // beside every 64-column chunk (the streamed slots' query chunks are a third of the dim-256
  // rerank's L2 sectors). One CTA of three 32 KB slots and two query buffers (160 KB), a
  // query loaded once a run of a padded query's candidates; or, at two CTAs an SM by the knobs
  // alone, two slots and one buffer (96 KB a CTA). hopper_wide_shape picks where no knob does;
  // MAXSIM_CUDA_HOPPER_RESIDENT=1 forces resident (PADDED_CTAS=2: two CTAs), =0 streamed, and a
  // CTA count alone streams.
  WideShape wide = hopper_wide_shape(p);
  if (r != nullptr && r[0] == '1') {
    wide = WideShape::kResidentRuns;
  } else if (streamed || (e != nullptr && e[0] >= '1' && e[0] <= '3')) {
    wide = WideShape::kStreamed;
  }
  if (wide == WideShape::kResidentRuns && p.dim <= 256) {
    return e != nullptr && e[0] == '2' ? run_forward_hopper<T, HopperShape<256, 2, 1, false, 2, 1, 64>>(p, pol, ep, ran)
                                       : run_forward_hopper<T, HopperShape<256, 3, 1, false, 1, 2, 64>>(p, pol, ep, ran);
  }
  if (one_cta) return run_forward_hopper<T, HopperShape<64, 8, 1, true>>(p, pol, ep, ran);
  if ((e != nullptr && e[0] == '3') || wide == WideShape::kStreamedThreeCtas) {
    return run_forward_hopper<T, HopperShape<64, 4, 1, true, 3, 1, 64>>(p, pol, ep, ran);
  }
  return run_forward_hopper<T, HopperShape<64, 4, 1, true, 2>>(p, pol, ep, ran);
}

// Packed on sm_90a: the padded launcher's shapes over PackedGrid (pair p a query of one
// document), so a packed call runs as its padded twin does.
inline PackedGrid make_packed_grid(const ForwardParams& p) {
  return PackedGrid{IndexView(p.query_offsets), IndexView(p.doc_offsets), IndexView(p.pair_query_ids),
                    IndexView(p.pair_doc_ids), p.pairs, 1, p.max_q_len, p.num_queries, p.num_docs, p.q_rows,
                    p.d_rows};
}

// The sm_90a kernel's turn, when it applies and is wanted (see hopper_wanted): ran = false
// leaves the call to the mma.sync kernels. Streamed: from launch_forward_mma_k.
template <class T, int SURF, bool STREAMED>
cudaError_t try_forward_hopper(const ForwardParams& p, bool& ran) {
  ran = false;
  if (!hopper_wanted(p) || !hopper_applies(p)) return cudaSuccess;
  if constexpr (SURF == 0) {
    return run_strided_hopper<T>(p, make_padded_grid(p), ran);
  } else if constexpr (SURF == 2) {
    return run_strided_hopper<T>(hopper_view(p), make_packed_grid(p), ran);
  } else if constexpr (STREAMED) {
    return launch_contrastive_hopper_streamed<T, SURF>(p, ran);
  } else {
    return launch_contrastive_hopper<T, SURF>(p, ran);
  }
}

template <class T, int SURF>
cudaError_t launch_forward_mma(const ForwardParams& p) {
  if (p.dim <= 128) {
    bool ran = false;
    const cudaError_t err = try_forward_hopper<T, SURF, false>(p, ran);
    if (ran || err != cudaSuccess) return err;
  }
  const int bm = pick_bm(p);
  const int kd = p.dim <= 64 ? 64 : (p.dim <= 128 ? 128 : 256);
  if constexpr (!is_contrastive(SURF)) {
    // RerankWide measured faster for long documents (ColPali pages, ~7%), the 4-warp shape
    // for short ones (Ld 180-256, ~10%) on an H200; average document length decides.
    const bool wide = p.rerank_variant >= 0 ? p.rerank_variant != 0 : average_doc_rows(p) >= 512;
    if (bm == 32 && kd <= 128 && wide) {
      return kd == 64 ? run_surface<typename RerankWide<T, 64>::type, SURF>(p)
                      : run_surface<typename RerankWide<T, 128>::type, SURF>(p);
    }
  }
  if constexpr (is_contrastive(SURF)) {
    // knob: 0 = 128-row blocks, anything else = 256-row blocks; default: 256 rows once
    // there are 256 stacked query rows to fill them
    const bool wide = p.variant >= 0 ? p.variant != 0 : p.num_queries * p.lq >= 256;
    if (bm == 128 && kd <= 128 && wide) {
      return kd == 64 ? run_surface<typename ContrastiveWide<T, 64>::type, SURF>(p)
                      : run_surface<typename ContrastiveWide<T, 128>::type, SURF>(p);
    }
  }
#define MAXSIM_MMA_CASE(KD_, BM_) \
  if (kd == KD_ && bm == BM_) return run_surface<typename MmaConfig<T, KD_, BM_>::type, SURF>(p);
  MAXSIM_MMA_CASE(64, 32) MAXSIM_MMA_CASE(64, 64) MAXSIM_MMA_CASE(64, 128)
  MAXSIM_MMA_CASE(128, 32) MAXSIM_MMA_CASE(128, 64) MAXSIM_MMA_CASE(128, 128)
  MAXSIM_MMA_CASE(256, 32) MAXSIM_MMA_CASE(256, 64) MAXSIM_MMA_CASE(256, 128)
#undef MAXSIM_MMA_CASE
  return cudaErrorInvalidValue;
}

// K-streaming tensor-core configs (fp16/bf16, dim > 256; any dim works): 64-column
// K-chunks of a document tile plus the query block's chunk per stage.
//   BM=32:  4 warps (2 x 2, 16 rows x 32 cols each), 64-row tiles, 6 stages (72 KB), 3 CTAs/SM
//   BM=64:  8 warps (4 x 2), 4 stages (64 KB), 2 CTAs/SM
//   BM=128 padded/packed: 8 warps (4 x 2, 32 x 32 each), 4 stages (96 KB), 2 CTAs/SM on sm_90
//   BM=128 contrastive: 128-row document tiles, 8 warps (4 x 2, 32 x 64 each), 4 stages
//     (128 KB), 1 CTA/SM, no register cap (the 2-CTA shape below is slower).
// H200, bf16 Nq=64 Lq=32 Nb=512 Ld=128: 0.97 / 1.70 ms at D=512 / 1024 against 1.11 / 2.04
// for the 2-CTA 128x64 shape. The BM=32 rerank shape beat an 8-warp and a 128-column-chunk
// variant at D=512..1024 (fp16 B=32 C=50 Lq=32 Ld=180).
template <class T, int BM>
struct MmaKConfig;
template <class T>
struct MmaKConfig<T, 32> { using type = MmaKMainloop<T, 32, 64, 2, 2, 64, 6, 3>; };
template <class T>
struct MmaKConfig<T, 64> { using type = MmaKMainloop<T, 64, 64, 4, 2, 64, 4, 2>; };
template <class T>
struct MmaKConfig<T, 128> { using type = MmaKMainloop<T, 128, 64, 4, 2, 64, 4, 2>; };
template <class T>
struct MmaKContrastive { using type = MmaKMainloop<T, 128, 128, 4, 2, 64, 4, 1>; };
// BM=128 when the device allows less than ~100 KB of shared memory per block (sm_86/sm_89
// give 99 KB; the two BM=128 shapes above need 100 / 131 KB): 3 stages, 76 KB. Such an SM
// holds one of these CTAs anyway (100 KB), so no register cap (with one it spilled).
template <class T>
struct MmaKSmall { using type = MmaKMainloop<T, 128, 64, 4, 2, 64, 3, 1>; };

template <class ML>
bool smem_fits() {
  return FwdSmem<ML, PaddedPolicy>::bytes() <= max_smem_optin();
}
// Alternatives behind the experiment knobs: MAXSIM_CUDA_RERANK_CFG=1|2 (padded/packed, BM=32),
// MAXSIM_CUDA_CONTRASTIVE_CFG=0 (contrastive BM=128 on the 2-CTA 128x64 shape).
template <class T>
struct MmaKRerankWide { using type = MmaKMainloop<T, 32, 64, 2, 4, 64, 6, 2>; };   // 8 warps
template <class T>
struct MmaKRerankK128 { using type = MmaKMainloop<T, 32, 64, 2, 2, 128, 4, 2>; };  // 128-col chunks

// Explicitly instantiated per (dtype, surface) in forward_<dtype>_kchunk_<surface>.cu.
template <class T, int SURF>
cudaError_t launch_forward_mma_k(const ForwardParams& p) {
  {
    bool ran = false;
    const cudaError_t err = try_forward_hopper<T, SURF, true>(p, ran);
    if (ran || err != cudaSuccess) return err;
  }
  const int bm = pick_bm(p);
  if (bm == 32) {
    if constexpr (!is_contrastive(SURF)) {
      if (p.rerank_variant == 1) return run_surface<typename MmaKRerankWide<T>::type, SURF>(p);
      if (p.rerank_variant == 2) return run_surface<typename MmaKRerankK128<T>::type, SURF>(p);
    }
    return run_surface<typename MmaKConfig<T, 32>::type, SURF>(p);
  }
  if (bm == 64) return run_surface<typename MmaKConfig<T, 64>::type, SURF>(p);
  if constexpr (is_contrastive(SURF)) {
    using C = typename MmaKContrastive<T>::type;
    if (p.variant != 0 && smem_fits<C>()) return run_surface<C, SURF>(p);
  }
  using Big = typename MmaKConfig<T, 128>::type;
  if (smem_fits<Big>()) return run_surface<Big, SURF>(p);
  return run_surface<typename MmaKSmall<T>::type, SURF>(p);
}

template <class ML>
cudaError_t run_any_surface(const ForwardParams& p) {
  switch (p.surface) {
    case Surface::kPadded: return run_surface<ML, 0>(p);
    case Surface::kContrastive: return run_surface<ML, 1>(p);
    case Surface::kContrastivePadded: return run_surface<ML, 3>(p);
    default: return run_surface<ML, 2>(p);
  }
}

template <class T, class Acc>
cudaError_t launch_forward_simt(const ForwardParams& p) {
  const int bm = pick_bm(p);
  if (bm == 32) return run_any_surface<SimtMainloop<T, Acc, 32>>(p);
  // float64's 128 x 8 thread tile would spill (128 accumulator registers): taller query
  // blocks run as 64-row chunks
  if (bm == 64 || sizeof(Acc) == 8) return run_any_surface<SimtMainloop<T, Acc, 64>>(p);
  if constexpr (sizeof(Acc) == 4) return run_any_surface<SimtMainloop<T, Acc, 128>>(p);
  return cudaErrorInvalidValue;
}

// ---- compressed documents (int8 / e4m3 with row scales; doc_format.cuh) ----
// A compressed tile is half the bytes of a 16-bit one, so the shapes take 128-row document
// tiles where the 16-bit ones take 64 (the same bytes a stage, twice the rows). Warps split
// the tile's columns rather than the query rows where the registers allow (BM = 32: 1 x 4
// warps of 32 query rows), since every warp widens the document bytes it multiplies:
// columns split over warps are widened once, query rows split over warps once per warp.
// (H100, HeavyRerank: 8 warps, 2 CTAs per SM, as 2 x 4 or 1 x 8 warps, 6 stages, were
// 1.2x / 1.5x slower than this 1 x 4, 3 CTAs; SingleQueryRerank and ColPaliRerank likewise.)
// (ptxas, sm_90a: none of these spills. The BM = 32 shape's three CTAs per SM cap a thread
// at 168 registers, which the contrastive policies' extra state overruns by a few bytes:
// there two CTAs; BM = 64 takes 64-row tiles and 6 stages under its 128-register cap.)
template <class T, int KD, int BM, DocFormat F, bool CONTRASTIVE>
struct CompressedConfig;
template <class T, int KD, DocFormat F, bool CONTRASTIVE>
struct CompressedConfig<T, KD, 32, F, CONTRASTIVE> {
  using type = std::conditional_t<(KD > 128), MmaMainloop<T, KD, 32, 64, 2, 2, 4, 2, F>,
                                  MmaMainloop<T, KD, 32, 128, 1, 4, 4, (CONTRASTIVE ? 2 : 3), F>>;
};
template <class T, int KD, DocFormat F, bool CONTRASTIVE>
struct CompressedConfig<T, KD, 64, F, CONTRASTIVE> {
  using type = std::conditional_t<(KD > 128), MmaMainloop<T, KD, 64, 64, 4, 2, 4, 1, F>,
                                  MmaMainloop<T, KD, 64, 64, 4, 2, 6, 2, F>>;
};
template <class T, int KD, DocFormat F, bool CONTRASTIVE>
struct CompressedConfig<T, KD, 128, F, CONTRASTIVE> {
  using type = std::conditional_t<(KD > 128), MmaMainloop<T, KD, 128, 64, 8, 1, 4, 1, F>,
                                  MmaMainloop<T, KD, 128, 128, 4, 2, 4, 1, F>>;
};
// dim > 256: the K-streaming shapes of 16-bit documents, 64-byte document chunk rows (BM =
// 128 with one CTA per SM: at two, 128 registers, it spilled ~300 bytes).
template <class T, int BM, DocFormat F>
struct CompressedKConfig;
template <class T, DocFormat F>
struct CompressedKConfig<T, 32, F> { using type = MmaKMainloop<T, 32, 64, 2, 2, 64, 6, 3, F>; };
template <class T, DocFormat F>
struct CompressedKConfig<T, 64, F> { using type = MmaKMainloop<T, 64, 64, 4, 2, 64, 4, 2, F>; };
template <class T, DocFormat F>
struct CompressedKConfig<T, 128, F> { using type = MmaKMainloop<T, 128, 64, 4, 2, 64, 4, 1, F>; };

// sm_90a, padded and packed, 64 < dim <= 128: the wgmma kernel with the documents as the
// register operand (forward_hopper_bytes.cuh); 32 query rows for Lq <= 32 (4 stages; 64-row
// tiles and 3 CTAs per SM, or 128-row tiles and 2 for long documents: hopper_bytes_short_tiles),
// else 64-row chunks (3 stages, 128-row tiles; for calls of at most a step an SM, one CTA an
// SM whose two consumer warpgroups split each step: hopper_bytes_split, 8 stages). ran = false
// leaves the call to mma.sync.
template <class T, DocFormat F, int SURF>
cudaError_t try_forward_hopper_bytes(const ForwardParams& p, bool& ran) {
  ran = false;
  if constexpr (SURF == 0 || SURF == 2) {
    const ForwardParams v = hopper_view(p);  // (packed: lq is max_q_len)
    if (!hopper_bytes_wanted(v) || !hopper_bytes_applies(p)) return cudaSuccess;
    const EpilogueArgs ep = make_args<T>(p).ep;
    auto run = [&](const auto& pol) {
      if (v.lq > 32) {
        if (hopper_bytes_split(v)) {
          return run_forward_hopper_bytes<T, F, HopperByteShape<64, 8, 128, 1, 2>>(v, pol, ep, ran);
        }
        return run_forward_hopper_bytes<T, F, HopperByteShape<64, 3>>(v, pol, ep, ran);
      }
      if (hopper_bytes_short_tiles(v)) {
        return run_forward_hopper_bytes<T, F, HopperByteShape<32, 4, 64, 3>>(v, pol, ep, ran);
      }
      return run_forward_hopper_bytes<T, F, HopperByteShape<32, 4>>(v, pol, ep, ran);
    };
    if constexpr (SURF == 0) {
      return run(make_padded_grid(p));
    } else {
      return run(make_packed_grid(p));
    }
  }
  return cudaSuccess;
}

// Contrastive calls with compressed documents on sm_90a: the resident kernel with a widening
// stage (forward_hopper_widen.cuh), as many consumer warpgroups as the 16-bit kernel takes.
// Stages (producer's ring / widened ring) fill the 227 KB of shared memory.
template <class T, DocFormat F, int SURF>
cudaError_t try_forward_hopper_widen(const ForwardParams& p, bool& ran) {
  ran = false;
  if constexpr (is_contrastive(SURF)) {
    if (!hopper_widen_applies(p)) return cudaSuccess;
    using Policy = std::conditional_t<SURF == 1, ContrastivePolicy, ContrastivePaddedPolicy>;
    const Policy pol = make_contrastive<Policy>(p, 64);
    const EpilogueArgs ep = make_args<T>(p).ep;
    switch (hopper_consumers(p)) {
      case 4: return run_forward_hopper_widen<T, HopperWidenShape<F, 4, 3, 3>>(p, pol, ep, ran);
      case 3: return run_forward_hopper_widen<T, HopperWidenShape<F, 3, 3, 3>>(p, pol, ep, ran);
      default: return run_forward_hopper_widen<T, HopperWidenShape<F, 2, 4, 3>>(p, pol, ep, ran);
    }
  }
  return cudaSuccess;
}

template <class T, DocFormat F, int SURF>
cudaError_t launch_compressed_surface(const ForwardParams& p) {
  const int bm = pick_bm(p);
  if constexpr (!std::is_same_v<T, float>) {
    bool ran = false;
    cudaError_t err = try_forward_hopper_bytes<T, F, SURF>(p, ran);
    if (ran || err != cudaSuccess) return err;
    err = try_forward_hopper_widen<T, F, SURF>(p, ran);
    if (ran || err != cudaSuccess) return err;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (bm == 32) return run_surface<SimtMainloop<float, float, 32, F>, SURF>(p);
    if (bm == 64) return run_surface<SimtMainloop<float, float, 64, F>, SURF>(p);
    return run_surface<SimtMainloop<float, float, 128, F>, SURF>(p);
  } else {
    if (p.dim > 256) {
      if (bm == 32) return run_surface<typename CompressedKConfig<T, 32, F>::type, SURF>(p);
      if (bm == 64) return run_surface<typename CompressedKConfig<T, 64, F>::type, SURF>(p);
      return run_surface<typename CompressedKConfig<T, 128, F>::type, SURF>(p);
    }
    const int kd = p.dim <= 64 ? 64 : (p.dim <= 128 ? 128 : 256);
#define MAXSIM_COMPRESSED_CASE(KD_, BM_) \
  if (kd == KD_ && bm == BM_)                                                                         \
    return run_surface<typename CompressedConfig<T, KD_, BM_, F, is_contrastive(SURF)>::type, SURF>(p);
    MAXSIM_COMPRESSED_CASE(64, 32) MAXSIM_COMPRESSED_CASE(64, 64) MAXSIM_COMPRESSED_CASE(64, 128)
    MAXSIM_COMPRESSED_CASE(128, 32) MAXSIM_COMPRESSED_CASE(128, 64) MAXSIM_COMPRESSED_CASE(128, 128)
    MAXSIM_COMPRESSED_CASE(256, 32) MAXSIM_COMPRESSED_CASE(256, 64) MAXSIM_COMPRESSED_CASE(256, 128)
#undef MAXSIM_COMPRESSED_CASE
    return cudaErrorInvalidValue;
  }
}

// ---- residual documents (decoded into 16-bit tiles; mainloop_mma.cuh) ----
// The 16-bit shapes of MmaConfig, with three stages where they take four at 64-row tiles:
// a residual stage also holds the packed bucket ids (a quarter more bytes), and three stages
// keep three CTAs per SM.
template <class T, int KD, int BM>
struct ResidualConfig;
template <class T, int KD>
struct ResidualConfig<T, KD, 32> {
  using type = MmaMainloop<T, KD, 32, (KD > 128 ? 32 : 64), 2, 2, (KD > 128 ? 4 : 3), (KD > 128 ? 1 : 3),
                           DocFormat::kResidual>;
};
template <class T, int KD>
struct ResidualConfig<T, KD, 64> {
  using type = MmaMainloop<T, KD, 64, (KD > 128 ? 32 : 64), 4, 2, (KD > 128 ? 4 : 3), (KD > 128 ? 1 : 2),
                           DocFormat::kResidual>;
};
template <class T, int KD>
struct ResidualConfig<T, KD, 128> {
  using type = std::conditional_t<(KD > 128), MmaMainloop<T, KD, 128, 32, 8, 1, 4, 1, DocFormat::kResidual>,
                                  MmaMainloop<T, KD, 128, 64, 4, 1, 4, 1, DocFormat::kResidual>>;
};

template <class T, int SURF>
cudaError_t launch_residual_surface(const ForwardParams& p) {
  const int bm = pick_bm(p);
  const int kd = p.dim <= 64 ? 64 : (p.dim <= 128 ? 128 : 256);
#define MAXSIM_RESIDUAL_CASE(KD_, BM_) \
  if (kd == KD_ && bm == BM_) return run_surface<typename ResidualConfig<T, KD_, BM_>::type, SURF>(p);
  MAXSIM_RESIDUAL_CASE(64, 32) MAXSIM_RESIDUAL_CASE(64, 64) MAXSIM_RESIDUAL_CASE(64, 128)
  MAXSIM_RESIDUAL_CASE(128, 32) MAXSIM_RESIDUAL_CASE(128, 64) MAXSIM_RESIDUAL_CASE(128, 128)
  MAXSIM_RESIDUAL_CASE(256, 32) MAXSIM_RESIDUAL_CASE(256, 64) MAXSIM_RESIDUAL_CASE(256, 128)
#undef MAXSIM_RESIDUAL_CASE
  return cudaErrorInvalidValue;
}

// Explicitly instantiated per query dtype in forward_<dtype>_residual.cu.
template <class T>
cudaError_t launch_forward_residual(const ForwardParams& p) {
  if (p.dim > 256) return cudaErrorInvalidValue;  // dispatch.cu sends these to the FFMA path
  switch (p.surface) {
    case Surface::kPadded: return launch_residual_surface<T, 0>(p);
    case Surface::kContrastive: return launch_residual_surface<T, 1>(p);
    case Surface::kContrastivePadded: return launch_residual_surface<T, 3>(p);
    default: return launch_residual_surface<T, 2>(p);
  }
}

// Residual documents on the FFMA path (SimtMainloop's decode): float32 queries, and 16-bit
// queries where the tensor-core decode does not apply (centroids of another dtype or not on
// 16-byte rows, dim > 256). Explicitly instantiated in forward_residual_simt.cu.
template <class T>
cudaError_t launch_forward_residual_simt(const ForwardParams& p) {
  const int bm = pick_bm(p);
  if (bm == 32) return run_any_surface<SimtMainloop<T, float, 32, DocFormat::kResidual>>(p);
  if (bm == 64) return run_any_surface<SimtMainloop<T, float, 64, DocFormat::kResidual>>(p);
  return run_any_surface<SimtMainloop<T, float, 128, DocFormat::kResidual>>(p);
}

// Explicitly instantiated per (query dtype, format) in forward_<dtype>_<format>.cu.
template <class T, DocFormat F>
cudaError_t launch_forward_compressed(const ForwardParams& p) {
  switch (p.surface) {
    case Surface::kPadded: return launch_compressed_surface<T, F, 0>(p);
    case Surface::kContrastive: return launch_compressed_surface<T, F, 1>(p);
    case Surface::kContrastivePadded: return launch_compressed_surface<T, F, 3>(p);
    default: return launch_compressed_surface<T, F, 2>(p);
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
