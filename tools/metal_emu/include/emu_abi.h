// The emulator's C ABI (emu_ops.cpp), as the Python tests (ctypes) and the ThreadSanitizer
// program (tsan_main.cpp) call it.
#pragma once

#include <cstdint>

extern "C" {

// An int32 / int64 index tensor; present == 0: an optional tensor not given.
struct EmuIndex {
  const void* data;
  int64_t numel;
  int is64;
  int present;
};

struct EmuOptions {
  int order;          // emu::Order
  uint64_t seed;      // for the random order
  uint32_t poison;    // pattern over threadgroup memory and outputs
  int real_threads;   // 1: std::thread per GPU thread (ThreadSanitizer)
};

// The residual codec of ColBERTv2 documents (doc_format kResidual; null otherwise): codes one
// int32 / int64 per document row, centroids [n_centroids, dim] and bucket weights
// [2**nbits], each float32 / float16 / bfloat16 (MaxsimFloatType).
struct EmuResidual {
  EmuIndex codes;
  const void* centroids;
  int64_t n_centroids;
  int centroid_dtype;
  const void* bucket_weights;
  int weight_dtype;
  int nbits;
  int normalize;
};

// surface: MaxsimSurface; dtype: maxsim_metal::Dtype of the queries; doc_format:
// maxsim_metal::DocFormat, with document_scales (scales_numel float32, one per document row)
// for int8 / float8 documents and null otherwise; residual for residual documents (their
// packed bytes as documents) and null otherwise; sizes: see params_for() in emu_ops.cpp.
int emu_forward(int surface, int dtype, int doc_format, const int64_t* sizes, int64_t dim,
                const void* queries, int64_t queries_numel, const void* documents,
                int64_t documents_numel, const float* document_scales, int64_t scales_numel,
                const EmuResidual* residual, const EmuIndex* idx, int with_argmax, float* scores, int64_t scores_numel,
                int32_t* argmax, int64_t argmax_numel, const EmuOptions* opt, char* err, int errlen);

int emu_backward(int surface, int dtype, int doc_format, int to_query, const int64_t* sizes,
                 int64_t dim, const void* queries, int64_t queries_numel, const void* documents,
                 int64_t documents_numel, const float* document_scales, int64_t scales_numel,
                 const EmuResidual* residual, const float* grad_scores, int64_t num_pairs, const int32_t* argmax,
                 int64_t argmax_width, const EmuIndex* idx, EmuIndex owner_pairs,
                 EmuIndex owner_pair_offsets, void* grad, int64_t grad_numel, const EmuOptions* opt,
                 char* err, int errlen);

// PLAID's centroid-only score: table [Nq, n_centroids, Lq] float32, codes, document_offsets
// [Nb + 1], query_lengths (absent: every row), pair ids (absent: every query x document);
// scores [scores_numel].
int emu_centroid_scores(int64_t Nq, int64_t n_centroids, int64_t Lq, const float* table, EmuIndex codes,
                        EmuIndex document_offsets, EmuIndex query_lengths, EmuIndex pair_query_ids,
                        EmuIndex pair_document_ids, float* scores, int64_t scores_numel,
                        const EmuOptions* opt, char* err, int errlen);

}  // extern "C"
