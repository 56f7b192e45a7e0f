// Tensor glue for the CPU kernels: checks what the kernels rely on (contiguity, dtypes,
// shapes; user-facing validation lives in the Python layer), allocates outputs,
// dispatches dtypes, and hands at::parallel_for to the torch-free kernels.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <string>

#include "maxsim_cpu/kernels.h"
#include "torch-ext/torch_binding.h"

namespace maxsim_cpu {
namespace {

struct AtParallelFor {
  template <class Fn>
  void operator()(int64_t begin, int64_t end, int64_t grain, const Fn& fn) const {
    if (end <= begin) return;
    at::parallel_for(begin, end, grain, fn);
  }
};

using maxsim_storage::DocumentStorage;

bool is_compressed(at::ScalarType s) { return s == at::kChar || s == at::kFloat8_e4m3fn; }

void check_data(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), "maxsim_cpu: ", name, " must be a CPU tensor");
  TORCH_CHECK(t.is_contiguous(), "maxsim_cpu: ", name, " must be contiguous");
  // Integers go into messages as strings: streaming an integer into a check's message
  // crashed the CUDA variant's module (maxsim_cuda/NOTES.md, 2026-11-24); strings did not.
  TORCH_CHECK(t.dim() == dim, "maxsim_cpu: ", name, " must have ", std::to_string(dim), " dimensions");
  const auto s = t.scalar_type();
  TORCH_CHECK(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble ||
                  ((is_compressed(s) || s == at::kByte) && std::strcmp(name, "documents") == 0),
              "maxsim_cpu: ", name, " must be float32, float16, bfloat16 or float64");
}

// Per-row float32 scales of compressed documents (int8 / float8 e4m3fn); null for float
// documents. The kernels index them by document row, so their count must be the rows'.
const float* document_scales_of(const at::Tensor& queries, const at::Tensor& documents,
                                const std::optional<at::Tensor>& scales) {
  if (documents.scalar_type() == at::kByte) return nullptr;  // residuals: ResidualRows
  const bool compressed = is_compressed(documents.scalar_type());
  TORCH_CHECK(compressed == scales.has_value(),
              compressed ? "maxsim_cpu: int8 / float8 documents need document_scales"
                         : "maxsim_cpu: document_scales given with float documents");
  if (!compressed) return nullptr;
  TORCH_CHECK(queries.scalar_type() != at::kDouble,
              "maxsim_cpu: compressed documents pair with float16, bfloat16 or float32 queries");
  const at::Tensor& sc = *scales;
  const int64_t rows = c10::multiply_integers(documents.sizes().slice(0, documents.dim() - 1));
  TORCH_CHECK(sc.device().is_cpu() && sc.is_contiguous() && sc.scalar_type() == at::kFloat &&
                  sc.numel() == rows,
              "maxsim_cpu: document_scales must be contiguous float32 CPU with one entry per document row");
  return sc.data_ptr<float>();
}

IndexView index_view(const at::Tensor& t, const char* name, int64_t numel) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "maxsim_cpu: ", name,
              " must be a contiguous CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, "maxsim_cpu: ", name,
              " must be int32 or int64");
  TORCH_CHECK(numel < 0 || t.numel() == numel, "maxsim_cpu: ", name, " must have ", std::to_string(numel),
              " elements, got ", std::to_string(t.numel()));
  return {t.data_ptr(), t.numel(), t.scalar_type() == at::kLong};
}

void check_pair(const at::Tensor& q, const at::Tensor& d) {
  if (d.scalar_type() == at::kByte) return;  // residuals: residual_rows checks them
  TORCH_CHECK(q.scalar_type() == d.scalar_type() || is_compressed(d.scalar_type()),
              "maxsim_cpu: queries and documents dtypes differ");
  TORCH_CHECK(q.size(-1) == d.size(-1), "maxsim_cpu: queries and documents embedding dims differ");
}

// Residual documents (uint8 packed bucket ids) as the kernels read them. The checks the
// kernels rely on are repeated here (the op's checks.h ran first with the user-facing ones).
ResidualRows residual_rows(const at::Tensor& queries, const at::Tensor& documents, const DocumentStorage& st) {
  TORCH_CHECK(st.codes.has_value() && st.centroids.has_value() && st.bucket_weights.has_value(),
              "maxsim_cpu: residual documents need codes, centroids and bucket weights");
  TORCH_CHECK(!st.scales.has_value(), "maxsim_cpu: document_scales given with residual documents");
  const at::Tensor& cents = *st.centroids;
  const at::Tensor weights = st.bucket_weights->to(at::kFloat).contiguous();
  const int64_t nw = weights.numel();
  TORCH_CHECK(nw == 2 || nw == 4 || nw == 16, "maxsim_cpu: bucket_weights must have 2, 4 or 16 entries");
  const int nbits = nw == 2 ? 1 : nw == 4 ? 2 : 4;
  const int64_t dim = queries.size(-1);
  TORCH_CHECK(cents.device().is_cpu() && cents.is_contiguous() && cents.dim() == 2 && cents.size(1) == dim &&
                  dim % (8 * nbits) == 0,
              "maxsim_cpu: centroids must be contiguous CPU [n_centroids, D] with D a multiple of 8 * nbits");
  TORCH_CHECK(documents.size(-1) == dim * nbits / 8, "maxsim_cpu: residual documents must have D * nbits / 8 bytes");
  const int64_t rows = c10::multiply_integers(documents.sizes().slice(0, documents.dim() - 1));
  ResidualRows r{};
  r.codes = index_view(*st.codes, "document_codes", rows);
  r.residuals = documents.data_ptr<uint8_t>();
  r.centroids = cents.data_ptr();
  const auto cs = cents.scalar_type();
  TORCH_CHECK(cs == at::kFloat || cs == at::kHalf || cs == at::kBFloat16,
              "maxsim_cpu: centroids must be float32, float16 or bfloat16");
  r.ctype = cs == at::kHalf ? CentroidType::kHalf : cs == at::kBFloat16 ? CentroidType::kBFloat16 : CentroidType::kFloat;
  r.n_centroids = cents.size(0);
  const float* w = weights.data_ptr<float>();
  r.set_weights(w, nbits);
  r.normalize = st.normalize;
  const auto qs = queries.scalar_type();
  TORCH_CHECK(qs != at::kDouble, "maxsim_cpu: residual documents pair with float16, bfloat16 or float32 queries");
  r.rounding = qs == at::kHalf ? Rounding::kHalf : qs == at::kBFloat16 ? Rounding::kBFloat16 : Rounding::kFloat;
  r.dim = dim;
  return r;
}

// Calls fn(T*) with the kernel storage type of t's dtype.
template <class Fn> void dispatch(at::ScalarType s, Fn&& fn) {
  switch (s) {
    case at::kFloat: fn(float{}); break;
    case at::kHalf: fn(Half{}); break;
    case at::kBFloat16: fn(BFloat16{}); break;
    case at::kDouble: fn(double{}); break;
    default: TORCH_CHECK(false, "maxsim_cpu: unsupported dtype ", s);
  }
}

// float32 scores, float64 for float64 inputs (docs/design.md: lets gradcheck work).
at::ScalarType score_dtype(const at::Tensor& queries) {
  return queries.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

template <class T> const T* ptr(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.data_ptr());
}
template <class T> T* mut_ptr(at::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }

// Calls fn(T{}, DT{}) with the query storage type and the document storage type.
template <class Fn> void dispatch_pair(const at::Tensor& queries, const at::Tensor& documents, Fn&& fn) {
  dispatch(queries.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    switch (documents.scalar_type()) {
      case at::kChar: if constexpr (!std::is_same_v<T, double>) fn(tag, int8_t{}); break;
      case at::kFloat8_e4m3fn: if constexpr (!std::is_same_v<T, double>) fn(tag, Float8E4M3{}); break;
      case at::kByte: if constexpr (!std::is_same_v<T, double>) fn(tag, ResidualRows{}); break;
      default: fn(tag, tag);
    }
  });
}

template <class Policy>
std::tuple<at::Tensor, at::Tensor> run_forward(const Policy& pol, const at::Tensor& queries,
                                               const at::Tensor& documents,
                                               const DocumentStorage& storage,
                                               at::IntArrayRef score_shape, int64_t argmax_width,
                                               bool with_argmax) {
  const float* scales = document_scales_of(queries, documents, storage.scales);
  const auto i32 = queries.options().dtype(at::kInt);
  at::Tensor scores = at::empty(score_shape, queries.options().dtype(score_dtype(queries)));
  std::vector<int64_t> arg_shape(score_shape.begin(), score_shape.end());
  arg_shape.push_back(argmax_width);
  at::Tensor argmax = with_argmax ? at::empty(arg_shape, i32) : at::empty({0}, i32);
  if (pol.num_pairs() == 0) return {scores, argmax};
  const int64_t dim = queries.size(-1);
  int32_t* a = with_argmax ? argmax.data_ptr<int32_t>() : nullptr;
  dispatch_pair(queries, documents, [&](auto tag, auto dtag) {
    using T = decltype(tag);
    using DT = decltype(dtag);
    if constexpr (std::is_same_v<T, double>) {
      forward_f64(pol, ptr<T>(queries), ptr<T>(documents), dim, scores.data_ptr<double>(), a,
                  argmax_width, AtParallelFor{});
    } else if constexpr (std::is_same_v<DT, ResidualRows>) {
      forward_f32<T>(pol, ptr<T>(queries), residual_rows(queries, documents, storage), dim,
                     scores.data_ptr<float>(), a, argmax_width, AtParallelFor{});
    } else {
      forward_f32<T>(pol, ptr<T>(queries), DenseRows<DT>{ptr<DT>(documents), scales, dim}, dim,
                     scores.data_ptr<float>(), a, argmax_width, AtParallelFor{});
    }
  });
  return {scores, argmax};
}

// Shared backward: grads start at zero; each owner family adds its rows.
template <class Policy, class QOwners, class DOwners>
std::tuple<at::Tensor, at::Tensor> run_backward(const Policy& pol, const at::Tensor& grad_scores,
                                                const at::Tensor& queries, const at::Tensor& documents,
                                                const at::Tensor& argmax, const QOwners& qowners,
                                                const DOwners& downers, bool need_q, bool need_d,
                                                const DocumentStorage& storage) {
  const float* scales = document_scales_of(queries, documents, storage.scales);
  TORCH_CHECK(!(need_d && (scales || storage.residual())), "maxsim_cpu: compressed documents get no gradient");
  const int64_t P = pol.num_pairs();
  TORCH_CHECK(grad_scores.device().is_cpu() && grad_scores.is_contiguous() &&
                  grad_scores.scalar_type() == score_dtype(queries) && grad_scores.numel() == P,
              "maxsim_cpu: grad_scores must be contiguous, shaped like scores, with their dtype");
  TORCH_CHECK(argmax.device().is_cpu() && argmax.is_contiguous() && argmax.scalar_type() == at::kInt &&
                  argmax.dim() == grad_scores.dim() + 1,
              "maxsim_cpu: argmax must be the contiguous int32 argmax of the forward");
  const int64_t width = argmax.size(-1);
  TORCH_CHECK(argmax.numel() == P * width, "maxsim_cpu: argmax does not match scores");
  // Owners that tile their output write every row themselves (see backward_owned).
  const bool work = P > 0 && width > 0;
  auto grad_like = [&](const at::Tensor& x, bool need, bool tiled) {
    if (!need) return at::empty({0}, x.options());
    return work && tiled ? at::empty_like(x) : at::zeros_like(x);
  };
  at::Tensor gq = grad_like(queries, need_q, qowners.tiles_output());
  at::Tensor gd = grad_like(documents, need_d, downers.tiles_output());
  if (!work) return {gq, gd};
  const int64_t dim = queries.size(-1);
  const int32_t* a = argmax.data_ptr<int32_t>();
  dispatch_pair(queries, documents, [&](auto tag, auto dtag) {
    using T = decltype(tag);
    using DT = decltype(dtag);
    const auto* g = grad_scores.data_ptr<typename AccOf<T>::type>();
    if (need_q) {
      if constexpr (std::is_same_v<DT, ResidualRows>) {
        backward_owned<true>(pol, qowners, g, ptr<T>(queries), residual_rows(queries, documents, storage), dim, a,
                             width, mut_ptr<T>(gq), AtParallelFor{});
      } else {
        backward_owned<true>(pol, qowners, g, ptr<T>(queries), DenseRows<DT>{ptr<DT>(documents), scales, dim}, dim,
                             a, width, mut_ptr<T>(gq), AtParallelFor{});
      }
    }
    if constexpr (std::is_same_v<DT, T>) {
      if (need_d)
        backward_owned<false>(pol, downers, g, ptr<T>(queries), DenseRows<T>{ptr<T>(documents), nullptr, dim}, dim,
                              a, width, mut_ptr<T>(gd), AtParallelFor{});
    }
  });
  return {gq, gd};
}

PaddedPolicy padded_policy(const at::Tensor& queries, const at::Tensor& documents,
                           const at::Tensor& query_lengths, const at::Tensor& doc_lengths) {
  check_data(queries, "queries", 3);
  check_data(documents, "documents", 4);
  check_pair(queries, documents);
  const int64_t B = queries.size(0), C = documents.size(1);
  TORCH_CHECK(documents.size(0) == B, "maxsim_cpu: queries and documents batch sizes differ");
  return {B, C, queries.size(1), documents.size(2), index_view(query_lengths, "query_lengths", B),
          index_view(doc_lengths, "doc_lengths", B * C)};
}

ContrastivePolicy contrastive_policy(const at::Tensor& queries, const at::Tensor& documents,
                                     const at::Tensor& document_offsets,
                                     const std::optional<at::Tensor>& query_lengths) {
  check_data(queries, "queries", 3);
  check_data(documents, "documents", 2);
  check_pair(queries, documents);
  const int64_t Nq = queries.size(0);
  IndexView off = index_view(document_offsets, "document_offsets", -1);
  TORCH_CHECK(off.size >= 1, "maxsim_cpu: document_offsets needs Nb+1 >= 1 entries");
  IndexView ql;
  if (query_lengths.has_value()) ql = index_view(*query_lengths, "query_lengths", Nq);
  return {Nq, off.size - 1, queries.size(1), {off, documents.size(0)}, ql};
}

ContrastivePaddedPolicy contrastive_padded_policy(const at::Tensor& queries,
                                                  const at::Tensor& documents,
                                                  const at::Tensor& document_lengths,
                                                  const std::optional<at::Tensor>& query_lengths) {
  check_data(queries, "queries", 3);
  check_data(documents, "documents", 3);
  check_pair(queries, documents);
  const int64_t Nq = queries.size(0), Nb = documents.size(0);
  IndexView ql;
  if (query_lengths.has_value()) ql = index_view(*query_lengths, "query_lengths", Nq);
  return {Nq, Nb, queries.size(1),
          {index_view(document_lengths, "document_lengths", Nb), documents.size(1)}, ql};
}

PackedPolicy packed_policy(const at::Tensor& queries, const at::Tensor& query_offsets,
                           const at::Tensor& documents, const at::Tensor& document_offsets,
                           const at::Tensor& pair_query_ids, const at::Tensor& pair_document_ids) {
  check_data(queries, "queries", 2);
  check_data(documents, "documents", 2);
  check_pair(queries, documents);
  IndexView qo = index_view(query_offsets, "query_offsets", -1);
  IndexView doff = index_view(document_offsets, "document_offsets", -1);
  TORCH_CHECK(qo.size >= 1 && doff.size >= 1, "maxsim_cpu: offsets need at least one entry");
  IndexView qid = index_view(pair_query_ids, "pair_query_ids", -1);
  IndexView did = index_view(pair_document_ids, "pair_document_ids", qid.size);
  return {queries.size(0), documents.size(0), qo, doff, qid, did};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> padded_forward(const at::Tensor& queries,
                                                  const at::Tensor& documents,
                                                  const at::Tensor& query_lengths,
                                                  const at::Tensor& doc_lengths, bool with_argmax,
                                                  const DocumentStorage& storage) {
  const PaddedPolicy pol = padded_policy(queries, documents, query_lengths, doc_lengths);
  return run_forward(pol, queries, documents, storage, {pol.B, pol.C}, pol.Lq, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> contrastive_forward(
    const at::Tensor& queries, const at::Tensor& documents, const at::Tensor& document_offsets,
    const std::optional<at::Tensor>& query_lengths, bool with_argmax,
    const DocumentStorage& storage) {
  const ContrastivePolicy pol = contrastive_policy(queries, documents, document_offsets, query_lengths);
  return run_forward(pol, queries, documents, storage, {pol.Nq, pol.Nb}, pol.Lq, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> contrastive_padded_forward(
    const at::Tensor& queries, const at::Tensor& documents, const at::Tensor& document_lengths,
    const std::optional<at::Tensor>& query_lengths, bool with_argmax,
    const DocumentStorage& storage) {
  const ContrastivePaddedPolicy pol =
      contrastive_padded_policy(queries, documents, document_lengths, query_lengths);
  return run_forward(pol, queries, documents, storage, {pol.Nq, pol.Nb}, pol.Lq, with_argmax);
}

std::tuple<at::Tensor, at::Tensor> packed_forward(
    const at::Tensor& queries, const at::Tensor& query_offsets, const at::Tensor& documents,
    const at::Tensor& document_offsets, const at::Tensor& pair_query_ids,
    const at::Tensor& pair_document_ids, int64_t max_q_len, bool with_argmax,
    const DocumentStorage& storage) {
  const PackedPolicy pol = packed_policy(queries, query_offsets, documents, document_offsets,
                                         pair_query_ids, pair_document_ids);
  TORCH_CHECK(max_q_len >= 0, "maxsim_cpu: max_q_len must be >= 0");
  return run_forward(pol, queries, documents, storage, {pol.num_pairs()}, max_q_len,
                     with_argmax);
}

std::tuple<at::Tensor, at::Tensor> padded_backward(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& documents,
    const at::Tensor& query_lengths, const at::Tensor& doc_lengths, const at::Tensor& argmax,
    bool need_grad_queries, bool need_grad_documents,
    const DocumentStorage& storage) {
  const PaddedPolicy pol = padded_policy(queries, documents, query_lengths, doc_lengths);
  // Query b owns pairs b*C + c; document (b, c) owns its single pair.
  const StridedOwners qo{pol.B, pol.Lq, pol.C, pol.C, 1};
  const StridedOwners dow{pol.B * pol.C, pol.Ld, 1, 1, 0};
  return run_backward(pol, grad_scores, queries, documents, argmax, qo, dow, need_grad_queries,
                      need_grad_documents, storage);
}

std::tuple<at::Tensor, at::Tensor> contrastive_backward(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& documents,
    const at::Tensor& document_offsets, const std::optional<at::Tensor>& query_lengths,
    const at::Tensor& argmax, bool need_grad_queries, bool need_grad_documents,
    const DocumentStorage& storage) {
  const ContrastivePolicy pol = contrastive_policy(queries, documents, document_offsets, query_lengths);
  // Query q owns pairs q*Nb + n; document n owns pairs q*Nb + n over q.
  const StridedOwners qo{pol.Nq, pol.Lq, pol.Nb, pol.Nb, 1};
  const IndexView& offsets = pol.documents.offsets;
  const OffsetOwnersStrided dow{offsets, pol.documents.T, pol.Nq, pol.Nb, offsets_monotone(offsets)};
  return run_backward(pol, grad_scores, queries, documents, argmax, qo, dow, need_grad_queries,
                      need_grad_documents, storage);
}

std::tuple<at::Tensor, at::Tensor> contrastive_padded_backward(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& documents,
    const at::Tensor& document_lengths, const std::optional<at::Tensor>& query_lengths,
    const at::Tensor& argmax, bool need_grad_queries, bool need_grad_documents,
    const DocumentStorage& storage) {
  const ContrastivePaddedPolicy pol =
      contrastive_padded_policy(queries, documents, document_lengths, query_lengths);
  // Query q owns pairs q*Nb + n; document n owns rows [n*Ld, (n+1)*Ld) and pairs q*Nb + n.
  const StridedOwners qo{pol.Nq, pol.Lq, pol.Nb, pol.Nb, 1};
  const StridedOwners dow{pol.Nb, pol.documents.Ld, pol.Nq, 1, pol.Nb};
  return run_backward(pol, grad_scores, queries, documents, argmax, qo, dow, need_grad_queries,
                      need_grad_documents, storage);
}

std::tuple<at::Tensor, at::Tensor> packed_backward(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& query_offsets,
    const at::Tensor& documents, const at::Tensor& document_offsets,
    const at::Tensor& pair_query_ids, const at::Tensor& pair_document_ids, const at::Tensor& argmax,
    const at::Tensor& pairs_by_query, const at::Tensor& query_pair_offsets,
    const at::Tensor& pairs_by_document, const at::Tensor& document_pair_offsets,
    bool need_grad_queries, bool need_grad_documents,
    const DocumentStorage& storage) {
  const PackedPolicy pol = packed_policy(queries, query_offsets, documents, document_offsets,
                                         pair_query_ids, pair_document_ids);
  const int64_t P = pol.num_pairs();
  const PackedOwners qo{pol.query_offsets, pol.Tq,
                        index_view(pairs_by_query, "pairs_by_query", P),
                        index_view(query_pair_offsets, "query_pair_offsets", pol.query_offsets.size),
                        pol.pair_query_ids, offsets_monotone(pol.query_offsets)};
  const PackedOwners dow{pol.document_offsets, pol.Td,
                         index_view(pairs_by_document, "pairs_by_document", P),
                         index_view(document_pair_offsets, "document_pair_offsets",
                                    pol.document_offsets.size),
                         pol.pair_document_ids, offsets_monotone(pol.document_offsets)};
  return run_backward(pol, grad_scores, queries, documents, argmax, qo, dow, need_grad_queries,
                      need_grad_documents, storage);
}

at::Tensor centroid_forward(const at::Tensor& table, const at::Tensor& document_codes,
                            const at::Tensor& document_offsets, const std::optional<at::Tensor>& query_lengths,
                            const std::optional<at::Tensor>& pair_query_ids,
                            const std::optional<at::Tensor>& pair_document_ids) {
  TORCH_CHECK(table.device().is_cpu() && table.is_contiguous() && table.scalar_type() == at::kFloat &&
                  table.dim() == 3,
              "maxsim_cpu: the centroid table must be contiguous float32 [Nq, n_centroids, Lq]");
  const int64_t Nq = table.size(0), n_centroids = table.size(1), Lq = table.size(2);
  CentroidPairs pol{};
  pol.Nq = Nq;
  pol.offsets = index_view(document_offsets, "document_offsets", -1);
  TORCH_CHECK(pol.offsets.size >= 1, "maxsim_cpu: document_offsets needs Nb + 1 >= 1 entries");
  pol.Nb = pol.offsets.size - 1;
  if (query_lengths.has_value()) pol.query_lengths = index_view(*query_lengths, "query_lengths", Nq);
  TORCH_CHECK(pair_query_ids.has_value() == pair_document_ids.has_value(),
              "maxsim_cpu: pair_query_ids and pair_document_ids go together");
  std::vector<int64_t> shape{Nq, pol.Nb};
  if (pair_query_ids.has_value()) {
    pol.pair_query_ids = index_view(*pair_query_ids, "pair_query_ids", -1);
    pol.pair_document_ids = index_view(*pair_document_ids, "pair_document_ids", pol.pair_query_ids.size);
    shape = {pol.pair_query_ids.size};
  }
  const IndexView codes = index_view(document_codes, "document_codes", -1);
  at::Tensor scores = at::empty(shape, table.options());
  if (pol.num_pairs() > 0)
    centroid_scores(pol, table.data_ptr<float>(), n_centroids, Lq, codes, scores.data_ptr<float>(), AtParallelFor{});
  return scores;
}

}  // namespace maxsim_cpu
