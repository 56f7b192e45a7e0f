// The contrastive forward on sm_90a for compressed documents (int8 / e4m3 with row scales,
// 64 < dim <= 128): forward_hopper.cuh's resident kernel with a widening stage between the
// producer's ring and the consumers.
//
// Corpus scoring is tensor-core bound: every document tile feeds C consumer warpgroups' MMAs
// (C x 64 query rows), so the bytes saved matter less than keeping the MMAs fed, and the
// consumers must stay as they are for 16-bit documents. So the roles are those of the 16-bit
// kernel, plus one: the producer warp TMAs each tile's bytes (one 128 x 128-byte box,
// 128-byte swizzled) and its row scales into a ring slot; three widening warps turn the
// bytes into the 16-bit tile the MMAs read (the same 128-byte-swizzled image TMA would have
// written for 16-bit documents) in a second ring, copy the 128 scales after it, and hand the
// slot on; the consumers run the 16-bit kernel's loop on that ring, multiplying each
// similarity by its row's scale before the fold (hopper_tile_mma), then release it. The
// widening warps sit beside the producer warp, so the CTA is C + 1 warpgroups; they never
// touch the consumers' registers or barriers, and a slow consumer only holds up the
// widened ring, as it holds up the producer's ring in the 16-bit kernel. (FlashAttention-3's
// fp8 V transpose by the producer warpgroup is the pattern.)
//
// Exactness as for every compressed kernel: byte values are exact in 16 bits, products
// accumulate in fp32 and the scale multiplies the similarity before the max.
// Torch-free.
#pragma once

#include "doc_format.cuh"
#include "forward_hopper.cuh"

namespace maxsim_cuda {
namespace kernel {

template <DocFormat F, int CONSUMERS_, int RAW_STAGES_, int WIDE_STAGES_>
struct HopperWidenShape {
  static constexpr DocFormat kFormat = F;
  static constexpr bool kStream = false;
  static constexpr int kCtasPerSm = 1;
  static constexpr int KD = 128, KB = 2;  // 16-bit query blocks and widened tiles: two 64-column blocks
  static constexpr int BM = 64, BN = 128, NT = BN / 8;
  static constexpr int kConsumers = CONSUMERS_, kStages = RAW_STAGES_, kWideStages = WIDE_STAGES_;
  static constexpr int kProducerWarp = kConsumers * 4;  // then the widening warps
  static constexpr int kWidenThreads = 96;  // three warps
  static constexpr int kThreads = kConsumers * 128 + 32 + kWidenThreads;
  static constexpr uint32_t kRowBytes = 128;
  static constexpr uint32_t kQueryBlockBytes = KB * BM * kRowBytes;
  // the producer's ring: a tile's bytes; beside the slot, its row scales from the row rounded down to 4
  static constexpr int kDocBlocks = 1;
  static constexpr uint32_t kDocBytes = BN * kRowBytes;
  static constexpr uint32_t kQueryInSlot = 0;
  static constexpr int kScaleBox = BN + 4;
  static constexpr uint32_t kScaleBytes = kScaleBox * sizeof(float);  // a slot's, beside it in the ring
  static constexpr uint32_t kSlotBytes = kDocBytes;
  static constexpr int kQueryBufs = 1;
  static constexpr bool kQueryReuse = false;
  static constexpr bool kWiden = true;
  static constexpr bool kDocsAsA = false;
  static constexpr int kEmptyArrivals = kWidenThreads;
  // the widened ring: the 16-bit tile, then its 128 row scales
  static constexpr uint32_t kWideTileBytes = KB * BN * kRowBytes;
  static constexpr uint32_t kWideScaleOffset = kWideTileBytes;
  static constexpr uint32_t kWideSlotBytes = kWideTileBytes + 1024;
  struct ConsumerSmem {
    HopperRing<kWideStages, kWideSlotBytes> wide;
  };
};

// The widening warps (wtid 0 .. 95): every slot of the producer's ring, in order, into the
// widened ring. A slot without data passes its TileInfo on alone.
//
// Who widens what. Chunk c (bytes 16c ..) of byte row r sits at chunk c ^ (r % 8) of the row
// and widens to 16-bit chunks 2(c % 4) + {0, 1} of column block c / 4, each at its own
// chunk ^ (r % 8). Eight lanes (one shared-memory wavefront) take chunks 0-3 of one row of a
// pair and 4-7 of the other, so their loads cover both halves of the swizzle and their
// stores land in distinct banks; 96 threads cover 12 rows a pass. 12 is 4 mod 8, so a
// thread's swizzle phase only alternates between two values and every address is a constant
// offset from a few registers: the tile is one unrolled run of eleven passes.
template <class T, class Shape, class Policy>
__device__ __forceinline__ void hopper_widen(HopperSmem<Shape>& sm, const HopperParams<Policy>& hp, StepRange range,
                                             int wtid) {
  constexpr int S = Shape::kStages, W = Shape::kWideStages, BN = Shape::BN;
  static_assert(Shape::kWidenThreads == 96 && BN == 128, "12 rows a pass, 11 passes");
  constexpr int kPasses = 11, kPassBytes = 12 * 128;
  const int q = wtid / 8, l = wtid % 8;
  const int r0 = 2 * (q / 2) + l / 4, c = l ^ (4 * (q % 2));
  const bool last_pass = r0 < 8;  // rows r0 + 120 < 128
  uint32_t src[2], dst_lo[2], dst_hi[2];
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const int x = (r0 % 8) ^ (4 * p), j = 2 * (c % 4);
    src[p] = uint32_t(r0 * 128 + ((c ^ x) * 16));
    dst_lo[p] = uint32_t((c / 4) * BN * 128 + r0 * 128 + ((j ^ x) * 16));
    dst_hi[p] = uint32_t((c / 4) * BN * 128 + r0 * 128 + (((j + 1) ^ x) * 16));
  }
  int it = 0;
  for (StepWalk<Policy::kStrided> walk(range, hp.pol.Nb, hp.runs); walk.more(); walk.next()) {
    TileInfo info;
    do {
      const int stage = it % S, ws = it % W;
      int left;
      info = next_tile(sm.ring, it, BN, left);
      mbar_wait(smem_addr(&sm.wide.empty[ws]), ((it / W) & 1) ^ 1);
      if (wtid == 0) sm.wide.info[ws] = info;
      if (info.len > 0) {  // the producer loaded the tile
        const uint32_t raw = smem_addr(sm.ring.slot[stage]), wide = smem_addr(sm.wide.slot[ws]);
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
          if (i + 1 < kPasses || last_pass) {
            const uint4 v = ld_shared_v4(raw + src[i % 2] + uint32_t(i * kPassBytes));
            uint4 lo, hi;
            widen_word<T, Shape::kFormat>(v.x, lo.x, lo.y);
            widen_word<T, Shape::kFormat>(v.y, lo.z, lo.w);
            widen_word<T, Shape::kFormat>(v.z, hi.x, hi.y);
            widen_word<T, Shape::kFormat>(v.w, hi.z, hi.w);
            st_shared_v4(wide + dst_lo[i % 2] + uint32_t(i * kPassBytes), lo);
            st_shared_v4(wide + dst_hi[i % 2] + uint32_t(i * kPassBytes), hi);
          }
        }
        for (int r = wtid; r < BN; r += Shape::kWidenThreads) {
          const uint32_t s = ld_shared_u32(smem_addr(sm.ring.scales[stage]) + uint32_t(4 * (r + info.scale_shift)));
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(wide + Shape::kWideScaleOffset + uint32_t(4 * r)),
                       "r"(s)
                       : "memory");
        }
        // the MMAs read the tile through the async proxy, and the producer's next TMA into the
        // raw slot must come after this thread's generic reads of it
        fence_proxy_async();
      }
      mbar_arrive(smem_addr(&sm.ring.empty[stage]));
      mbar_arrive(smem_addr(&sm.wide.full[ws]));
      ++it;
    } while (!(info.flags & kTileLast));
  }
}

template <class T, class Shape, class Policy>
__global__ void __launch_bounds__(Shape::kThreads, 1)
    maxsim_forward_hopper_widen_kernel(const HopperParams<Policy> hp, const __grid_constant__ CUtensorMap qmap,
                                       const __grid_constant__ CUtensorMap dmap,
                                       const __grid_constant__ CUtensorMap tmap,
                                       const __grid_constant__ CUtensorMap smap) {
#if MAXSIM_HAS_WGMMA
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t pad = ((smem_addr(smem_raw) + 1023u) & ~1023u) - smem_addr(smem_raw);
  auto& sm = *reinterpret_cast<HopperSmem<Shape>*>(smem_raw + pad);
  const StepRange range = walk_range<Policy::kStrided>(hp.sets * hp.pol.Nb);
  if (range.begin >= range.end) return;
  hopper_init_barriers<Shape>(sm);
  const int warp = uniform(static_cast<int>(threadIdx.x / 32));
  if (warp == Shape::kProducerWarp) {
    if (threadIdx.x % 32 == 0) hopper_produce<Shape>(sm, hp, range, &qmap, &dmap, &tmap, &smap);
    return;
  }
  if (warp > Shape::kProducerWarp) {
    hopper_widen<T, Shape>(sm, hp, range, static_cast<int>(threadIdx.x) - (Shape::kProducerWarp + 1) * 32);
    return;
  }
  wait_prior_grids();  // before the epilogue's global writes
  hopper_consume<T, Shape>(sm, hp, range);
#endif
}

// ---- host ----

// Whether this kernel takes the call: compressed documents, contrastive (over packed or
// padded documents), 64 < dim <= 128 with rows a multiple of 16 bytes (TMA strides).
// MAXSIM_CUDA_HOPPER_WIDEN=0 leaves every such call to the mma.sync kernels (read per call:
// tests and comparisons).
inline bool hopper_widen_applies(const ForwardParams& p) {
  const char* e = std::getenv("MAXSIM_CUDA_HOPPER_WIDEN");
  if (e != nullptr && e[0] == '0') return false;
  return p.doc_format != DocFormat::kNative && is_contrastive(static_cast<int>(p.surface)) && p.dim > 64 &&
         p.dim <= 128 && p.dim % 16 == 0 && reinterpret_cast<uintptr_t>(p.doc_scales) % 16 == 0 &&
         hopper_call_fits(p);
}

template <class T, class Shape, class Policy>
cudaError_t run_forward_hopper_widen(const ForwardParams& p, const Policy& pol, const EpilogueArgs& ep, bool& ran) {
  ran = false;
  CUtensorMap qmap, dmap, smap;
  if (!rows_map<T>(qmap, p.queries, p.q_rows, p.dim, Shape::BM) ||
      !byte_rows_map(dmap, p.documents, p.d_rows, p.dim, Shape::BN) ||
      !scales_map(smap, p.doc_scales, p.d_rows, Shape::kScaleBox)) {
    return cudaSuccess;  // not taken: the mma.sync kernels run instead
  }
  return launch_hopper<Shape, maxsim_forward_hopper_widen_kernel<T, Shape, Policy>>(p, pol, ep, ran, 1, qmap, dmap, dmap,
                                                                                    smap);
}

}  // namespace kernel
}  // namespace maxsim_cuda
