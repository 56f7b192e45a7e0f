// MaxSim forward on Apple GPUs: scores[p] = sum_i max_j <q_i, d_j> for every pair p of a
// surface (docs/design.md), optionally with the argmax. One threadgroup per pair; its four
// simdgroups own 8 query rows each of a 32-row query chunk. Query chunk and document tile
// are staged through threadgroup memory as float, 32 embedding columns at a time, and
// multiplied on 8x8 simdgroup matrices with float32 accumulation; the running row
// maximum never leaves the simdgroup. Any dim (zero-filled to a multiple of 8), any query
// length (chunks). Threadgroup memory layout: MaxsimForwardLayout in params.h.
//
// Documents come in a storage format (tiles.h): the queries' type, or int8 / float8 e4m3fn
// with one float32 scale per row (document_scales, read only by scaled formats). The tile
// load widens them; each similarity is scaled in the fold, before it meets the running max.
#include <metal_stdlib>

#include "params.h"
#include "policies.h"
#include "tiles.h"

using namespace metal;

template <typename T, typename Docs, int kSurface>
kernel void maxsim_forward(constant MaxsimParams& params [[buffer(0)]],
                           device const T* queries [[buffer(1)]],
                           device const typename Docs::element* documents [[buffer(2)]],
                           device const int* index0 [[buffer(3)]],
                           device const int* index1 [[buffer(4)]],
                           device const int* index2 [[buffer(5)]],
                           device const int* index3 [[buffer(6)]],
                           device float* scores [[buffer(7)]],
                           device int* argmax [[buffer(8)]],
                           device const float* document_scales [[buffer(9)]],
                           device const int* document_codes [[buffer(10)]],
                           device const uchar* centroids [[buffer(11)]],
                           device const uchar* bucket_weights [[buffer(12)]],
                           threadgroup float* smem [[threadgroup(0)]],
                           uint group [[threadgroup_position_in_grid]],
                           uint tid [[thread_index_in_threadgroup]],
                           uint sg [[simdgroup_index_in_threadgroup]],
                           uint lane [[thread_index_in_simdgroup]]) {
  const long p = long(group);
  if (p >= params.num_pairs) return;
  const Policy<kSurface> pol = make_policy<kSurface>(params, index0, index1, index2, index3);
  const PairSpec s = pol.pair(p);
  const DocumentExtras docx = document_extras(params, document_scales, document_codes, centroids, bucket_weights);
  const long width = params.argmax_width, dim = params.dim;
  device int* arow = argmax + p * width;  // only touched when params.with_argmax

  if (!s.ok || s.qlen == 0 || s.dlen == 0) {
    if (tid == 0) scores[p] = !s.ok ? nan_value() : (s.qlen == 0 ? 0.0f : minus_infinity());
    if (params.with_argmax)
      for (long i = tid; i < width; i += kMaxsimThreads) arow[i] = -1;
    return;
  }

  threadgroup float* qtile = smem + kQueryTile;
  threadgroup float* dtile = smem + kDocTile;
  threadgroup float* sims = smem + kSims + sg * 8 * kMaxsimDocRows;  // this simdgroup's 8 rows
  threadgroup float* row_max = smem + kRowMax;
  threadgroup float* row_factor = smem + kRowFactor;  // normalised formats: 1 / ||t_j|| of the tile
  const long dim8 = (dim + 7) / 8 * 8;
  // lane = 4 * r + quarter: row r of the simdgroup's 8, columns quarter*8 .. +8 of a tile
  const uint r = lane / 4, quarter = lane % 4;
  float total = 0.0f;  // thread 0's running score

  for (long i0 = 0; i0 < s.qlen; i0 += kMaxsimQueryRows) {
    const long qrows = min(long(kMaxsimQueryRows), s.qlen - i0);
    Best best = no_best();
    for (long j0 = 0; j0 < s.dlen; j0 += kMaxsimDocRows) {
      const long drows = min(long(kMaxsimDocRows), s.dlen - j0);
      simdgroup_float8x8 acc[kMaxsimDocRows / 8];
      for (int n = 0; n < kMaxsimDocRows / 8; ++n) acc[n] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      float sumsq = 0.0f;  // normalised formats: thread tid < 32 sums the squares of tile row tid
      for (long k0 = 0; k0 < dim8; k0 += kMaxsimDimChunk) {
        stage_rows<kMaxsimQueryRows, PlainFormat<T>>(qtile, queries, docx, s.qrow + i0, qrows, k0, tid);
        stage_rows<kMaxsimDocRows, Docs>(dtile, documents, docx, s.drow + j0, drows, k0, tid);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        const int kc = int(min(long(kMaxsimDimChunk), dim8 - k0));
        for (int kk = 0; kk < kc; kk += 8) {
          simdgroup_float8x8 a;
          simdgroup_load(a, qtile + sg * 8 * kMaxsimDimChunk + kk, kMaxsimDimChunk);
          for (int n = 0; n < kMaxsimDocRows / 8; ++n) {
            simdgroup_float8x8 b;  // b[k][c] = document row 8n + c, column kk + k
            simdgroup_load(b, dtile + n * 8 * kMaxsimDimChunk + kk, kMaxsimDimChunk, ulong2(0, 0), true);
            simdgroup_multiply_accumulate(acc[n], a, b, acc[n]);
          }
        }
        if (Docs::kRowNorm && tid < uint(kMaxsimDocRows)) {
          // the staged (rounded) values, in column order: the same sum on every run. The
          // previous tile's fold, which read row_factor, ended before this step's barrier.
          for (int c = 0; c < kMaxsimDimChunk; ++c) sumsq += dtile[tid * kMaxsimDimChunk + c] * dtile[tid * kMaxsimDimChunk + c];
          if (k0 + kMaxsimDimChunk >= dim8) row_factor[tid] = Docs::factor(sumsq, docx);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // tiles are restaged next step
      }
      for (int n = 0; n < kMaxsimDocRows / 8; ++n) simdgroup_store(acc[n], sims + n * 8, kMaxsimDocRows);
      simdgroup_barrier(mem_flags::mem_threadgroup);
      Best cand = no_best();
      for (uint c = quarter * 8; c < quarter * 8 + 8; ++c) {
        if (long(c) >= drows) break;
        Best x;
        const float sim = sims[r * kMaxsimDocRows + c];
        x.value = Docs::kRowNorm ? sim * row_factor[c] : Docs::scaled(sim, documents, docx, s.drow + j0 + c);
        x.index = int(j0 + c);
        cand = better(cand, x);
      }
      cand = shuffle_better(cand, 1);
      cand = shuffle_better(cand, 2);
      best = better(best, cand);
      simdgroup_barrier(mem_flags::mem_threadgroup);  // sims is rewritten by the next tile
    }
    const long row = sg * 8 + r;  // row within the chunk
    if (quarter == 0 && row < qrows) {
      row_max[row] = best.value;
      if (params.with_argmax && i0 + row < width) arow[i0 + row] = best.index;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0)
      for (long i = 0; i < qrows; ++i) total += row_max[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);  // row_max is rewritten by the next chunk
  }
  if (tid == 0) scores[p] = total;
  if (params.with_argmax)
    for (long i = s.qlen + tid; i < width; i += kMaxsimThreads) arow[i] = -1;
}

#define MAXSIM_FORWARD(name, T, docs, surface) \
  template [[host_name(#name)]] [[kernel]] decltype(maxsim_forward<T, docs, surface>) maxsim_forward<T, docs, surface>;

// maxsim_forward_<surface>_<query type>[_<document format>] (launch_plan.h builds the names)
MAXSIM_FORWARD(maxsim_forward_padded_float, float, PlainFormat<float>, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_float_int8, float, Int8Format, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_float_e4m3fn, float, E4M3Format, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_float_residual, float, ResidualFormat<float>, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_half, half, PlainFormat<half>, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_half_int8, half, Int8Format, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_half_e4m3fn, half, E4M3Format, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_half_residual, half, ResidualFormat<half>, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_bfloat_int8, bfloat, Int8Format, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_bfloat_e4m3fn, bfloat, E4M3Format, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_padded_bfloat_residual, bfloat, ResidualFormat<bfloat>, kMaxsimPadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_float, float, PlainFormat<float>, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_float_int8, float, Int8Format, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_float_e4m3fn, float, E4M3Format, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_float_residual, float, ResidualFormat<float>, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_half, half, PlainFormat<half>, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_half_int8, half, Int8Format, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_half_e4m3fn, half, E4M3Format, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_half_residual, half, ResidualFormat<half>, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_bfloat_int8, bfloat, Int8Format, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_bfloat_e4m3fn, bfloat, E4M3Format, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_bfloat_residual, bfloat, ResidualFormat<bfloat>, kMaxsimContrastive)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_float, float, PlainFormat<float>, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_float_int8, float, Int8Format, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_float_e4m3fn, float, E4M3Format, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_float_residual, float, ResidualFormat<float>, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_half, half, PlainFormat<half>, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_half_int8, half, Int8Format, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_half_e4m3fn, half, E4M3Format, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_half_residual, half, ResidualFormat<half>, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_bfloat_int8, bfloat, Int8Format, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_bfloat_e4m3fn, bfloat, E4M3Format, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_contrastive_padded_bfloat_residual, bfloat, ResidualFormat<bfloat>, kMaxsimContrastivePadded)
MAXSIM_FORWARD(maxsim_forward_packed_float, float, PlainFormat<float>, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_float_int8, float, Int8Format, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_float_e4m3fn, float, E4M3Format, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_float_residual, float, ResidualFormat<float>, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_half, half, PlainFormat<half>, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_half_int8, half, Int8Format, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_half_e4m3fn, half, E4M3Format, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_half_residual, half, ResidualFormat<half>, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_bfloat_int8, bfloat, Int8Format, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_bfloat_e4m3fn, bfloat, E4M3Format, kMaxsimPacked)
MAXSIM_FORWARD(maxsim_forward_packed_bfloat_residual, bfloat, ResidualFormat<bfloat>, kMaxsimPacked)
