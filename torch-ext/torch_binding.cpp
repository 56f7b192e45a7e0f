// Op schemas and per-backend registration. Autograd is in autograd.cpp; validation and
// the fake (meta) kernels live in the Python package; this file only wires names to kernels.
#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

#define MAXSIM_IMPL_BACKEND(ops, key, ns)                              \
  ops.impl("padded_forward", key, &ns::padded_forward);               \
  ops.impl("contrastive_forward", key, &ns::contrastive_forward);     \
  ops.impl("contrastive_padded_forward", key, &ns::contrastive_padded_forward); \
  ops.impl("packed_forward", key, &ns::packed_forward);               \
  ops.impl("padded_backward", key, &ns::padded_backward);             \
  ops.impl("contrastive_backward", key, &ns::contrastive_backward);   \
  ops.impl("contrastive_padded_backward", key, &ns::contrastive_padded_backward); \
  ops.impl("packed_backward", key, &ns::packed_backward);

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def(
      "padded_forward(Tensor queries, Tensor documents, Tensor query_lengths, "
      "Tensor doc_lengths, bool with_argmax, Tensor? document_scales=None) -> (Tensor, Tensor)");
  ops.def(
      "contrastive_forward(Tensor queries, Tensor documents, Tensor document_offsets, "
      "Tensor? query_lengths, bool with_argmax, Tensor? document_scales=None) -> (Tensor, Tensor)");
  ops.def(
      "contrastive_padded_forward(Tensor queries, Tensor documents, Tensor document_lengths, "
      "Tensor? query_lengths, bool with_argmax, Tensor? document_scales=None) -> (Tensor, Tensor)");
  ops.def(
      "packed_forward(Tensor queries, Tensor query_offsets, Tensor documents, "
      "Tensor document_offsets, Tensor pair_query_ids, Tensor pair_document_ids, "
      "int max_q_len, bool with_argmax, Tensor? document_scales=None) -> (Tensor, Tensor)");
  ops.def(
      "padded_backward(Tensor grad_scores, Tensor queries, Tensor documents, "
      "Tensor query_lengths, Tensor doc_lengths, Tensor argmax, bool need_grad_queries, "
      "bool need_grad_documents, Tensor? document_scales=None) -> (Tensor, Tensor)");
  ops.def(
      "contrastive_backward(Tensor grad_scores, Tensor queries, Tensor documents, "
      "Tensor document_offsets, Tensor? query_lengths, Tensor argmax, "
      "bool need_grad_queries, bool need_grad_documents, Tensor? document_scales=None) -> (Tensor, Tensor)");
  ops.def(
      "contrastive_padded_backward(Tensor grad_scores, Tensor queries, Tensor documents, "
      "Tensor document_lengths, Tensor? query_lengths, Tensor argmax, "
      "bool need_grad_queries, bool need_grad_documents, Tensor? document_scales=None) -> (Tensor, Tensor)");
  ops.def(
      "packed_backward(Tensor grad_scores, Tensor queries, Tensor query_offsets, "
      "Tensor documents, Tensor document_offsets, Tensor pair_query_ids, "
      "Tensor pair_document_ids, Tensor argmax, Tensor pairs_by_query, "
      "Tensor query_pair_offsets, Tensor pairs_by_document, Tensor document_pair_offsets, "
      "bool need_grad_queries, bool need_grad_documents, Tensor? document_scales=None) -> (Tensor, Tensor)");

  // Every variant carries the CPU backend, so CPU tensors work next to a GPU build.
  MAXSIM_IMPL_BACKEND(ops, c10::DeviceType::CPU, maxsim_cpu)
#if defined(CUDA_KERNEL)
  MAXSIM_IMPL_BACKEND(ops, c10::DeviceType::CUDA, maxsim_cuda)
#endif
#if defined(METAL_KERNEL)
  MAXSIM_IMPL_BACKEND(ops, c10::DeviceType::MPS, maxsim_metal)
#endif
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
