// The contrastive, padded (rerank) and packed forward on sm_90a: warp-specialised, TMA-fed, wgmma.
// fp16/bf16, dim a multiple of 8; queries longer than 64 rows run as 64-row chunks.
//
// Roles. One producer warp (one elected lane) walks the CTA's steps, reads each document's
// rows (one step ahead) and issues TMA tile loads into a ring of kStages slots guarded by
// full / empty mbarriers, with a TileInfo per slot so the consumers read no indices
// themselves. kConsumers warpgroups each own one 64-row query block (policy blocks
// kConsumers * set + g) and share every document tile: per tile, wgmma m64n128k16 (m64n64k16
// for a tail of at most 64 rows) from the swizzled shared-memory operands into fp32
// registers, release the slot(s), fold into the running (max, argmax) with the mma.sync
// kernels' MmaRowMax (wgmma's accumulator layout is mma.sync's m16n8 layout per 8 columns),
// and after a document's last tile run the shared epilogue on the warpgroup's 64 rows (a
// named barrier instead of __syncthreads). The warpgroups run decoupled, so one's fold and
// epilogue overlap the others' MMAs.
//
// Operands (HopperShape). dim <= 128, resident: the query blocks are loaded once per set
// (single buffer, reloaded after every warpgroup released it: qempty) and a slot holds a
// whole document tile. dim > 128 (padded, packed: any dim), streamed: a slot holds one 64-column
// K-chunk of the tile and of every block, and a tile's MMAs accumulate over ceil(dim / 64)
// slots.
//
// Schedule. Steps are (set, document) in set-major order, split contiguously over a
// persistent grid like the mma.sync kernel (contrastive), or strided over it (padded: each
// step its own query and document, one consumer warpgroup, the query in every slot; packed
// the same with pair p as a query of one document, its query rows found by the producer).
//
// Bounded loads (padded, packed): a document's last tile, and the query block, arrive as
// 32-row boxes up to their lengths instead of whole boxes, so a short document costs its own
// rows and not the padding after them; m64n64 / m64n32 MMAs run its short tails.
//
// Where a tile runs past its document (the next document's rows, zero rows past the tensor,
// or stale rows past a bounded load's last box), the fold masks those columns by select, so
// not even a NaN there gets in; columns past dim arrive as zeros. Query rows past a
// segment's length are scored and never reported, as in the mma.sync kernels. Host side: the
// tensor maps (encoded through the runtime's driver entry point, no libcuda link) and the
// checks that pick this path. Torch-free.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "../launch.h"
#include "epilogue.cuh"
#include "hopper_primitives.cuh"
#include "mainloop_mma.cuh"
#include "policies.cuh"
#include "scheduler.cuh"
#include "scratch.cuh"

namespace maxsim_cuda {
namespace kernel {

// The value lane 0 holds, for every lane (see hopper_consume).
template <class V>
__device__ __forceinline__ V uniform(V v) {
  return __shfl_sync(0xffffffffu, v, 0);
}

// Two ways to feed the consumers. Resident (dim <= 128): each warpgroup's query block sits
// in shared memory for a whole set and a ring slot holds a document tile of all KD columns.
// Streamed (STREAM, any dim): a ring slot holds one 64-column K-chunk of the tile and of
// every consumer's query block, and a tile's MMAs accumulate over ceil(dim / 64) slots, as a
// GEMM mainloop does; the query chunks come from L2 again for every tile.
template <int KD_, int STAGES_, int CONSUMERS_, bool STREAM_ = false, int CTAS_ = 1>
struct HopperShape {
  static constexpr bool kStream = STREAM_;
  static constexpr int kCtasPerSm = CTAS_;  // resident CTAs an SM is planned for
  static constexpr int KD = kStream ? 64 : KD_, KB = KD / 64;  // 64-column (128-byte) swizzle blocks per slot
  static constexpr int BM = 64;                                 // query rows per consumer warpgroup
  static constexpr int BN = 128;                                // document rows per tile
  static constexpr int NT = BN / 8;
  static constexpr int kConsumers = CONSUMERS_, kStages = STAGES_;
  static constexpr int kThreads = kConsumers * 128 + 32;
  static constexpr int kProducerWarp = kConsumers * 4;
  static constexpr uint32_t kRowBytes = 128;
  static constexpr uint32_t kQueryBlockBytes = KB * BM * kRowBytes;  // one warpgroup's block (streamed: chunk)
  static constexpr uint32_t kDocBytes = KB * BN * kRowBytes;         // one tile (streamed: chunk)
  // A ring slot: streamed, the consumers' query chunks first, then the document chunk.
  static constexpr uint32_t kQueryInSlot = kStream ? kConsumers * kQueryBlockBytes : 0;
  static constexpr uint32_t kSlotBytes = kQueryInSlot + kDocBytes;
  // What the compressed-document shape (forward_hopper_bytes.cuh) changes: 128-byte
  // document rows in one block, each slot's row scales after its tile, and two query buffers.
  static constexpr int kDocBlocks = KB;         // 128-byte column blocks of a document tile
  static constexpr uint32_t kScaleBytes = 0;    // per slot, after the tile
  static constexpr uint32_t kScaleOffset = kSlotBytes;
  static constexpr int kQueryBufs = 1;          // resident query buffers (ring)
  static constexpr bool kWiden = false;         // a widening stage between the rings
  static constexpr int kEmptyArrivals = kConsumers * 128;  // arrivals that free a producer slot
  static_assert(KD % 64 == 0 && KB >= 1 && KB <= 2, "KD");
};

// What the producer read about the tile in a ring slot: its document (the consumers need no
// index reads of their own) and its place in it. A document with no rows (or bad offsets)
// still gets one slot, with no data, so that its step reaches the epilogue.
struct TileInfo {
  int64_t doc, len;  // len: the document's rows (0 when bad)
  int32_t tile;      // index within the document
  int32_t flags;     // kTileOk: offsets valid; kTileLast: the document's last tile
  int32_t qlen;      // strided walks (a query per step): the query's length (policy qlen_of)
  int32_t scale_shift;  // byte shape: where the tile's first row scale sits in the slot's scales
};
constexpr int32_t kTileOk = 1, kTileLast = 2;

// The resident shapes' query blocks (streamed shapes keep theirs in the ring slots).
template <class Shape, bool = Shape::kStream>
struct HopperQueryBlocks {
  alignas(1024) unsigned char query[Shape::kQueryBufs][Shape::kConsumers][Shape::kQueryBlockBytes];
};
template <class Shape>
struct HopperQueryBlocks<Shape, true> {};

// A ring of tile slots and their barriers: the producer's (TMA writes, consumers or a
// widening stage read), and for shapes with a widening stage the widened tiles' ring.
template <int STAGES, uint32_t SLOT_BYTES>
struct HopperRing {
  static constexpr int kStages = STAGES;
  alignas(1024) unsigned char slot[STAGES][SLOT_BYTES];
  TileInfo info[STAGES];
  uint64_t full[STAGES], empty[STAGES];
};

// The consumers' own shared memory beyond the epilogue's (empty but for the compressed shapes).
template <class Shape, bool = (Shape::kScaleBytes > 0)>
struct HopperConsumerSmem {};
template <class Shape>
struct HopperConsumerSmem<Shape, true> : Shape::ConsumerSmem {};

template <class Shape>
struct HopperSmem : HopperQueryBlocks<Shape>, HopperConsumerSmem<Shape> {
  HopperRing<Shape::kStages, Shape::kSlotBytes> ring;
  uint64_t qfull[Shape::kQueryBufs], qempty[Shape::kQueryBufs];
  EpilogueSmem<float, Shape::BM, 1> epi[Shape::kConsumers];
  // + 1024: the swizzle atoms need a 1024-byte aligned base; the dynamic window promises 16.
  static constexpr size_t bytes() { return sizeof(HopperSmem) + 1024; }
};

// The ring whose tiles the consumers multiply: the producer's, or the widened one.
template <class Shape>
__device__ __forceinline__ auto& consumer_ring(HopperSmem<Shape>& sm) {
  if constexpr (Shape::kWiden) {
    return sm.wide;
  } else {
    return sm.ring;
  }
}

// Waits for ring slot `it` to be full and returns its TileInfo, the fields the consumers
// branch on made warp-uniform (ptxas then keeps the MMAs' branches uniform), and in `left`
// the tile's rows of its document (<= 0: a slot without data).
template <class Ring>
__device__ __forceinline__ TileInfo next_tile(Ring& ring, int it, int bn, int& left) {
  constexpr int S = Ring::kStages;
  const int stage = it % S;
  mbar_wait(smem_addr(&ring.full[stage]), (it / S) & 1);
  TileInfo info = ring.info[stage];
  info.len = uniform(info.len);
  info.tile = uniform(info.tile);
  info.flags = uniform(info.flags);
  info.scale_shift = uniform(info.scale_shift);
  const int64_t left64 = info.len - int64_t(info.tile) * bn;
  left = static_cast<int>(left64 < bn ? left64 : bn);
  return info;
}

struct WarpgroupSync {
  int id;
  __device__ __forceinline__ void operator()() const { named_barrier(id, 128); }
};

// 64-row query blocks. Lq <= 64: the policy's blocks of G stacked queries (nchunks = 1).
// Lq > 64: block b is chunk b % nchunks of query b / nchunks (G = 1); each chunk's row
// maxima sum into partial[(q * nchunks + c) * Nb + n] and sum_query_chunks adds a query's
// chunks in order.
template <class Policy>
struct HopperParams {
  Policy pol;          // built for 64-row blocks
  int64_t blocks;      // 64-row query blocks
  int64_t nchunks;     // blocks per query (1: the policy's stacked blocks)
  int64_t sets;        // sets of kConsumers consecutive blocks; steps are (set, document), set-major
  int kchunks;         // streamed shapes: 64-column K-chunks per tile (ceil(dim / 64))
  float* partial;      // nchunks > 1: [Nq * nchunks, Nb] chunk sums
  EpilogueArgs ep;
};

// First query row of block b.
template <class Policy>
__device__ __forceinline__ int64_t block_row0(const HopperParams<Policy>& hp, int64_t b) {
  if (hp.nchunks == 1) return b * hp.pol.G * hp.pol.Lq;
  const int64_t q = div_nonneg(b, hp.nchunks);
  return q * hp.pol.Lq + (b - q * hp.nchunks) * 64;
}

// The query of block b (the first of its stacked queries).
template <class Policy>
__device__ __forceinline__ int64_t block_query(const HopperParams<Policy>& hp, int64_t b) {
  return hp.nchunks == 1 ? b * hp.pol.G : div_nonneg(b, hp.nchunks);
}

// Epilogue of one 64-row chunk of a long query (all 128 threads of the warpgroup): argmax
// of its rows, and the ordered sum of its valid rows' maxima into hp.partial. finish_chunk
// with a chunk-sum destination could do this too, but its general row pass (stacked
// segments) costs registers: the 4-warpgroup shapes, capped at 96, then spill.
template <class Policy>
__device__ __forceinline__ void finish_query_chunk(EpilogueSmem<float, 64, 1>& sm, const HopperParams<Policy>& hp,
                                                   const StepDesc& d, int64_t q, int64_t c, int64_t n, int tid,
                                                   WarpgroupSync sync) {
  const EpilogueArgs& ea = hp.ep;
  sync();  // red_m / red_i written
  if (tid < 64) {
    const int64_t i = c * 64 + tid;
    const int idx = sm.red_i[tid];
    if (ea.with_argmax && i < ea.width) {
      const bool valid = i < d.qlen0 && !d.bad && d.dlen > 0;
      ea.argmax[d.out0 * ea.width + i] = valid ? (idx == kNoIndex ? 0 : idx) : -1;
    }
    sm.rowmax[tid] = sm.red_m[tid];
  }
  sync();
  if (tid == 0) {
    int64_t rows = d.qlen0 - c * 64;
    rows = rows < 0 ? 0 : (rows > 64 ? 64 : rows);
    const float sum = ordered_sum(sm.rowmax, rows, 0.f);
    hp.partial[(q * hp.nchunks + c) * hp.pol.Nb + n] = d.bad ? quiet_nan<float>() : sum;
  }
}

// scores[q, n] = the sum of query q's chunk sums against document n, chunk 0 first.
template <int = 0>
__global__ void sum_query_chunks(const float* partial, float* scores, int64_t nq, int64_t nb, int64_t nchunks) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= nq * nb) return;
  const int64_t q = k / nb, n = k - q * nb;
  const float* p = partial + q * nchunks * nb + n;
  float acc = 0.f;
  for (int64_t c = 0; c < nchunks; ++c) acc += p[c * nb];
  scores[k] = acc;
}

// The steps (set, document) a CTA walks, set-major. Contiguous: the CTA's range of
// consecutive steps, so a set's blocks stay for a run of documents (no divide per step).
// Strided (the padded grid): steps blockIdx.x, + gridDim.x, ..., so the CTAs stream
// neighbouring documents at the same time (measured: the contiguous split's 132 separate
// streams reach ~72% of HBM bandwidth).
template <bool STRIDED>
struct StepWalk {
  int64_t s, end, set, n, Nb;
  __device__ __forceinline__ StepWalk(StepRange r, int64_t Nb_)
      : s(r.begin), end(r.end), set(div_nonneg(r.begin, Nb_)), n(0), Nb(Nb_) {
    n = s - set * Nb;
  }
  __device__ __forceinline__ bool more() const { return s < end; }
  __device__ __forceinline__ void next() {
    if (STRIDED) {
      s += gridDim.x;
      set = div_nonneg(s, Nb);
      n = s - set * Nb;
    } else {
      ++s;
      if (++n == Nb) {
        n = 0;
        ++set;
      }
    }
  }
};
// This CTA's steps: [begin, end) contiguous, or (strided) begin, begin + gridDim.x, ... < end.
template <bool STRIDED>
__device__ __forceinline__ StepRange walk_range(int64_t total) {
  return STRIDED ? StepRange{blockIdx.x, total} : cta_steps(total, gridDim.x, blockIdx.x);
}

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
  StepWalk<Policy::kStrided> walk(range, pol.Nb);
  // A step's index reads, made a step ahead: the document's rows, and on a strided walk
  // (a query per step) the query's length, which travels in the TileInfo instead of being
  // read by the consumers per step (a global read and two warpgroup barriers in front of
  // every step's first tile). A pair grid reads the query's first row here too, from the
  // pair's ids, which it reads a step earlier still (ids2, for step s2), so that no read
  // waits for another within a step.
  struct Ahead {
    int64_t row0 = 0, len = 0, qrow0 = 0;
    int32_t qlen = 0;
    bool ok = false;
  };
  [[maybe_unused]] auto read_ahead = [&](int64_t set, int64_t n) {
    Ahead a;
    if constexpr (!Policy::kPairRows) {
      a.ok = pol.doc_rows(block_query(hp, set * C), n, a.row0, a.len);
      if constexpr (Policy::kStrided) a.qlen = static_cast<int32_t>(pol.qlen_of(block_query(hp, set * C)));
    }
    return a;
  };
  [[maybe_unused]] auto read_pair = [&](const auto& ids) {
    Ahead a;
    if constexpr (Policy::kPairRows) {
      int64_t ql = 0;
      a.ok = pol.pair_rows(ids, a.qrow0, ql, a.row0, a.len);
      a.qlen = a.ok ? static_cast<int32_t>(ql) : -1;
    }
    return a;
  };
  Ahead next;
  [[maybe_unused]] int64_t s2 = 0;
  auto ids2 = [&] {
    if constexpr (Policy::kPairRows) {
      // a pair grid's step s is block s (Nb = 1, one consumer)
      next = read_pair(pol.pair_ids(block_query(hp, walk.s)));
      s2 = walk.s + gridDim.x;
      return pol.pair_ids(block_query(hp, s2 < walk.end ? s2 : walk.s));
    } else {
      next = read_ahead(walk.set, walk.n);
      return 0;
    }
  }();
  // Pair grids: the current block's first query row and its 32-row boxes (0: the chunk
  // holds no query rows, and its document is not loaded).
  int qrow = 0, qboxes = 0;
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
  while (walk.more()) {
    const Ahead cur = next;
    const int64_t cur_n = walk.n, cur_row0 = cur.row0;
    int64_t cur_len = cur.ok ? cur.len : 0;
    const bool cur_ok = cur.ok;
    const int32_t cur_qlen = cur.qlen;
    const int64_t this_set = walk.set;
    walk.next();
    if (walk.more()) {  // consumed one iteration later
      if constexpr (Policy::kPairRows) {
        next = read_pair(ids2);
        s2 += gridDim.x;
        if (s2 < walk.end) ids2 = pol.pair_ids(block_query(hp, s2));
      } else {
        next = read_ahead(walk.set, walk.n);
      }
    }
    if (this_set != cur_set) {
      first = this_set * C;
      blocks = static_cast<int>(hp.blocks - first < C ? hp.blocks - first : C);
      if constexpr (Policy::kPairRows) {
        const int64_t c = hp.nchunks > 1 ? first - div_nonneg(first, hp.nchunks) * hp.nchunks : 0;
        const int64_t rows = clamp64(int64_t(cur_qlen) - c * 64, 0, 64);
        qrow = static_cast<int>(cur.qrow0 + c * 64);
        qboxes = static_cast<int>((rows + kBoxRows - 1) / kBoxRows);
        qbytes = uint32_t(qboxes) * kBoxBytes;
      } else {
        qbytes = 0;
        for (int g = 0; g < blocks; ++g) {
          qbytes += Policy::kBoundedLoads ? uint32_t(query_boxes(hp, first + g)) * kBoxBytes
                                          : Shape::kQueryBlockBytes / KB;
        }
      }
      if constexpr (!Shape::kStream) {
        // round r fills buffer r % kQueryBufs once the consumers released its round r - kQueryBufs
        // (a fresh barrier passes the first wait)
        constexpr int QB = Shape::kQueryBufs;
        const int qbuf = static_cast<int>(qround % QB);
        mbar_wait(smem_addr(&sm.qempty[qbuf]), ((qround / QB) & 1) ^ 1);
        ++qround;
        mbar_arrive_expect_tx(smem_addr(&sm.qfull[qbuf]), KB * qbytes);
        for (int g = 0; g < blocks; ++g) {
#pragma unroll
          for (int kb = 0; kb < KB; ++kb) {
            load_query(smem_addr(sm.query[qbuf][g]) + kb * Shape::BM * kRowBytes, smem_addr(&sm.qfull[qbuf]), g,
                       kb * 64);
          }
        }
      }
      cur_set = this_set;
    }
    // A chunk without query rows (an empty query, or one shorter than the longest) has
    // nothing to score: one slot without data carries its step to the epilogue.
    if (Policy::kPairRows && qboxes == 0) cur_len = 0;
    const bool data = cur_len > 0;
    const int64_t ntiles = data ? (cur_len + BN - 1) / BN : 1;
    const int nk = Shape::kStream && data ? hp.kchunks : 1;
    for (int64_t t = 0; t < ntiles; ++t) {
      const int drow = static_cast<int>(cur_row0 + t * BN);
      const int64_t left = cur_len - t * BN;
      // 0: the whole tile as one box
      const int boxes = Policy::kBoundedLoads && left < BN ? static_cast<int>((left + kBoxRows - 1) / kBoxRows) : 0;
      const uint32_t dbytes =
          (boxes > 0 ? Shape::kDocBlocks * uint32_t(boxes) * kBoxBytes : Shape::kDocBytes) + Shape::kScaleBytes;
      const uint32_t tx = !data ? 0u : (Shape::kStream ? qbytes : 0u) + dbytes;
      const TileInfo info{cur_n, cur_len, static_cast<int32_t>(t),
                          (cur_ok ? kTileOk : 0) | (t + 1 == ntiles ? kTileLast : 0), cur_qlen, drow & 3};
      for (int kc = 0; kc < nk; ++kc, ++it) {
        const int stage = it % S;
        const uint32_t full = smem_addr(&sm.ring.full[stage]), slot = smem_addr(sm.ring.slot[stage]);
        mbar_wait(smem_addr(&sm.ring.empty[stage]), ((it / S) & 1) ^ 1);
        sm.ring.info[stage] = info;
        mbar_arrive_expect_tx(full, tx);
        if (!data) continue;
        if constexpr (Shape::kStream) {
#pragma unroll
          for (int g = 0; g < blocks; ++g) load_query(slot + g * Shape::kQueryBlockBytes, full, g, kc * 64);
        }
        // a box's first element must sit 16 bytes aligned (else the copy faults with an illegal
        // instruction): the scales come from the row rounded down to 4, 4 more of them
        if constexpr (Shape::kScaleBytes > 0) tma_load_1d(slot + Shape::kScaleOffset, smap, full, drow & ~3);
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
}

// This warpgroup's MMAs for one tile whose first slot (`it`) is full: S[64 x N] = Q block *
// tile^T over all columns, N = 128, or 64 / 32 (narrow) when at most N document rows are
// left. Releases the tile's slots and returns the slot counter past them. Descriptors of the
// k16 steps are the base descriptors plus constant offsets (the address field is addr / 16
// and the operands lie below 256 KB, so the add never carries out of it).
// Streamed: one slot per K-chunk; a chunk's MMAs are issued before the previous chunk's
// finish (wait_group 1), and a slot is released once its MMAs have read it.
template <class T, class Shape, int N>
__device__ __forceinline__ int hopper_tile_mma(HopperSmem<Shape>& sm, float (&acc)[N / 8][4], int g, int it, int nk) {
  auto& ring = consumer_ring(sm);
  constexpr int S = std::remove_reference_t<decltype(ring)>::kStages;
  using Mma = WgmmaM64<T, N>;
  fence_registers(acc);
  if constexpr (!Shape::kStream) {
    const int stage = it % S;
    const uint32_t slot = smem_addr(ring.slot[stage]);
    const uint64_t qdesc = sw128_desc(smem_addr(sm.query[0][g]));
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
  int64_t cur_set = -1, qb = 0, query = 0, chunk = 0;
  uint32_t qround = 0;
  bool active = false;
  for (StepWalk<Policy::kStrided> walk(range, pol.Nb); walk.more(); walk.next()) {
    const int64_t set = walk.set, n = walk.n;
    if (set != cur_set) {
      // every MMA on the old blocks has drained (streamed shapes keep no blocks)
      if (!Shape::kStream && cur_set >= 0) mbar_arrive(smem_addr(&sm.qempty[0]));
      cur_set = set;
      qb = set * C + g;
      active = qb < hp.blocks;  // uniform over the warpgroup
      if (hp.nchunks > 1) {
        query = div_nonneg(qb, hp.nchunks);
        chunk = qb - query * hp.nchunks;
      }
      if constexpr (!Policy::kStrided) {  // strided walks: the query length is in the TileInfo
        if (active) {  // the block's query lengths, read once per block
          const int nseg =
              hp.nchunks > 1 ? 1 : static_cast<int>(pol.Nq - qb * pol.G < pol.G ? pol.Nq - qb * pol.G : pol.G);
          const int64_t q0 = hp.nchunks > 1 ? query : qb * pol.G;
          sync();  // the last epilogue has finished reading seg_qlen
          for (int k = tid; k < nseg; k += 128) epi.seg_qlen[k] = pol.qlen_of(q0 + k);
          sync();
        }
      }
      if constexpr (!Shape::kStream) mbar_wait(smem_addr(&sm.qfull[0]), (qround++) & 1);
    }
    row_max.reset();
    TileInfo info;
    do {
      const int stage = it % S;
      int left;
      info = next_tile(ring, it, BN, left);
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
      constexpr bool kNarrow = !Shape::kStream || C == 1;
      constexpr bool kNarrow32 = kNarrow && Policy::kBoundedLoads && Shape::kCtasPerSm == 1;
      if (kNarrow32 && work && left <= 32) {
        float acc[1][4][4];
        it = hopper_tile_mma<T, Shape, 32>(sm, acc[0], g, it, nk);
        row_max.fold(acc, lane, 0, left, info.tile * BN, hp.ep.with_argmax);
      } else if (kNarrow && work && left <= 64) {
        float acc[1][8][4];
        it = hopper_tile_mma<T, Shape, 64>(sm, acc[0], g, it, nk);
        row_max.fold(acc, lane, 0, left, info.tile * BN, hp.ep.with_argmax);
      } else if (work) {
        float acc[1][Shape::NT][4];
        it = hopper_tile_mma<T, Shape, 128>(sm, acc[0], g, it, nk);
        row_max.fold(acc, lane, 0, left, info.tile * BN, hp.ep.with_argmax);
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
      row_max.reduce(epi.red_m, epi.red_i, lane, warp, 0);
      if (hp.nchunks > 1) {
        const StepDesc d = pol.step_at(query, n, ok, 0, info.len, qlen0);
        finish_query_chunk(epi, hp, d, query, chunk, n, tid, sync);
      } else {
        const StepDesc d = pol.step_at(qb, n, ok, 0, info.len, qlen0);
        finish_chunk<float, Shape::BM, 1, 128>(epi, d, 0, 1, carry, hp.ep, tid, sync);
      }
    }
  }
}

template <class Shape>
__device__ __forceinline__ void hopper_init_barriers(HopperSmem<Shape>& sm) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < Shape::kStages; ++s) {
      mbar_init(smem_addr(&sm.ring.full[s]), 1);
      mbar_init(smem_addr(&sm.ring.empty[s]), Shape::kEmptyArrivals);
    }
    if constexpr (Shape::kWiden) {  // filled by the widening warps, freed by the consumers
      for (int s = 0; s < Shape::kWideStages; ++s) {
        mbar_init(smem_addr(&sm.wide.full[s]), Shape::kWidenThreads);
        mbar_init(smem_addr(&sm.wide.empty[s]), Shape::kConsumers * 128);
      }
    }
    for (int b = 0; b < Shape::kQueryBufs; ++b) {
      mbar_init(smem_addr(&sm.qfull[b]), 1);
      mbar_init(smem_addr(&sm.qempty[b]), Shape::kConsumers * 128);
    }
    fence_mbar_init();
  }
  __syncthreads();
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
  hopper_consume<T, Shape>(sm, hp, range);
#endif
}

// ---- host ----

// Comparisons only: MAXSIM_CUDA_FORCE_MMA_SYNC=1 keeps the mma.sync kernels on sm_90a.
// Read on every call (one getenv) so one process can time both paths.
inline bool force_mma_sync() {
  const char* e = std::getenv("MAXSIM_CUDA_FORCE_MMA_SYNC");
  return e != nullptr && e[0] == '1';
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
// the grid's blocks); a max_q_len above the query tensor's rows is left to the mma.sync
// kernels too, since every pair would walk ceil(max_q_len / 64) chunks, most without rows.
// The checks every sm_90a kernel shares; hopper_applies adds this kernel's own (16-bit
// documents), forward_hopper_bytes.cuh and forward_hopper_widen.cuh theirs (compressed ones).
inline bool hopper_call_fits(const ForwardParams& p) {
  constexpr int64_t kCoordLimit = (int64_t(1) << 31) - 256;  // TMA coordinates are int32
  const bool packed = p.surface == Surface::kPacked;
  const int64_t lq = packed ? p.max_q_len : p.lq;
  return lq >= 1 && (!packed || lq <= p.q_rows) && p.dim >= 8 && p.dim % 8 == 0 && p.dim < kCoordLimit &&
         p.num_queries > 0 && p.num_docs > 0 && p.q_rows > 0 && p.d_rows > 0 && p.q_rows < kCoordLimit &&
         p.d_rows < kCoordLimit && reinterpret_cast<uintptr_t>(p.queries) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.documents) % 16 == 0 && !force_mma_sync() &&
         wgmma_compiled_for_current_device();
}
inline bool hopper_applies(const ForwardParams& p) {
  return p.doc_format == DocFormat::kNative && hopper_call_fits(p);
}

// Rows of an average document: padded, the padded length; else the packed rows per document.
inline int64_t average_doc_rows(const ForwardParams& p) {
  if (p.surface == Surface::kPadded) return p.ld;
  return p.num_docs > 0 ? p.d_rows / p.num_docs : 0;
}

// Padded and packed calls whose average document is shorter than this stay on the mma.sync
// kernels at dim <= 128. H100, GPU time per call, mma.sync / this kernel: SmallRerank (Ld
// 180) full 9.2 / 9.4 us, ragged 8.0 / 8.8; Rerank (Ld 180) full 36.1 / 31.7, ragged 26.4 /
// 28.6; SmallRerankPacked 8.9 / 10.1, HeavyRerankPacked (average ~160 rows) 57.9 / 62.7.
// From 256 rows on this kernel wins or ties (HeavyRerank full 81.4 / 75.7, ragged 56.6 /
// 56.8; LongDocStress 16.1 / 10.6, LongDocStressPacked 16.8 / 10.8; ColPaliRerank ragged
// 67.8 / 64.6, ColPaliRerankPacked 70.3 / 66.0), and at dim > 128 at every length
// (RerankD256..1024 8-13% faster).
constexpr int64_t kHopperMinDocRows = 256;

// Whether this kernel is wanted for the call's surface and shape (contrastive: always).
// MAXSIM_CUDA_HOPPER_PADDED / MAXSIM_CUDA_HOPPER_PACKED = 1 take it for every padded /
// packed call it can run, 0 for none (read per call: tests and comparisons).
inline bool hopper_wanted(const ForwardParams& p) {
  if (p.doc_format != DocFormat::kNative) return false;  // see hopper_applies
  if (is_contrastive(static_cast<int>(p.surface))) return true;
  const char* e = std::getenv(p.surface == Surface::kPacked ? "MAXSIM_CUDA_HOPPER_PACKED" : "MAXSIM_CUDA_HOPPER_PADDED");
  if (e != nullptr && (e[0] == '0' || e[0] == '1')) return e[0] == '1';
  return p.dim > 128 || average_doc_rows(p) >= kHopperMinDocRows;
}

// dim > 128 on sm_90a: the dispatcher sends these calls to the K-streaming launcher
// (launch_forward_mma_k), which tries the streamed shapes first.
inline bool hopper_streamed_wanted(const ForwardParams& p) {
  return p.dim > 128 && hopper_wanted(p) && hopper_applies(p);
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

// The launch both kernels share (maps: their tensor maps, passed on as kernel arguments).
// (The kernel is a template argument: the occupancy cache below is per kernel.)
template <class Shape, auto kKernel, class Policy, class... Maps>
cudaError_t launch_hopper(const ForwardParams& p, const Policy& pol, const EpilogueArgs& ep, bool& ran,
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
  // Resident CTAs per SM, cached per device: the shape's plan, or fewer if the device
  // says so (a grid planned for two per SM that got one would run in two waves).
  static int occupancy[64] = {0};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  int& occ = occupancy[dev & 63];
  if (occ == 0) {
    err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    int o = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kern, Shape::kThreads, smem);
    if (err != cudaSuccess) return err;
    occ = o < 1 ? 1 : (o > Shape::kCtasPerSm ? Shape::kCtasPerSm : o);
  }
  const int64_t ctas = plan_ctas(steps, p.num_sms, occ);
  // Long queries' chunk sums: stream-ordered scratch (capturable in a CUDA graph).
  const size_t partial_bytes = hp.nchunks > 1 ? size_t(hp.blocks) * size_t(pol.Nb) * sizeof(float) : 0;
  if (partial_bytes > 0) {
    err = scratch_alloc(reinterpret_cast<void**>(&hp.partial), partial_bytes, p.stream);
    if (err != cudaSuccess) return err;
  }
  ran = true;
  kern<<<static_cast<unsigned>(ctas), Shape::kThreads, smem, p.stream>>>(hp, maps...);
  err = cudaGetLastError();
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
  return launch_hopper<Shape, maxsim_forward_hopper_kernel<T, Shape, Policy>>(p, pol, ep, ran, qmap, dmap, tmap);
}

}  // namespace kernel
}  // namespace maxsim_cuda
