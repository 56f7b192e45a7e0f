// Op schemas and per-backend registration. The trailing storage arguments say how the
// documents are stored (document_scales: int8 / float8; document_codes, centroids,
// bucket_weights, normalize: ColBERTv2 residuals); backends receive them as one struct.
// Autograd is in autograd.cpp, the fake (meta)
// kernels in the Python package. Every backend's forward is registered behind the argument
// checks of checks.h (and made contiguous), so each backend's kernels see checked,
// contiguous tensors and the Python entry points need no validation of their own.
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/matmul.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "checks.h"
#include "registration.h"
#include "torch_binding.h"

namespace maxsim_checked {

using at::Tensor;
using Opt = std::optional<Tensor>;
using Pair = std::tuple<Tensor, Tensor>;
using maxsim_storage::DocumentStorage;

inline Opt contiguous(const Opt& t) { return t.has_value() ? Opt(t->contiguous()) : std::nullopt; }

// The schema's storage arguments as one struct, contiguous.
inline DocumentStorage storage_of(const Opt& scales, const Opt& codes, const Opt& centroids, const Opt& weights,
                                  bool normalize) {
  return {contiguous(scales), contiguous(codes), contiguous(centroids), contiguous(weights), normalize};
}

#define MAXSIM_STORAGE_PARAMS \
  const Opt &scales, const Opt &codes, const Opt &centroids, const Opt &weights, bool normalize
#define MAXSIM_STORAGE_ARGS scales, codes, centroids, weights, normalize

template <Pair (*Fn)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, const DocumentStorage&)>
Pair padded_forward(const Tensor& q, const Tensor& d, const Tensor& ql, const Tensor& dl, bool with_argmax,
                    MAXSIM_STORAGE_PARAMS) {
  const DocumentStorage st = storage_of(MAXSIM_STORAGE_ARGS);
  maxsim_checks::padded(q, d, ql, dl, st);
  return Fn(q.contiguous(), d.contiguous(), ql.contiguous(), dl.contiguous(), with_argmax, st);
}

// PACKED: documents cut by document_offsets; else padded with document_lengths.
template <Pair (*Fn)(const Tensor&, const Tensor&, const Tensor&, const Opt&, bool, const DocumentStorage&),
          bool PACKED>
Pair contrastive_forward(const Tensor& q, const Tensor& d, const Tensor& segments, const Opt& ql, bool with_argmax,
                         MAXSIM_STORAGE_PARAMS) {
  const DocumentStorage st = storage_of(MAXSIM_STORAGE_ARGS);
  maxsim_checks::contrastive<PACKED>(q, d, segments, ql, st);
  return Fn(q.contiguous(), d.contiguous(), segments.contiguous(), contiguous(ql), with_argmax, st);
}

template <Pair (*Fn)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                     bool, const DocumentStorage&)>
Pair packed_forward(const Tensor& q, const Tensor& q_offsets, const Tensor& d, const Tensor& d_offsets,
                    const Tensor& pq, const Tensor& pd, int64_t max_q_len, bool with_argmax, MAXSIM_STORAGE_PARAMS) {
  const DocumentStorage st = storage_of(MAXSIM_STORAGE_ARGS);
  maxsim_checks::packed(q, q_offsets, d, d_offsets, pq, pd, max_q_len, st);
  return Fn(q.contiguous(), q_offsets.contiguous(), d.contiguous(), d_offsets.contiguous(), pq.contiguous(),
            pd.contiguous(), max_q_len < 0 ? 0 : max_q_len, with_argmax, st);
}

// Backward ops: called by autograd.cpp with the forward's (checked) tensors.
template <Pair (*Fn)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                     bool, const DocumentStorage&)>
Pair padded_backward(const Tensor& g, const Tensor& q, const Tensor& d, const Tensor& ql, const Tensor& dl,
                     const Tensor& argmax, bool need_q, bool need_d, MAXSIM_STORAGE_PARAMS) {
  return Fn(g, q, d, ql, dl, argmax, need_q, need_d, storage_of(MAXSIM_STORAGE_ARGS));
}

template <Pair (*Fn)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Opt&, const Tensor&, bool, bool,
                     const DocumentStorage&)>
Pair contrastive_backward(const Tensor& g, const Tensor& q, const Tensor& d, const Tensor& segments, const Opt& ql,
                          const Tensor& argmax, bool need_q, bool need_d, MAXSIM_STORAGE_PARAMS) {
  return Fn(g, q, d, segments, ql, argmax, need_q, need_d, storage_of(MAXSIM_STORAGE_ARGS));
}

template <Pair (*Fn)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                     const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                     bool, const DocumentStorage&)>
Pair packed_backward(const Tensor& g, const Tensor& q, const Tensor& q_offsets, const Tensor& d,
                     const Tensor& d_offsets, const Tensor& pq, const Tensor& pd, const Tensor& argmax,
                     const Tensor& by_query, const Tensor& query_ptr, const Tensor& by_doc, const Tensor& doc_ptr,
                     bool need_q, bool need_d, MAXSIM_STORAGE_PARAMS) {
  return Fn(g, q, q_offsets, d, d_offsets, pq, pd, argmax, by_query, query_ptr, by_doc, doc_ptr, need_q, need_d,
            storage_of(MAXSIM_STORAGE_ARGS));
}

#undef MAXSIM_STORAGE_PARAMS
#undef MAXSIM_STORAGE_ARGS

// PLAID's centroid-only score in one op: the checks, the [Nq, n_centroids, Lq] table of
// query-centroid similarities, then the backend's gather (its centroid_forward). The table
// accumulates in float32 or better whatever the caller's matmul settings allow: CUDA builds it
// with maxsim_cuda::centroid_table; elsewhere a matmul, in float64 on the CPU where the float32
// precision is not "highest" (oneDNN may round float32 inputs to bfloat16 otherwise); Metal
// has no reduced float32 matmul.
using Table = Tensor (*)(const Tensor&, const Tensor&);
using Gather = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const Opt&, const Opt&, const Opt&);

inline Tensor matmul_table(const Tensor& q, const Tensor& cents) {
  const bool wide = q.is_cpu() && at::globalContext().float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST;
  const auto acc = wide || q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::NoGradGuard no_grad;
  return at::matmul(cents.to(acc), q.to(acc).transpose(1, 2)).to(at::kFloat).contiguous();
}

template <Table MakeTable, Gather Fn>
Tensor centroid_score(const Tensor& q, const Tensor& codes, const Tensor& offs, const Tensor& cents, const Opt& ql,
                      const Opt& pq, const Opt& pd) {
  maxsim_checks::centroids(q, codes, offs, cents, ql, pq, pd);
  return Fn(MakeTable(q, cents), codes.contiguous(), offs.contiguous(), contiguous(ql), contiguous(pq),
            contiguous(pd));
}

}  // namespace maxsim_checked

#define MAXSIM_IMPL_BACKEND(ops, key, ns)                                                                \
  ops.impl("padded_forward", key, &maxsim_checked::padded_forward<&ns::padded_forward>);                \
  ops.impl("contrastive_forward", key, &maxsim_checked::contrastive_forward<&ns::contrastive_forward, true>); \
  ops.impl("contrastive_padded_forward", key,                                                           \
           &maxsim_checked::contrastive_forward<&ns::contrastive_padded_forward, false>);              \
  ops.impl("packed_forward", key, &maxsim_checked::packed_forward<&ns::packed_forward>);                \
  ops.impl("padded_backward", key, &maxsim_checked::padded_backward<&ns::padded_backward>);             \
  ops.impl("contrastive_backward", key, &maxsim_checked::contrastive_backward<&ns::contrastive_backward>);   \
  ops.impl("contrastive_padded_backward", key,                                                           \
           &maxsim_checked::contrastive_backward<&ns::contrastive_padded_backward>);                   \
  ops.impl("packed_backward", key, &maxsim_checked::packed_backward<&ns::packed_backward>);

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def(
      "padded_forward(Tensor queries, Tensor documents, Tensor query_lengths, "
      "Tensor doc_lengths, bool with_argmax, Tensor? document_scales=None, Tensor? document_codes=None, "
      "Tensor? centroids=None, Tensor? bucket_weights=None, bool normalize=True) -> (Tensor, Tensor)");
  ops.def(
      "contrastive_forward(Tensor queries, Tensor documents, Tensor document_offsets, "
      "Tensor? query_lengths, bool with_argmax, Tensor? document_scales=None, Tensor? document_codes=None, "
      "Tensor? centroids=None, Tensor? bucket_weights=None, bool normalize=True) -> (Tensor, Tensor)");
  ops.def(
      "contrastive_padded_forward(Tensor queries, Tensor documents, Tensor document_lengths, "
      "Tensor? query_lengths, bool with_argmax, Tensor? document_scales=None, Tensor? document_codes=None, "
      "Tensor? centroids=None, Tensor? bucket_weights=None, bool normalize=True) -> (Tensor, Tensor)");
  ops.def(
      "packed_forward(Tensor queries, Tensor query_offsets, Tensor documents, "
      "Tensor document_offsets, Tensor pair_query_ids, Tensor pair_document_ids, "
      "int max_q_len, bool with_argmax, Tensor? document_scales=None, Tensor? document_codes=None, "
      "Tensor? centroids=None, Tensor? bucket_weights=None, bool normalize=True) -> (Tensor, Tensor)");
  ops.def(
      "padded_backward(Tensor grad_scores, Tensor queries, Tensor documents, "
      "Tensor query_lengths, Tensor doc_lengths, Tensor argmax, bool need_grad_queries, "
      "bool need_grad_documents, Tensor? document_scales=None, Tensor? document_codes=None, "
      "Tensor? centroids=None, Tensor? bucket_weights=None, bool normalize=True) -> (Tensor, Tensor)");
  ops.def(
      "contrastive_backward(Tensor grad_scores, Tensor queries, Tensor documents, "
      "Tensor document_offsets, Tensor? query_lengths, Tensor argmax, "
      "bool need_grad_queries, bool need_grad_documents, Tensor? document_scales=None, Tensor? document_codes=None, "
      "Tensor? centroids=None, Tensor? bucket_weights=None, bool normalize=True) -> (Tensor, Tensor)");
  ops.def(
      "contrastive_padded_backward(Tensor grad_scores, Tensor queries, Tensor documents, "
      "Tensor document_lengths, Tensor? query_lengths, Tensor argmax, "
      "bool need_grad_queries, bool need_grad_documents, Tensor? document_scales=None, Tensor? document_codes=None, "
      "Tensor? centroids=None, Tensor? bucket_weights=None, bool normalize=True) -> (Tensor, Tensor)");
  ops.def(
      "packed_backward(Tensor grad_scores, Tensor queries, Tensor query_offsets, "
      "Tensor documents, Tensor document_offsets, Tensor pair_query_ids, "
      "Tensor pair_document_ids, Tensor argmax, Tensor pairs_by_query, "
      "Tensor query_pair_offsets, Tensor pairs_by_document, Tensor document_pair_offsets, "
      "bool need_grad_queries, bool need_grad_documents, Tensor? document_scales=None, Tensor? document_codes=None, "
      "Tensor? centroids=None, Tensor? bucket_weights=None, bool normalize=True) -> (Tensor, Tensor)");

  // PLAID's centroid-only stage (torch-ext/maxsim/_residual.py builds the table).
  ops.def(
      "centroid_forward(Tensor table, Tensor document_codes, Tensor document_offsets, "
      "Tensor? query_lengths, Tensor? pair_query_ids, Tensor? pair_document_ids) -> Tensor");
  ops.def("centroid_table(Tensor queries, Tensor centroids) -> Tensor");
  ops.def(
      "centroid_score(Tensor queries, Tensor document_codes, Tensor document_offsets, Tensor centroids, "
      "Tensor? query_lengths, Tensor? pair_query_ids, Tensor? pair_document_ids) -> Tensor");

  // Every variant carries the CPU backend, so CPU tensors work next to a GPU build.
  MAXSIM_IMPL_BACKEND(ops, c10::DeviceType::CPU, maxsim_cpu)
  ops.impl("centroid_forward", c10::DeviceType::CPU, &maxsim_cpu::centroid_forward);
  ops.impl("centroid_score", c10::DeviceType::CPU,
           &maxsim_checked::centroid_score<&maxsim_checked::matmul_table, &maxsim_cpu::centroid_forward>);
#if defined(CUDA_KERNEL)
  MAXSIM_IMPL_BACKEND(ops, c10::DeviceType::CUDA, maxsim_cuda)
  ops.impl("centroid_forward", c10::DeviceType::CUDA, &maxsim_cuda::centroid_forward);
  ops.impl("centroid_table", c10::DeviceType::CUDA, &maxsim_cuda::centroid_table);
  ops.impl("centroid_score", c10::DeviceType::CUDA,
           &maxsim_checked::centroid_score<&maxsim_cuda::centroid_table, &maxsim_cuda::centroid_forward>);
#endif
#if defined(METAL_KERNEL)
  MAXSIM_IMPL_BACKEND(ops, c10::DeviceType::MPS, maxsim_metal)
  ops.impl("centroid_forward", c10::DeviceType::MPS, &maxsim_metal::centroid_forward);
  ops.impl("centroid_score", c10::DeviceType::MPS,
           &maxsim_checked::centroid_score<&maxsim_checked::matmul_table, &maxsim_metal::centroid_forward>);
#endif
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
