// Objective-C++ glue of the Metal backend: allocates outputs, binds tensors at the slots
// of maxsim_metal/launch_plan.h and encodes the plan's launches on torch's current MPS
// stream. No arithmetic and no validation live here (the Python layer validates; the
// kernels range-check every index): what is launched comes from the launch plan, which
// the Linux emulator runs in tests/test_metal_emulated.py. This file itself is not
// compiled there; keep it thin enough that reading it is the check.
//
// The encoder is the stream's own (never ended here) and the command buffer is committed
// with COMMIT_AND_CONTINUE, so consecutive calls and torch's own kernels share it.
//
// Compressed documents (int8 / float8 e4m3fn values, document_scales: one float32 per row)
// pick the plan's pipeline of their format and bind the scales at the DocumentScales slot;
// the kernels widen and scale in their tile loads. They have grad_queries only.
#include <ATen/ATen.h>
#include <ATen/mps/MPSStream.h>
#include <ATen/native/mps/OperationUtils.h>
#import <Metal/Metal.h>

#include <mutex>
#include <string>
#include <unordered_map>

#include "maxsim_metal/launch_plan.h"
#include "torch_binding.h"

#ifdef EMBEDDED_METALLIB_HEADER
#include EMBEDDED_METALLIB_HEADER
#else
#error "EMBEDDED_METALLIB_HEADER not defined (kernel-builder / tools/build_metal.py define it)"
#endif

namespace maxsim_metal {
namespace {

// How the documents are stored (torch_binding.h): this backend scores float and int8 / float8
// documents; ColBERTv2 residuals are scored by the CPU backend only so far.
const std::optional<at::Tensor>& dense_storage(const maxsim_storage::DocumentStorage& storage) {
  TORCH_CHECK_NOT_IMPLEMENTED(!storage.residual(), "maxsim_metal: residual (ColBERTv2) documents are not supported on "
                              "this device yet; score them on the CPU");
  return storage.scales;
}

id<MTLComputePipelineState> pipeline(const std::string& name) {
  static std::mutex mu;
  static std::unordered_map<std::string, id<MTLComputePipelineState>> cache;
  static id<MTLLibrary> library = nil;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  id<MTLDevice> device = at::mps::getCurrentMPSStream()->device();
  NSError* error = nil;
  if (library == nil) {
    library = EMBEDDED_METALLIB_NAMESPACE::createLibrary(device, &error);
    TORCH_CHECK(library != nil, "maxsim_metal: cannot load the embedded metallib: ",
                error ? error.localizedDescription.UTF8String : "unknown error");
  }
  id<MTLFunction> fn = [library newFunctionWithName:[NSString stringWithUTF8String:name.c_str()]];
  TORCH_CHECK(fn != nil, "maxsim_metal: no kernel ", name, " in the metallib");
  id<MTLComputePipelineState> state = [device newComputePipelineStateWithFunction:fn error:&error];
  TORCH_CHECK(state != nil, "maxsim_metal: cannot build pipeline ", name, ": ",
              error ? error.localizedDescription.UTF8String : "unknown error");
  cache.emplace(name, state);
  return state;
}

Dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return Dtype::kFloat;
    case at::kHalf: return Dtype::kHalf;
    case at::kBFloat16: return Dtype::kBFloat;
    default: TORCH_CHECK(false, "maxsim_metal: float32, float16 or bfloat16 only, got ", t.scalar_type());
  }
}

// The documents' storage format. The Python layer pairs scales with compressed documents
// only; the check here keeps a kernel from reading a scales buffer that is not there.
DocFormat doc_format_of(const at::Tensor& documents, const std::optional<at::Tensor>& scales) {
  const auto s = documents.scalar_type();
  const DocFormat f = s == at::kChar ? DocFormat::kInt8
                      : s == at::kFloat8_e4m3fn ? DocFormat::kFloat8E4M3
                                                : DocFormat::kQueryDtype;
  TORCH_CHECK(is_compressed(f) == scales.has_value(),
              is_compressed(f) ? "maxsim_metal: int8 / float8 documents need document_scales"
                               : "maxsim_metal: document_scales given with float documents");
  return f;
}

IndexArg index_arg(const at::Tensor& t) { return {t.numel(), t.scalar_type() == at::kLong, true}; }
IndexArg index_arg(const std::optional<at::Tensor>& t) { return t ? index_arg(*t) : IndexArg{}; }
IndexArg no_index() { return IndexArg{}; }

// A tensor at a buffer slot; an empty one (or an absent / unused slot) binds `fallback`,
// which the kernel never reads for it.
struct Binding {
  id<MTLBuffer> buffer;
  NSUInteger offset;
};
Binding binding(const at::Tensor& t, const at::Tensor& fallback) {
  const at::Tensor& b = t.numel() > 0 ? t : fallback;
  return {at::native::mps::getMTLBufferStorage(b), NSUInteger(b.storage_offset() * b.element_size())};
}
Binding binding(const std::optional<at::Tensor>& t, const at::Tensor& fallback) {
  return binding(t ? *t : fallback, fallback);
}

static_assert(kForwardParams == 0 && kBackwardParams == 0, "encode() binds the parameters at slot 0");

void encode(const Launch& l, const Binding* slots, int num_slots) {
  if (!l.run) return;
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  id<MTLComputePipelineState> state = pipeline(l.kernel);
  const MaxsimParams params = l.params;
  const MTLSize groups = MTLSizeMake(l.groups[0], l.groups[1], l.groups[2]);
  const MTLSize threads = MTLSizeMake(l.threads, 1, 1);
  const NSUInteger tg_bytes = l.threadgroup_bytes;
  at::native::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
    id<MTLComputeCommandEncoder> enc = stream->commandEncoder();
    [enc setComputePipelineState:state];
    [enc setBytes:&params length:sizeof(MaxsimParams) atIndex:kForwardParams];
    for (int s = 1; s < num_slots; ++s) [enc setBuffer:slots[s].buffer offset:slots[s].offset atIndex:s];
    [enc setThreadgroupMemoryLength:tg_bytes atIndex:0];
    [enc dispatchThreadgroups:groups threadsPerThreadgroup:threads];
  });
  stream->synchronize(at::mps::SyncType::COMMIT_AND_CONTINUE);
}

std::tuple<at::Tensor, at::Tensor> forward(MaxsimSurface surface, const MaxsimParams& params,
                                           const at::Tensor& queries, const at::Tensor& documents,
                                           const std::optional<at::Tensor>& document_scales,
                                           const at::Tensor* index0, const at::Tensor* index1,
                                           const at::Tensor* index2, const at::Tensor* index3,
                                           std::vector<int64_t> score_shape, bool with_argmax) {
  const Launch l =
      plan_forward(surface, dtype_of(queries), doc_format_of(documents, document_scales), params);
  at::Tensor scores = at::empty(score_shape, queries.options().dtype(at::kFloat));
  score_shape.push_back(params.argmax_width);
  at::Tensor argmax = at::empty(with_argmax ? score_shape : std::vector<int64_t>{0},
                                queries.options().dtype(at::kInt));
  Binding slots[kForwardSlots];
  slots[kForwardQueries] = binding(queries, queries);
  slots[kForwardDocuments] = binding(documents, queries);
  slots[kForwardIndex0] = binding(index0 ? *index0 : queries, queries);
  slots[kForwardIndex1] = binding(index1 ? *index1 : queries, queries);
  slots[kForwardIndex2] = binding(index2 ? *index2 : queries, queries);
  slots[kForwardIndex3] = binding(index3 ? *index3 : queries, queries);
  slots[kForwardScores] = binding(scores, scores);
  slots[kForwardArgmax] = binding(argmax, scores);
  slots[kForwardDocumentScales] = binding(document_scales, queries);
  encode(l, slots, kForwardSlots);
  return {scores, argmax};
}

// One gradient; owner lists only for packed (pairs_by_*, *_pair_offsets).
at::Tensor gradient(MaxsimSurface surface, bool to_query, const MaxsimParams& params,
                    const at::Tensor& grad_scores, const at::Tensor& queries,
                    const at::Tensor& documents, const std::optional<at::Tensor>& document_scales,
                    const at::Tensor& argmax, const at::Tensor* index0, const at::Tensor* index1,
                    const at::Tensor* index2, const at::Tensor* index3, const at::Tensor* owner_pairs,
                    const at::Tensor* owner_pair_offsets) {
  const DocFormat docs = doc_format_of(documents, document_scales);
  TORCH_CHECK(to_query || !is_compressed(docs), "maxsim_metal: compressed documents get no gradient");
  const Launch l = plan_backward(surface, dtype_of(queries), docs, to_query, params,
                                 owner_pairs ? index_arg(*owner_pairs) : no_index(),
                                 owner_pair_offsets ? index_arg(*owner_pair_offsets) : no_index());
  const at::Tensor& like = to_query ? queries : documents;
  at::Tensor grad = l.zero_output ? at::zeros_like(like) : at::empty_like(like);
  Binding slots[kBackwardSlots];
  slots[kBackwardQueries] = binding(queries, grad);
  slots[kBackwardDocuments] = binding(documents, grad);
  slots[kBackwardGradScores] = binding(grad_scores, grad);
  slots[kBackwardArgmax] = binding(argmax, grad);
  slots[kBackwardIndex0] = binding(index0 ? *index0 : grad, grad);
  slots[kBackwardIndex1] = binding(index1 ? *index1 : grad, grad);
  slots[kBackwardIndex2] = binding(index2 ? *index2 : grad, grad);
  slots[kBackwardIndex3] = binding(index3 ? *index3 : grad, grad);
  slots[kBackwardOwnerPairs] = binding(owner_pairs ? *owner_pairs : grad, grad);
  slots[kBackwardOwnerPairOffsets] = binding(owner_pair_offsets ? *owner_pair_offsets : grad, grad);
  slots[kBackwardGrad] = binding(grad, grad);
  slots[kBackwardDocumentScales] = binding(document_scales, grad);
  encode(l, slots, kBackwardSlots);
  return grad;
}

at::Tensor none_like(const at::Tensor& t) { return at::empty({0}, t.options()); }

}  // namespace

std::tuple<at::Tensor, at::Tensor> padded_forward(const at::Tensor& queries, const at::Tensor& documents,
                                                  const at::Tensor& query_lengths,
                                                  const at::Tensor& doc_lengths, bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const std::optional<at::Tensor>& document_scales = dense_storage(storage);
  const MaxsimParams p = padded_params(queries.size(0), documents.size(1), queries.size(1), documents.size(2),
                                       queries.size(2), index_arg(query_lengths), index_arg(doc_lengths),
                                       with_argmax);
  return forward(kMaxsimPadded, p, queries, documents, document_scales, &query_lengths, &doc_lengths,
                 nullptr, nullptr, {p.B, p.C}, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> contrastive_forward(const at::Tensor& queries, const at::Tensor& documents,
                                                       const at::Tensor& document_offsets,
                                                       const std::optional<at::Tensor>& query_lengths,
                                                       bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const std::optional<at::Tensor>& document_scales = dense_storage(storage);
  const MaxsimParams p = contrastive_params(queries.size(0), queries.size(1), documents.size(0), queries.size(2),
                                            index_arg(document_offsets), index_arg(query_lengths), with_argmax);
  return forward(kMaxsimContrastive, p, queries, documents, document_scales, &document_offsets,
                 query_lengths ? &*query_lengths : nullptr, nullptr, nullptr, {p.Nq, p.Nb}, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> contrastive_padded_forward(const at::Tensor& queries,
                                                              const at::Tensor& documents,
                                                              const at::Tensor& document_lengths,
                                                              const std::optional<at::Tensor>& query_lengths,
                                                              bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const std::optional<at::Tensor>& document_scales = dense_storage(storage);
  const MaxsimParams p = contrastive_padded_params(queries.size(0), queries.size(1), documents.size(0),
                                                   documents.size(1), queries.size(2), index_arg(document_lengths),
                                                   index_arg(query_lengths), with_argmax);
  return forward(kMaxsimContrastivePadded, p, queries, documents, document_scales, &document_lengths,
                 query_lengths ? &*query_lengths : nullptr, nullptr, nullptr, {p.Nq, p.Nb}, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> packed_forward(const at::Tensor& queries, const at::Tensor& query_offsets,
                                                  const at::Tensor& documents, const at::Tensor& document_offsets,
                                                  const at::Tensor& pair_query_ids,
                                                  const at::Tensor& pair_document_ids, int64_t max_q_len,
                                                  bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const std::optional<at::Tensor>& document_scales = dense_storage(storage);
  const MaxsimParams p = packed_params(queries.size(0), documents.size(0), queries.size(1),
                                       index_arg(query_offsets), index_arg(document_offsets),
                                       index_arg(pair_query_ids), index_arg(pair_document_ids), max_q_len,
                                       with_argmax);
  return forward(kMaxsimPacked, p, queries, documents, document_scales, &query_offsets, &document_offsets,
                 &pair_query_ids, &pair_document_ids, {p.num_pairs}, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> padded_backward(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                   const at::Tensor& documents, const at::Tensor& query_lengths,
                                                   const at::Tensor& doc_lengths, const at::Tensor& argmax,
                                                   bool need_grad_queries, bool need_grad_documents,
    const maxsim_storage::DocumentStorage& storage) {
  const std::optional<at::Tensor>& document_scales = dense_storage(storage);
  const MaxsimParams p = padded_params(queries.size(0), documents.size(1), queries.size(1), documents.size(2),
                                       queries.size(2), index_arg(query_lengths), index_arg(doc_lengths), true);
  auto grad = [&](bool to_query) {
    return gradient(kMaxsimPadded, to_query, p, grad_scores, queries, documents, document_scales, argmax,
                    &query_lengths, &doc_lengths, nullptr, nullptr, nullptr, nullptr);
  };
  return {need_grad_queries ? grad(true) : none_like(queries),
          need_grad_documents ? grad(false) : none_like(documents)};
}

std::tuple<at::Tensor, at::Tensor> contrastive_backward(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                        const at::Tensor& documents,
                                                        const at::Tensor& document_offsets,
                                                        const std::optional<at::Tensor>& query_lengths,
                                                        const at::Tensor& argmax, bool need_grad_queries,
                                                        bool need_grad_documents,
    const maxsim_storage::DocumentStorage& storage) {
  const std::optional<at::Tensor>& document_scales = dense_storage(storage);
  const MaxsimParams p = contrastive_params(queries.size(0), queries.size(1), documents.size(0), queries.size(2),
                                            index_arg(document_offsets), index_arg(query_lengths), true);
  auto grad = [&](bool to_query) {
    return gradient(kMaxsimContrastive, to_query, p, grad_scores, queries, documents, document_scales, argmax,
                    &document_offsets, query_lengths ? &*query_lengths : nullptr, nullptr, nullptr, nullptr,
                    nullptr);
  };
  return {need_grad_queries ? grad(true) : none_like(queries),
          need_grad_documents ? grad(false) : none_like(documents)};
}

std::tuple<at::Tensor, at::Tensor> contrastive_padded_backward(const at::Tensor& grad_scores,
                                                               const at::Tensor& queries,
                                                               const at::Tensor& documents,
                                                               const at::Tensor& document_lengths,
                                                               const std::optional<at::Tensor>& query_lengths,
                                                               const at::Tensor& argmax, bool need_grad_queries,
                                                               bool need_grad_documents,
    const maxsim_storage::DocumentStorage& storage) {
  const std::optional<at::Tensor>& document_scales = dense_storage(storage);
  const MaxsimParams p = contrastive_padded_params(queries.size(0), queries.size(1), documents.size(0),
                                                   documents.size(1), queries.size(2), index_arg(document_lengths),
                                                   index_arg(query_lengths), true);
  auto grad = [&](bool to_query) {
    return gradient(kMaxsimContrastivePadded, to_query, p, grad_scores, queries, documents, document_scales,
                    argmax, &document_lengths, query_lengths ? &*query_lengths : nullptr, nullptr, nullptr, nullptr,
                    nullptr);
  };
  return {need_grad_queries ? grad(true) : none_like(queries),
          need_grad_documents ? grad(false) : none_like(documents)};
}

std::tuple<at::Tensor, at::Tensor> packed_backward(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& query_offsets,
    const at::Tensor& documents, const at::Tensor& document_offsets, const at::Tensor& pair_query_ids,
    const at::Tensor& pair_document_ids, const at::Tensor& argmax, const at::Tensor& pairs_by_query,
    const at::Tensor& query_pair_offsets, const at::Tensor& pairs_by_document,
    const at::Tensor& document_pair_offsets, bool need_grad_queries, bool need_grad_documents,
    const maxsim_storage::DocumentStorage& storage) {
  const std::optional<at::Tensor>& document_scales = dense_storage(storage);
  const MaxsimParams p = packed_params(queries.size(0), documents.size(0), queries.size(1),
                                       index_arg(query_offsets), index_arg(document_offsets),
                                       index_arg(pair_query_ids), index_arg(pair_document_ids), argmax.size(-1),
                                       true);
  auto grad = [&](bool to_query) {
    return gradient(kMaxsimPacked, to_query, p, grad_scores, queries, documents, document_scales, argmax,
                    &query_offsets, &document_offsets, &pair_query_ids, &pair_document_ids,
                    to_query ? &pairs_by_query : &pairs_by_document,
                    to_query ? &query_pair_offsets : &document_pair_offsets);
  };
  return {need_grad_queries ? grad(true) : none_like(queries),
          need_grad_documents ? grad(false) : none_like(documents)};
}

}  // namespace maxsim_metal
