// Tensor glue for the CUDA backend: check shapes, allocate outputs, read the current
// stream, fill the plain params struct and call the torch-free launchers (launch.h).
// No host synchronisation: every launch is enqueued on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // at::cuda::getCurrentCUDAStream is this function

#include <atomic>
#include <cstdlib>

#include "maxsim_cuda/launch.h"
#include "torch_binding.h"

namespace maxsim_cuda {
namespace {

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kFloat: return DType::kF32;
    case at::kDouble: return DType::kF64;
    default: TORCH_CHECK(false, "maxsim: unsupported dtype ", t.scalar_type());
  }
}

at::ScalarType score_type(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

void check_device(const at::Tensor& t, const at::Tensor& ref, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == ref.device(), "maxsim: ", name, " must be on ", ref.device());
}

IndexRef index_ref(const at::Tensor& t, const at::Tensor& ref, const char* name) {
  check_device(t, ref, name);
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, "maxsim: ", name,
              " must be int32 or int64");
  TORCH_CHECK(t.is_contiguous(), "maxsim: ", name, " must be contiguous");
  IndexRef r;
  r.ptr = t.numel() > 0 ? t.data_ptr() : nullptr;
  r.size = t.numel();
  r.is64 = t.scalar_type() == at::kLong;
  return r;
}

void check_inputs(const at::Tensor& q, const at::Tensor& d) {
  TORCH_CHECK(q.is_cuda(), "maxsim: queries must be a CUDA tensor");
  check_device(d, q, "documents");
  TORCH_CHECK(q.scalar_type() == d.scalar_type(), "maxsim: queries and documents must share a dtype");
  TORCH_CHECK(q.is_contiguous() && d.is_contiguous(), "maxsim: inputs must be contiguous");
  dtype_of(q);
}

void check_launch(cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "maxsim CUDA launch failed: ", cudaGetErrorString(err));
}

// Multiprocessor count of the current device, cached per device (no sync, capture-safe).
int num_sms() {
  static std::atomic<int> cache[64];
  int dev = 0;
  check_launch(cudaGetDevice(&dev));
  int n = cache[dev & 63].load(std::memory_order_relaxed);
  if (n == 0) {
    check_launch(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cache[dev & 63].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Tuning knobs for device experiments (read once; unset = the tuned defaults):
// MAXSIM_CUDA_CONTRASTIVE_CFG=0|2 (contrastive block shape), MAXSIM_CUDA_RERANK_CFG=0|1
// (padded/packed block shape for short queries). See kernel/forward_kernel.cuh. Every
// setting computes the same results; tools/device/tune.sh checks and times them.
int env_knob(const char* name) {
  const char* e = std::getenv(name);
  return e ? std::atoi(e) : -1;
}
int contrastive_variant() {
  static const int v = env_knob("MAXSIM_CUDA_CONTRASTIVE_CFG");
  return v;
}
int rerank_variant() {
  static const int v = env_knob("MAXSIM_CUDA_RERANK_CFG");
  return v;
}

template <class P>
void fill_common(P& p, const at::Tensor& q, const at::Tensor& d) {
  p.dtype = dtype_of(q);
  p.queries = q.numel() > 0 ? q.data_ptr() : nullptr;
  p.documents = d.numel() > 0 ? d.data_ptr() : nullptr;
  p.dim = q.size(-1);
  // Rows from the leading sizes, not numel / dim: with dim == 0 there are still rows
  // (every dot product is 0), and offsets are checked against these counts.
  p.q_rows = c10::multiply_integers(q.sizes().slice(0, q.dim() - 1));
  p.d_rows = c10::multiply_integers(d.sizes().slice(0, d.dim() - 1));
  p.num_sms = num_sms();
  p.stream = c10::cuda::getCurrentCUDAStream().stream();
}

std::tuple<at::Tensor, at::Tensor> forward_outputs(const at::Tensor& q, at::IntArrayRef score_shape,
                                                   at::IntArrayRef argmax_shape, bool with_argmax) {
  auto scores = at::empty(score_shape, q.options().dtype(score_type(q)));
  auto argmax = with_argmax ? at::empty(argmax_shape, q.options().dtype(at::kInt))
                            : at::empty({0}, q.options().dtype(at::kInt));
  return {scores, argmax};
}

void set_outputs(ForwardParams& p, at::Tensor& scores, at::Tensor& argmax, bool with_argmax, int64_t width) {
  p.scores = scores.numel() > 0 ? scores.data_ptr() : nullptr;
  p.argmax = with_argmax && argmax.numel() > 0 ? argmax.data_ptr<int32_t>() : nullptr;
  p.argmax_width = with_argmax ? width : 0;
}

// Gradient outputs: `owned` ones are fully written by the kernels, the others start at zero.
at::Tensor grad_output(bool need, const at::Tensor& like, bool owned) {
  if (!need) return at::empty({0}, like.options());
  return owned ? at::empty_like(like) : at::zeros_like(like);
}

at::Tensor grad_scores_as(const at::Tensor& g, const at::Tensor& q) {
  check_device(g, q, "grad_scores");
  return g.to(score_type(q)).contiguous();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> padded_forward(const at::Tensor& queries, const at::Tensor& documents,
                                                  const at::Tensor& query_lengths, const at::Tensor& doc_lengths,
                                                  bool with_argmax) {
  check_inputs(queries, documents);
  TORCH_CHECK(queries.dim() == 3 && documents.dim() == 4, "maxsim: padded expects [B,Lq,D] and [B,C,Ld,D]");
  const int64_t B = queries.size(0), Lq = queries.size(1), D = queries.size(2);
  const int64_t C = documents.size(1), Ld = documents.size(2);
  TORCH_CHECK(documents.size(0) == B && documents.size(3) == D, "maxsim: padded shape mismatch");
  const c10::cuda::CUDAGuard guard(queries.device());
  auto [scores, argmax] = forward_outputs(queries, {B, C}, {B, C, Lq}, with_argmax);
  if (B * C == 0) return {scores, argmax};
  ForwardParams p;
  p.surface = Surface::kPadded;
  fill_common(p, queries, documents);
  p.num_queries = B;
  p.num_docs = B * C;
  p.cands = C;
  p.lq = Lq;
  p.ld = Ld;
  p.pairs = B * C;
  p.query_lengths = index_ref(query_lengths, queries, "query_lengths");
  p.doc_lengths = index_ref(doc_lengths, queries, "doc_lengths");
  p.rerank_variant = rerank_variant();
  set_outputs(p, scores, argmax, with_argmax, Lq);
  check_launch(launch_forward(p));
  return {scores, argmax};
}

std::tuple<at::Tensor, at::Tensor> contrastive_forward(const at::Tensor& queries, const at::Tensor& documents,
                                                       const at::Tensor& document_offsets,
                                                       const std::optional<at::Tensor>& query_lengths,
                                                       bool with_argmax) {
  check_inputs(queries, documents);
  TORCH_CHECK(queries.dim() == 3 && documents.dim() == 2, "maxsim: contrastive expects [Nq,Lq,D] and [T,D]");
  const int64_t Nq = queries.size(0), Lq = queries.size(1), D = queries.size(2);
  TORCH_CHECK(documents.size(1) == D, "maxsim: dim mismatch");
  const int64_t Nb = document_offsets.numel() > 0 ? document_offsets.numel() - 1 : 0;
  const c10::cuda::CUDAGuard guard(queries.device());
  auto [scores, argmax] = forward_outputs(queries, {Nq, Nb}, {Nq, Nb, Lq}, with_argmax);
  if (Nq * Nb == 0) return {scores, argmax};
  ForwardParams p;
  p.surface = Surface::kContrastive;
  fill_common(p, queries, documents);
  p.num_queries = Nq;
  p.num_docs = Nb;
  p.lq = Lq;
  p.pairs = Nq * Nb;
  p.doc_offsets = index_ref(document_offsets, queries, "document_offsets");
  if (query_lengths.has_value()) p.query_lengths = index_ref(*query_lengths, queries, "query_lengths");
  p.variant = contrastive_variant();
  set_outputs(p, scores, argmax, with_argmax, Lq);
  check_launch(launch_forward(p));
  return {scores, argmax};
}

std::tuple<at::Tensor, at::Tensor> packed_forward(const at::Tensor& queries, const at::Tensor& query_offsets,
                                                  const at::Tensor& documents, const at::Tensor& document_offsets,
                                                  const at::Tensor& pair_query_ids,
                                                  const at::Tensor& pair_document_ids, int64_t max_q_len,
                                                  bool with_argmax) {
  check_inputs(queries, documents);
  TORCH_CHECK(queries.dim() == 2 && documents.dim() == 2, "maxsim: packed expects [Tq,D] and [Td,D]");
  TORCH_CHECK(documents.size(1) == queries.size(1), "maxsim: dim mismatch");
  TORCH_CHECK(max_q_len >= 0, "maxsim: max_q_len must be >= 0");
  const int64_t P = pair_query_ids.numel();
  TORCH_CHECK(pair_document_ids.numel() == P, "maxsim: pair id tensors differ in length");
  const c10::cuda::CUDAGuard guard(queries.device());
  auto [scores, argmax] = forward_outputs(queries, {P}, {P, max_q_len}, with_argmax);
  if (P == 0) return {scores, argmax};
  ForwardParams p;
  p.surface = Surface::kPacked;
  fill_common(p, queries, documents);
  p.num_queries = query_offsets.numel() > 0 ? query_offsets.numel() - 1 : 0;
  p.num_docs = document_offsets.numel() > 0 ? document_offsets.numel() - 1 : 0;
  p.pairs = P;
  p.max_q_len = max_q_len;
  p.query_offsets = index_ref(query_offsets, queries, "query_offsets");
  p.doc_offsets = index_ref(document_offsets, queries, "document_offsets");
  p.pair_query_ids = index_ref(pair_query_ids, queries, "pair_query_ids");
  p.pair_doc_ids = index_ref(pair_document_ids, queries, "pair_document_ids");
  p.rerank_variant = rerank_variant();
  set_outputs(p, scores, argmax, with_argmax, max_q_len);
  check_launch(launch_forward(p));
  return {scores, argmax};
}

namespace {
void fill_backward(BackwardParams& p, const at::Tensor& g, const at::Tensor& q, const at::Tensor& d,
                   const at::Tensor& argmax, at::Tensor& gq, at::Tensor& gd, bool need_q, bool need_d) {
  fill_common(p, q, d);
  p.grad_scores = g.numel() > 0 ? g.data_ptr() : nullptr;
  check_device(argmax, q, "argmax");
  TORCH_CHECK(argmax.scalar_type() == at::kInt && argmax.is_contiguous(), "maxsim: argmax must be contiguous int32");
  p.argmax = argmax.numel() > 0 ? argmax.data_ptr<int32_t>() : nullptr;
  p.argmax_width = argmax.dim() > 0 ? argmax.size(-1) : 0;
  p.grad_queries = need_q && gq.numel() > 0 ? gq.data_ptr() : nullptr;
  p.grad_documents = need_d && gd.numel() > 0 ? gd.data_ptr() : nullptr;
}
void zero_all(at::Tensor& gq, at::Tensor& gd) {
  if (gq.numel() > 0) gq.zero_();
  if (gd.numel() > 0) gd.zero_();
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> padded_backward(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                   const at::Tensor& documents, const at::Tensor& query_lengths,
                                                   const at::Tensor& doc_lengths, const at::Tensor& argmax,
                                                   bool need_grad_queries, bool need_grad_documents) {
  check_inputs(queries, documents);
  TORCH_CHECK(queries.dim() == 3 && documents.dim() == 4, "maxsim: padded expects [B,Lq,D] and [B,C,Ld,D]");
  const c10::cuda::CUDAGuard guard(queries.device());
  auto gq = grad_output(need_grad_queries, queries, true);
  auto gd = grad_output(need_grad_documents, documents, true);
  const int64_t B = queries.size(0), C = documents.size(1);
  if (B * C == 0 || queries.size(2) == 0 || (!need_grad_queries && !need_grad_documents)) {
    zero_all(gq, gd);
    return {gq, gd};
  }
  TORCH_CHECK(argmax.numel() == B * C * queries.size(1), "maxsim: argmax shape mismatch");
  const auto g = grad_scores_as(grad_scores, queries);
  TORCH_CHECK(g.numel() == B * C, "maxsim: grad_scores shape mismatch");
  BackwardParams p;
  p.surface = Surface::kPadded;
  fill_backward(p, g, queries, documents, argmax, gq, gd, need_grad_queries, need_grad_documents);
  p.num_queries = B;
  p.num_docs = B * C;
  p.cands = C;
  p.lq = queries.size(1);
  p.ld = documents.size(2);
  p.pairs = B * C;
  p.query_lengths = index_ref(query_lengths, queries, "query_lengths");
  p.doc_lengths = index_ref(doc_lengths, queries, "doc_lengths");
  check_launch(launch_backward(p));
  return {gq, gd};
}

std::tuple<at::Tensor, at::Tensor> contrastive_backward(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                        const at::Tensor& documents,
                                                        const at::Tensor& document_offsets,
                                                        const std::optional<at::Tensor>& query_lengths,
                                                        const at::Tensor& argmax, bool need_grad_queries,
                                                        bool need_grad_documents) {
  check_inputs(queries, documents);
  TORCH_CHECK(queries.dim() == 3 && documents.dim() == 2, "maxsim: contrastive expects [Nq,Lq,D] and [T,D]");
  const c10::cuda::CUDAGuard guard(queries.device());
  auto gq = grad_output(need_grad_queries, queries, true);
  auto gd = grad_output(need_grad_documents, documents, false);
  const int64_t Nq = queries.size(0), Lq = queries.size(1);
  const int64_t Nb = document_offsets.numel() > 0 ? document_offsets.numel() - 1 : 0;
  if (Nq * Nb == 0 || queries.size(2) == 0 || (!need_grad_queries && !need_grad_documents)) {
    zero_all(gq, gd);
    return {gq, gd};
  }
  TORCH_CHECK(argmax.numel() == Nq * Nb * Lq, "maxsim: argmax shape mismatch");
  const auto g = grad_scores_as(grad_scores, queries);
  TORCH_CHECK(g.numel() == Nq * Nb, "maxsim: grad_scores shape mismatch");
  BackwardParams p;
  p.surface = Surface::kContrastive;
  fill_backward(p, g, queries, documents, argmax, gq, gd, need_grad_queries, need_grad_documents);
  p.num_queries = Nq;
  p.num_docs = Nb;
  p.lq = Lq;
  p.pairs = Nq * Nb;
  p.argmax_width = Lq;
  p.doc_offsets = index_ref(document_offsets, queries, "document_offsets");
  if (query_lengths.has_value()) p.query_lengths = index_ref(*query_lengths, queries, "query_lengths");
  check_launch(launch_backward(p));
  return {gq, gd};
}

std::tuple<at::Tensor, at::Tensor> packed_backward(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& query_offsets,
    const at::Tensor& documents, const at::Tensor& document_offsets, const at::Tensor& pair_query_ids,
    const at::Tensor& pair_document_ids, const at::Tensor& argmax, const at::Tensor& pairs_by_query,
    const at::Tensor& query_pair_offsets, const at::Tensor& pairs_by_document,
    const at::Tensor& document_pair_offsets, bool need_grad_queries, bool need_grad_documents) {
  check_inputs(queries, documents);
  TORCH_CHECK(queries.dim() == 2 && documents.dim() == 2, "maxsim: packed expects [Tq,D] and [Td,D]");
  const c10::cuda::CUDAGuard guard(queries.device());
  auto gq = grad_output(need_grad_queries, queries, false);
  auto gd = grad_output(need_grad_documents, documents, false);
  const int64_t P = pair_query_ids.numel();
  if (P == 0 || queries.size(1) == 0 || (!need_grad_queries && !need_grad_documents)) return {gq, gd};
  TORCH_CHECK(argmax.dim() == 2 && argmax.size(0) == P, "maxsim: argmax must be [P, max_q_len]");
  const auto g = grad_scores_as(grad_scores, queries);
  TORCH_CHECK(g.numel() == P, "maxsim: grad_scores shape mismatch");
  BackwardParams p;
  p.surface = Surface::kPacked;
  fill_backward(p, g, queries, documents, argmax, gq, gd, need_grad_queries, need_grad_documents);
  p.num_queries = query_offsets.numel() > 0 ? query_offsets.numel() - 1 : 0;
  p.num_docs = document_offsets.numel() > 0 ? document_offsets.numel() - 1 : 0;
  p.pairs = P;
  p.query_offsets = index_ref(query_offsets, queries, "query_offsets");
  p.doc_offsets = index_ref(document_offsets, queries, "document_offsets");
  p.pair_query_ids = index_ref(pair_query_ids, queries, "pair_query_ids");
  p.pair_doc_ids = index_ref(pair_document_ids, queries, "pair_document_ids");
  p.pairs_by_query = index_ref(pairs_by_query, queries, "pairs_by_query");
  p.query_pair_offsets = index_ref(query_pair_offsets, queries, "query_pair_offsets");
  p.pairs_by_document = index_ref(pairs_by_document, queries, "pairs_by_document");
  p.document_pair_offsets = index_ref(document_pair_offsets, queries, "document_pair_offsets");
  check_launch(launch_backward(p));
  return {gq, gd};
}

}  // namespace maxsim_cuda
