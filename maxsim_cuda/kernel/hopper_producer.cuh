// The producer warp of the sm_90a kernels (one elected lane): walks the CTA's steps, reads
// each document's rows one step ahead, and issues the TMA loads of the query blocks and the
// document tiles (whole boxes, or 32-row boxes for bounded loads; the row scales of compressed
// documents) into the ring, writing each slot's TileInfo. Torch-free.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "hopper_pipeline.cuh"
#include "hopper_primitives.cuh"
#include "hopper_scheduler.cuh"
#include "policies.cuh"
#include "timeline.cuh"

namespace maxsim_cuda {
namespace kernel {

// Rows of a bounded load's box (Policy::kBoundedLoads): four of them at 4 KB offsets leave
// the same 128-byte-swizzled image as one 128-row box (the swizzle atom is 8 rows, 1 KB).
constexpr int kBoxRows = 32;
constexpr uint32_t kBoxBytes = kBoxRows * 128;

// Query boxes block b is loaded with: one 64-row box, or (bounded) the 32-row boxes that
// cover its query's rows; the block rows past them keep stale data, which only reaches
// accumulator rows that are never reported (the epilogue sums and reports rows < qlen).
template <class Policy>
__device__ __forceinline__ int query_boxes(const HopperParams<Policy>& hp, int64_t b) {
  if constexpr (!Policy::kBoundedLoads) {
    return 1;
  } else {
    int64_t rows = hp.pol.Lq * hp.pol.G;
    if (hp.nchunks > 1) rows = hp.pol.Lq - (b - div_nonneg(b, hp.nchunks) * hp.nchunks) * 64;
    rows = rows < 64 ? rows : 64;
    return static_cast<int>((rows + kBoxRows - 1) / kBoxRows);
  }
}

// How many rows a document's last tile (left < BN of its rows) moves back so that the
// window its MMAs take (tile_mma_rows) ends at the document's last row: the consumers then
// fold that window without a mask, at no extra cost in the tensor pipe. The rows it repeats
// were folded in the tile before, with the same index; max and argmax (ties to the lowest
// row, NaN included) come out the same for a row seen twice. Not when the document is
// shorter than the window, nor on the bounded-load grids when the window would take more
// 32-row boxes than the tile's rows do (the bytes of the rerank are its cost).
template <class Shape, class Policy>
__device__ __forceinline__ int tail_back(int64_t len, int left) {
  const int rows = tile_mma_rows<Shape, Policy>(left);
  if (left >= rows || len < rows) return 0;
  if (Policy::kBoundedLoads && (left + kBoxRows - 1) / kBoxRows != rows / kBoxRows) return 0;
  return rows - left;
}

// The producer: one lane. Document rows for step s + 1 are read while step s's tiles are
// issued, so their latency stays off the ring. A tile takes one slot (resident), or one per
// K-chunk (streamed); a document without rows takes one slot without data. Bounded loads:
// a tile with fewer than BN rows left is loaded as ceil(rows / 32) 32-row boxes (tmap), and
// the slot's expected bytes are exactly those boxes' (TMA counts a whole box, zero-filled
// rows past the tensor included); the slot rows past them are stale, and the consumers'
// fold masks their columns by select.
template <class Shape, class Policy>
__device__ __forceinline__ void hopper_produce(HopperSmem<Shape>& sm, const HopperParams<Policy>& hp, StepRange range,
                                               const CUtensorMap* qmap, const CUtensorMap* dmap,
                                               const CUtensorMap* tmap, const CUtensorMap* smap = nullptr) {
  constexpr int S = Shape::kStages, BN = Shape::BN, KB = Shape::KB, C = Shape::kConsumers;
  constexpr uint32_t kRowBytes = Shape::kRowBytes;
  const Policy& pol = hp.pol;
  int it = 0;
  int64_t cur_set = -1;
  uint32_t qround = 0;
  int blocks = 0;       // query blocks of the current set
  int64_t first = 0;    // its first block
  uint32_t qbytes = 0;  // the bytes of one K-block of the set's query blocks
  // The strided grids' documents belong to one query: their sets must be single blocks.
  static_assert(C == 1 || !Policy::kStrided, "strided grids: one consumer");
  prefetch_tensormap(qmap);
  prefetch_tensormap(dmap);
  if constexpr (Policy::kBoundedLoads) prefetch_tensormap(tmap);
  if constexpr (Shape::kScaleBytes > 0) prefetch_tensormap(smap);
  wait_prior_grids();  // before the first index read
  StepWalk<Policy::kStrided> walk(range, pol.Nb, hp.runs);
  // A step's index reads, issued a step ahead (while the step before it issues its tiles)
  // and looked at only when its own step starts: the document's rows, and on a strided walk
  // (a query per step) the query's length, which travels in the TileInfo instead of being
  // read by the consumers per step (a global read and two warpgroup barriers in front of
  // every step's first tile). A pair grid reads the query's first row here too, from the
  // pair's ids, which it issues a step earlier still (ids2, for walk2's step), so that no
  // read waits for another within a step. Looked at in the step that issued them, the
  // reads cost the producer their whole latency before that step's first tile: a length
  // that misses in L2 waits behind the documents' own traffic.
  typename Policy::StepRead next;
  StepWalk<Policy::kStrided> walk2 = walk;  // pair grids: the step after walk's
  walk2.next();
  auto ids2 = [&] {
    if constexpr (Policy::kPairRows) {
      // a pair grid's step s is block s (Nb = 1, one consumer); the first step's ids are
      // looked at at once (nothing to hide them behind)
      next = pol.issue_pair(pol.ids_of(pol.issue_ids(block_query(hp, walk.s))));
      return pol.issue_ids(block_query(hp, walk2.more() ? walk2.s : walk.s));
    } else {
      next = pol.issue_step(block_query(hp, walk.set * C), walk.n);
      return 0;
    }
  }();
  // Pair grids: the current block's first query row and its 32-row boxes (0: the chunk
  // holds no query rows, and its document is not loaded). Shape::kQueryReuse: the rows the
  // query buffers last received, so that consecutive pairs of one query load it once.
  int qrow = 0, qboxes = 0, loaded_qrow = -1, loaded_qboxes = -1;
  // Query block g of the set, K-block at column x, into dst (the boxes query_boxes counts).
  auto load_query = [&](uint32_t dst, uint32_t bar, int g, int x) {
    if constexpr (Policy::kPairRows) {
      for (int j = 0; j < qboxes; ++j) tma_load_2d(dst + j * kBoxBytes, qmap, bar, x, qrow + j * kBoxRows);
    } else if constexpr (Policy::kBoundedLoads) {
      const int row = static_cast<int>(block_row0(hp, first + g));
      const int boxes = query_boxes(hp, first + g);
      for (int j = 0; j < boxes; ++j) tma_load_2d(dst + j * kBoxBytes, qmap, bar, x, row + j * kBoxRows);
    } else {
      tma_load_2d(dst, qmap, bar, x, static_cast<int>(block_row0(hp, first + g)));
    }
  };
  // The non-pair grids' query blocks of a set: every one a step of the set loads.
  auto set_query = [&](int64_t set) {
    first = set * C;
    blocks = static_cast<int>(hp.blocks - first < C ? hp.blocks - first : C);
    qbytes = 0;
    for (int g = 0; g < blocks; ++g) {
      qbytes += Policy::kBoundedLoads ? uint32_t(query_boxes(hp, first + g)) * kBoxBytes : Shape::kQueryBlockBytes / KB;
    }
  };
  auto issue_query = [&](int qbuf) {  // resident shapes: into query buffer qbuf
    if constexpr (!Shape::kStream) {
      mbar_arrive_expect_tx(smem_addr(&sm.qfull[qbuf]), KB * qbytes);
      for (int g = 0; g < blocks; ++g) {
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) {
          load_query(smem_addr(sm.query[qbuf][g]) + kb * (Shape::kQueryBlockBytes / KB), smem_addr(&sm.qfull[qbuf]),
                     g, kb * 64);
        }
      }
    }
  };
  // kAhead (the padded grid, resident 16-bit shapes): a CTA's first step's query blocks and
  // first document tile are placed by arithmetic on the grid alone (the query's padded rows,
  // the document's first min(Ld, BN) rows; a first tile never moves back), so they are issued
  // before the step's lengths are read, and the tile's slot gets its TileInfo and its arrival
  // once they are. The read's latency then leaves the first tile's path: the whole call, for a
  // call of one step a CTA. A tile loaded past a short document's rows is masked as a bounded
  // load's stale rows are; a document without rows leaves its bytes unread. The byte shapes
  // (forward_hopper_bytes.cuh) take it too, with the tile's row scales: the first row is k * Ld
  // there as well, so the scales' box and the TileInfo's scale shift agree with the loop's.
  constexpr bool kAhead = Policy::kBoundedLoads && !Policy::kPairRows && !Shape::kStream && !Shape::kWiden;
  bool query_ahead = false, tile_ahead = false;
  if constexpr (kAhead) {
    if (walk.more()) {
      set_query(walk.set);
      issue_query(0);  // round 0: its empty barrier is fresh
      query_ahead = true;
      const int boxes = pol.Ld < BN ? static_cast<int>((pol.Ld + kBoxRows - 1) / kBoxRows) : 0;
      const int drow = static_cast<int>(next.k * pol.Ld);
      const uint32_t full = smem_addr(&sm.ring.full[0]), slot = smem_addr(sm.ring.slot[0]);
      mbar_expect_tx(full, (boxes > 0 ? Shape::kDocBlocks * uint32_t(boxes) * kBoxBytes : Shape::kDocBytes) +
                               Shape::kScaleBytes);
      if constexpr (Shape::kScaleBytes > 0) tma_load_1d(smem_addr(sm.ring.scales[0]), smap, full, drow & ~3);
#pragma unroll
      for (int kb = 0; kb < Shape::kDocBlocks; ++kb) {
        const uint32_t dst = slot + kb * BN * kRowBytes;
        if (boxes == 0) {
          tma_load_2d(dst, dmap, full, kb * 64, drow);
        } else {
          for (int j = 0; j < boxes; ++j) tma_load_2d(dst + j * kBoxBytes, tmap, full, kb * 64, drow + j * kBoxRows);
        }
      }
      tile_ahead = true;
      timeline_stamp(kTlFirstIssue);
    }
  }
  while (walk.more()) {
    const StepRows cur = pol.step_rows(next);
    const int64_t cur_n = walk.n, cur_row0 = cur.row0;
    int64_t cur_len = cur.ok ? cur.len : 0;
    const bool cur_ok = cur.ok;
    const int32_t cur_qlen = cur.qlen;
    const int64_t this_set = walk.set;
    walk.next();
    if (walk.more()) {  // consumed one iteration later
      if constexpr (Policy::kPairRows) {
        next = pol.issue_pair(pol.ids_of(ids2));
        walk2.next();
        if (walk2.more()) ids2 = pol.issue_ids(block_query(hp, walk2.s));
      } else {
        next = pol.issue_step(block_query(hp, walk.set * C), walk.n);
      }
    }
    bool new_query = false;  // this step's first tile tells the consumers (kTileQuery)
    if (this_set != cur_set) {
      if constexpr (Policy::kPairRows) {
        first = this_set * C;
        blocks = static_cast<int>(hp.blocks - first < C ? hp.blocks - first : C);
        const int64_t c = hp.nchunks > 1 ? first - div_nonneg(first, hp.nchunks) * hp.nchunks : 0;
        const int64_t rows = clamp64(int64_t(cur_qlen) - c * 64, 0, 64);
        qrow = static_cast<int>(cur.qrow0 + c * 64);
        qboxes = static_cast<int>((rows + kBoxRows - 1) / kBoxRows);
        qbytes = uint32_t(qboxes) * kBoxBytes;
      } else if (!query_ahead) {
        set_query(this_set);
      }
      new_query = true;
      if constexpr (Shape::kQueryReuse && Policy::kPairRows) {
        new_query = qrow != loaded_qrow || qboxes != loaded_qboxes;
        loaded_qrow = qrow;
        loaded_qboxes = qboxes;
      }
      if constexpr (!Shape::kStream) {
        if (new_query) {
          // round r fills buffer r % kQueryBufs once the consumers released its round
          // r - kQueryBufs (a fresh barrier passes the first wait)
          constexpr int QB = Shape::kQueryBufs;
          const int qbuf = static_cast<int>(qround % QB);
          if (!query_ahead) {
            mbar_wait(smem_addr(&sm.qempty[qbuf]), ((qround / QB) & 1) ^ 1);
            issue_query(qbuf);
          }
          ++qround;
        }
      }
      cur_set = this_set;
      query_ahead = false;
    }
    // A chunk without query rows (an empty query, or one shorter than the longest) has
    // nothing to score: one slot without data carries its step to the epilogue.
    if (Policy::kPairRows && qboxes == 0) cur_len = 0;
    const bool data = cur_len > 0;
    const int64_t ntiles = data ? (cur_len + BN - 1) / BN : 1;
    const int nk = Shape::kStream && data ? hp.kchunks : 1;
    for (int64_t t = 0; t < ntiles; ++t) {
      const int64_t left = cur_len - t * BN;
      const int back = data && left < BN ? tail_back<Shape, Policy>(cur_len, static_cast<int>(left)) : 0;
      const int drow = static_cast<int>(cur_row0 + t * BN - back);
      const int64_t rows = left + back;  // of the document, from drow on
      // 0: the whole tile as one box
      const int boxes = Policy::kBoundedLoads && rows < BN ? static_cast<int>((rows + kBoxRows - 1) / kBoxRows) : 0;
      const uint32_t dbytes =
          (boxes > 0 ? Shape::kDocBlocks * uint32_t(boxes) * kBoxBytes : Shape::kDocBytes) + Shape::kScaleBytes;
      const uint32_t tx = !data ? 0u : (Shape::kStream ? qbytes : 0u) + dbytes;
      const TileInfo info{cur_n, cur_len, static_cast<int32_t>(t),
                          (cur_ok ? kTileOk : 0) | (t + 1 == ntiles ? kTileLast : 0) |
                              (t == 0 && new_query ? kTileQuery : 0) | (back << TileInfo::kTileBackShift),
                          cur_qlen, drow & 3};
      for (int kc = 0; kc < nk; ++kc, ++it) {
        const int stage = it % S;
        const uint32_t full = smem_addr(&sm.ring.full[stage]), slot = smem_addr(sm.ring.slot[stage]);
        mbar_wait(smem_addr(&sm.ring.empty[stage]), ((it / S) & 1) ^ 1);
        sm.ring.info[stage] = info;
        if (it == 0) timeline_stamp(kTlFirstInfo);
        if (tile_ahead) {  // slot 0 holds this step's first rows already (kAhead)
          tile_ahead = false;
          mbar_arrive(full);
          continue;
        }
        mbar_arrive_expect_tx(full, tx);
        if (!data) continue;
        if constexpr (Shape::kStream) {
#pragma unroll
          for (int g = 0; g < blocks; ++g) load_query(slot + g * Shape::kQueryBlockBytes, full, g, kc * 64);
        }
        // a box's first element must sit 16 bytes aligned (else the copy faults with an illegal
        // instruction): the scales come from the row rounded down to 4, 4 more of them
        if constexpr (Shape::kScaleBytes > 0) tma_load_1d(smem_addr(sm.ring.scales[stage]), smap, full, drow & ~3);
#pragma unroll
        for (int kb = 0; kb < Shape::kDocBlocks; ++kb) {
          const uint32_t dst = slot + Shape::kQueryInSlot + kb * BN * kRowBytes;
          const int x = Shape::kStream ? kc * 64 : kb * 64;
          if (boxes == 0) {
            tma_load_2d(dst, dmap, full, x, drow);
          } else {
            for (int j = 0; j < boxes; ++j) tma_load_2d(dst + j * kBoxBytes, tmap, full, x, drow + j * kBoxRows);
          }
        }
      }
    }
  }
  // The next call's CTAs may take the SM slots this grid's leave from here on. Signalled at
  // the producer's start instead, the one-query rerank's byte-kernel rows ran 2-5% slower with
  // PDL than without (H100, 2026-11-26); signalled here, 0.5-5% faster. Not where the host
  // says the early launch would crowd the next grid (launch_hopper): then the signal is the
  // CTA's exit.
  if (hp.signal_early) allow_dependent_grids();
}

}  // namespace kernel
}  // namespace maxsim_cuda
