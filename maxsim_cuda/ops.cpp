// Tensor glue for the CUDA backend: check shapes, allocate outputs, read the current
// stream, fill the plain params struct and call the torch-free launchers (launch.h).
// No host synchronisation: every launch is enqueued on the current stream.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // at::cuda::getCurrentCUDAStream is this function
#include <torch/version.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "maxsim_cuda/launch.h"
#include "torch-ext/torch_binding.h"

namespace maxsim_cuda {
namespace {

using maxsim_storage::DocumentStorage;


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

DocFormat doc_format_of(const at::Tensor& d) {
  switch (d.scalar_type()) {
    case at::kChar: return DocFormat::kInt8;
    case at::kFloat8_e4m3fn: return DocFormat::kE4M3;
    default: return DocFormat::kNative;
  }
}

// Documents share the queries' dtype, or are compressed (int8 / float8 e4m3fn) with
// document_scales, one float32 per document row, against float16 / bfloat16 / float32 queries.
void check_inputs(const at::Tensor& q, const at::Tensor& d, const std::optional<at::Tensor>& scales) {
  TORCH_CHECK(q.is_cuda(), "maxsim: queries must be a CUDA tensor");
  check_device(d, q, "documents");
  const bool compressed = doc_format_of(d) != DocFormat::kNative;
  TORCH_CHECK(compressed == scales.has_value(),
              compressed ? "maxsim: int8 / float8_e4m3fn documents need document_scales"
                         : "maxsim: document_scales given with float documents");
  if (compressed) {
    TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kFloat,
                "maxsim: compressed documents pair with float16, bfloat16 or float32 queries, got ",
                q.scalar_type());
  } else {
    TORCH_CHECK(q.scalar_type() == d.scalar_type(), "maxsim: queries and documents must share a dtype");
  }
  TORCH_CHECK(q.is_contiguous() && d.is_contiguous(), "maxsim: inputs must be contiguous");
  dtype_of(q);
}

// The kernels read one scale per document row; the rows come from the documents' leading
// sizes, as base_problem counts them (dim == 0 still has rows, their similarities all 0).
const float* scales_of(const at::Tensor& q, const at::Tensor& d, const std::optional<at::Tensor>& scales) {
  if (!scales.has_value()) return nullptr;
  const at::Tensor& sc = *scales;
  check_device(sc, q, "document_scales");
  TORCH_CHECK(sc.scalar_type() == at::kFloat, "maxsim: document_scales must be float32, got ", sc.scalar_type());
  TORCH_CHECK(sc.is_contiguous(), "maxsim: document_scales must be contiguous");
  const int64_t rows = c10::multiply_integers(d.sizes().slice(0, d.dim() - 1));
  // The counts go in as strings: streaming an integer into the message (c10::str) crashed
  // the process (SIGSEGV in the module's own std::ostream::_M_insert<long>, H100 build).
  TORCH_CHECK(sc.numel() == rows, "maxsim: document_scales must have one entry per document row (",
              std::to_string(rows), "), got ", std::to_string(sc.numel()));
  return sc.numel() > 0 ? sc.data_ptr<float>() : nullptr;
}

void check_no_document_gradient(const DocumentStorage& st, bool need_grad_documents) {
  TORCH_CHECK(!((st.scales.has_value() || st.residual()) && need_grad_documents),
              "maxsim: compressed documents get no gradient (need_grad_documents must be false)");
}

// Residual documents' codec for the kernels (checks.h has run the user-facing checks). Every
// query dtype and centroid dtype pairs up: dispatch.cu sends 16-bit queries with centroids of
// their dtype on 16-byte rows (dim <= 256) to the tensor-core decode, the rest to the FFMA path.
ResidualRef residual_ref(const at::Tensor& q, const at::Tensor& d, const DocumentStorage& st) {
  TORCH_CHECK(st.centroids.has_value() && st.bucket_weights.has_value(),
              "maxsim: residual documents need centroids and bucket weights");
  TORCH_CHECK(!st.scales.has_value(), "maxsim: document_scales given with residual documents");
  const at::Tensor& cents = *st.centroids;
  const at::Tensor& codes = *st.codes;
  check_device(cents, q, "centroids");
  check_device(codes, q, "document_codes");
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kFloat,
              "maxsim: residual documents pair with float16, bfloat16 or float32 queries");
  const int64_t dim = q.size(-1);
  TORCH_CHECK(cents.is_contiguous() && cents.dim() == 2 && cents.size(1) == dim,
              "maxsim: centroids must be contiguous [n_centroids, D]");
  const auto cs = cents.scalar_type();
  TORCH_CHECK(cs == at::kHalf || cs == at::kBFloat16 || cs == at::kFloat,
              "maxsim: centroids must be float16, bfloat16 or float32");
  const at::Tensor& w = *st.bucket_weights;
  check_device(w, q, "bucket_weights");
  TORCH_CHECK(w.is_contiguous() && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kHalf ||
                                    w.scalar_type() == at::kBFloat16),
              "maxsim: bucket_weights must be contiguous float32, float16 or bfloat16");
  const int64_t nw = w.numel();
  TORCH_CHECK(nw == 2 || nw == 4 || nw == 16, "maxsim: bucket_weights must have 2, 4 or 16 entries");
  ResidualRef r;
  r.nbits = nw == 2 ? 1 : nw == 4 ? 2 : 4;
  TORCH_CHECK(dim % (8 * r.nbits) == 0 && d.size(-1) == dim * r.nbits / 8,
              "maxsim: residual documents must have D * nbits / 8 bytes per token");
  const int64_t rows = c10::multiply_integers(d.sizes().slice(0, d.dim() - 1));
  TORCH_CHECK(codes.is_contiguous() && codes.numel() == rows &&
                  (codes.scalar_type() == at::kInt || codes.scalar_type() == at::kLong),
              "maxsim: document_codes must be contiguous int32 / int64 with one code per token");
  r.codes = codes.numel() > 0 ? codes.data_ptr() : nullptr;
  r.codes_is64 = codes.scalar_type() == at::kLong;
  r.centroids = cents.numel() > 0 ? cents.data_ptr() : nullptr;
  r.centroids_dtype = cs == at::kHalf ? 1 : cs == at::kBFloat16 ? 2 : 0;
  r.n_centroids = cents.numel() > 0 ? cents.size(0) : 0;
  r.weights = w.data_ptr();
  r.weights_dtype = w.scalar_type() == at::kHalf ? 1 : w.scalar_type() == at::kBFloat16 ? 2 : 0;
  r.normalize = st.normalize ? 1 : 0;
  return r;
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
// (padded/packed block shape for short queries). See kernel/forward_configs.cuh. Every
// setting computes the same results; see maxsim_cuda/NOTES.md for checking and timing one.
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

// float32 embeddings under torch.set_float32_matmul_precision (launch.h, RoundInputs): "high"
// and "medium" score rounded copies on the 16-bit kernels, "highest" (torch's default) keeps
// float32 products. Only well-formed float32 calls are rounded; anything else goes on to the
// checks and their errors unchanged. Gradients never use the copies: the backward gathers the
// float32 rows that the forward's argmax names, so they are float32 exact under every setting.
// Compressed and residual documents keep their bytes; only the queries are rounded (residual
// tokens then round to the copy's dtype, as the contract has them round to the products' type).
class Float32Rounding {
 public:
  Float32Rounding(const at::Tensor& q, const at::Tensor& d, const DocumentStorage& st) {
    if (q.scalar_type() != at::kFloat || !q.is_cuda()) return;
    const auto precision = at::globalContext().float32MatmulPrecision();
    if (precision == at::Float32MatmulPrecision::HIGHEST) return;
    const bool float_documents = d.scalar_type() == at::kFloat;
    if (!float_documents && !st.residual() && doc_format_of(d) == DocFormat::kNative) return;
    if (d.device() != q.device() || !q.is_contiguous() || !d.is_contiguous()) return;
    r_.to_bf16 = precision == at::Float32MatmulPrecision::MEDIUM;
    const auto rounded = q.options().dtype(r_.to_bf16 ? at::kBFloat16 : at::kHalf);
    q_ = at::empty(q.sizes(), rounded);
    add(q, q_);
    if (float_documents) {
      d_ = at::empty(d.sizes(), rounded);
      add(d, d_);
    }
    if (!r_.to_bf16) {
      amax_ = at::empty({r_.tensors}, q.options().dtype(at::kInt));
      r_.amax = reinterpret_cast<uint32_t*>(amax_.data_ptr<int32_t>());
    }
    r_.num_sms = num_sms();
    r_.stream = c10::cuda::getCurrentCUDAStream().stream();
    check_launch(launch_round_inputs(r_));
  }
  const at::Tensor& queries(const at::Tensor& q) const { return q_.defined() ? q_ : q; }
  const at::Tensor& documents(const at::Tensor& d) const { return d_.defined() ? d_ : d; }
  // Scores of "high"'s scaled copies carry a power of two; this takes it out exactly.
  void unscale(const at::Tensor& scores) const {
    if (!amax_.defined() || scores.numel() == 0) return;
    check_launch(launch_unscale_scores(r_, scores.data_ptr<float>(), scores.numel()));
  }

 private:
  void add(const at::Tensor& src, const at::Tensor& dst) {
    r_.src[r_.tensors] = src.numel() > 0 ? src.data_ptr<float>() : nullptr;
    r_.dst[r_.tensors] = dst.numel() > 0 ? dst.data_ptr() : nullptr;
    r_.n[r_.tensors] = src.numel();
    ++r_.tensors;
  }
  RoundInputs r_;
  at::Tensor q_, d_, amax_;
};

// The Problem of each surface: shape checks, sizes, index tensors. The caller holds a
// CUDAGuard for the queries' device (the stream read here is that device's).
Problem base_problem(Surface surface, const at::Tensor& q, const at::Tensor& d, const DocumentStorage& st) {
  Problem p;
  if (st.residual()) {
    TORCH_CHECK(q.is_cuda(), "maxsim: queries must be a CUDA tensor");
    check_device(d, q, "documents");
    TORCH_CHECK(q.is_contiguous() && d.is_contiguous() && d.scalar_type() == at::kByte,
                "maxsim: residual documents must be contiguous uint8");
    p.doc_format = DocFormat::kResidual;
    p.residual = residual_ref(q, d, st);
  } else {
    check_inputs(q, d, st.scales);
    p.doc_format = doc_format_of(d);
    p.doc_scales = scales_of(q, d, st.scales);
  }
  p.surface = surface;
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
  return p;
}

int64_t segments(const at::Tensor& offsets) { return offsets.numel() > 0 ? offsets.numel() - 1 : 0; }

Problem padded_problem(const at::Tensor& q, const at::Tensor& d, const at::Tensor& query_lengths,
                       const at::Tensor& doc_lengths, const DocumentStorage& st) {
  TORCH_CHECK(q.dim() == 3 && d.dim() == 4, "maxsim: padded expects [B,Lq,D] and [B,C,Ld,D]");
  TORCH_CHECK(d.size(0) == q.size(0) && (st.residual() || d.size(3) == q.size(2)), "maxsim: padded shape mismatch");
  Problem p = base_problem(Surface::kPadded, q, d, st);
  p.num_queries = q.size(0);
  p.cands = d.size(1);
  p.num_docs = p.pairs = p.num_queries * p.cands;
  p.lq = q.size(1);
  p.ld = d.size(2);
  p.query_lengths = index_ref(query_lengths, q, "query_lengths");
  p.doc_lengths = index_ref(doc_lengths, q, "doc_lengths");
  return p;
}

Problem contrastive_problem(const at::Tensor& q, const at::Tensor& d, const at::Tensor& document_offsets,
                            const std::optional<at::Tensor>& query_lengths,
                            const DocumentStorage& st) {
  TORCH_CHECK(q.dim() == 3 && d.dim() == 2, "maxsim: contrastive expects [Nq,Lq,D] and [T,D]");
  TORCH_CHECK(st.residual() || d.size(1) == q.size(2), "maxsim: dim mismatch");
  Problem p = base_problem(Surface::kContrastive, q, d, st);
  p.num_queries = q.size(0);
  p.num_docs = segments(document_offsets);
  p.lq = q.size(1);
  p.pairs = p.num_queries * p.num_docs;
  p.doc_offsets = index_ref(document_offsets, q, "document_offsets");
  if (query_lengths.has_value()) p.query_lengths = index_ref(*query_lengths, q, "query_lengths");
  return p;
}

Problem contrastive_padded_problem(const at::Tensor& q, const at::Tensor& d,
                                   const at::Tensor& document_lengths,
                                   const std::optional<at::Tensor>& query_lengths,
                                   const DocumentStorage& st) {
  TORCH_CHECK(q.dim() == 3 && d.dim() == 3,
              "maxsim: contrastive_padded expects [Nq,Lq,D] and [Nb,Ld,D]");
  TORCH_CHECK(st.residual() || d.size(2) == q.size(2), "maxsim: dim mismatch");
  Problem p = base_problem(Surface::kContrastivePadded, q, d, st);
  p.num_queries = q.size(0);
  p.num_docs = d.size(0);
  p.lq = q.size(1);
  p.ld = d.size(1);
  p.pairs = p.num_queries * p.num_docs;
  p.doc_lengths = index_ref(document_lengths, q, "document_lengths");
  TORCH_CHECK(document_lengths.numel() == p.num_docs, "maxsim: document_lengths must be [Nb]");
  if (query_lengths.has_value()) p.query_lengths = index_ref(*query_lengths, q, "query_lengths");
  return p;
}

Problem packed_problem(const at::Tensor& q, const at::Tensor& query_offsets, const at::Tensor& d,
                       const at::Tensor& document_offsets, const at::Tensor& pair_query_ids,
                       const at::Tensor& pair_document_ids, const DocumentStorage& st) {
  TORCH_CHECK(q.dim() == 2 && d.dim() == 2, "maxsim: packed expects [Tq,D] and [Td,D]");
  TORCH_CHECK(st.residual() || d.size(1) == q.size(1), "maxsim: dim mismatch");
  TORCH_CHECK(pair_document_ids.numel() == pair_query_ids.numel(), "maxsim: pair id tensors differ in length");
  Problem p = base_problem(Surface::kPacked, q, d, st);
  p.num_queries = segments(query_offsets);
  p.num_docs = segments(document_offsets);
  p.pairs = pair_query_ids.numel();
  p.query_offsets = index_ref(query_offsets, q, "query_offsets");
  p.doc_offsets = index_ref(document_offsets, q, "document_offsets");
  p.pair_query_ids = index_ref(pair_query_ids, q, "pair_query_ids");
  p.pair_doc_ids = index_ref(pair_document_ids, q, "pair_document_ids");
  return p;
}

// Allocates (scores [score_shape], argmax [score_shape..., width] or [0]) and launches.
std::tuple<at::Tensor, at::Tensor> run_forward(ForwardParams& p, const at::Tensor& q, at::IntArrayRef score_shape,
                                               int64_t width, bool with_argmax) {
  auto scores = at::empty(score_shape, q.options().dtype(score_type(q)));
  at::Tensor argmax;
  if (with_argmax) {
    std::vector<int64_t> shape(score_shape.begin(), score_shape.end());
    shape.push_back(width);
    argmax = at::empty(shape, q.options().dtype(at::kInt));
  } else {
    argmax = at::empty({0}, q.options().dtype(at::kInt));
  }
  if (p.pairs == 0) return {scores, argmax};
  p.scores = scores.numel() > 0 ? scores.data_ptr() : nullptr;
  p.argmax = with_argmax && argmax.numel() > 0 ? argmax.data_ptr<int32_t>() : nullptr;
  p.argmax_width = with_argmax ? width : 0;
  check_launch(launch_forward(p));
  return {scores, argmax};
}

// Gradient outputs: `owned` ones are fully written by the kernels, the others start at zero.
at::Tensor grad_output(bool need, const at::Tensor& like, bool owned) {
  if (!need) return at::empty({0}, like.options());
  return owned ? at::empty_like(like) : at::zeros_like(like);
}

// Allocates the gradients and launches; `width` is the argmax row width the surface
// expects (-1: any, packed's max_q_len).
std::tuple<at::Tensor, at::Tensor> run_backward(BackwardParams& p, const at::Tensor& grad_scores, const at::Tensor& q,
                                                const at::Tensor& d, const at::Tensor& argmax, int64_t width,
                                                bool need_q, bool need_d, bool q_owned, bool d_owned) {
  auto gq = grad_output(need_q, q, q_owned);
  auto gd = grad_output(need_d, d, d_owned);
  if (p.pairs == 0 || p.dim == 0 || (!need_q && !need_d)) {
    // owned gradients are uninitialised: nothing will write them
    if (q_owned && gq.numel() > 0) gq.zero_();
    if (d_owned && gd.numel() > 0) gd.zero_();
    return {gq, gd};
  }
  check_device(argmax, q, "argmax");
  TORCH_CHECK(argmax.scalar_type() == at::kInt && argmax.is_contiguous(), "maxsim: argmax must be contiguous int32");
  TORCH_CHECK(argmax.dim() >= 1 && (width < 0 || argmax.size(-1) == width) &&
                  argmax.numel() == p.pairs * argmax.size(-1),
              "maxsim: argmax must be [pairs..., query width]");
  check_device(grad_scores, q, "grad_scores");
  const auto g = grad_scores.to(score_type(q)).contiguous();
  TORCH_CHECK(g.numel() == p.pairs, "maxsim: grad_scores shape mismatch");
  p.grad_scores = g.data_ptr();
  p.argmax = argmax.numel() > 0 ? argmax.data_ptr<int32_t>() : nullptr;
  p.argmax_width = argmax.size(-1);
  p.grad_queries = need_q && gq.numel() > 0 ? gq.data_ptr() : nullptr;
  p.grad_documents = need_d && gd.numel() > 0 ? gd.data_ptr() : nullptr;
  check_launch(launch_backward(p));
  return {gq, gd};
}

template <class Params>
Params with_problem(const Problem& problem) {
  Params p;
  static_cast<Problem&>(p) = problem;
  return p;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> padded_forward(const at::Tensor& queries, const at::Tensor& documents,
                                                  const at::Tensor& query_lengths, const at::Tensor& doc_lengths,
                                                  bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const c10::cuda::CUDAGuard guard(queries.device());
  const Float32Rounding rounded(queries, documents, storage);
  const at::Tensor& q = rounded.queries(queries);
  auto p = with_problem<ForwardParams>(
      padded_problem(q, rounded.documents(documents), query_lengths, doc_lengths, storage));
  p.rerank_variant = rerank_variant();
  auto out = run_forward(p, q, {p.num_queries, p.cands}, p.lq, with_argmax);
  rounded.unscale(std::get<0>(out));
  return out;
}

std::tuple<at::Tensor, at::Tensor> contrastive_forward(const at::Tensor& queries, const at::Tensor& documents,
                                                       const at::Tensor& document_offsets,
                                                       const std::optional<at::Tensor>& query_lengths,
                                                       bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const c10::cuda::CUDAGuard guard(queries.device());
  const Float32Rounding rounded(queries, documents, storage);
  const at::Tensor& q = rounded.queries(queries);
  auto p = with_problem<ForwardParams>(
      contrastive_problem(q, rounded.documents(documents), document_offsets, query_lengths, storage));
  p.variant = contrastive_variant();
  auto out = run_forward(p, q, {p.num_queries, p.num_docs}, p.lq, with_argmax);
  rounded.unscale(std::get<0>(out));
  return out;
}

std::tuple<at::Tensor, at::Tensor> contrastive_padded_forward(const at::Tensor& queries,
                                                              const at::Tensor& documents,
                                                              const at::Tensor& document_lengths,
                                                              const std::optional<at::Tensor>& query_lengths,
                                                              bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  const c10::cuda::CUDAGuard guard(queries.device());
  const Float32Rounding rounded(queries, documents, storage);
  const at::Tensor& q = rounded.queries(queries);
  auto p = with_problem<ForwardParams>(
      contrastive_padded_problem(q, rounded.documents(documents), document_lengths, query_lengths, storage));
  p.variant = contrastive_variant();
  auto out = run_forward(p, q, {p.num_queries, p.num_docs}, p.lq, with_argmax);
  rounded.unscale(std::get<0>(out));
  return out;
}

std::tuple<at::Tensor, at::Tensor> packed_forward(const at::Tensor& queries, const at::Tensor& query_offsets,
                                                  const at::Tensor& documents, const at::Tensor& document_offsets,
                                                  const at::Tensor& pair_query_ids,
                                                  const at::Tensor& pair_document_ids, int64_t max_q_len,
                                                  bool with_argmax,
    const maxsim_storage::DocumentStorage& storage) {
  TORCH_CHECK(max_q_len >= 0, "maxsim: max_q_len must be >= 0");
  const c10::cuda::CUDAGuard guard(queries.device());
  const Float32Rounding rounded(queries, documents, storage);
  const at::Tensor& q = rounded.queries(queries);
  auto p = with_problem<ForwardParams>(
      packed_problem(q, query_offsets, rounded.documents(documents), document_offsets, pair_query_ids,
                     pair_document_ids, storage));
  p.max_q_len = max_q_len;
  p.rerank_variant = rerank_variant();
  auto out = run_forward(p, q, {p.pairs}, max_q_len, with_argmax);
  rounded.unscale(std::get<0>(out));
  return out;
}

// Every gradient row has one owner. Padded rows are all owned by some (b, c) / b; a
// contrastive document row only if its segment exists, a packed row only if a pair names
// its segment: those start at zero.
std::tuple<at::Tensor, at::Tensor> padded_backward(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                   const at::Tensor& documents, const at::Tensor& query_lengths,
                                                   const at::Tensor& doc_lengths, const at::Tensor& argmax,
                                                   bool need_grad_queries, bool need_grad_documents,
    const maxsim_storage::DocumentStorage& storage) {
  check_no_document_gradient(storage, need_grad_documents);
  const c10::cuda::CUDAGuard guard(queries.device());
  auto p = with_problem<BackwardParams>(
      padded_problem(queries, documents, query_lengths, doc_lengths, storage));
  return run_backward(p, grad_scores, queries, documents, argmax, p.lq, need_grad_queries, need_grad_documents,
                      true, true);
}

std::tuple<at::Tensor, at::Tensor> contrastive_backward(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                        const at::Tensor& documents,
                                                        const at::Tensor& document_offsets,
                                                        const std::optional<at::Tensor>& query_lengths,
                                                        const at::Tensor& argmax, bool need_grad_queries,
                                                        bool need_grad_documents,
    const maxsim_storage::DocumentStorage& storage) {
  check_no_document_gradient(storage, need_grad_documents);
  const c10::cuda::CUDAGuard guard(queries.device());
  auto p = with_problem<BackwardParams>(
      contrastive_problem(queries, documents, document_offsets, query_lengths, storage));
  return run_backward(p, grad_scores, queries, documents, argmax, p.lq, need_grad_queries, need_grad_documents,
                      true, false);
}

// Padded documents: document n's CTAs write all its Ld rows (zeros past its length).
std::tuple<at::Tensor, at::Tensor> contrastive_padded_backward(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& documents,
    const at::Tensor& document_lengths, const std::optional<at::Tensor>& query_lengths,
    const at::Tensor& argmax, bool need_grad_queries, bool need_grad_documents,
    const maxsim_storage::DocumentStorage& storage) {
  check_no_document_gradient(storage, need_grad_documents);
  const c10::cuda::CUDAGuard guard(queries.device());
  auto p = with_problem<BackwardParams>(
      contrastive_padded_problem(queries, documents, document_lengths, query_lengths, storage));
  return run_backward(p, grad_scores, queries, documents, argmax, p.lq, need_grad_queries, need_grad_documents,
                      true, true);
}

std::tuple<at::Tensor, at::Tensor> packed_backward(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& query_offsets,
    const at::Tensor& documents, const at::Tensor& document_offsets, const at::Tensor& pair_query_ids,
    const at::Tensor& pair_document_ids, const at::Tensor& argmax, const at::Tensor& pairs_by_query,
    const at::Tensor& query_pair_offsets, const at::Tensor& pairs_by_document,
    const at::Tensor& document_pair_offsets, bool need_grad_queries, bool need_grad_documents,
    const maxsim_storage::DocumentStorage& storage) {
  check_no_document_gradient(storage, need_grad_documents);
  const c10::cuda::CUDAGuard guard(queries.device());
  auto p = with_problem<BackwardParams>(
      packed_problem(queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids,
                     storage));
  p.pairs_by_query = index_ref(pairs_by_query, queries, "pairs_by_query");
  p.query_pair_offsets = index_ref(query_pair_offsets, queries, "query_pair_offsets");
  p.pairs_by_document = index_ref(pairs_by_document, queries, "pairs_by_document");
  p.document_pair_offsets = index_ref(document_pair_offsets, queries, "document_pair_offsets");
  return run_backward(p, grad_scores, queries, documents, argmax, -1, need_grad_queries, need_grad_documents,
                      false, false);
}

at::Tensor centroid_table(const at::Tensor& queries, const at::Tensor& centroids) {
  TORCH_CHECK(queries.is_cuda() && queries.dim() == 3, "maxsim: queries must be [Nq, Lq, D] on CUDA");
  check_device(centroids, queries, "centroids");
  TORCH_CHECK(centroids.dim() == 2 && centroids.size(1) == queries.size(2),
              "maxsim: centroids must be [n_centroids, D] with the queries' D");
  TORCH_CHECK(centroids.size(0) <= 0x7fffffff, "maxsim: at most 2**31 - 1 centroids");
  const c10::cuda::CUDAGuard guard(queries.device());
  const at::Tensor q = queries.contiguous(), c = centroids.contiguous();
  const int64_t nq = q.size(0), nc = c.size(0), lq = q.size(1);
  // [n_centroids, Nq * Lq] seen as [Nq, n_centroids, Lq]: one GEMM for every query
  const auto as_table = [&](const at::Tensor& t) { return t.view({nc, nq, lq}).permute({1, 0, 2}); };
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)  // mm's out_dtype
  const bool sixteen_bit = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  if (sixteen_bit && c.scalar_type() == q.scalar_type()) {
    // 16-bit products are exact in float32 and cuBLAS accumulates in float32 for a float32
    // output, whatever the TF32 / reduced-precision settings (they concern other dtypes)
    return as_table(at::mm(c, q.reshape({nq * lq, q.size(2)}).t(), at::kFloat));
  }
#endif
  at::Tensor table = at::empty({nc, nq * lq}, q.options().dtype(at::kFloat));
  CentroidTableParams p;
  p.queries = q.numel() > 0 ? q.data_ptr() : nullptr;
  p.centroids = c.numel() > 0 ? c.data_ptr() : nullptr;
  p.query_dtype = dtype_of(q);
  p.centroid_dtype = dtype_of(c);
  p.num_queries = q.size(0);
  p.lq = q.size(1);
  p.n_centroids = c.size(0);
  p.dim = q.size(2);
  p.table = table.numel() > 0 ? table.data_ptr<float>() : nullptr;
  p.stream = c10::cuda::getCurrentCUDAStream().stream();
  check_launch(launch_centroid_table(p));
  return as_table(table);
}

at::Tensor centroid_forward(const at::Tensor& table, const at::Tensor& document_codes,
                            const at::Tensor& document_offsets, const std::optional<at::Tensor>& query_lengths,
                            const std::optional<at::Tensor>& pair_query_ids,
                            const std::optional<at::Tensor>& pair_document_ids) {
  TORCH_CHECK(table.is_cuda() && table.scalar_type() == at::kFloat && table.dim() == 3 &&
                  (table.size(2) <= 1 || table.stride(2) == 1) && table.stride(0) >= 0 && table.stride(1) >= 0,
              "maxsim: the centroid table must be float32 [Nq, n_centroids, Lq] on CUDA, Lq contiguous");
  const c10::cuda::CUDAGuard guard(table.device());
  CentroidParams p;
  p.table = table.numel() > 0 ? table.data_ptr<float>() : nullptr;
  p.num_queries = table.size(0);
  p.n_centroids = table.size(1);
  p.lq = table.size(2);
  p.query_stride = table.stride(0);
  p.row_stride = table.stride(1);
  p.codes = index_ref(document_codes, table, "document_codes");
  p.doc_offsets = index_ref(document_offsets, table, "document_offsets");
  p.num_docs = document_offsets.numel() > 0 ? document_offsets.numel() - 1 : 0;
  if (query_lengths.has_value()) p.query_lengths = index_ref(*query_lengths, table, "query_lengths");
  TORCH_CHECK(pair_query_ids.has_value() == pair_document_ids.has_value(),
              "maxsim: pair_query_ids and pair_document_ids go together");
  std::vector<int64_t> shape{p.num_queries, p.num_docs};
  if (pair_query_ids.has_value()) {
    TORCH_CHECK(pair_query_ids->numel() == pair_document_ids->numel(), "maxsim: pair id tensors differ in length");
    p.pair_query_ids = index_ref(*pair_query_ids, table, "pair_query_ids");
    p.pair_doc_ids = index_ref(*pair_document_ids, table, "pair_document_ids");
    shape = {pair_query_ids->numel()};
  }
  at::Tensor scores = at::empty(shape, table.options());
  p.pairs = scores.numel();
  p.scores = p.pairs > 0 ? scores.data_ptr<float>() : nullptr;
  p.stream = c10::cuda::getCurrentCUDAStream().stream();
  check_launch(launch_centroid_score(p));
  return scores;
}

}  // namespace maxsim_cuda
