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
// Compressed documents pick the plan's pipeline of their format: int8 / float8 e4m3fn values
// bind their scales (one float32 per row) at the DocumentScales slot; ColBERTv2 residuals
// (uint8 packed bucket ids) bind their codes, centroids and bucket weights at their own
// slots. The kernels decode in their tile loads. They have grad_queries only.
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

MaxsimFloatType float_type_of(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf ? kMaxsimFloat16 : t.scalar_type() == at::kBFloat16 ? kMaxsimBFloat16 : kMaxsimFloat32;
}

Dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return Dtype::kFloat;
    case at::kHalf: return Dtype::kHalf;
    case at::kBFloat16: return Dtype::kBFloat;
    default: TORCH_CHECK(false, "maxsim_metal: float32, float16 or bfloat16 only, got ", t.scalar_type());
  }
}

IndexArg index_arg(const at::Tensor& t) { return {t.numel(), t.scalar_type() == at::kLong, true}; }

// The documents' storage format. The ops' checks (checks.h) pair scales with int8 / float8
// documents and a codec with residual ones; the checks here keep a kernel from reading a
// buffer that is not there.
DocFormat doc_format_of(const at::Tensor& documents, const maxsim_storage::DocumentStorage& storage) {
  if (storage.residual()) {
    TORCH_CHECK(documents.scalar_type() == at::kByte && storage.centroids && storage.bucket_weights &&
                    !storage.scales,
                "maxsim_metal: residual documents need uint8 bytes, codes, centroids and bucket weights");
    return DocFormat::kResidual;
  }
  const auto s = documents.scalar_type();
  const DocFormat f = s == at::kChar ? DocFormat::kInt8
                      : s == at::kFloat8_e4m3fn ? DocFormat::kFloat8E4M3
                                                : DocFormat::kQueryDtype;
  TORCH_CHECK(is_compressed(f) == storage.scales.has_value(),
              is_compressed(f) ? "maxsim_metal: int8 / float8 documents need document_scales"
                               : "maxsim_metal: document_scales given with float documents");
  return f;
}

// The codec into the parameter block (residual documents only); nbits from the number of
// bucket weights (2, 4 or 16, checked by the ops).
void set_storage(MaxsimParams& p, const maxsim_storage::DocumentStorage& storage) {
  if (!storage.residual()) return;
  ResidualArg r;
  r.codes = index_arg(*storage.codes);
  r.n_centroids = storage.centroids->size(0);
  const int64_t buckets = storage.bucket_weights->numel();
  r.nbits = buckets == 2 ? 1 : buckets == 4 ? 2 : 4;
  r.normalize = storage.normalize;
  r.centroid_dtype = float_type_of(*storage.centroids);
  r.weight_dtype = float_type_of(*storage.bucket_weights);
  set_residual(p, r);
}
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

static_assert(kForwardParams == 0 && kBackwardParams == 0 && kCentroidParams == 0,
              "encode() binds the parameters at slot 0");

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

std::tuple<at::Tensor, at::Tensor> forward(MaxsimSurface surface, MaxsimParams params,
                                           const at::Tensor& queries, const at::Tensor& documents,
                                           const maxsim_storage::DocumentStorage& storage,
                                           const at::Tensor* index0, const at::Tensor* index1,
                                           const at::Tensor* index2, const at::Tensor* index3,
                                           std::vector<int64_t> score_shape, bool with_argmax) {
  const DocFormat docs = doc_format_of(documents, storage);
  set_storage(params, storage);
  const Launch l = plan_forward(surface, dtype_of(queries), docs, params);
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
  slots[kForwardDocumentScales] = binding(storage.scales, queries);
  slots[kForwardDocumentCodes] = binding(storage.codes, queries);
  slots[kForwardCentroids] = binding(storage.centroids, queries);
  slots[kForwardBucketWeights] = binding(storage.bucket_weights, queries);
  encode(l, slots, kForwardSlots);
  return {scores, argmax};
}

// One gradient; owner lists only for packed (pairs_by_*, *_pair_offsets).
at::Tensor gradient(MaxsimSurface surface, bool to_query, MaxsimParams params,
                    const at::Tensor& grad_scores, const at::Tensor& queries,
                    const at::Tensor& documents, const maxsim_storage::DocumentStorage& storage,
                    const at::Tensor& argmax, const at::Tensor* index0, const at::Tensor* index1,
                    const at::Tensor* index2, const at::Tensor* index3, const at::Tensor* owner_pairs,
                    const at::Tensor* owner_pair_offsets) {
  const DocFormat docs = doc_format_of(documents, storage);
  TORCH_CHECK(to_query || !is_compressed(docs), "maxsim_metal: compressed documents get no gradient");
  set_storage(params, storage);
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
  slots[kBackwardDocumentScales] = binding(storage.scales, grad);
  slots[kBackwardDocumentCodes] = binding(storage.codes, grad);
  slots[kBackwardCentroids] = binding(storage.centroids, grad);
  slots[kBackwardBucketWeights] = binding(storage.bucket_weights, grad);
  encode(l, slots, kBackwardSlots);
  return grad;
}

at::Tensor none_like(const at::Tensor& t) { return at::empty({0}, t.options()); }

}  // namespace

at::Tensor centroid_forward(const at::Tensor& table, const at::Tensor& document_codes,
                            const at::Tensor& document_offsets, const std::optional<at::Tensor>& query_lengths,
                            const std::optional<at::Tensor>& pair_query_ids,
                            const std::optional<at::Tensor>& pair_document_ids) {
  TORCH_CHECK(table.is_contiguous() && table.scalar_type() == at::kFloat && table.dim() == 3,
              "maxsim_metal: the centroid table must be contiguous float32 [Nq, n_centroids, Lq]");
  TORCH_CHECK(pair_query_ids.has_value() == pair_document_ids.has_value(),
              "maxsim_metal: pair_query_ids and pair_document_ids go together");
  const Launch l = plan_centroid_scores(table.size(0), table.size(1), table.size(2), index_arg(document_codes),
                                        index_arg(document_offsets), index_arg(query_lengths),
                                        index_arg(pair_query_ids), index_arg(pair_document_ids));
  const std::vector<int64_t> shape = pair_query_ids ? std::vector<int64_t>{l.params.num_pairs}
                                                    : std::vector<int64_t>{l.params.Nq, l.params.Nb};
  at::Tensor scores = at::empty(shape, table.options());
  Binding slots[kCentroidSlots];
  slots[kCentroidTable] = binding(table, scores);
  slots[kCentroidDocumentCodes] = binding(document_codes, scores);
  slots[kCentroidIndex0] = binding(document_offsets, scores);
  slots[kCentroidIndex1] = binding(query_lengths, scores);
  slots[kCentroidIndex2] = binding(pair_query_ids, scores);
  slots[kCentroidIndex3] = binding(pair_document_ids, scores);
  slots[kCentroidScores] = binding(scores, scores);
  encode(l, slots, kCentroidSlots);
  return scores;
}

std::tuple<at::Tensor, at::Tensor> padded_forward(const at::Tensor& queries, const at::Tensor& documents,
                                                  const at::Tensor& query_lengths,
                                                  const at::Tensor& doc_lengths, bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const MaxsimParams p = padded_params(queries.size(0), documents.size(1), queries.size(1), documents.size(2),
                                       queries.size(2), index_arg(query_lengths), index_arg(doc_lengths),
                                       with_argmax);
  return forward(kMaxsimPadded, p, queries, documents, storage, &query_lengths, &doc_lengths,
                 nullptr, nullptr, {p.B, p.C}, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> contrastive_forward(const at::Tensor& queries, const at::Tensor& documents,
                                                       const at::Tensor& document_offsets,
                                                       const std::optional<at::Tensor>& query_lengths,
                                                       bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const MaxsimParams p = contrastive_params(queries.size(0), queries.size(1), documents.size(0), queries.size(2),
                                            index_arg(document_offsets), index_arg(query_lengths), with_argmax);
  return forward(kMaxsimContrastive, p, queries, documents, storage, &document_offsets,
                 query_lengths ? &*query_lengths : nullptr, nullptr, nullptr, {p.Nq, p.Nb}, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> contrastive_padded_forward(const at::Tensor& queries,
                                                              const at::Tensor& documents,
                                                              const at::Tensor& document_lengths,
                                                              const std::optional<at::Tensor>& query_lengths,
                                                              bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const MaxsimParams p = contrastive_padded_params(queries.size(0), queries.size(1), documents.size(0),
                                                   documents.size(1), queries.size(2), index_arg(document_lengths),
                                                   index_arg(query_lengths), with_argmax);
  return forward(kMaxsimContrastivePadded, p, queries, documents, storage, &document_lengths,
                 query_lengths ? &*query_lengths : nullptr, nullptr, nullptr, {p.Nq, p.Nb}, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> packed_forward(const at::Tensor& queries, const at::Tensor& query_offsets,
                                                  const at::Tensor& documents, const at::Tensor& document_offsets,
                                                  const at::Tensor& pair_query_ids,
                                                  const at::Tensor& pair_document_ids, int64_t max_q_len,
                                                  bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const MaxsimParams p = packed_params(queries.size(0), documents.size(0), queries.size(1),
                                       index_arg(query_offsets), index_arg(document_offsets),
                                       index_arg(pair_query_ids), index_arg(pair_document_ids), max_q_len,
                                       with_argmax);
  return forward(kMaxsimPacked, p, queries, documents, storage, &query_offsets, &document_offsets,
                 &pair_query_ids, &pair_document_ids, {p.num_pairs}, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> padded_backward(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                   const at::Tensor& documents, const at::Tensor& query_lengths,
                                                   const at::Tensor& doc_lengths, const at::Tensor& argmax,
                                                   bool need_grad_queries, bool need_grad_documents,
    const maxsim_storage::DocumentStorage& storage) {
  const MaxsimParams p = padded_params(queries.size(0), documents.size(1), queries.size(1), documents.size(2),
                                       queries.size(2), index_arg(query_lengths), index_arg(doc_lengths), true);
  auto grad = [&](bool to_query) {
    return gradient(kMaxsimPadded, to_query, p, grad_scores, queries, documents, storage, argmax,
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
  const MaxsimParams p = contrastive_params(queries.size(0), queries.size(1), documents.size(0), queries.size(2),
                                            index_arg(document_offsets), index_arg(query_lengths), true);
  auto grad = [&](bool to_query) {
    return gradient(kMaxsimContrastive, to_query, p, grad_scores, queries, documents, storage, argmax,
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
  const MaxsimParams p = contrastive_padded_params(queries.size(0), queries.size(1), documents.size(0),
                                                   documents.size(1), queries.size(2), index_arg(document_lengths),
                                                   index_arg(query_lengths), true);
  auto grad = [&](bool to_query) {
    return gradient(kMaxsimContrastivePadded, to_query, p, grad_scores, queries, documents, storage,
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
  const MaxsimParams p = packed_params(queries.size(0), documents.size(0), queries.size(1),
                                       index_arg(query_offsets), index_arg(document_offsets),
                                       index_arg(pair_query_ids), index_arg(pair_document_ids), argmax.size(-1),
                                       true);
  auto grad = [&](bool to_query) {
    return gradient(kMaxsimPacked, to_query, p, grad_scores, queries, documents, storage, argmax,
                    &query_offsets, &document_offsets, &pair_query_ids, &pair_document_ids,
                    to_query ? &pairs_by_query : &pairs_by_document,
                    to_query ? &query_pair_offsets : &document_pair_offsets);
  };
  return {need_grad_queries ? grad(true) : none_like(queries),
          need_grad_documents ? grad(false) : none_like(documents)};
}

}  // namespace maxsim_metal
