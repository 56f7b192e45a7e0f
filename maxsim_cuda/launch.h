// Torch-free interface between the tensor glue (ops.cpp) and the CUDA kernels.
// Everything here is plain data: raw pointers, sizes, a stream. No host synchronisation
// happens behind these functions; they only enqueue work on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace maxsim_cuda {

enum class Surface : int { kPadded = 0, kContrastive = 1, kPacked = 2, kContrastivePadded = 3 };

// Both contrastive surfaces (documents cut by offsets, or padded with lengths) share block
// shapes, scheduling and gradient ownership; only where a document's rows are differs.
constexpr bool is_contrastive(int surface) { return surface == 1 || surface == 3; }
enum class DType : int { kF16 = 0, kBF16 = 1, kF32 = 2, kF64 = 3 };
// How the documents are stored: in the queries' dtype (kNative), or compressed to one byte a
// value, int8 (symmetric) or float8 e4m3fn, with one float32 scale per document row
// (value = v * scale; each similarity is scaled before the max). Compressed documents pair
// with kF16 / kBF16 / kF32 queries and get no gradient.
// kResidual: ColBERTv2 residuals (uint8 packed bucket ids, a centroid id per row, see
// ResidualRef), decoded on chip: into 16-bit tensor-core tiles for float16 / bfloat16 queries
// with centroids of their dtype (16-byte aligned, dim <= 256), into the FFMA path's float32
// chunks for every other query / centroid dtype pair and dim.
enum class DocFormat : int { kNative = 0, kInt8 = 1, kE4M3 = 2, kResidual = 3 };

// An index tensor (lengths, offsets, ids) of int32 or int64; `size` is its element count
// so reads can be range-checked on the device.
struct IndexRef {
  const void* ptr = nullptr;
  int64_t size = 0;
  int is64 = 0;
};

// Residual documents' codec: row r decodes to round(centroids[codes[r]] + weights[bucket])
// per dimension (summed in float32, rounded to the queries' type), and its similarities are
// multiplied by 1 / max(||row||, 1e-12) when `normalize`. A code outside [0, n_centroids)
// gives the row a NaN factor (never an out-of-bounds read).
struct ResidualRef {
  const void* codes = nullptr;  // [d_rows] int32 / int64
  int codes_is64 = 0;
  const void* centroids = nullptr;  // [n_centroids, dim], contiguous
  int centroids_dtype = 0;          // 0 float32, 1 float16, 2 bfloat16
  int64_t n_centroids = 0;
  const void* weights = nullptr;  // bucket weights, 2**nbits of them, on the device
  int weights_dtype = 0;          // 0 float32, 1 float16, 2 bfloat16
  int nbits = 0;
  int normalize = 1;
};

// Whether the centroids are 16-bit rows of the queries' dtype on 16-byte boundaries: rows the
// tensor-core decode copies as they are, and grad_queries reads a 16-byte vector at a time.
inline bool residual_rows_of(const ResidualRef& r, DType queries) {
  const int q = queries == DType::kF16 ? 1 : queries == DType::kBF16 ? 2 : -1;
  return r.centroids_dtype == q && (reinterpret_cast<uintptr_t>(r.centroids) & 15) == 0;
}

// What forward and backward both see of a call: the surface, its embeddings and sizes and
// index tensors, and where to run. Shapes, by surface (see docs/design.md):
//   padded:      queries [B,Lq,D]  documents [B,C,Ld,D]   num_queries=B, cands=C, lq=Lq, ld=Ld
//   contrastive: queries [Nq,Lq,D] documents [T,D]        num_queries=Nq, num_docs=Nb, lq=Lq
//   packed:      queries [Tq,D]    documents [Td,D]       num_queries=Nq, num_docs=Nd, pairs=P
//   contrastive padded: queries [Nq,Lq,D] documents [Nb,Ld,D]  num_queries=Nq, num_docs=Nb,
//                lq=Lq, ld=Ld, doc_lengths [Nb]
struct Problem {
  Surface surface = Surface::kPadded;
  DType dtype = DType::kF16;  // the queries' (and native documents') dtype
  DocFormat doc_format = DocFormat::kNative;
  const void* queries = nullptr;
  const void* documents = nullptr;
  const float* doc_scales = nullptr;  // compressed documents: [d_rows]
  ResidualRef residual;               // residual documents
  int64_t dim = 0;
  int64_t q_rows = 0;  // rows of the queries tensor (all leading dims flattened)
  int64_t d_rows = 0;  // rows of the documents tensor
  int64_t num_queries = 0;
  int64_t num_docs = 0;
  int64_t cands = 0;
  int64_t lq = 0;
  int64_t ld = 0;
  int64_t pairs = 0;  // B*C, Nq*Nb or P
  IndexRef query_lengths, doc_lengths;    // padded (both), contrastive (query_lengths, optional),
                                          // contrastive padded (doc_lengths; query_lengths optional)
  IndexRef query_offsets, doc_offsets;    // packed (both), contrastive (doc_offsets)
  IndexRef pair_query_ids, pair_doc_ids;  // packed
  int num_sms = 1;
  cudaStream_t stream = nullptr;
};

struct ForwardParams : Problem {
  void* scores = nullptr;     // float32 (float64 for kF64 inputs), [pairs]
  int32_t* argmax = nullptr;  // [pairs, argmax_width] or null
  int64_t argmax_width = 0;   // Lq, Lq or max_q_len (0 without argmax)
  int64_t max_q_len = 0;      // packed: sizes the query block (longer queries still work)
  int variant = -1;           // tuning knob: contrastive block rows, 0 = 128, else 256 (-1 = default)
  int rerank_variant = -1;    // tuning knob: padded/packed block shape for Lq <= 32 (-1 = default)
};

struct BackwardParams : Problem {
  const void* grad_scores = nullptr;  // float32 (float64 for kF64), [pairs]
  const int32_t* argmax = nullptr;    // [pairs, argmax_width]
  int64_t argmax_width = 0;
  void* grad_queries = nullptr;    // null when not needed; same dtype/shape as queries
  void* grad_documents = nullptr;  // null when not needed
  // packed: pair indices grouped by query / by document (CSR), so each gradient row has one owner
  IndexRef pairs_by_query, query_pair_offsets, pairs_by_document, document_pair_offsets;
};

// PLAID's centroid-only score: scores[p] = sum_{i < qlen} max_j table[q, codes[j], i] over the
// document's codes, table [Nq, n_centroids, Lq] float32, element (q, c, i) at
// q * query_stride + c * row_stride + i. Pairs: every query x every document (pair ids absent)
// or listed. Bad ids / offsets score NaN, a bad code makes its token NaN.
struct CentroidParams {
  const float* table = nullptr;
  int64_t num_queries = 0, n_centroids = 0, lq = 0, query_stride = 0, row_stride = 0;
  IndexRef codes, doc_offsets, query_lengths, pair_query_ids, pair_doc_ids;
  int64_t num_docs = 0, pairs = 0;
  float* scores = nullptr;
  cudaStream_t stream = nullptr;
};
cudaError_t launch_centroid_score(const CentroidParams& p);

// The table the score gathers from, for the inputs cuBLAS does not take with float32
// accumulation (float32 or mixed dtypes): <queries[q, i], centroids[c]> accumulated in float32
// in dimension order at table[(c * Nq + q) * Lq + i] (queries [Nq, Lq, dim], centroids
// [n_centroids, dim], each contiguous in any float dtype). The layout is the one
// centroids @ queries.reshape(Nq * Lq, dim).T gives, so both routes return the same strides.
struct CentroidTableParams {
  const void* queries = nullptr;
  const void* centroids = nullptr;
  DType query_dtype = DType::kF32, centroid_dtype = DType::kF32;
  int64_t num_queries = 0, lq = 0, n_centroids = 0, dim = 0;
  float* table = nullptr;
  cudaStream_t stream = nullptr;
};
cudaError_t launch_centroid_table(const CentroidTableParams& p);

// float32 embeddings on the 16-bit kernels, as torch.set_float32_matmul_precision allows:
// "high" rounds each tensor to float16 after multiplying it by a power of two picked from its
// largest finite magnitude (TF32's significand, float32's range; the scores then carry the
// product of the powers, which launch_unscale_scores removes), "medium" rounds to bfloat16.
// Tensor 0 is the queries, tensor 1 (when `tensors` is 2) the float documents.
struct RoundInputs {
  const float* src[2] = {nullptr, nullptr};
  void* dst[2] = {nullptr, nullptr};  // float16 / bfloat16, n[t] elements
  int64_t n[2] = {0, 0};
  int tensors = 0;
  int to_bf16 = 0;
  uint32_t* amax = nullptr;  // [tensors], device scratch the launcher clears ("high" only)
  int num_sms = 1;
  cudaStream_t stream = nullptr;
};
cudaError_t launch_round_inputs(const RoundInputs& r);
cudaError_t launch_unscale_scores(const RoundInputs& r, float* scores, int64_t n);

// Forward: one kernel family; the surface is a policy. Half types run tensor-core
// (mma.sync) mainloops (query in registers for dim <= 256, K-streamed through shared
// memory above), fp32/fp64 the SIMT FFMA mainloop.
cudaError_t launch_forward(const ForwardParams& p);
// Backward: gradients from the stored argmax; every output row has one owner.
// The caller zero-fills grad tensors whose rows are not all owned by a segment
// (contrastive grad_documents, packed grad_queries / grad_documents).
cudaError_t launch_backward(const BackwardParams& p);

}  // namespace maxsim_cuda
