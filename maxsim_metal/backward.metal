// MaxSim backward on Apple GPUs, driven by the forward's argmax (docs/design.md):
// grad_q[i] += g_p * d[argmax_i] and grad_d[argmax_i] += g_p * q_i. Deterministic without
// atomics: an owner (a query or a document segment, policies.h) owns its output rows; one
// threadgroup pass covers kMaxsimGradRows of them and kMaxsimGradColumns columns. The
// threads evaluate the owner's (pair, row) entries 128 at a time in the fixed order (pairs
// in the owner's order, then increasing query row), publish the hits in threadgroup
// memory, and each thread then adds them, in order, to its column of the accumulator.
// Every pass stores all of its rows, so each output row is written by exactly one pass.
//
// Documents come in a storage format (tiles.h). Compressed ones (int8 / float8 e4m3fn, one
// float32 scale per row) have grad_queries only: grad_q[i] += (g_p * scale[a_i]) * v[a_i],
// the scale folded into the entry's weight and the row widened as it is read, the CPU
// backend's order of products.
#include <metal_stdlib>

#include "params.h"
#include "policies.h"
#include "tiles.h"

using namespace metal;

// Entry k of owner o for the pass over rows [j0, j0 + kMaxsimGradRows): whether it adds to
// one of those rows (local row, else -1), from which source row, with which weight.
template <typename Docs, int kSurface, bool kToQuery>
inline int entry_hit(Policy<kSurface> pol, Owners own, long o, long row0, long nrows, long j0,
                     long k, long width, long num_pairs, device const int* argmax,
                     device const float* grad_scores, device const typename Docs::element* documents,
                     thread const DocumentExtras& docx, thread long& src, thread float& weight) {
  // grad_queries: entries (pair t, row j0 + r); grad_documents: entries (pair t, query row i)
  const long per_pair = kToQuery ? long(kMaxsimGradRows) : width;
  const long t = k / per_pair, u = k % per_pair;
  const long p = own.pair_at(o, t);
  if (p < 0 || p >= num_pairs) return -1;
  const PairSpec s = pol.pair(p);
  // the pair must use exactly this owner's rows (guards inconsistent owner lists)
  if (!s.ok || (kToQuery ? (s.qrow != row0 || s.qlen > nrows) : (s.drow != row0 || s.dlen > nrows)))
    return -1;
  const long i = kToQuery ? j0 + u : u;
  if (i >= s.qlen || i >= width) return -1;
  const long a = long(argmax[p * width + i]);
  if (a < 0 || a >= s.dlen) return -1;  // never trust argmax for bounds
  weight = grad_scores[p];
  if (kToQuery) {
    src = s.drow + a;
    weight = Docs::scaled(weight, documents, docx, src);
    return int(u);
  }
  if (a < j0 || a >= j0 + kMaxsimGradRows) return -1;
  src = s.qrow + i;
  return int(a - j0);
}

// Element (row, col) of the gradient's source rows (documents for grad_queries), as float.
template <typename T, typename Docs, bool kToQuery>
inline float source_value(device const T* queries, device const typename Docs::element* documents,
                          thread const DocumentExtras& docx, long row, long col) {
  return kToQuery ? Docs::value(documents, docx, row, col) : float(queries[row * docx.dim + col]);
}

template <typename T, typename Docs, int kSurface, bool kToQuery>
kernel void maxsim_backward(constant MaxsimParams& params [[buffer(0)]],
                            device const T* queries [[buffer(1)]],
                            device const typename Docs::element* documents [[buffer(2)]],
                            device const float* grad_scores [[buffer(3)]],
                            device const int* argmax [[buffer(4)]],
                            device const int* index0 [[buffer(5)]],
                            device const int* index1 [[buffer(6)]],
                            device const int* index2 [[buffer(7)]],
                            device const int* index3 [[buffer(8)]],
                            device const int* owner_pairs [[buffer(9)]],
                            device const int* owner_pair_offsets [[buffer(10)]],
                            device T* grad [[buffer(11)]],
                            device const float* document_scales [[buffer(12)]],
                            device const int* document_codes [[buffer(13)]],
                            device const uchar* centroids [[buffer(14)]],
                            device const uchar* bucket_weights [[buffer(15)]],
                            threadgroup float* smem [[threadgroup(0)]],
                            uint2 group [[threadgroup_position_in_grid]],
                            uint tid [[thread_index_in_threadgroup]]) {
  const long o = long(group.x);
  if (o >= params.num_owners) return;
  const Policy<kSurface> pol = make_policy<kSurface>(params, index0, index1, index2, index3);
  const Owners own = make_owners<kSurface, kToQuery>(params, index0, index1, index2, index3,
                                                     owner_pairs, owner_pair_offsets);
  const DocumentExtras docx = document_extras(params, document_scales, document_codes, centroids, bucket_weights);
  long row0 = 0, nrows = 0;
  if (!own.rows(o, row0, nrows)) return;  // no rows: the output starts at zero there
  const long width = params.argmax_width, dim = params.dim;
  const long entries = own.num_pairs(o) * (kToQuery ? long(kMaxsimGradRows) : width);

  threadgroup float* acc = smem + kGradAcc;
  threadgroup int* hit_src_lo = reinterpret_cast<threadgroup int*>(smem + kHitSourceLow);
  threadgroup int* hit_src_hi = reinterpret_cast<threadgroup int*>(smem + kHitSourceHigh);
  threadgroup float* hit_weight = smem + kHitWeight;
  threadgroup int* hit_row = reinterpret_cast<threadgroup int*>(smem + kHitRow);

  for (long j0 = long(group.y) * kMaxsimGradRows; j0 < nrows; j0 += long(params.grid_rows) * kMaxsimGradRows) {
    const long rows_here = min(long(kMaxsimGradRows), nrows - j0);
    for (long c0 = 0; c0 < dim; c0 += kMaxsimGradColumns) {
      const long col = c0 + tid;
      for (int j = 0; j < kMaxsimGradRows; ++j) acc[j * kMaxsimGradColumns + tid] = 0.0f;
      for (long base = 0; base < entries; base += kMaxsimThreads) {
        long src = 0;
        float weight = 0.0f;
        const long k = base + tid;
        const int j = k < entries ? entry_hit<Docs, kSurface, kToQuery>(pol, own, o, row0, nrows, j0, k, width,
                                                                        params.num_pairs, argmax, grad_scores,
                                                                        documents, docx, src, weight)
                                  : -1;
        hit_row[tid] = j;
        hit_src_lo[tid] = as_type<int>(uint(ulong(src) & 0xffffffffUL));
        hit_src_hi[tid] = as_type<int>(uint(ulong(src) >> 32));
        hit_weight[tid] = weight;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        const int batch = int(min(long(kMaxsimThreads), entries - base));
        if (col < dim)
          for (int h = 0; h < batch; ++h) {
            const int jj = hit_row[h];
            if (jj < 0) continue;
            const ulong hi = as_type<uint>(hit_src_hi[h]), lo = as_type<uint>(hit_src_lo[h]);
            const long sr = as_type<long>((hi << 32) | lo);
            acc[jj * kMaxsimGradColumns + tid] +=
                hit_weight[h] * source_value<T, Docs, kToQuery>(queries, documents, docx, sr, col);
          }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the hit slots are rewritten next batch
      }
      if (col < dim)
        for (long j = 0; j < rows_here; ++j)
          grad[(row0 + j0 + j) * dim + col] = T(acc[j * kMaxsimGradColumns + tid]);
    }
  }
}

#define MAXSIM_BACKWARD(name, T, docs, surface, to_query) \
  template [[host_name(#name)]] [[kernel]] decltype(maxsim_backward<T, docs, surface, to_query>) maxsim_backward<T, docs, surface, to_query>;

// maxsim_grad_<queries|documents>_<surface>_<query type>[_<document format>]
// (launch_plan.h builds the names); compressed documents have no grad_documents
MAXSIM_BACKWARD(maxsim_grad_queries_padded_float, float, PlainFormat<float>, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_float_int8, float, Int8Format, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_float_e4m3fn, float, E4M3Format, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_float_residual, float, ResidualFormat<float>, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_half, half, PlainFormat<half>, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_half_int8, half, Int8Format, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_half_e4m3fn, half, E4M3Format, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_half_residual, half, ResidualFormat<half>, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_bfloat_int8, bfloat, Int8Format, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_bfloat_e4m3fn, bfloat, E4M3Format, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_padded_bfloat_residual, bfloat, ResidualFormat<bfloat>, kMaxsimPadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_float, float, PlainFormat<float>, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_float_int8, float, Int8Format, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_float_e4m3fn, float, E4M3Format, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_float_residual, float, ResidualFormat<float>, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_half, half, PlainFormat<half>, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_half_int8, half, Int8Format, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_half_e4m3fn, half, E4M3Format, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_half_residual, half, ResidualFormat<half>, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_bfloat_int8, bfloat, Int8Format, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_bfloat_e4m3fn, bfloat, E4M3Format, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_bfloat_residual, bfloat, ResidualFormat<bfloat>, kMaxsimContrastive, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_float, float, PlainFormat<float>, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_float_int8, float, Int8Format, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_float_e4m3fn, float, E4M3Format, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_float_residual, float, ResidualFormat<float>, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_half, half, PlainFormat<half>, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_half_int8, half, Int8Format, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_half_e4m3fn, half, E4M3Format, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_half_residual, half, ResidualFormat<half>, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_bfloat_int8, bfloat, Int8Format, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_bfloat_e4m3fn, bfloat, E4M3Format, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_contrastive_padded_bfloat_residual, bfloat, ResidualFormat<bfloat>, kMaxsimContrastivePadded, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_float, float, PlainFormat<float>, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_float_int8, float, Int8Format, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_float_e4m3fn, float, E4M3Format, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_float_residual, float, ResidualFormat<float>, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_half, half, PlainFormat<half>, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_half_int8, half, Int8Format, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_half_e4m3fn, half, E4M3Format, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_half_residual, half, ResidualFormat<half>, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_bfloat_int8, bfloat, Int8Format, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_bfloat_e4m3fn, bfloat, E4M3Format, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_queries_packed_bfloat_residual, bfloat, ResidualFormat<bfloat>, kMaxsimPacked, true)
MAXSIM_BACKWARD(maxsim_grad_documents_padded_float, float, PlainFormat<float>, kMaxsimPadded, false)
MAXSIM_BACKWARD(maxsim_grad_documents_padded_half, half, PlainFormat<half>, kMaxsimPadded, false)
MAXSIM_BACKWARD(maxsim_grad_documents_padded_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimPadded, false)
MAXSIM_BACKWARD(maxsim_grad_documents_contrastive_float, float, PlainFormat<float>, kMaxsimContrastive, false)
MAXSIM_BACKWARD(maxsim_grad_documents_contrastive_half, half, PlainFormat<half>, kMaxsimContrastive, false)
MAXSIM_BACKWARD(maxsim_grad_documents_contrastive_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimContrastive, false)
MAXSIM_BACKWARD(maxsim_grad_documents_contrastive_padded_float, float, PlainFormat<float>, kMaxsimContrastivePadded, false)
MAXSIM_BACKWARD(maxsim_grad_documents_contrastive_padded_half, half, PlainFormat<half>, kMaxsimContrastivePadded, false)
MAXSIM_BACKWARD(maxsim_grad_documents_contrastive_padded_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimContrastivePadded, false)
MAXSIM_BACKWARD(maxsim_grad_documents_packed_float, float, PlainFormat<float>, kMaxsimPacked, false)
MAXSIM_BACKWARD(maxsim_grad_documents_packed_half, half, PlainFormat<half>, kMaxsimPacked, false)
MAXSIM_BACKWARD(maxsim_grad_documents_packed_bfloat, bfloat, PlainFormat<bfloat>, kMaxsimPacked, false)
