// The contrastive, padded (rerank) and packed forward on sm_90a: warp-specialised, TMA-fed, wgmma.
// fp16/bf16, dim a multiple of 8; queries longer than 64 rows run as 64-row chunks.
//
// Roles. One producer warp (one elected lane) walks the CTA's steps, reads each document's
// rows (one step ahead) and issues TMA tile loads into a ring of kStages slots guarded by
// full / empty mbarriers, with a TileInfo per slot so the consumers read no indices
// themselves. kConsumers warpgroups each own one 64-row query block (policy blocks
// kConsumers * set + g) and share every document tile: per tile, wgmma m64n128k16 (m64n64k16
// for a tail of at most 64 rows, and for every tile of the three-CTA shape, whose tiles are
// 64 rows) from the swizzled shared-memory operands into fp32 registers, release the
// slot(s), fold into the running (max, argmax) with the mma.sync
// kernels' MmaRowMax (wgmma's accumulator layout is mma.sync's m16n8 layout per 8 columns),
// and after a document's last tile run the shared epilogue on the warpgroup's 64 rows (a
// named barrier instead of __syncthreads). The warpgroups run decoupled, so one's fold and
// epilogue overlap the others' MMAs.
//
// Operands (HopperShape). dim <= 128, resident: a slot holds a whole document tile and the
// query blocks are loaded once per set, into one buffer reloaded after every warpgroup
// released it (contrastive: qempty at the set change), or on the strided grids into two
// buffers the producer fills a step ahead (the consumer follows its kTileQuery flag). Streamed
// (dim > 128; padded and packed also when forced at any dim): a slot holds one 64-column
// K-chunk of the tile and of every block, and a tile's MMAs accumulate over ceil(dim / 64)
// slots.
//
// Schedule. Steps are (set, document) in set-major order, split contiguously over a
// persistent grid like the mma.sync kernel (contrastive), or strided over it in runs
// (padded: each step its own query and document, one consumer warpgroup; packed the same
// with pair p as a query of one document, its query rows found by the producer).
//
// Bounded loads (padded, packed): a document's last tile, and the query block, arrive as
// 32-row boxes up to their lengths instead of whole boxes, so a short document costs its own
// rows and not the padding after them; m64n64 / m64n32 MMAs run its short tails.
//
// Where a tile runs past its document (the next document's rows, zero rows past the tensor,
// or stale rows past a bounded load's last box), the fold masks those columns by select, so
// not even a NaN there gets in; columns past dim arrive as zeros. Query rows past a
// segment's length are scored and never reported, as in the mma.sync kernels.
//
// Files. This one holds the 16-bit consumer, the kernel and its host entry; the pieces the
// compressed-document kernels (forward_hopper_bytes.cuh, forward_hopper_widen.cuh) share with
// it: hopper_pipeline.cuh (shape, ring, barriers), hopper_scheduler.cuh (blocks, sets, step
// walk), hopper_producer.cuh (the TMA producer), hopper_epilogue.cuh (long queries' chunk
// sums), hopper_launch.cuh (tensor maps, which calls take an sm_90a kernel, the launch).
// Torch-free.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../launch.h"
#include "epilogue.cuh"
#include "hopper_epilogue.cuh"
#include "hopper_launch.cuh"
#include "hopper_pipeline.cuh"
#include "hopper_primitives.cuh"
#include "hopper_producer.cuh"
#include "hopper_scheduler.cuh"
#include "mainloop_mma.cuh"
#include "policies.cuh"

namespace maxsim_cuda {
namespace kernel {

// This warpgroup's MMAs for one tile whose first slot (`it`) is full: S[64 x N] = Q block *
// tile^T over all columns, N = BN (128, or 64 in the three-CTA shape), or 64 / 32 (narrow)
// when at most N document rows are left. Releases the tile's slots and returns the slot
// counter past them. Descriptors of the k16 steps are the base descriptors plus constant
// offsets (the address field is addr / 16 and the operands lie below 256 KB, so the add
// never carries out of it).
// Streamed: one slot per K-chunk; a chunk's MMAs are issued before the previous chunk's
// finish (wait_group 1), and a slot is released once its MMAs have read it.
// qblock: resident shapes, the shared-memory address of this warpgroup's query block.
template <class T, class Shape, int N>
__device__ __forceinline__ int hopper_tile_mma(HopperSmem<Shape>& sm, float (&acc)[N / 8][4], int g, uint32_t qblock,
                                               int it, int nk) {
  auto& ring = consumer_ring(sm);
  constexpr int S = std::remove_reference_t<decltype(ring)>::kStages;
  using Mma = WgmmaM64<T, N>;
  fence_registers(acc);
  if constexpr (!Shape::kStream) {
    const int stage = it % S;
    const uint32_t slot = smem_addr(ring.slot[stage]);
    const uint64_t qdesc = sw128_desc(qblock);
    const uint64_t tdesc = sw128_desc(slot);
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < Shape::KB; ++kb)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t a = qdesc + ((kb * Shape::BM * Shape::kRowBytes + kk * 32) >> 4);
        const uint64_t b = tdesc + ((kb * Shape::BN * Shape::kRowBytes + kk * 32) >> 4);
        Mma::run(acc, a, b, (kb | kk) != 0);
      }
    wgmma_commit();
    wgmma_wait<0>();
    if constexpr (Shape::kWiden) {
      // widened tiles carry their row scales: applied before the slot is handed back
      fence_registers(acc);
      scale_columns<Shape::kFormat>(reinterpret_cast<float(&)[1][N / 8][4]>(acc), slot + Shape::kWideScaleOffset,
                                    2 * (threadIdx.x % 4));
    }
    mbar_arrive(smem_addr(&ring.empty[stage]));
    ++it;
  } else {
#pragma unroll 1
    for (int kc = 0; kc < nk; ++kc, ++it) {
      const int stage = it % S;
      if (kc > 0) mbar_wait(smem_addr(&ring.full[stage]), (it / S) & 1);
      const uint32_t slot = smem_addr(ring.slot[stage]);
      const uint64_t qdesc = sw128_desc(slot + g * Shape::kQueryBlockBytes);
      const uint64_t tdesc = sw128_desc(slot + Shape::kQueryInSlot);
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) Mma::run(acc, qdesc + ((kk * 32) >> 4), tdesc + ((kk * 32) >> 4), (kc | kk) != 0);
      wgmma_commit();
      wgmma_wait<1>();
      fence_registers(acc);
      if (kc > 0) mbar_arrive(smem_addr(&ring.empty[(it - 1) % S]));  // the previous chunk's MMAs are done
    }
    wgmma_wait<0>();
    mbar_arrive(smem_addr(&ring.empty[(it - 1) % S]));
  }
  fence_registers(acc);
  return it;
}

template <class T, class Shape, class Policy>
__device__ __forceinline__ void hopper_consume(HopperSmem<Shape>& sm, const HopperParams<Policy>& hp,
                                               StepRange range) {
  constexpr int BN = Shape::BN, C = Shape::kConsumers;
  auto& ring = consumer_ring(sm);
  constexpr int S = std::remove_reference_t<decltype(ring)>::kStages;
  const Policy& pol = hp.pol;
  // Warp-uniform values go through a shuffle: ptxas then knows every branch around the
  // MMAs is uniform over the warpgroup (else it serialises them, warning C7520).
  const int g = uniform(threadIdx.x / 128), tid = threadIdx.x % 128, warp = tid / 32, lane = threadIdx.x % 32;
  auto& epi = sm.epi[g];
  const WarpgroupSync sync{1 + g};
  MmaRowMax<1, Shape::NT, BN, 1, BN> row_max;
  float carry = 0.f;
  int it = 0;
  int64_t cur_set = -1, qb = 0;
  uint32_t qround = 0;
  bool active = false;
  // One query buffer: released and awaited at every set change, which the walk shows.
  // Several (resident strided shapes): the producer fills round r's buffer while round r - 1
  // is scored, and says on a step's first tile that it loaded one (kTileQuery; pair grids
  // skip a pair's query when the last pair had the same rows), so the old buffer is released
  // there, once every MMA on it has been waited for.
  constexpr int QB = Shape::kQueryBufs;
  static_assert(QB == 1 || Policy::kStrided, "several query buffers: strided walks");
  uint32_t qblock = 0;
  if constexpr (!Shape::kStream && QB == 1) qblock = smem_addr(sm.query[0][g]);
  for (StepWalk<Policy::kStrided> walk(range, pol.Nb, hp.runs); walk.more(); walk.next()) {
    const int64_t set = walk.set, n = walk.n;
    if (set != cur_set) {
      // every MMA on the old blocks has drained (streamed shapes keep no blocks)
      if (!Shape::kStream && QB == 1 && cur_set >= 0) mbar_arrive(smem_addr(&sm.qempty[0]));
      cur_set = set;
      qb = set * C + g;
      active = qb < hp.blocks;  // uniform over the warpgroup
      if constexpr (!Policy::kStrided) {  // strided walks: the query length is in the TileInfo
        if (active) {  // the block's query lengths, read once per block
          const int nseg =
              hp.nchunks > 1 ? 1 : static_cast<int>(pol.Nq - qb * pol.G < pol.G ? pol.Nq - qb * pol.G : pol.G);
          const int64_t q0 = hp.nchunks > 1 ? div_nonneg(qb, hp.nchunks) : qb * pol.G;
          sync();  // the last epilogue has finished reading seg_qlen
          for (int k = tid; k < nseg; k += 128) epi.seg_qlen[k] = pol.qlen_of(q0 + k);
          sync();
        }
      }
      if constexpr (!Shape::kStream && QB == 1) mbar_wait(smem_addr(&sm.qfull[0]), (qround++) & 1);
    }
    row_max.reset();
    TileInfo info;
    do {
      const int stage = it % S;
      int left;
      info = next_tile(ring, it, BN, left);
      if constexpr (!Shape::kStream && QB > 1) {
        if (info.flags & kTileQuery) {
          if (qround > 0) mbar_arrive(smem_addr(&sm.qempty[(qround - 1) % QB]));
          const uint32_t buf = qround % QB;
          mbar_wait(smem_addr(&sm.qfull[buf]), (qround / QB) & 1);
          ++qround;
          qblock = smem_addr(sm.query[buf][g]);
        }
      }
      const bool work = active && left > 0;
      const int nk = Shape::kStream && info.len > 0 ? hp.kchunks : 1;  // the tile's slots
      // Accumulators live from the MMAs to the fold only (the first k-step overwrites them);
      // each narrow MMA gets its own set (sharing one made ptxas serialise them, C7511).
      // Streamed shapes with several consumers have no narrow path: with two K-loops ptxas
      // needs ~25 more registers and spills (3 warpgroups, capped at 128) or serialises the
      // MMAs (4, capped at 96); one consumer (the padded grid) is capped at 255.
      // N = 32 only on the bounded-load (padded) grid, where the contrastive shapes are left
      // as they were measured, and at one CTA per SM: its 16 accumulators get registers of
      // their own (184 in all); at two CTAs per SM (capped at 168) ptxas then spills.
      // tile_mma_rows holds the rule; asked at 64 and 32 rows, it says which MMAs the shape
      // has at all. A last tile's window ends at its document's last row where the document is
      // long enough (tail_back), so left is then the MMA's width and the fold takes no mask.
      static_assert(!Shape::kDocsAsA, "byte shapes run forward_hopper_bytes.cuh's consumer");
      constexpr bool kNarrow = BN > 64 && tile_mma_rows<Shape, Policy>(64) == 64;
      constexpr bool kNarrow32 = tile_mma_rows<Shape, Policy>(32) == 32;
      const int mma_rows = tile_mma_rows<Shape, Policy>(left);
      const int first = info.first_row(BN);
      if (kNarrow32 && work && mma_rows == 32) {
        float acc[1][4][4];
        it = hopper_tile_mma<T, Shape, 32>(sm, acc[0], g, qblock, it, nk);
        row_max.fold(acc, lane, 0, left, first, hp.ep.with_argmax);
      } else if (kNarrow && work && mma_rows == 64) {
        float acc[1][8][4];
        it = hopper_tile_mma<T, Shape, 64>(sm, acc[0], g, qblock, it, nk);
        row_max.fold(acc, lane, 0, left, first, hp.ep.with_argmax);
      } else if (work) {
        float acc[1][Shape::NT][4];
        it = hopper_tile_mma<T, Shape, BN>(sm, acc[0], g, qblock, it, nk);
        row_max.fold(acc, lane, 0, left, first, hp.ep.with_argmax);
      } else {  // nothing to compute here: pass the tile's slots on
        mbar_arrive(smem_addr(&ring.empty[stage]));
        ++it;
        for (int kc = 1; kc < nk; ++kc, ++it) {
          mbar_wait(smem_addr(&ring.full[it % S]), (it / S) & 1);
          mbar_arrive(smem_addr(&ring.empty[it % S]));
        }
      }
    } while (!(info.flags & kTileLast));
    if (active) {
      const bool ok = (info.flags & kTileOk) != 0;
      const int64_t qlen0 = Policy::kStrided ? int64_t(info.qlen) : epi.seg_qlen[0];
      row_max.reduce(epi.red_m, epi.red_i, lane, warp, 0, hp.ep.with_argmax);
      if (hp.nchunks > 1) {
        // The block's query and chunk, derived here rather than kept across the tile loop:
        // two int64 fewer live there is what keeps the three-consumer streamed shape
        // (capped at 128 registers) from spilling.
        const int64_t query = div_nonneg(qb, hp.nchunks), chunk = qb - query * hp.nchunks;
        const StepDesc d = pol.step_at(query, n, ok, 0, info.len, qlen0);
        finish_query_chunk(epi, hp, d, query, chunk, n, tid, sync);
      } else {
        const StepDesc d = pol.step_at(qb, n, ok, 0, info.len, qlen0);
        finish_chunk<float, Shape::BM, 1, 128>(epi, d, 0, 1, carry, hp.ep, tid, sync);
      }
    }
  }
}

template <class T, class Shape, class Policy>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kCtasPerSm)
    maxsim_forward_hopper_kernel(const HopperParams<Policy> hp, const __grid_constant__ CUtensorMap qmap,
                                 const __grid_constant__ CUtensorMap dmap, const __grid_constant__ CUtensorMap tmap) {
#if MAXSIM_HAS_WGMMA
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t pad = ((smem_addr(smem_raw) + 1023u) & ~1023u) - smem_addr(smem_raw);
  auto& sm = *reinterpret_cast<HopperSmem<Shape>*>(smem_raw + pad);
  const StepRange range = walk_range<Policy::kStrided>(hp.sets * hp.pol.Nb);
  if (range.begin >= range.end) return;
  hopper_init_barriers<Shape>(sm);
  if (uniform(threadIdx.x / 32) == Shape::kProducerWarp) {
    if (threadIdx.x % 32 == 0) hopper_produce<Shape>(sm, hp, range, &qmap, &dmap, &tmap);
    return;
  }
  wait_prior_grids();  // before the epilogue's global writes
  hopper_consume<T, Shape>(sm, hp, range);
#endif
}

// ---- host ----

template <class T, class Shape, class Policy>
cudaError_t run_forward_hopper(const ForwardParams& p, const Policy& pol, const EpilogueArgs& ep, bool& ran) {
  ran = false;
  // tmap: the documents in 32-row boxes (bounded loads' short tiles; else never read).
  constexpr bool kBounded = Policy::kBoundedLoads;
  CUtensorMap qmap, dmap, tmap;
  if (!rows_map<T>(qmap, p.queries, p.q_rows, p.dim, kBounded ? kBoxRows : Shape::BM) ||
      !rows_map<T>(dmap, p.documents, p.d_rows, p.dim, Shape::BN) ||
      (kBounded && !rows_map<T>(tmap, p.documents, p.d_rows, p.dim, kBoxRows))) {
    return cudaSuccess;  // not taken: the mma.sync kernels run instead
  }
  if (!kBounded) tmap = dmap;
  const int64_t run = Shape::kQueryBufs > 1 ? hopper_query_run("MAXSIM_CUDA_HOPPER_RUN") : 1;
  return launch_hopper<Shape, maxsim_forward_hopper_kernel<T, Shape, Policy>>(p, pol, ep, ran, run, qmap, dmap, tmap);
}

}  // namespace kernel
}  // namespace maxsim_cuda
