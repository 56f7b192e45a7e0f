// The padded and packed forward on sm_90a for compressed documents (int8 / e4m3 with row
// scales, 64 < dim <= 128): the sm_90a producer and step walk (hopper_producer.cuh,
// hopper_scheduler.cuh), with the roles of the operands swapped so that the document bytes
// never go back to shared memory as 16-bit values.
//
// wgmma takes its B operand from shared memory as 16-bit values only, but its A operand may
// come from registers. So here the documents are A: per 128-row tile a consumer thread reads
// its rows' bytes (TMA put them in the slot, 128-byte swizzled), widens them in registers
// into A fragments, and m64nNk16 chains (N = 32 query rows; at 64, two 32-column chains a half,
// each fold under the next chain) multiply them with the
// step's query, which is B. The accumulator is S^T: rows are document rows, columns query
// rows, so each thread keeps a running (max, argmax) per query column over its own document
// rows (the per-element scale first, fold_tile over its four rows of a tile), and the max over
// a document happens once per step: quad shuffles and a four-warp merge, then the shared
// epilogue (split steps, for calls of few long steps: two warpgroups take a step's tiles by
// parity and warpgroup 0 merges all eight warps). The slot is released as soon as its bytes
// and scales are in registers (with the proxy fence: release_after_reads). A slot holds the
// tile's bytes; the ring keeps its row scales beside it, loaded from the first row
// rounded down to a multiple of 4 (a TMA box must start 16-byte aligned: an unaligned start
// faults with an illegal instruction), TileInfo::scale_shift saying where the first row's
// scale is.
//
// The k permutation. A lane's A fragment holds, per k16 step s, columns 16s + 2t + {0, 1}
// (a0, a1) and 16s + 8 + 2t + {0, 1} (a2, a3) of its rows (t = lane % 4). Reading those from
// a byte row would take 2-byte loads; instead logical column 16s + 8h + 2t + e stands for
// physical column 32t + 4s + 2h + e, so lane t's eight words are the row's 32 bytes
// [32t, 32t + 32): two 16-byte shared loads a row, word s widening to (a0, a2) or (a1, a3)
// as widen_word's (lo, hi). The query gets the same permutation: at each new query the
// consumers copy the raw TMA block (two query buffers, so the producer loads the next one
// while this one is scored) into the permuted, swizzled B block, 4-byte pairs at a time.
// A new query is the producer's call (kTileQuery on the step's first tile): a CTA walks runs
// of consecutive steps (hopper_query_run), and the steps of a run that share their query
// (a padded query's candidates; a pair list's consecutive pairs of one query) load and
// permute it once.
// Columns past dim are zeros in both operands (TMA fills them), so dim <= 128 takes the same
// eight k-steps; dim <= 64 would load an all-outside query box and stays with mma.sync.
//
// Exactness as for the mma.sync kernels: the values are exact in 16 bits, the products
// accumulate in fp32 and each similarity is multiplied by its row's scale before the max.
// Torch-free.
#pragma once

#include "doc_format.cuh"
#include "epilogue.cuh"
#include "hopper_epilogue.cuh"
#include "hopper_launch.cuh"
#include "hopper_pipeline.cuh"
#include "hopper_primitives.cuh"
#include "hopper_producer.cuh"
#include "hopper_scheduler.cuh"
#include "timeline.cuh"

namespace maxsim_cuda {
namespace kernel {

// N_ query rows (32: Lq <= 32, 64: 64-row chunks), document tiles of BN_ rows (128: two
// 64-row halves, 64: one), CTAS_ resident CTAs an SM is planned for, SPLIT_ consumer
// warpgroups sharing each step (2: they take its tiles by parity, for calls with fewer
// steps than SMs, where one warpgroup a CTA leaves the SMs' issue slots idle).
template <int N_, int STAGES_, int BN_ = 128, int CTAS_ = 2, int SPLIT_ = 1>
struct HopperByteShape {
  static constexpr bool kStream = false;
  static constexpr int kCtasPerSm = CTAS_;
  static constexpr int KD = 128, KB = 2;  // the query's two 64-column blocks
  static constexpr int BM = 64;           // query block rows (hopper_blocks, the epilogue)
  static constexpr int kQueryRows = N_;   // rows the MMAs take: Lq <= 32, or 64-row chunks
  static constexpr int BN = BN_, NT = N_ / 8, kHalves = BN_ / 64;
  static constexpr int kConsumers = 1, kStages = STAGES_;  // one query block a step
  static constexpr int kSplit = SPLIT_;
  static constexpr int kThreads = kSplit * 128 + 32;
  static constexpr int kProducerWarp = kSplit * 4;
  static constexpr uint32_t kRowBytes = 128;
  // a raw query buffer: the N rows the MMAs take (bounded loads fill 32-row boxes)
  static constexpr uint32_t kQueryBlockBytes = KB * N_ * kRowBytes;
  static constexpr uint32_t kDocBytes = BN * kRowBytes;  // BN rows of <= 128 bytes
  static constexpr uint32_t kQueryInSlot = 0;
  static constexpr int kDocBlocks = 1;
  static constexpr int kScaleBox = BN + 4;  // the tile's scales from its row rounded down to 4
  static constexpr uint32_t kScaleBytes = kScaleBox * sizeof(float);  // a slot's, beside it in the ring
  static constexpr uint32_t kSlotBytes = kDocBytes;
  static constexpr int kQueryBufs = 2;
  static constexpr bool kQueryReuse = true;  // a query is loaded and permuted at kTileQuery only
  static constexpr bool kWiden = false;
  static constexpr bool kDocsAsA = true;  // 64-row halves of a tile are the MMAs' A operand
  static constexpr int kEmptyArrivals = kSplit * 128;  // every warpgroup reads every slot's TileInfo
  // split steps: warpgroup 0 merges a step's parts while warpgroup 1 goes on to the next
  // step, so the parts alternate between two buffers by step
  static constexpr int kPartBufs = kSplit == 2 ? 2 : 1;
  struct ConsumerSmem {
    alignas(1024) unsigned char qperm[KB * N_ * 128];  // the permuted query (B), 128-byte swizzled
    float part_m[kPartBufs][kSplit * 4][N_];           // each warp's column maxima of a step
    int part_i[kPartBufs][kSplit * 4][N_];
  };
  static_assert(N_ == 32 || N_ == 64, "N");
  static_assert(BN_ == 64 || BN_ == 128, "BN");
  static_assert(SPLIT_ == 1 || SPLIT_ == 2, "SPLIT");
};

// The raw query block (TMA layout: [2][N rows][128 B], chunk c of row n at c ^ (n % 8)) into
// the permuted B block ([2][N rows][128 B], same swizzle). Physical 4-byte pair P = 16t + 2s + h
// goes to logical pair 8s + 4h + t; a thread moves one 16-byte chunk (4 pairs) at a time.
template <int N, int THREADS>
__device__ __forceinline__ void permute_query(uint32_t raw, uint32_t perm, int tid) {
#pragma unroll
  for (int k = tid; k < N * 16; k += THREADS) {
    const int n = k / 16, c = k % 16;  // physical columns 8c .. 8c + 7 of query row n
    const uint4 v = ld_shared_v4(raw + uint32_t((c / 8) * N * 128 + n * 128 + (((c % 8) ^ (n % 8)) * 16)));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int u = 16 * (c % 4) + 8 * (i / 2) + 4 * (i % 2) + c / 4;  // logical pair
      const int ub = u % 32;
      const uint32_t dst = perm + uint32_t((u / 32) * N * 128 + n * 128 + (((ub / 4) ^ (n % 8)) * 16) + (ub % 4) * 4);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(w[i]) : "memory");
    }
  }
}

// Keeps an A register's value in place until the wgmma reading it has been waited for.
__device__ __forceinline__ void fence_a(uint32_t (&a)[8][4]) {
#pragma unroll
  for (int s = 0; s < 8; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[s][i])::"memory");
}

// One 64-row half of a tile: the thread's two rows' 32 bytes each (rows r and r + 8 of the
// half's warp block) widened into the A fragments of the eight k-steps.
template <class T, DocFormat F>
__device__ __forceinline__ void widen_half(const uint4 (&raw)[2][2], uint32_t (&a)[8][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t w[8] = {raw[h][0].x, raw[h][0].y, raw[h][0].z, raw[h][0].w,
                           raw[h][1].x, raw[h][1].y, raw[h][1].z, raw[h][1].w};
#pragma unroll
    for (int s = 0; s < 8; ++s) widen_word<T, F>(w[s], a[s][h], a[s][2 + h]);
  }
}

// The half's MMAs against query rows row0 .. row0 + NC of the permuted B block of N rows
// (row0 a multiple of 8: a whole number of 1 KB swizzle atoms, so the descriptor only moves).
template <class T, int N, int NC = N>
__device__ __forceinline__ void half_mma(float (&acc)[NC / 8][4], const uint32_t (&a)[8][4], uint32_t perm,
                                         int row0 = 0) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const uint64_t b =
        sw128_desc(perm + uint32_t((s / 4) * N * 128 + row0 * 128)) + uint64_t(((s % 4) * 32) >> 4);
    WgmmaM64RegA<T, NC>::run(acc, a[s], b, s != 0);
  }
}

// Running (max, argmax) per query column of this thread: columns nt * 8 + 2 * (lane % 4) + e.
template <int NT>
struct ColumnMax {
  float m[NT][2];
  int idx[NT][2];
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        m[nt][e] = neg_inf<float>();
        idx[nt][e] = kNoIndex;
      }
  }
  // H halves' rows of this thread (acc[j] and sc[j] from half H0 + j; local rows row0 +
  // {0, 8} + 64 * half, increasing), scaled, rows at or past `left` masked by select; query
  // columns NT0 * 8 .. (NT0 + NTC) * 8 (all of them by default; a 32-column chain's
  // accumulator holds NTC = NT / 2 of them).
  template <int H0, int H, bool MASK, bool INDEX, int NT0 = 0, int NTC = NT>
  __device__ __forceinline__ void fold(const float (&acc)[H][NTC][4], const float (&sc)[H][2], int row0, int left,
                                       int col_base) {
    static_assert(NT0 + NTC <= NT, "columns");
    int col[2 * H];
#pragma unroll
    for (int k = 0; k < 2 * H; ++k) col[k] = (H0 + k / 2) * 64 + 8 * (k % 2);
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v[2 * H];
#pragma unroll
        for (int k = 0; k < 2 * H; ++k) {
          const float x = acc[k / 2][nt][2 * (k % 2) + e] * sc[k / 2][k % 2];
          v[k] = (MASK && row0 + col[k] >= left) ? neg_inf<float>() : x;
        }
        fold_tile<2 * H, INDEX>(m[NT0 + nt][e], idx[NT0 + nt][e], v, col, col_base);
      }
  }
  template <int H0, int H, bool MASK>
  __device__ __forceinline__ void fold(const float (&acc)[H][NT][4], const float (&sc)[H][2], int row0, int left,
                                       int col_base, bool index) {
    index ? fold<H0, H, MASK, true>(acc, sc, row0, left, col_base)
          : fold<H0, H, MASK, false>(acc, sc, row0, left, col_base);
  }
  // Query columns NT0 * 8 .. (NT0 + NTC) * 8 of half H0's rows (acc from an MMA into those
  // columns alone): fold's per-column work, so the results are its bits.
  template <int NT0, int NTC, int H0>
  __device__ __forceinline__ void fold_columns(const float (&acc)[NTC][4], const float (&sc)[2], int row0, int left,
                                               int col_base, bool mask, bool index) {
    const auto& a = reinterpret_cast<const float(&)[1][NTC][4]>(acc);
    const auto& s = reinterpret_cast<const float(&)[1][2]>(sc);
    if (mask) {
      index ? fold<H0, 1, true, true, NT0, NTC>(a, s, row0, left, col_base)
            : fold<H0, 1, true, false, NT0, NTC>(a, s, row0, left, col_base);
    } else {
      index ? fold<H0, 1, false, true, NT0, NTC>(a, s, row0, left, col_base)
            : fold<H0, 1, false, false, NT0, NTC>(a, s, row0, left, col_base);
    }
  }
  // The warp's maxima of each column over its lanes' rows (merge_lanes across the eight
  // lanes of a column), written by the lanes of row group 0 into the warp's parts. One loop
  // nest per INDEX: one nest branching on a runtime flag at every merge built to a kernel
  // whose argmax form lost lanes 4-7's rows on an H200 (2026-11-26; the score-only form was
  // right, and the same source with an unrelated branch added was right too). Cause not found.
  template <bool INDEX>
  __device__ __forceinline__ void to_warp_parts(float* part_m, int* part_i, int g, int t4) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
#pragma unroll
        for (int o = 4; o < 32; o *= 2) merge_lanes<INDEX>(m[nt][e], idx[nt][e], o);
        if (g == 0) {
          part_m[nt * 8 + 2 * t4 + e] = m[nt][e];
          if (INDEX) part_i[nt * 8 + 2 * t4 + e] = idx[nt][e];
        }
      }
  }
};

template <class T, DocFormat F, class Shape, class Policy>
__device__ __forceinline__ void hopper_consume_bytes(HopperSmem<Shape>& sm, const HopperParams<Policy>& hp,
                                                     StepRange range) {
  static_assert(Policy::kStrided && Shape::kConsumers == 1, "padded and packed grids");
  constexpr int S = Shape::kStages, BN = Shape::BN, N = Shape::kQueryRows, NT = Shape::NT, W = Shape::kSplit;
  const Policy& pol = hp.pol;
  const int tid = threadIdx.x % 128, warp = uniform(tid / 32), lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int wg = uniform(static_cast<int>(threadIdx.x / 128));  // split steps: the tile parity it takes
  auto& epi = sm.epi[0];
  const WarpgroupSync sync{1};  // warpgroup 0's (the epilogue's)
  // split steps: both warpgroups (a new query's permutation; a step's parts)
  auto both = [] { named_barrier(2, 256); };
  const uint32_t perm = smem_addr(sm.qperm);
  const int row0 = warp * 16 + g;  // this thread's first row of a tile (then + 8, + 64, + 72)
  const bool index = hp.ep.with_argmax;
  ColumnMax<NT> cm;
  float carry = 0.f;
  int it = 0;
  int64_t cur_set = -1, query = 0, chunk = 0;
  uint32_t qround = 0;
  int parts = 0;  // the step's part buffer
  for (StepWalk<true> walk(range, pol.Nb, hp.runs); walk.more(); walk.next()) {
    const int64_t qb = walk.set, n = walk.n;  // one 64-row block per set
    if (hp.nchunks > 1 && qb != cur_set) {
      cur_set = qb;
      query = div_nonneg(qb, hp.nchunks);
      chunk = qb - query * hp.nchunks;
    }
    int left;
    TileInfo info = next_tile(sm.ring, it, BN, left);
    if (threadIdx.x == 0) timeline_stamp(kTlFirstTile);
    if (info.flags & kTileQuery) {  // the producer loaded a new query for this step
      const int buf = static_cast<int>(qround % 2);
      mbar_wait(smem_addr(&sm.qfull[buf]), (qround / 2) & 1);
      if (threadIdx.x == 0) timeline_stamp(kTlQuery);
      ++qround;
      // every thread is past the last step's MMAs (its epilogue's barriers; split steps: the
      // step's end, where both warpgroups meet), so qperm is free
      permute_query<N, W * 128>(smem_addr(sm.query[buf][0]), perm, static_cast<int>(threadIdx.x));
      // one fence for both proxies' orders: the permuted query's generic writes before the
      // MMAs' async reads, and the raw buffer's generic reads before the producer's next TMA
      fence_proxy_async();
      if constexpr (W == 2) {
        both();
        if (wg == 0) mbar_arrive(smem_addr(&sm.qempty[buf]));  // (128 arrivals)
      } else {
        mbar_arrive(smem_addr(&sm.qempty[buf]));
        sync();
      }
    }
    cm.reset();
    for (;; info = next_tile(sm.ring, it, BN, left)) {
      const int stage = it % S;
      if (left <= 0 || (W == 2 && (info.tile & 1) != wg)) {  // no rows, or the other warpgroup's
        mbar_arrive(smem_addr(&sm.ring.empty[stage]));
        ++it;
        if (info.flags & kTileLast) break;
        continue;
      }
      constexpr int HV = Shape::kHalves;
      const bool two = HV == 2 && left > 64;  // uniform: the second half has rows
      const uint32_t slot = smem_addr(sm.ring.slot[stage]), scales = smem_addr(sm.ring.scales[stage]);
      uint4 raw[HV][2][2];
      float sc[HV][2];
#pragma unroll
      for (int hh = 0; hh < HV; ++hh) {
        if (hh == 1 && !two) break;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = hh * 64 + row0 + 8 * h;  // r % 8 == g
          raw[hh][h][0] = ld_shared_v4(slot + uint32_t(r * 128 + (((2 * t4) ^ g) * 16)));
          raw[hh][h][1] = ld_shared_v4(slot + uint32_t(r * 128 + (((2 * t4 + 1) ^ g) * 16)));
          sc[hh][h] = __uint_as_float(ld_shared_u32(scales + uint32_t(4 * (r + info.scale_shift))));
        }
      }
      release_after_reads(smem_addr(&sm.ring.empty[stage]));  // the bytes and scales are in registers
      ++it;
      const int col_base = info.first_row(BN) + row0;
      if constexpr (N == 32 && HV == 2) {
        // both halves' MMAs in flight, one fold over the thread's four rows
        float acc[2][NT][4];
        uint32_t a0[8][4], a1[8][4];
        widen_half<T, F>(raw[0], a0);
        fence_registers(acc[0]);
        wgmma_fence();
        half_mma<T, N>(acc[0], a0, perm);
        wgmma_commit();
        if (two) {
          widen_half<T, F>(raw[1], a1);
          fence_registers(acc[1]);
          wgmma_fence();  // a1 was written after the first fence
          half_mma<T, N>(acc[1], a1, perm);
          wgmma_commit();
        }
        wgmma_wait<0>();
        fence_registers(acc[0]);
        fence_a(a0);
        if (two) {
          fence_registers(acc[1]);
          fence_a(a1);
          if (left >= BN) {
            cm.template fold<0, 2, false>(acc, sc, row0, left, col_base, index);
          } else {
            cm.template fold<0, 2, true>(acc, sc, row0, left, col_base, index);
          }
        } else {
          const float(&sc0)[1][2] = reinterpret_cast<const float(&)[1][2]>(sc[0]);
          cm.template fold<0, 1, true>(reinterpret_cast<const float(&)[1][NT][4]>(acc[0]), sc0, row0, left, col_base,
                                       index);
        }
      } else if constexpr (N == 64) {
        static_assert(HV == 2, "every 64-query-row shape has 128-row tiles");
        // 64 query rows: both halves in flight need ~200 registers (the split shape's nine
        // warps are three on some scheduler, which caps a thread at 168), so a half's MMAs run
        // as two 32-column chains into the same 32 accumulator registers, and each fold runs
        // under the next chain: the left columns' fold under the right columns' MMAs, the
        // right columns' under the next half's left ones.
        constexpr int NC = 4;  // 8-column blocks a chain
        float acc_l[NC][4], acc_r[NC][4];
        uint32_t a[8][4];
        const auto chain = [&](float(&acc)[NC][4], int first_row) {
          fence_registers(acc);
          wgmma_fence();
          half_mma<T, N, 32>(acc, a, perm, first_row);
          wgmma_commit();
        };
        widen_half<T, F>(raw[0], a);
        chain(acc_l, 0);
        chain(acc_r, 32);
        wgmma_wait<1>();
        fence_registers(acc_l);
        const bool mask0 = left < 64, mask1 = left < BN;
        cm.template fold_columns<0, NC, 0>(acc_l, sc[0], row0, left, col_base, mask0, index);
        wgmma_wait<0>();
        fence_registers(acc_r);
        fence_a(a);
        if (two) {
          widen_half<T, F>(raw[1], a);
          chain(acc_l, 0);
          cm.template fold_columns<NC, NC, 0>(acc_r, sc[0], row0, left, col_base, mask0, index);
          chain(acc_r, 32);
          wgmma_wait<1>();
          fence_registers(acc_l);
          cm.template fold_columns<0, NC, 1>(acc_l, sc[1], row0, left, col_base, mask1, index);
          wgmma_wait<0>();
          fence_registers(acc_r);
          fence_a(a);
          cm.template fold_columns<NC, NC, 1>(acc_r, sc[1], row0, left, col_base, mask1, index);
        } else {
          cm.template fold_columns<NC, NC, 0>(acc_r, sc[0], row0, left, col_base, mask0, index);
        }
      } else {
        // one half at a time: 64-row tiles (three CTAs an SM: 136 registers a thread)
#pragma unroll
        for (int hh = 0; hh < HV; ++hh) {
          if (hh == 1 && !two) break;
          float acc[1][NT][4];
          uint32_t a[8][4];
          widen_half<T, F>(raw[hh], a);
          fence_registers(acc[0]);
          wgmma_fence();
          half_mma<T, N>(acc[0], a, perm);
          wgmma_commit();
          wgmma_wait<0>();
          fence_registers(acc[0]);
          fence_a(a);
          const float(&sch)[1][2] = reinterpret_cast<const float(&)[1][2]>(sc[hh]);
          if (hh == 0) {
            left >= 64 ? cm.template fold<0, 1, false>(acc, sch, row0, left, col_base, index)
                       : cm.template fold<0, 1, true>(acc, sch, row0, left, col_base, index);
          } else {
            left >= BN ? cm.template fold<1, 1, false>(acc, sch, row0, left, col_base, index)
                       : cm.template fold<1, 1, true>(acc, sch, row0, left, col_base, index);
          }
        }
      }
      if (info.flags & kTileLast) break;
    }
    if (tid == 0) timeline_stamp(wg == 0 ? kTlChainEnd0 : kTlChainEnd1);
    // The step's column maxima: over the eight lanes of a column, then over the four warps
    // (eight for split steps; a call without argmax merges the maxima alone).
    float(&part_m)[W * 4][N] = sm.part_m[parts];
    int(&part_i)[W * 4][N] = sm.part_i[parts];
    index ? cm.template to_warp_parts<true>(part_m[wg * 4 + warp], part_i[wg * 4 + warp], g, t4)
          : cm.template to_warp_parts<false>(part_m[wg * 4 + warp], part_i[wg * 4 + warp], g, t4);
    if constexpr (W == 2) {
      both();
      parts ^= 1;
      if (wg == 1) continue;  // warpgroup 0 finishes the step
    } else {
      sync();
    }
    if (tid < 64) {
      float m = neg_inf<float>();
      int idx = kNoIndex;
      if (tid < N) {
        if (hp.ep.with_argmax) {
#pragma unroll
          for (int w = 0; w < W * 4; ++w) merge(m, idx, part_m[w][tid], part_i[w][tid]);
        } else {
#pragma unroll
          for (int w = 0; w < W * 4; w += 4) {
            m = max_nan(m, max_nan(max_nan(part_m[w][tid], part_m[w + 1][tid]),
                                   max_nan(part_m[w + 2][tid], part_m[w + 3][tid])));
          }
        }
      }
      epi.red_m[tid] = m;
      epi.red_i[tid] = idx;
    }
    const bool ok = (info.flags & kTileOk) != 0;
    const int64_t qlen0 = int64_t(info.qlen);
    if (hp.nchunks > 1) {
      const StepDesc d = pol.step_at(query, n, ok, 0, info.len, qlen0);
      finish_query_chunk(epi, hp, d, query, chunk, n, tid, sync);
    } else {
      const StepDesc d = pol.step_at(qb, n, ok, 0, info.len, qlen0);
      finish_chunk<float, Shape::BM, 1, 128>(epi, d, 0, 1, carry, hp.ep, tid, sync);
    }
    if (tid == 0) {
      timeline_stamp(kTlEnd);
      timeline_stamp_ns(kTlEndNs);
    }
  }
}

template <class T, DocFormat F, class Shape, class Policy>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kCtasPerSm)
    maxsim_forward_hopper_bytes_kernel(const HopperParams<Policy> hp, const __grid_constant__ CUtensorMap qmap,
                                       const __grid_constant__ CUtensorMap dmap,
                                       const __grid_constant__ CUtensorMap tmap,
                                       const __grid_constant__ CUtensorMap smap) {
#if MAXSIM_HAS_WGMMA
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t pad = ((smem_addr(smem_raw) + 1023u) & ~1023u) - smem_addr(smem_raw);
  auto& sm = *reinterpret_cast<HopperSmem<Shape>*>(smem_raw + pad);
  const StepRange range = walk_range<true>(hp.sets * hp.pol.Nb);
  if (range.begin >= range.end) return;
  if (threadIdx.x == 0) timeline_start();
  hopper_init_barriers<Shape>(sm);
  if (uniform(threadIdx.x / 32) == Shape::kProducerWarp) {
    if (threadIdx.x % 32 == 0) hopper_produce<Shape>(sm, hp, range, &qmap, &dmap, &tmap, &smap);
    return;
  }
  wait_prior_grids();  // before the epilogue's global writes
  hopper_consume_bytes<T, F, Shape>(sm, hp, range);
#endif
}

// ---- host ----

// Whether this kernel takes the call: compressed documents, padded or packed, 64 < dim <= 128
// with rows a multiple of 16 bytes (TMA strides), the tensors 16-byte aligned.
inline bool hopper_bytes_applies(const ForwardParams& p) {
  const bool strided = p.surface == Surface::kPadded || p.surface == Surface::kPacked;
  return p.doc_format != DocFormat::kNative && strided && p.dim > 64 && p.dim <= 128 && p.dim % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.doc_scales) % 16 == 0 && hopper_call_fits(p);
}

// Which calls this kernel takes by default: every call it applies to. Lq <= 32, H200, int8, GPU
// time this kernel (64-row tiles) / mma.sync (2026-11-26): HeavyRerank (Ld 256) 40.4 / 60.7 us,
// Rerank (180) 18.9 / 33.2, SmallRerank (180) 6.6 / 9.9, Ld 64 21.4 / 40.4, ColPaliRerank (1030,
// 128-row tiles) 44.8 / 62.5. Lq 64 (64-row query chunks, 128-row tiles), H200, int8,
// tools/device/probe_long_steps.py, B x C = 8 x 16 (the split shape) and 32 x 16 (2026-11-28):
// padded Ld 64 5.19 / 5.56 and 7.92 / 9.61 us, Ld 256 6.28 / 8.67 and 11.77 / 18.18, Ld 384
// 7.10 / 10.57 and 14.25 / 24.36; packed Ld 64 5.25 / 5.60 and 7.94 / 10.20, Ld 256 6.40 / 8.59
// and 11.67 / 18.62, Ld 384 7.12 / 10.64 and 14.15 / 24.37 (packed calls took mma.sync below
// 300 rows on average until then). MAXSIM_CUDA_HOPPER_BYTES=0 leaves every call to mma.sync
// (read per call: tests and comparisons); =1, which the comparison scripts set, is the default.
inline bool hopper_bytes_wanted(const ForwardParams&) {
  const char* e = std::getenv("MAXSIM_CUDA_HOPPER_BYTES");
  return e == nullptr || e[0] != '0';
}

// Lq <= 32: 64-row tiles at three CTAs an SM, or 128-row tiles at two for documents of 512
// rows or more on average, where the fewer steps' tiles stream better (H200, int8, 64 / 128:
// HeavyRerank 40.4 / 43.7 us, Rerank 18.9 / 22.5, SingleQueryRerank (300) 16.5 / 16.3,
// ColPaliRerank 45.5 / 44.8). MAXSIM_CUDA_HOPPER_BYTES_TILE=64 | 128 forces one (read per call).
inline bool hopper_bytes_short_tiles(const ForwardParams& p) {
  const char* e = std::getenv("MAXSIM_CUDA_HOPPER_BYTES_TILE");
  if (e != nullptr && (e[0] == '6' || e[0] == '1')) return e[0] == '6';
  return average_doc_rows(p) < 512;
}

// Lq > 32 (64-row query chunks): calls with at most one step an SM split each step's tiles
// between two consumer warpgroups of a CTA (one CTA an SM): with one warpgroup a CTA such a
// call leaves half the planned CTA slots empty and its warps' issue slots idle.
// MAXSIM_CUDA_HOPPER_BYTES_SPLIT=0 | 1 forces it off or on (read per call).
inline bool hopper_bytes_split(const ForwardParams& v) {
  const char* e = std::getenv("MAXSIM_CUDA_HOPPER_BYTES_SPLIT");
  if (e != nullptr && (e[0] == '0' || e[0] == '1')) return e[0] == '1';
  const int64_t steps = hopper_blocks(v).blocks * (v.surface == Surface::kPacked ? 1 : v.cands);
  return steps <= v.num_sms;
}

template <class T, DocFormat F, class Shape, class Policy>
cudaError_t run_forward_hopper_bytes(const ForwardParams& p, const Policy& pol, const EpilogueArgs& ep, bool& ran) {
  ran = false;
  CUtensorMap qmap, dmap, tmap, smap;
  if (!rows_map<T>(qmap, p.queries, p.q_rows, p.dim, kBoxRows) ||
      !byte_rows_map(dmap, p.documents, p.d_rows, p.dim, Shape::BN) ||
      !byte_rows_map(tmap, p.documents, p.d_rows, p.dim, kBoxRows) ||
      !scales_map(smap, p.doc_scales, p.d_rows, Shape::kScaleBox)) {
    return cudaSuccess;  // not taken: the mma.sync kernels run instead
  }
  return launch_hopper<Shape, maxsim_forward_hopper_bytes_kernel<T, F, Shape, Policy>>(p, pol, ep, ran,
                                                                                        hopper_query_run("MAXSIM_CUDA_HOPPER_BYTES_RUN"), qmap, dmap,
                                                                                        tmap, smap);
}

}  // namespace kernel
}  // namespace maxsim_cuda
