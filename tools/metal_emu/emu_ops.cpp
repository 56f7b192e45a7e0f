// C ABI of the emulated Metal backend, for the Python tests (ctypes on CPU tensors). It
// does what maxsim_metal/ops.mm does, with the same launch plan: build the parameter
// block, bind every tensor at its slot, launch. Differences are the emulator's checks:
// every buffer is copied into an allocation of exactly its size (AddressSanitizer sees
// any access past it), outputs start as a poison pattern unless the plan zeroes them, and
// an unused or absent slot is bound to a zero-byte allocation (document_scales of float
// documents included, so a kernel that read them would fault under ASan).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "emu_abi.h"
#include "maxsim_metal/launch_plan.h"
#include "runtime.h"

using maxsim_metal::DocFormat;
using maxsim_metal::Dtype;
using maxsim_metal::IndexArg;
using maxsim_metal::Launch;


namespace {

size_t element_size(int dtype) { return dtype == int(Dtype::kFloat) ? 4 : 2; }
// Documents: the queries' element size, or one byte for int8 / float8 e4m3fn and for the
// packed bytes of residuals.
size_t document_element_size(int dtype, int doc_format) {
  return maxsim_metal::is_compressed(DocFormat(doc_format)) ? 1 : element_size(dtype);
}

IndexArg arg_of(const EmuIndex& e) {
  IndexArg a;
  a.size = e.present ? e.numel : 0;
  a.is64 = e.is64 != 0;
  a.present = e.present != 0;
  return a;
}

maxsim_metal::ResidualArg residual_arg(const EmuResidual& r) {
  maxsim_metal::ResidualArg a;
  a.codes = arg_of(r.codes);
  a.n_centroids = r.n_centroids;
  a.nbits = r.nbits;
  a.normalize = r.normalize != 0;
  a.centroid_dtype = MaxsimFloatType(r.centroid_dtype);
  a.weight_dtype = MaxsimFloatType(r.weight_dtype);
  return a;
}

// Exact-size device buffers, bound by slot.
struct Buffers {
  std::vector<void*> slots;
  std::vector<void*> owned;
  explicit Buffers(int n) : slots(size_t(n), nullptr) {}
  ~Buffers() {
    for (void* p : owned) std::free(p);
  }
  void* alloc(size_t bytes) {
    void* p = std::malloc(bytes);
    owned.push_back(p);
    return p;
  }
  void* input(int slot, const void* src, size_t bytes) {
    void* p = alloc(bytes);
    if (bytes) std::memcpy(p, src, bytes);
    slots[size_t(slot)] = p;
    return p;
  }
  void* output(int slot, size_t bytes, bool zero, uint32_t poison) {
    auto* p = static_cast<unsigned char*>(alloc(bytes));
    for (size_t b = 0; b < bytes; ++b) p[b] = zero ? 0 : uint8_t(poison >> (8 * (b % 4)));
    slots[size_t(slot)] = p;
    return p;
  }
  // a float32 buffer, or a zero-byte one when absent
  void floats(int slot, const float* src, int64_t numel) {
    if (src == nullptr) {
      slots[size_t(slot)] = alloc(0);
      return;
    }
    input(slot, src, size_t(numel) * 4);
  }
  // the residual codec at its three slots; zero-byte buffers when there is none
  void residual(int codes, int centroids, int weights, const EmuResidual* r, int64_t dim) {
    if (r == nullptr) {
      for (int s : {codes, centroids, weights}) slots[size_t(s)] = alloc(0);
      return;
    }
    index(codes, r->codes);
    const auto bytes = [](int type) { return size_t(type == kMaxsimFloat32 ? 4 : 2); };
    input(centroids, r->centroids, size_t(r->n_centroids * dim) * bytes(r->centroid_dtype));
    input(weights, r->bucket_weights, (size_t(1) << r->nbits) * bytes(r->weight_dtype));
  }
  void index(int slot, const EmuIndex& e) {
    if (!e.present) {
      slots[size_t(slot)] = alloc(0);
      return;
    }
    input(slot, e.data, size_t(e.numel) * (e.is64 ? 8 : 4));
  }
};

int finish(const std::string& msg, char* err, int errlen) {
  if (msg.empty()) return 0;
  std::snprintf(err, size_t(errlen), "%s", msg.c_str());
  return 1;
}

int launch(const Launch& l, Buffers& bufs, const EmuOptions& o, char* err, int errlen) {
  if (!l.run) return 0;
  emu::Dispatch d{};
  d.groups[0] = l.groups[0];
  d.groups[1] = l.groups[1];
  d.groups[2] = l.groups[2];
  d.threads = l.threads;
  d.threadgroup_bytes = l.threadgroup_bytes;
  d.order = o.order;
  d.seed = o.seed;
  d.poison = o.poison;
  d.real_threads = o.real_threads != 0;
  d.num_buffers = int(bufs.slots.size());
  return finish(emu::dispatch(l.kernel.c_str(), bufs.slots.data(), d), err, errlen);
}

MaxsimParams params_for(int surface, const int64_t* sizes, int64_t dim, const EmuIndex* idx,
                        bool with_argmax) {
  // sizes: padded B, C, Lq, Ld; contrastive Nq, Lq, T; contrastive_padded Nq, Lq, Nb, Ld;
  // packed Tq, Td, max_q_len
  switch (surface) {
    case kMaxsimPadded:
      return maxsim_metal::padded_params(sizes[0], sizes[1], sizes[2], sizes[3], dim, arg_of(idx[0]),
                                         arg_of(idx[1]), with_argmax);
    case kMaxsimContrastive:
      return maxsim_metal::contrastive_params(sizes[0], sizes[1], sizes[2], dim, arg_of(idx[0]),
                                              arg_of(idx[1]), with_argmax);
    case kMaxsimContrastivePadded:
      return maxsim_metal::contrastive_padded_params(sizes[0], sizes[1], sizes[2], sizes[3], dim,
                                                     arg_of(idx[0]), arg_of(idx[1]), with_argmax);
    default:
      return maxsim_metal::packed_params(sizes[0], sizes[1], dim, arg_of(idx[0]), arg_of(idx[1]),
                                         arg_of(idx[2]), arg_of(idx[3]), sizes[2], with_argmax);
  }
}

}  // namespace

extern "C" {

// Forward of one surface. scores [num_pairs] float32, argmax [num_pairs * width] int32
// (argmax_numel 0 without argmax). doc_format: DocFormat; compressed documents come with
// document_scales (one float32 per document row, scales_numel of them), float ones with
// null. Returns 0, or 1 with a message in err.
int emu_forward(int surface, int dtype, int doc_format, const int64_t* sizes, int64_t dim,
                const void* queries, int64_t queries_numel, const void* documents,
                int64_t documents_numel, const float* document_scales, int64_t scales_numel,
                const EmuResidual* residual, const EmuIndex* idx, int with_argmax, float* scores, int64_t scores_numel,
                int32_t* argmax, int64_t argmax_numel, const EmuOptions* opt, char* err, int errlen) {
  using namespace maxsim_metal;
  MaxsimParams prm = params_for(surface, sizes, dim, idx, with_argmax != 0);
  if (residual) set_residual(prm, residual_arg(*residual));
  const Launch l = plan_forward(MaxsimSurface(surface), Dtype(dtype), DocFormat(doc_format), prm);
  Buffers b(kForwardSlots);
  const size_t es = element_size(dtype);
  b.input(kForwardParams, &l.params, sizeof(MaxsimParams));
  b.input(kForwardQueries, queries, size_t(queries_numel) * es);
  b.input(kForwardDocuments, documents, size_t(documents_numel) * document_element_size(dtype, doc_format));
  b.floats(kForwardDocumentScales, document_scales, scales_numel);
  b.residual(kForwardDocumentCodes, kForwardCentroids, kForwardBucketWeights, residual, dim);
  const int index_slots[4] = {kForwardIndex0, kForwardIndex1, kForwardIndex2, kForwardIndex3};
  for (int k = 0; k < 4; ++k) b.index(index_slots[k], idx[k]);
  void* s = b.output(kForwardScores, size_t(scores_numel) * 4, false, opt->poison);
  void* a = b.output(kForwardArgmax, size_t(argmax_numel) * 4, false, opt->poison);
  const int rc = launch(l, b, *opt, err, errlen);
  if (scores_numel) std::memcpy(scores, s, size_t(scores_numel) * 4);
  if (argmax_numel) std::memcpy(argmax, a, size_t(argmax_numel) * 4);
  return rc;
}

// One gradient (to_query: grad_queries, else grad_documents) of one surface; grad has the
// numel and dtype of queries / documents. owner_pairs / owner_pair_offsets: the packed
// surface's pairs_by_* and *_pair_offsets for that gradient (absent otherwise). Compressed
// documents (doc_format, document_scales as for emu_forward) have grad_queries only; asking
// for their grad_documents is an error, as in the glue.
int emu_backward(int surface, int dtype, int doc_format, int to_query, const int64_t* sizes,
                 int64_t dim, const void* queries, int64_t queries_numel, const void* documents,
                 int64_t documents_numel, const float* document_scales, int64_t scales_numel,
                 const EmuResidual* residual, const float* grad_scores, int64_t num_pairs,
                 const int32_t* argmax, int64_t argmax_width, const EmuIndex* idx,
                 EmuIndex owner_pairs, EmuIndex owner_pair_offsets, void* grad, int64_t grad_numel,
                 const EmuOptions* opt, char* err, int errlen) {
  using namespace maxsim_metal;
  int64_t s2[4] = {sizes[0], sizes[1], sizes[2], sizes[3]};
  if (surface == kMaxsimPacked) s2[2] = argmax_width;  // the saved argmax's width
  MaxsimParams prm = params_for(surface, s2, dim, idx, true);
  if (residual) set_residual(prm, residual_arg(*residual));
  if (is_compressed(DocFormat(doc_format)) && !to_query)
    return finish("compressed documents get no gradient", err, errlen);
  const Launch l = plan_backward(MaxsimSurface(surface), Dtype(dtype), DocFormat(doc_format),
                                 to_query != 0, prm, arg_of(owner_pairs), arg_of(owner_pair_offsets));
  Buffers b(kBackwardSlots);
  const size_t es = element_size(dtype);
  b.input(kBackwardParams, &l.params, sizeof(MaxsimParams));
  b.input(kBackwardQueries, queries, size_t(queries_numel) * es);
  b.input(kBackwardDocuments, documents, size_t(documents_numel) * document_element_size(dtype, doc_format));
  b.floats(kBackwardDocumentScales, document_scales, scales_numel);
  b.residual(kBackwardDocumentCodes, kBackwardCentroids, kBackwardBucketWeights, residual, dim);
  b.input(kBackwardGradScores, grad_scores, size_t(num_pairs) * 4);
  b.input(kBackwardArgmax, argmax, size_t(num_pairs * argmax_width) * 4);
  const int index_slots[4] = {kBackwardIndex0, kBackwardIndex1, kBackwardIndex2, kBackwardIndex3};
  for (int k = 0; k < 4; ++k) b.index(index_slots[k], idx[k]);
  b.index(kBackwardOwnerPairs, owner_pairs);
  b.index(kBackwardOwnerPairOffsets, owner_pair_offsets);
  // grad_queries has the queries' dtype; grad_documents (float documents only) theirs, the same
  void* g = b.output(kBackwardGrad, size_t(grad_numel) * es, l.zero_output, opt->poison);
  const int rc = launch(l, b, *opt, err, errlen);
  if (grad_numel) std::memcpy(grad, g, size_t(grad_numel) * es);
  return rc;
}

int emu_centroid_scores(int64_t Nq, int64_t n_centroids, int64_t Lq, const float* table, EmuIndex codes,
                        EmuIndex document_offsets, EmuIndex query_lengths, EmuIndex pair_query_ids,
                        EmuIndex pair_document_ids, float* scores, int64_t scores_numel,
                        const EmuOptions* opt, char* err, int errlen) {
  using namespace maxsim_metal;
  const Launch l = plan_centroid_scores(Nq, n_centroids, Lq, arg_of(codes), arg_of(document_offsets),
                                        arg_of(query_lengths), arg_of(pair_query_ids),
                                        arg_of(pair_document_ids));
  Buffers b(kCentroidSlots);
  b.input(kCentroidParams, &l.params, sizeof(MaxsimParams));
  b.input(kCentroidTable, table, size_t(Nq * n_centroids * Lq) * 4);
  b.index(kCentroidDocumentCodes, codes);
  const EmuIndex idx[4] = {document_offsets, query_lengths, pair_query_ids, pair_document_ids};
  const int index_slots[4] = {kCentroidIndex0, kCentroidIndex1, kCentroidIndex2, kCentroidIndex3};
  for (int k = 0; k < 4; ++k) b.index(index_slots[k], idx[k]);
  void* s = b.output(kCentroidScores, size_t(scores_numel) * 4, false, opt->poison);
  const int rc = launch(l, b, *opt, err, errlen);
  if (scores_numel) std::memcpy(scores, s, size_t(scores_numel) * 4);
  return rc;
}

// The plan's threadgroup bytes etc., for tests of the plan itself; the pipeline name goes
// to name (name_len bytes, NUL-terminated).
int emu_plan(int surface, int dtype, int doc_format, int backward, int to_query, const int64_t* sizes,
             int64_t dim, const EmuIndex* idx, int64_t* out /* groups x, y, threads, bytes, run, zero */,
             char* name, int name_len) {
  using namespace maxsim_metal;
  const MaxsimParams prm = params_for(surface, sizes, dim, idx, true);
  const EmuIndex none{nullptr, 0, 0, 0};
  const Launch l = backward ? plan_backward(MaxsimSurface(surface), Dtype(dtype), DocFormat(doc_format),
                                            to_query != 0, prm, arg_of(none), arg_of(none))
                            : plan_forward(MaxsimSurface(surface), Dtype(dtype), DocFormat(doc_format), prm);
  std::snprintf(name, size_t(name_len), "%s", l.kernel.c_str());
  out[0] = l.groups[0];
  out[1] = l.groups[1];
  out[2] = l.threads;
  out[3] = l.threadgroup_bytes;
  out[4] = l.run;
  out[5] = l.zero_output;
  return 0;
}

}  // extern "C"

extern "C" {

// Any registered kernel with raw buffers (the emulator's self-tests).
int emu_launch(const char* kernel, unsigned groups, unsigned threads, unsigned threadgroup_bytes,
               void* const* buffers, int num_buffers, const EmuOptions* opt, char* err, int errlen) {
  emu::Dispatch d{};
  d.groups[0] = groups;
  d.groups[1] = d.groups[2] = 1;
  d.threads = threads;
  d.threadgroup_bytes = threadgroup_bytes;
  d.order = opt->order;
  d.seed = opt->seed;
  d.poison = opt->poison;
  d.real_threads = opt->real_threads != 0;
  d.num_buffers = num_buffers;
  return finish(emu::dispatch(kernel, buffers, d), err, errlen);
}

}  // extern "C"
