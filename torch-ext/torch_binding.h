// Backend entry points behind the op schemas in torch_binding.cpp. Semantics and
// argument meanings: docs/design.md. Each backend defines these in its own namespace.
#pragma once

#include <ATen/core/Tensor.h>
#include <optional>
#include <tuple>

namespace maxsim_storage {

// How the documents are stored beyond their dtype (docs/compressed.md, docs/residual.md):
// int8 / float8 e4m3fn values carry one float32 scale per token; uint8 documents are
// ColBERTv2 residuals (packed bucket ids) with a centroid id per token, the centroids and the
// bucket weights (2**nbits of them), L2-normalised after decompression when `normalize`.
struct DocumentStorage {
  std::optional<at::Tensor> scales;
  std::optional<at::Tensor> codes, centroids, bucket_weights;
  bool normalize = true;
  bool residual() const { return codes.has_value(); }
};

}  // namespace maxsim_storage

#define MAXSIM_DECLARE_BACKEND(ns)                                                     \
  namespace ns {                                                                       \
  std::tuple<at::Tensor, at::Tensor> padded_forward(                                   \
      const at::Tensor& queries, const at::Tensor& documents,                          \
      const at::Tensor& query_lengths, const at::Tensor& doc_lengths, bool with_argmax,                                                              \
      const maxsim_storage::DocumentStorage& storage); \
  std::tuple<at::Tensor, at::Tensor> contrastive_forward(                              \
      const at::Tensor& queries, const at::Tensor& documents,                          \
      const at::Tensor& document_offsets,                                              \
      const std::optional<at::Tensor>& query_lengths, bool with_argmax,                                                              \
      const maxsim_storage::DocumentStorage& storage);               \
  std::tuple<at::Tensor, at::Tensor> contrastive_padded_forward(                       \
      const at::Tensor& queries, const at::Tensor& documents,                          \
      const at::Tensor& document_lengths,                                              \
      const std::optional<at::Tensor>& query_lengths, bool with_argmax,                                                              \
      const maxsim_storage::DocumentStorage& storage);               \
  std::tuple<at::Tensor, at::Tensor> packed_forward(                                   \
      const at::Tensor& queries, const at::Tensor& query_offsets,                      \
      const at::Tensor& documents, const at::Tensor& document_offsets,                 \
      const at::Tensor& pair_query_ids, const at::Tensor& pair_document_ids,           \
      int64_t max_q_len, bool with_argmax,                                                              \
      const maxsim_storage::DocumentStorage& storage);                                            \
  std::tuple<at::Tensor, at::Tensor> padded_backward(                                  \
      const at::Tensor& grad_scores, const at::Tensor& queries,                        \
      const at::Tensor& documents, const at::Tensor& query_lengths,                    \
      const at::Tensor& doc_lengths, const at::Tensor& argmax,                         \
      bool need_grad_queries, bool need_grad_documents,                               \
      const maxsim_storage::DocumentStorage& storage);                               \
  std::tuple<at::Tensor, at::Tensor> contrastive_backward(                             \
      const at::Tensor& grad_scores, const at::Tensor& queries,                        \
      const at::Tensor& documents, const at::Tensor& document_offsets,                 \
      const std::optional<at::Tensor>& query_lengths, const at::Tensor& argmax,        \
      bool need_grad_queries, bool need_grad_documents,                               \
      const maxsim_storage::DocumentStorage& storage);                               \
  std::tuple<at::Tensor, at::Tensor> contrastive_padded_backward(                      \
      const at::Tensor& grad_scores, const at::Tensor& queries,                        \
      const at::Tensor& documents, const at::Tensor& document_lengths,                 \
      const std::optional<at::Tensor>& query_lengths, const at::Tensor& argmax,        \
      bool need_grad_queries, bool need_grad_documents,                               \
      const maxsim_storage::DocumentStorage& storage);                               \
  std::tuple<at::Tensor, at::Tensor> packed_backward(                                  \
      const at::Tensor& grad_scores, const at::Tensor& queries,                        \
      const at::Tensor& query_offsets, const at::Tensor& documents,                    \
      const at::Tensor& document_offsets, const at::Tensor& pair_query_ids,            \
      const at::Tensor& pair_document_ids, const at::Tensor& argmax,                   \
      const at::Tensor& pairs_by_query, const at::Tensor& query_pair_offsets,          \
      const at::Tensor& pairs_by_document, const at::Tensor& document_pair_offsets,    \
      bool need_grad_queries, bool need_grad_documents,                               \
      const maxsim_storage::DocumentStorage& storage);                               \
  }

// PLAID's centroid-only score (every backend): table [Nq, n_centroids, Lq] float32 -> scores.
#define MAXSIM_DECLARE_CENTROIDS(ns)                                                              \
  namespace ns {                                                                                \
  at::Tensor centroid_forward(const at::Tensor& table, const at::Tensor& document_codes,          \
                              const at::Tensor& document_offsets,                                 \
                              const std::optional<at::Tensor>& query_lengths,                     \
                              const std::optional<at::Tensor>& pair_query_ids,                    \
                              const std::optional<at::Tensor>& pair_document_ids);                \
  }

MAXSIM_DECLARE_BACKEND(maxsim_cpu)
MAXSIM_DECLARE_CENTROIDS(maxsim_cpu)
#if defined(CUDA_KERNEL)
MAXSIM_DECLARE_BACKEND(maxsim_cuda)
MAXSIM_DECLARE_CENTROIDS(maxsim_cuda)
namespace maxsim_cuda {
// The centroid score's table in float32 accumulation whatever the matmul settings (CUDA only:
// the CPU takes a float64 matmul under reduced precision settings, Metal has no TF32).
at::Tensor centroid_table(const at::Tensor& queries, const at::Tensor& centroids);
}
#endif
#if defined(METAL_KERNEL)
MAXSIM_DECLARE_BACKEND(maxsim_metal)
MAXSIM_DECLARE_CENTROIDS(maxsim_metal)
#endif
