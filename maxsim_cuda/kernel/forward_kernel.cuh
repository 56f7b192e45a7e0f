// The forward kernel: one template for every surface (Policy) and mainloop (ML).
// A CTA walks its step range as one flat stream of document tiles
// (step -> M-chunk of the query block -> document tile); the producer runs kStages-1
// tiles ahead across step boundaries, the consumer reloads the query fragments only when
// the query block (or M-chunk) changes and runs the epilogue after the last tile of each
// (step, chunk). Block shapes and the choice among them: forward_configs.cuh. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../launch.h"
#include "epilogue.cuh"
#include "mainloop_mma.cuh"
#include "mainloop_mma_k.cuh"
#include "mainloop_simt.cuh"
#include "policies.cuh"
#include "scheduler.cuh"

namespace maxsim_cuda {
namespace kernel {

// A mainloop with a member kKChunk streams each document tile in K-chunks of that many
// columns (MmaKMainloop); the others see whole tiles.
template <class ML, class = void>
struct KSplit {
  static constexpr bool value = false;
  static constexpr int chunk = 0;
};
template <class ML>
struct KSplit<ML, std::void_t<decltype(ML::kKChunk)>> {
  static constexpr bool value = true;
  static constexpr int chunk = ML::kKChunk;
};

// KC > 0: each tile is walked as ceil(dim / KC) K-chunks (kc innermost); KC == 0: whole tiles.
// WINDOW: a document's short last tile ends at its last row (tile_back).
template <class Policy, int BM, int BN, int KC = 0, bool WINDOW = false>
struct TileStream {
  int64_t s, end;
  int64_t chunk, tile;
  int64_t ntiles, nchunks, load_rows;
  int64_t kc, nk, kchunks;  // K-split only
  StepDesc d;
  typename Policy::Ahead next;  // ahead(s + 1), read while step s runs
  bool valid;

  __device__ __forceinline__ void open(const Policy& pol) {
    d = pol.step(s, next);
    if (s + 1 < end) next = pol.ahead(s + 1);
    load_rows = d.bad ? 0 : d.dlen;
    if (d.nseg == 1 && d.qlen0 == 0) load_rows = 0;  // nothing to score: skip the document
    ntiles = load_rows > 0 ? (load_rows + BN - 1) / BN : 1;
    nchunks = d.nseg > 1 ? 1 : (d.qlen0 > 0 ? (d.qlen0 + BM - 1) / BM : 1);
    if constexpr (KC > 0) nk = load_rows > 0 ? kchunks : 1;  // an empty tile needs no K walk
  }
  __device__ __forceinline__ void start(const Policy& pol, StepRange r, int64_t dim = 0) {
    s = r.begin;
    end = r.end;
    chunk = tile = 0;
    if constexpr (KC > 0) {
      kc = 0;
      kchunks = dim > 0 ? (dim + KC - 1) / KC : 1;
    }
    valid = s < end;
    if (valid) {
      next = pol.ahead(s);
      open(pol);
    }
  }
  __device__ __forceinline__ void advance(const Policy& pol) {
    if constexpr (KC > 0) {
      if (++kc < nk) return;
      kc = 0;
    }
    if (++tile < ntiles) return;
    tile = 0;
    if (++chunk < nchunks) return;
    chunk = 0;
    if (++s < end) {
      open(pol);
    } else {
      valid = false;
    }
  }
  // A document of at least BN rows is walked in whole tiles: its short last tile (left rows,
  // 0 < left < BN) starts BN - left rows early, so that it ends at the document's last row.
  // The rows it takes again were folded by the tile before; a repeat changes neither the max
  // nor, ties going to the lowest index already held, the argmax. The fold then takes no mask,
  // and the copies read real rows (L2 hits) where they zero-filled. Shorter documents keep
  // one masked tile. The tensor-core mainloops take it, whose masked fold it saves; not the
  // K-split ones (their contrastive shape at 128 query rows spilled 4 bytes with it at sm_80),
  // nor the FFMA one, whose fold is not its cost and whose residual decode would redo rows.
  static constexpr bool kTailWindow = WINDOW;
  // The tile's first row within its document, the fold's index base: tile * BN, but at most
  // load_rows - BN (which only the last tile reaches), and 0 for a document shorter than BN.
  __device__ __forceinline__ int64_t tile_col0() const {
    if constexpr (!kTailWindow) return tile * BN;
    const int64_t c = tile * BN < load_rows - BN ? tile * BN : load_rows - BN;
    return c > 0 ? c : 0;
  }
  __device__ __forceinline__ int64_t tile_row0() const { return d.doc_row0 + tile_col0(); }
  __device__ __forceinline__ int tile_rows() const {
    if constexpr (kTailWindow) return load_rows >= BN ? BN : static_cast<int>(load_rows);  // shorter: one tile
    const int64_t left = load_rows - tile * BN;
    return static_cast<int>(left < 0 ? 0 : (left > BN ? BN : left));
  }
};

// Producer side of one pipeline stage: a whole document tile, or one K-chunk of a tile and
// of the query block (K-split mainloops).
template <class ML, class TS>
__device__ __forceinline__ void produce(const ML& ml, int stage, const TS& prod, const typename ML::Elem* queries,
                                        const typename ML::DocT* docs) {
  if constexpr (KSplit<ML>::value) {
    ml.load_chunk(stage, queries, docs, prod.d.q_row0 + prod.chunk * ML::BM, prod.tile_row0(), prod.tile_rows(),
                  prod.kc);
  } else {
    ml.load_tile(stage, docs, prod.tile_row0(), prod.tile_rows());
  }
}

// D: the documents' element type (T, or bytes of a compressed format with row scales).
template <class T, class D = T>
struct FwdArgs {
  const T* queries;
  const D* documents;
  const float* doc_scales;  // compressed documents: one per row; else null
  int64_t dim;
  EpilogueArgs ep;
  ResidualRef res;  // residual documents: the codec
};

// Whether a mainloop decodes residual documents (only MmaMainloop has the member).
template <class ML, class = void>
struct DecodesResiduals : std::false_type {};
template <class ML>
struct DecodesResiduals<ML, std::enable_if_t<ML::kResidual>> : std::true_type {};

template <class ML, class Policy>
struct FwdSmem {
  using Epi = EpilogueSmem<typename ML::Acc, ML::BM, ML::kSlots>;
  static constexpr size_t epi_offset() { return (ML::smem_bytes() + 15) / 16 * 16; }
  static constexpr size_t bytes() { return epi_offset() + sizeof(Epi); }
};

// A new query's rows into the mainloop (cur_key / cur_chunk name the ones it holds), for
// stacked-query blocks and K-split mainloops; one-query blocks take theirs through the kernel's
// own lambda (see there). The previous step ended with finish_chunk, so every thread is past
// its reads of the query registers (and of the SIMT path's qvalid); seg_qlen (stacked queries)
// is read by that epilogue too, so its rewrite waits at a barrier first unless the caller has
// just met one.
template <bool kSyncFirst, class ML, class Stream, class Epi, class Policy>
__device__ __forceinline__ void take_query(ML& ml, const Stream& cons, Epi& epi, const Policy& pol,
                                           const typename ML::Elem* queries, int64_t& cur_key, int64_t& cur_chunk) {
  if (cons.d.qkey == cur_key && cons.chunk == cur_chunk) return;
  if (cons.d.nseg > 1 && cons.d.qkey != cur_key) {
    if constexpr (kSyncFirst) __syncthreads();
    for (int s = threadIdx.x; s < cons.d.nseg; s += ML::kThreads) epi.seg_qlen[s] = pol.seg_qlen(cons.d, s);
    __syncthreads();
  }
  QueryRows qr{&cons.d, epi.seg_qlen, cons.chunk, ML::BM};
  ml.load_query(queries, qr);
  cur_key = cons.d.qkey;
  cur_chunk = cons.chunk;
}

// CTAs an SM a kernel instantiation is compiled for: the mainloop's kMinBlocks, or its
// min_blocks_for<Policy>() where it has one (the register budget depends on the surface).
template <class ML, class Policy, class = void>
struct MinBlocks {
  static constexpr int value = ML::kMinBlocks;
};
template <class ML, class Policy>
struct MinBlocks<ML, Policy, std::void_t<decltype(ML::template min_blocks_for<Policy>())>> {
  static constexpr int value = ML::template min_blocks_for<Policy>();
};

template <class ML, class Policy>
__global__ void __launch_bounds__(ML::kThreads, MinBlocks<ML, Policy>::value)
    maxsim_forward_kernel(const Policy pol, const FwdArgs<typename ML::Elem, typename ML::DocT> a) {
  using T = typename ML::Elem;
  using Acc = typename ML::Acc;
  constexpr int BM = ML::BM, BN = ML::BN, S = ML::kStages;
  extern __shared__ __align__(16) unsigned char smem[];
  auto& epi = *reinterpret_cast<typename FwdSmem<ML, Policy>::Epi*>(smem + FwdSmem<ML, Policy>::epi_offset());

  const StepRange range = cta_steps(pol.steps(), gridDim.x, blockIdx.x);
  if (range.begin >= range.end) return;
  wait_prior_grids();

  constexpr bool KSPLIT = KSplit<ML>::value;
  ML ml;
  if constexpr (KSPLIT) {
    ml.init(smem, a.dim, a.documents, a.queries, pol.query_rows(), a.doc_scales);
  } else {
    ml.init(smem, a.dim, a.documents, a.doc_scales);
  }
  if constexpr (DecodesResiduals<ML>::value) ml.bind_residual(a.res, a.documents);

  TileStream<Policy, BM, BN, KSplit<ML>::chunk, !KSPLIT && ML::kPipelined> cons, prod;
  cons.start(pol, range, a.dim);
  prod = cons;

  // The first step's query is read before the prologue's tile copies, where a step's block is
  // one query held in registers: its loads go out first (SmallRerank 8.15 -> 6.73 us, H200),
  // and its row index is not held across the copies (ptxas spilled it there in the e4m3 BM 64
  // shape at two CTAs an SM). Stacked queries (a seg_qlen pass, barriers) and K-split
  // mainloops (queries staged with the tiles) take theirs in the loop, through take_query.
  // The one-query take is this lambda and the others that function because ptxas allocates
  // registers differently for the two forms of the same code: the function spilled 18 bytes in
  // the float16 / bfloat16 BM 64 padded shape at sm_90a, the lambda 4-8 bytes in the K-split
  // and stacked residual shapes (NOTES.md, "The mma.sync kernels' query load").
  int64_t cur_key = INT64_MIN, cur_chunk = -1;
  auto take_one_query = [&]() {
    if (cons.d.qkey == cur_key && cons.chunk == cur_chunk) return;
    ml.load_query(a.queries, QueryRows{&cons.d, epi.seg_qlen, cons.chunk, BM});
    cur_key = cons.d.qkey;
    cur_chunk = cons.chunk;
  };
  if constexpr (!KSPLIT && Policy::kOneQueryPerStep) {
    if (cons.valid) take_one_query();
  }

  if constexpr (ML::kPipelined) {
#pragma unroll
    for (int st = 0; st < S - 1; ++st) {
      if (prod.valid) {
        produce(ml, st, prod, a.queries, a.documents);
        prod.advance(pol);
      }
      cp_async_commit();
    }
  }

  int stage = 0;
  Acc carry = Acc(0);
  while (cons.valid) {
    // A new query's rows, when the step has one: read before the wait for the step's first tile
    // so that the two memory round trips overlap (read after it, a CTA with one step waits for
    // both in turn), except in K-split mainloops, which stage the query with the tiles (taken
    // before the barrier there, their two-CTA shape spilled). The previous iteration ended with
    // finish_chunk, so every thread is past its reads of the query registers (and of the SIMT
    // path's qvalid); seg_qlen needs the barrier.
    if constexpr (!KSPLIT) {
      if (cons.tile == 0) {
        if constexpr (Policy::kOneQueryPerStep) take_one_query();
        else take_query<true>(ml, cons, epi, pol, a.queries, cur_key, cur_chunk);
      }
    }
    if constexpr (ML::kPipelined) cp_async_wait<(S >= 2 ? S - 2 : 0)>();
    __syncthreads();  // tile `stage` landed for everyone; the slot read last iteration is free
    bool first_k = true, last_k = true;
    if constexpr (KSPLIT) {
      first_k = cons.kc == 0;
      last_k = cons.kc + 1 == cons.nk;
    }
    if (cons.tile == 0 && first_k) {
      if constexpr (KSPLIT) take_query<false>(ml, cons, epi, pol, a.queries, cur_key, cur_chunk);
      ml.reset();
    }
    if constexpr (ML::kPipelined) {
      if (prod.valid) {
        produce(ml, (stage + S - 1) % S, prod, a.queries, a.documents);
        prod.advance(pol);
      }
      cp_async_commit();
      // every load issued: the next call's CTAs may take the SM slots this grid's leave
      // (as the sm_90a producers do; repeated until the CTA ends, which the instruction allows)
      if (!prod.valid) allow_dependent_grids();
    }
    if constexpr (KSPLIT) {
      ml.compute_k(stage, first_k, last_k, cons.tile_rows(), static_cast<int>(cons.tile_col0()), a.ep.with_argmax);
    } else {
      ml.compute(stage, a.documents, cons.tile_row0(), cons.tile_rows(), static_cast<int>(cons.tile_col0()),
                 a.ep.with_argmax);
    }
    if (cons.tile + 1 == cons.ntiles && last_k) {
      ml.reduce(epi.red_m, epi.red_i, a.ep.with_argmax);
      finish_chunk<Acc, BM, ML::kSlots, ML::kThreads>(epi, cons.d, cons.chunk, cons.nchunks, carry, a.ep);
    }
    cons.advance(pol);
    stage = (stage + 1) % S;
  }
  if constexpr (ML::kPipelined) cp_async_wait<0>();
}

// One persistent launch of a kernel instantiation, as many CTAs as stay resident.
template <class ML, class Policy>
cudaError_t run_forward(const Policy& pol, const FwdArgs<typename ML::Elem, typename ML::DocT>& a, int num_sms,
                        cudaStream_t stream) {
  const int64_t steps = pol.steps();
  if (steps <= 0) return cudaSuccess;
  constexpr auto kern = maxsim_forward_kernel<ML, Policy>;
  constexpr size_t smem = FwdSmem<ML, Policy>::bytes();
  int occ = 1;
  const cudaError_t err = resident_ctas<kern>(ML::kThreads, smem, 1 << 30, occ);
  if (err != cudaSuccess) return err;
  // (shared_sm_ctas models 256-thread CTAs sharing an SM, as measured; narrower ones take
  // what is resident)
  if constexpr (MinBlocks<ML, Policy>::value > ML::kMinBlocks && ML::kThreads == 256)
    occ = shared_sm_ctas(steps, num_sms, occ);
  const int64_t ctas = plan_ctas(steps, num_sms, occ);
  return launch_programmatic<kern>(static_cast<unsigned>(ctas), ML::kThreads, smem, stream, pol, a);
}

// ---- policy construction from the plain params ----

inline PaddedPolicy make_padded(const ForwardParams& p) {
  return PaddedPolicy{IndexView(p.query_lengths), IndexView(p.doc_lengths), p.num_queries, p.cands, p.lq, p.ld};
}

template <class Policy>
inline Policy make_contrastive(const ForwardParams& p, int bm) {
  Policy pol;
  pol.qlens = IndexView(p.query_lengths);
  if constexpr (std::is_same_v<Policy, ContrastivePaddedPolicy>)
    pol.docs = PaddedDocuments{IndexView(p.doc_lengths), p.num_docs, p.ld};
  else
    pol.docs = OffsetDocuments{IndexView(p.doc_offsets), p.num_docs, p.d_rows};
  pol.Nq = p.num_queries;
  pol.Nb = p.num_docs;
  pol.Lq = p.lq;
  int64_t g = p.lq > 0 ? bm / p.lq : 1;
  if (g < 1) g = 1;
  if (g > p.num_queries) g = p.num_queries > 0 ? p.num_queries : 1;
  pol.G = static_cast<int>(g);
  pol.order.nq_blocks = (p.num_queries + g - 1) / g;
  pol.order.num_docs = p.num_docs;
  pol.order.group = 32;
  return pol;
}

inline PackedPolicy make_packed(const ForwardParams& p) {
  return PackedPolicy{IndexView(p.query_offsets), IndexView(p.doc_offsets), IndexView(p.pair_query_ids),
                      IndexView(p.pair_doc_ids), p.num_queries, p.num_docs, p.q_rows, p.d_rows, p.pairs};
}

// Rows a block should hold: the padded query length (padded), stacked queries up to 128
// rows (contrastive), max_q_len (packed). Longer queries run as M-chunks.
inline int64_t block_rows(const ForwardParams& p) {
  switch (p.surface) {
    case Surface::kPadded: return p.lq;
    case Surface::kContrastive:
    case Surface::kContrastivePadded: {
      const int64_t r = p.num_queries * p.lq;
      return r < 128 ? r : 128;
    }
    default: return p.max_q_len;
  }
}
inline int pick_bm(const ForwardParams& p) {
  const int64_t r = block_rows(p);
  return r <= 32 ? 32 : (r <= 64 ? 64 : 128);
}

template <class T, class D = T>
FwdArgs<T, D> make_args(const ForwardParams& p) {
  FwdArgs<T, D> a;
  a.queries = static_cast<const T*>(p.queries);
  a.documents = static_cast<const D*>(p.documents);
  a.doc_scales = p.doc_scales;
  a.dim = p.dim;
  a.res = p.residual;
  a.ep.scores = p.scores;
  a.ep.argmax = p.argmax;
  a.ep.width = p.argmax_width;
  a.ep.with_argmax = p.argmax != nullptr;
  return a;
}

template <class ML, int SURF>
cudaError_t run_surface(const ForwardParams& p) {
  const auto a = make_args<typename ML::Elem, typename ML::DocT>(p);
  if constexpr (SURF == 0) {
    return run_forward<ML>(make_padded(p), a, p.num_sms, p.stream);
  } else if constexpr (SURF == 1) {
    return run_forward<ML>(make_contrastive<ContrastivePolicy>(p, ML::BM), a, p.num_sms, p.stream);
  } else if constexpr (SURF == 3) {
    return run_forward<ML>(make_contrastive<ContrastivePaddedPolicy>(p, ML::BM), a, p.num_sms,
                           p.stream);
  } else {
    return run_forward<ML>(make_packed(p), a, p.num_sms, p.stream);
  }
}

}  // namespace kernel
}  // namespace maxsim_cuda
