// The shared-memory pipeline of the sm_90a kernels (forward_hopper.cuh, forward_hopper_bytes.cuh,
// forward_hopper_widen.cuh): the block shape, the ring of tile slots with its full / empty
// mbarriers and the TileInfo the producer writes beside each slot, the query buffers, and the
// consumers' view of the ring. Torch-free.
#pragma once

#include <cstdint>
#include <type_traits>

#include "epilogue.cuh"
#include "hopper_primitives.cuh"

namespace maxsim_cuda {
namespace kernel {

// Two ways to feed the consumers. Resident (dim <= 128; strided shapes up to 256 columns,
// run_strided_hopper): each warpgroup's query block sits
// in shared memory for a whole set and a ring slot holds a document tile of all KD columns.
// Streamed (STREAM, any dim): a ring slot holds one 64-column K-chunk of the tile and of
// every consumer's query block, and a tile's MMAs accumulate over ceil(dim / 64) slots, as a
// GEMM mainloop does; the query chunks come from L2 again for every tile.
// QBUFS_ (resident strided shapes): query buffers the producer fills a step ahead.
// BN_: document rows a tile, 128, or 64 for the strided shapes at three CTAs an SM (their
// consumer's 64 x 64 accumulators fit the 136 registers a thread that three CTAs of 160
// threads leave, where 64 x 128 do not).
template <int KD_, int STAGES_, int CONSUMERS_, bool STREAM_ = false, int CTAS_ = 1, int QBUFS_ = 1, int BN_ = 128>
struct HopperShape {
  static constexpr bool kStream = STREAM_;
  static constexpr int kCtasPerSm = CTAS_;  // resident CTAs an SM is planned for
  static constexpr int KD = kStream ? 64 : KD_, KB = KD / 64;  // 64-column (128-byte) swizzle blocks per slot
  static constexpr int BM = 64;                                 // query rows per consumer warpgroup
  static constexpr int BN = BN_;                                // document rows per tile
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
  // document rows in one block, each slot's row scales (HopperRing::scales), and two query buffers.
  static constexpr int kDocBlocks = KB;         // 128-byte column blocks of a document tile
  static constexpr uint32_t kScaleBytes = 0;    // per slot
  static constexpr int kQueryBufs = QBUFS_;     // resident query buffers (ring)
  // pair grids: consecutive pairs of one query load it once (the consumers follow kTileQuery)
  static constexpr bool kQueryReuse = QBUFS_ > 1;
  static constexpr bool kWiden = false;         // a widening stage between the rings
  static constexpr bool kDocsAsA = false;       // documents are the MMAs' B operand (N = tile rows)
  static constexpr int kEmptyArrivals = kConsumers * 128;  // arrivals that free a producer slot
  static_assert(KD % 64 == 0 && KB >= 1 && KB <= 4, "KD");
  static_assert(QBUFS_ == 1 || (!STREAM_ && CONSUMERS_ == 1), "several query buffers: resident strided shapes");
  static_assert(BN_ == 128 || (BN_ == 64 && CONSUMERS_ == 1), "64-row tiles: strided shapes");
};

// What the producer read about the tile in a ring slot: its document (the consumers need no
// index reads of their own) and its place in it. A document with no rows (or bad offsets)
// still gets one slot, with no data, so that its step reaches the epilogue.
struct TileInfo {
  int64_t doc, len;  // len: the document's rows (0 when bad)
  int32_t tile;      // index within the document
  int32_t flags;     // kTileOk: offsets valid; kTileLast: the document's last tile; and back()
  int32_t qlen;      // strided walks (a query per step): the query's length (StepRows::qlen)
  int32_t scale_shift;  // byte shape: where the tile's first row scale sits in the slot's scales
  // Rows the slot starts before row tile * BN: a short last tile's window (tail_back). In
  // flags' high bits, so that the one shuffle making flags warp-uniform covers it.
  __device__ __forceinline__ int back() const { return flags >> kTileBackShift; }
  __device__ __forceinline__ int first_row(int bn) const { return tile * bn - back(); }
  static constexpr int kTileBackShift = 8;
};
// kTileQuery: the step's first tile, when the producer loaded the step a new query (the byte
// shape's consumers wait for it and permute it; the other shapes load one at every set).
constexpr int32_t kTileOk = 1, kTileLast = 2, kTileQuery = 4;

// The resident shapes' query blocks (streamed shapes keep theirs in the ring slots).
template <class Shape, bool = Shape::kStream>
struct HopperQueryBlocks {
  alignas(1024) unsigned char query[Shape::kQueryBufs][Shape::kConsumers][Shape::kQueryBlockBytes];
};
template <class Shape>
struct HopperQueryBlocks<Shape, true> {};

// A ring of tile slots and their barriers: the producer's (TMA writes, consumers or a
// widening stage read), and for shapes with a widening stage the widened tiles' ring.
// Compressed tiles' row scales (SCALE_FLOATS a slot) sit beside the slots, not in them: a
// slot is a whole number of 1 KB swizzle atoms, and 272 to 528 bytes of scales in it cost a
// whole atom a slot. A TMA destination must be 128-byte aligned, so each slot's scales start
// on 128 bytes. Readers of a slot through generic loads (the byte kernel's consumers, the
// widening warps) fence the async proxy before releasing it: the next TMA into the slot is
// an async-proxy write.
// (Bases, so that the slots come first and a ring of 16-bit tiles has no scales array.)
template <int STAGES, uint32_t SLOT_BYTES>
struct HopperRingSlots {
  alignas(1024) unsigned char slot[STAGES][SLOT_BYTES];
};
template <int STAGES, int SCALE_FLOATS>
struct HopperRingScales {
  static constexpr int kScaleStride = (SCALE_FLOATS + 31) / 32 * 32;  // floats, 128-byte steps
  alignas(128) float scales[STAGES][kScaleStride];
};
template <int STAGES>
struct HopperRingScales<STAGES, 0> {};

template <int STAGES, uint32_t SLOT_BYTES, int SCALE_FLOATS = 0>
struct HopperRing : HopperRingSlots<STAGES, SLOT_BYTES>, HopperRingScales<STAGES, SCALE_FLOATS> {
  static constexpr int kStages = STAGES;
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
  HopperRing<Shape::kStages, Shape::kSlotBytes, Shape::kScaleBytes / 4> ring;
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
  left = static_cast<int>(left64 < bn ? left64 : bn) + info.back();
  return info;
}

// The document rows a tile's MMAs take, given `left` rows of its document in the tile (at most
// BN): short last tiles get narrower MMAs (64 or, on the bounded-load grids at one CTA an SM,
// 32 columns), except in the streamed shapes with several consumers (no narrow path there);
// the byte shape, whose documents are the MMAs' 64-row A operand, takes 64-row halves. The
// producer moves a short last tile's window back to end at the document's last row by this
// rule (tail_back) and the consumers pick their MMA by it, so both read it from here.
template <class Shape, class Policy>
__host__ __device__ constexpr int tile_mma_rows(int left) {
  if constexpr (Shape::kDocsAsA) {
    return left <= 64 ? 64 : Shape::BN;
  } else {
    constexpr bool narrow = (!Shape::kStream || Shape::kConsumers == 1) && Shape::BN > 64;
    constexpr bool narrow32 = narrow && Policy::kBoundedLoads && Shape::kCtasPerSm == 1;
    return narrow32 && left <= 32 ? 32 : narrow && left <= 64 ? 64 : Shape::BN;
  }
}

struct WarpgroupSync {
  int id;
  __device__ __forceinline__ void operator()() const { named_barrier(id, 128); }
};

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

}  // namespace kernel
}  // namespace maxsim_cuda
