// Launch plan of the Metal kernels: kernel names, parameter blocks, buffer slots, grid,
// threadgroup size and threadgroup-memory bytes for every entry point. Pure C++ (no torch,
// no Metal), shared by the Objective-C++ glue (ops.mm) and the Linux emulator, so what
// the glue launches is what the emulated tests ran.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "params.h"

namespace maxsim_metal {

enum class Dtype { kFloat, kHalf, kBFloat };

inline const char* dtype_name(Dtype t) {
  return t == Dtype::kFloat ? "float" : t == Dtype::kHalf ? "half" : "bfloat";
}

// Storage format of the documents (tiles.h): the queries' dtype; compressed with one float32
// scale per row (bound at the DocumentScales slot); or ColBERTv2 residuals (packed bucket
// bytes as the documents, with codes, centroids and bucket weights at their own slots). A
// pipeline name carries it as a suffix after the query dtype: maxsim_forward_padded_half_int8.
enum class DocFormat { kQueryDtype, kInt8, kFloat8E4M3, kResidual };

inline const char* doc_format_suffix(DocFormat f) {
  switch (f) {
    case DocFormat::kInt8: return "_int8";
    case DocFormat::kFloat8E4M3: return "_e4m3fn";
    case DocFormat::kResidual: return "_residual";
    default: return "";
  }
}
// Compressed documents are frozen storage: they get no gradient.
inline bool is_compressed(DocFormat f) { return f != DocFormat::kQueryDtype; }
inline bool has_row_scales(DocFormat f) { return f == DocFormat::kInt8 || f == DocFormat::kFloat8E4M3; }
inline const char* surface_name(MaxsimSurface s) {
  switch (s) {
    case kMaxsimPadded: return "padded";
    case kMaxsimContrastive: return "contrastive";
    case kMaxsimContrastivePadded: return "contrastive_padded";
    default: return "packed";
  }
}

// Buffer slots, as the [[buffer(n)]] attributes of maxsim_forward / maxsim_backward
// (tests/test_metal_emulated.py checks both files against each other).
enum ForwardSlot {
  kForwardParams = 0, kForwardQueries = 1, kForwardDocuments = 2, kForwardIndex0 = 3,
  kForwardIndex1 = 4, kForwardIndex2 = 5, kForwardIndex3 = 6, kForwardScores = 7,
  kForwardArgmax = 8, kForwardDocumentScales = 9, kForwardDocumentCodes = 10,
  kForwardCentroids = 11, kForwardBucketWeights = 12, kForwardSlots = 13,
};
enum BackwardSlot {
  kBackwardParams = 0, kBackwardQueries = 1, kBackwardDocuments = 2, kBackwardGradScores = 3,
  kBackwardArgmax = 4, kBackwardIndex0 = 5, kBackwardIndex1 = 6, kBackwardIndex2 = 7,
  kBackwardIndex3 = 8, kBackwardOwnerPairs = 9, kBackwardOwnerPairOffsets = 10,
  kBackwardGrad = 11, kBackwardDocumentScales = 12, kBackwardDocumentCodes = 13,
  kBackwardCentroids = 14, kBackwardBucketWeights = 15, kBackwardSlots = 16,
};

enum CentroidSlot {
  kCentroidParams = 0, kCentroidTable = 1, kCentroidDocumentCodes = 2, kCentroidIndex0 = 3,
  kCentroidIndex1 = 4, kCentroidIndex2 = 5, kCentroidIndex3 = 6, kCentroidScores = 7,
  kCentroidSlots = 8,
};

// An index tensor as the kernels see it (absent: an optional tensor not given).
struct IndexArg {
  int64_t size = 0;
  bool is64 = false;
  bool present = false;
};

inline void set_index(MaxsimParams& p, int k, IndexArg a) {
  p.index_size[k] = a.present ? a.size : 0;
  p.index_is64[k] = a.is64 ? 1 : 0;
  p.index_present[k] = a.present ? 1 : 0;
}

// The residual codec as the kernels see it (residual documents only).
struct ResidualArg {
  IndexArg codes;          // one centroid id per document row
  int64_t n_centroids = 0;
  int nbits = 0;
  bool normalize = true;
  MaxsimFloatType centroid_dtype = kMaxsimFloat32, weight_dtype = kMaxsimFloat32;
};

inline void set_residual(MaxsimParams& p, const ResidualArg& r) {
  p.codes_size = r.codes.present ? r.codes.size : 0;
  p.codes_is64 = r.codes.is64 ? 1 : 0;
  p.n_centroids = r.n_centroids;
  p.nbits = r.nbits;
  p.normalize = r.normalize ? 1 : 0;
  p.centroid_dtype = r.centroid_dtype;
  p.weight_dtype = r.weight_dtype;
}

inline MaxsimParams empty_params(int64_t dim, int64_t Tq, int64_t Td, bool with_argmax) {
  MaxsimParams p = {};
  p.dim = dim;
  p.Tq = Tq;
  p.Td = Td;
  p.with_argmax = with_argmax ? 1 : 0;
  p.grid_rows = 1;
  return p;
}

// queries [B,Lq,D], documents [B,C,Ld,D], query_lengths [B], doc_lengths [B,C]
inline MaxsimParams padded_params(int64_t B, int64_t C, int64_t Lq, int64_t Ld, int64_t dim,
                                  IndexArg query_lengths, IndexArg doc_lengths, bool with_argmax) {
  MaxsimParams p = empty_params(dim, B * Lq, B * C * Ld, with_argmax);
  p.B = B;
  p.C = C;
  p.Lq = Lq;
  p.Ld = Ld;
  p.num_pairs = B * C;
  p.argmax_width = Lq;
  set_index(p, 0, query_lengths);
  set_index(p, 1, doc_lengths);
  return p;
}

// queries [Nq,Lq,D], documents [T,D], document_offsets [Nb+1], query_lengths [Nq] or absent
inline MaxsimParams contrastive_params(int64_t Nq, int64_t Lq, int64_t T, int64_t dim,
                                       IndexArg document_offsets, IndexArg query_lengths,
                                       bool with_argmax) {
  MaxsimParams p = empty_params(dim, Nq * Lq, T, with_argmax);
  p.Nq = Nq;
  p.Nb = std::max<int64_t>(document_offsets.size - 1, 0);
  p.Lq = Lq;
  p.num_pairs = p.Nq * p.Nb;
  p.argmax_width = Lq;
  set_index(p, 0, document_offsets);
  set_index(p, 1, query_lengths);
  return p;
}

// queries [Nq,Lq,D], documents [Nb,Ld,D], document_lengths [Nb], query_lengths [Nq] or absent
inline MaxsimParams contrastive_padded_params(int64_t Nq, int64_t Lq, int64_t Nb, int64_t Ld,
                                              int64_t dim, IndexArg document_lengths,
                                              IndexArg query_lengths, bool with_argmax) {
  MaxsimParams p = empty_params(dim, Nq * Lq, Nb * Ld, with_argmax);
  p.Nq = Nq;
  p.Nb = Nb;
  p.Lq = Lq;
  p.Ld = Ld;
  p.num_pairs = Nq * Nb;
  p.argmax_width = Lq;
  set_index(p, 0, document_lengths);
  set_index(p, 1, query_lengths);
  return p;
}

// queries [Tq,D], documents [Td,D], offsets [Nq+1] / [Nd+1], pair ids [P]
inline MaxsimParams packed_params(int64_t Tq, int64_t Td, int64_t dim, IndexArg query_offsets,
                                  IndexArg document_offsets, IndexArg pair_query_ids,
                                  IndexArg pair_document_ids, int64_t max_q_len, bool with_argmax) {
  MaxsimParams p = empty_params(dim, Tq, Td, with_argmax);
  p.num_pairs = pair_query_ids.size;
  p.argmax_width = max_q_len;
  set_index(p, 0, query_offsets);
  set_index(p, 1, document_offsets);
  set_index(p, 2, pair_query_ids);
  set_index(p, 3, pair_document_ids);
  return p;
}

struct Launch {
  std::string kernel;            // [[host_name]] of the pipeline
  MaxsimParams params;           // bound with setBytes at slot 0
  uint32_t groups[3] = {1, 1, 1};
  uint32_t threads = kMaxsimThreads;
  uint32_t threadgroup_bytes = 0;
  bool run = false;              // false: nothing to launch
  bool zero_output = false;      // backward: the gradient must start at zero
};

inline Launch plan_forward(MaxsimSurface surface, Dtype dtype, DocFormat docs,
                           const MaxsimParams& params) {
  Launch l;
  l.kernel = std::string("maxsim_forward_") + surface_name(surface) + "_" + dtype_name(dtype) +
             doc_format_suffix(docs);
  l.params = params;
  l.groups[0] = uint32_t(params.num_pairs);
  l.threadgroup_bytes = uint32_t(kForwardFloats * sizeof(float));
  l.run = params.num_pairs > 0;
  return l;
}

// `params` from the forward's builder with with_argmax = true and argmax_width the width of
// the saved argmax. For packed, owner_pair_offsets is query_pair_offsets (to_query) or
// document_pair_offsets, and owner_pairs the matching pairs_by_* tensor. Compressed
// documents have grad_queries only (no maxsim_grad_documents_*_int8 pipeline exists; the
// glue refuses to ask for one).
inline Launch plan_backward(MaxsimSurface surface, Dtype dtype, DocFormat docs, bool to_query,
                            MaxsimParams params, IndexArg owner_pairs, IndexArg owner_pair_offsets) {
  Launch l;
  l.kernel = std::string(to_query ? "maxsim_grad_queries_" : "maxsim_grad_documents_") +
             surface_name(surface) + "_" + dtype_name(dtype) + doc_format_suffix(docs);
  set_index(params, 4, owner_pairs);
  set_index(params, 5, owner_pair_offsets);
  // owners tile their output (every row written by its owner) only on the strided surfaces
  bool tiled = true;
  int64_t owners = 0, rows = 0;
  if (surface == kMaxsimPadded) {
    owners = to_query ? params.B : params.B * params.C;
    rows = to_query ? params.Lq : params.Ld;
  } else if ((surface == kMaxsimContrastive || surface == kMaxsimContrastivePadded) && to_query) {
    owners = params.Nq;
    rows = params.Lq;
  } else if (surface == kMaxsimContrastivePadded) {
    owners = params.Nb;
    rows = params.Ld;
  } else {
    tiled = false;
    const int offsets_slot = surface == kMaxsimContrastive ? 0 : (to_query ? 0 : 1);
    owners = std::max<int64_t>(params.index_size[offsets_slot] - 1, 0);
    const int64_t total = to_query ? params.Tq : params.Td;
    rows = owners > 0 ? (total + owners - 1) / owners : 0;  // a typical segment
  }
  params.num_owners = owners;
  const int64_t passes = (rows + kMaxsimGradRows - 1) / kMaxsimGradRows;
  params.grid_rows = int(std::min<int64_t>(std::max<int64_t>(passes, 1), 64));
  l.params = params;
  l.groups[0] = uint32_t(owners);
  l.groups[1] = uint32_t(params.grid_rows);
  l.threadgroup_bytes = uint32_t(kBackwardWords * 4);
  l.run = owners > 0 && params.num_pairs > 0 && params.argmax_width > 0 && params.dim > 0;
  l.zero_output = !tiled || !l.run;
  return l;
}

// PLAID's centroid-only score (centroid.metal): table [Nq, n_centroids, Lq] float32, codes
// [T], document_offsets [Nb + 1], query_lengths [Nq] or absent; every query x every
// document, or the listed pairs (pair ids present).
inline Launch plan_centroid_scores(int64_t Nq, int64_t n_centroids, int64_t Lq, IndexArg codes,
                                   IndexArg document_offsets, IndexArg query_lengths,
                                   IndexArg pair_query_ids, IndexArg pair_document_ids) {
  MaxsimParams p = empty_params(0, 0, 0, false);
  p.Nq = Nq;
  p.Nb = std::max<int64_t>(document_offsets.size - 1, 0);
  p.Lq = Lq;
  p.n_centroids = n_centroids;
  p.codes_size = codes.size;
  p.codes_is64 = codes.is64 ? 1 : 0;
  const bool listed = pair_query_ids.present;
  p.num_pairs = listed ? pair_query_ids.size : Nq * p.Nb;
  set_index(p, 0, document_offsets);
  set_index(p, 1, query_lengths);
  set_index(p, 2, pair_query_ids);
  set_index(p, 3, pair_document_ids);
  Launch l;
  l.kernel = listed ? "maxsim_centroid_scores_pairs" : "maxsim_centroid_scores_all";
  l.params = p;
  l.groups[0] = uint32_t(p.num_pairs);
  l.threadgroup_bytes = uint32_t(kMaxsimThreads * sizeof(float));
  l.run = p.num_pairs > 0;
  return l;
}

}  // namespace maxsim_metal
