// Argument checks of the forward ops, run in C++ once per call before any backend kernel
// (torch_binding.cpp wraps every backend's forward with them), so the Python entry points
// stay a thin call. Messages name the argument and say what is wrong, as the Python layer's
// did; rank, shape, dtype and device problems raise ValueError / TypeError on every device.
// Checks that read index values (lengths, offsets, ids) run where reading is free: CPU
// tensors, or any device with MAXSIM_CHECK_VALUES=1 (a host sync on a GPU). Without them the
// kernels still stay in bounds (lengths clamped, bad offsets or ids score NaN).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "torch_binding.h"

namespace maxsim_checks {

using at::Tensor;
using Opt = std::optional<Tensor>;
using maxsim_storage::DocumentStorage;

// What Python prints: tuple(t.shape), str(t.dtype).
inline std::string shape_str(c10::IntArrayRef s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) r += ", ";
    r += std::to_string(s[i]);
  }
  if (s.size() == 1) r += ",";
  return r + ")";
}

inline std::string dtype_str(c10::ScalarType t) {
  switch (t) {
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::kComplexHalf: return "torch.complex32";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    case at::kFloat8_e4m3fnuz: return "torch.float8_e4m3fnuz";
    case at::kFloat8_e5m2fnuz: return "torch.float8_e5m2fnuz";
    default: return std::string("torch.") + c10::toString(t);
  }
}

inline bool is_float8(c10::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2 || t == at::kFloat8_e4m3fnuz ||
         t == at::kFloat8_e5m2fnuz || std::strncmp(c10::toString(t), "Float8", 6) == 0;
}

inline void embeddings(const char* name, const Tensor& t, int64_t ndim, const char* what) {
  TORCH_CHECK_VALUE(t.dim() == ndim, std::string(name) + " must have " + std::to_string(ndim) + " dimensions " +
                                         what + ", got shape " + shape_str(t.sizes()));
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kHalf || s == at::kBFloat16 || s == at::kFloat || s == at::kDouble,
                   std::string(name) + " must be float16, bfloat16 or float32 (float64 on CPU/CUDA), got " +
                       dtype_str(s));
  TORCH_CHECK_TYPE(s != at::kDouble || t.is_cpu() || t.is_cuda(),
                   std::string(name) + " is float64, which is supported on CPU and CUDA only, not " +
                       t.device().str());
}

inline bool reads_values(const Tensor& t) {
  if (t.is_cpu()) return true;
  const char* e = std::getenv("MAXSIM_CHECK_VALUES");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

// (min, max) of a non-empty index tensor: a loop on the CPU, aminmax elsewhere.
inline std::pair<int64_t, int64_t> min_max(const Tensor& t) {
  if (t.is_cpu()) {
    const Tensor c = t.contiguous();
    const int64_t n = c.numel();
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    auto scan = [&](auto* p) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = static_cast<int64_t>(p[i]);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
      }
    };
    if (c.scalar_type() == at::kInt) {
      scan(c.const_data_ptr<int32_t>());
    } else {
      scan(c.const_data_ptr<int64_t>());
    }
    return {lo, hi};
  }
  auto [lo, hi] = at::aminmax(t);
  return {lo.item<int64_t>(), hi.item<int64_t>()};
}

// ColBERTv2 residual documents: uint8 packed bucket ids [..., D * nbits / 8] with their codes,
// centroids and bucket weights. Returns D.
inline int64_t residual_documents(const Tensor& t, int64_t ndim, const char* what, const DocumentStorage& st,
                                  const Tensor& queries) {
  TORCH_CHECK_VALUE(!st.scales.has_value(), "document_scales is only for int8 / float8_e4m3fn documents; "
                                            "residual documents take document_codes and residual_codec");
  TORCH_CHECK_VALUE(st.centroids.has_value() && st.bucket_weights.has_value(),
                    "residual documents need residual_codec (centroids and bucket_weights)");
  TORCH_CHECK_VALUE(t.dim() == ndim, "documents must have " + std::to_string(ndim) + " dimensions " + what +
                                         " (the last: D * nbits / 8 residual bytes), got shape " + shape_str(t.sizes()));
  const Tensor& codes = *st.codes;
  const Tensor& cents = *st.centroids;
  const Tensor& w = *st.bucket_weights;
  const auto cs = cents.scalar_type();
  TORCH_CHECK_TYPE(cents.dim() == 2 && (cs == at::kHalf || cs == at::kBFloat16 || cs == at::kFloat),
                   "residual_codec.centroids must be a 2-D float16, bfloat16 or float32 tensor [n_centroids, D], got " +
                       dtype_str(cs) + " of shape " + shape_str(cents.sizes()));
  const auto ws = w.scalar_type();
  TORCH_CHECK_TYPE(w.dim() == 1 && (ws == at::kHalf || ws == at::kBFloat16 || ws == at::kFloat),
                   "residual_codec.bucket_weights must be a 1-D float tensor, got " + dtype_str(ws) + " of shape " +
                       shape_str(w.sizes()));
  const int64_t nw = w.numel();
  TORCH_CHECK_VALUE(nw == 2 || nw == 4 || nw == 16, "residual_codec.bucket_weights must have 2**nbits entries "
                                                    "(nbits 1, 2 or 4), got " + std::to_string(nw));
  const int64_t nbits = nw == 2 ? 1 : nw == 4 ? 2 : 4;
  const int64_t dim = cents.size(1);
  TORCH_CHECK_VALUE(dim % (8 * nbits) == 0, "residual_codec: the embedding dim (" + std::to_string(dim) +
                                                ") must be a multiple of 8 * nbits = " + std::to_string(8 * nbits));
  TORCH_CHECK_VALUE(t.size(-1) == dim * nbits / 8, "residual documents must have D * nbits / 8 = " +
                                                       std::to_string(dim * nbits / 8) + " bytes per token (D " +
                                                       std::to_string(dim) + ", nbits " + std::to_string(nbits) +
                                                       "), got " + std::to_string(t.size(-1)));
  const auto ks = codes.scalar_type();
  TORCH_CHECK_TYPE(ks == at::kInt || ks == at::kLong, "document_codes must be int32 or int64, got " + dtype_str(ks));
  TORCH_CHECK_VALUE(cents.size(0) > 0 || codes.numel() == 0,
                    "residual_codec.centroids has no rows, but there are document tokens to decode");
  const auto want = t.sizes().slice(0, t.dim() - 1);
  TORCH_CHECK_VALUE(codes.sizes() == want, "document_codes must have shape " + shape_str(want) +
                                               " (one code per token), got " + shape_str(codes.sizes()));
  for (const auto& [name, x] : {std::pair<const char*, const Tensor*>{"document_codes", &codes},
                                {"residual_codec.centroids", &cents},
                                {"residual_codec.bucket_weights", &w}}) {
    TORCH_CHECK_VALUE(x->device() == t.device(), std::string(name) + " is on " + x->device().str() +
                                                     " but documents are on " + t.device().str());
  }
  TORCH_CHECK_TYPE(queries.scalar_type() != at::kDouble,
                   "residual documents pair with float16, bfloat16 or float32 queries, got float64 queries");
  TORCH_CHECK_VALUE(queries.size(-1) == dim, "queries and residual_codec.centroids must have the same embedding "
                                             "dim, got " + std::to_string(queries.size(-1)) + " and " +
                                                 std::to_string(dim));
  if (reads_values(queries) && codes.numel() > 0) {
    const auto [low, high] = min_max(codes);
    const int64_t bad = low < 0 ? low : high;
    TORCH_CHECK_VALUE(low >= 0 && high < cents.size(0),
                      "document_codes must be in [0, n_centroids) = [0, " + std::to_string(cents.size(0)) +
                          "), found " + std::to_string(bad));
  }
  return dim;
}

// The documents and how they are stored; true when they are not the queries' float type
// (int8 / float8_e4m3fn values with one float32 scale per token, or residuals). Whether they
// may get a gradient is the Python layer's check: it needs the caller's grad mode.
inline bool documents(const Tensor& t, int64_t ndim, const char* what, const DocumentStorage& st,
                      const Tensor& queries) {
  const Opt& scales = st.scales;
  const auto s = t.scalar_type();
  if (st.residual() || s == at::kByte) {
    TORCH_CHECK_VALUE(st.residual(), "uint8 documents are ColBERTv2 residuals: pass document_codes= and "
                                     "residual_codec=");
    TORCH_CHECK_TYPE(s == at::kByte, "document_codes is only for residual documents (uint8 packed bucket ids); "
                                     "documents are " + dtype_str(s));
    residual_documents(t, ndim, what, st, queries);
    return true;
  }
  TORCH_CHECK_VALUE(!st.centroids.has_value() && !st.bucket_weights.has_value(),
                    "residual_codec is only for residual documents (uint8, with document_codes)");
  if (s == at::kChar || is_float8(s)) {
    TORCH_CHECK_TYPE(s == at::kChar || s == at::kFloat8_e4m3fn,
                     "float8 documents must be torch.float8_e4m3fn, got " + dtype_str(s));
    TORCH_CHECK_VALUE(t.dim() == ndim, "documents must have " + std::to_string(ndim) + " dimensions " + what +
                                           ", got shape " + shape_str(t.sizes()));
    TORCH_CHECK_VALUE(scales.has_value(), "documents are " + dtype_str(s) +
                                              ": pass their per-token scales as document_scales= "
                                              "(maxsim.quantize_documents returns both)");
    const Tensor& sc = *scales;
    TORCH_CHECK_TYPE(sc.scalar_type() == at::kFloat, "document_scales must be float32, got " + dtype_str(sc.scalar_type()));
    const auto want = t.sizes().slice(0, t.dim() - 1);
    TORCH_CHECK_VALUE(sc.sizes() == want, "document_scales must have shape " + shape_str(want) +
                                              " (documents' shape without its last dim), got " + shape_str(sc.sizes()));
    TORCH_CHECK_VALUE(sc.device() == t.device(), "document_scales is on " + sc.device().str() +
                                                     " but documents are on " + t.device().str());
    TORCH_CHECK_TYPE(queries.scalar_type() != at::kDouble,
                     "compressed documents pair with float16, bfloat16 or float32 queries, got float64 queries");
    return true;
  }
  embeddings("documents", t, ndim, what);
  TORCH_CHECK_VALUE(!scales.has_value(), "document_scales is only for int8 / float8_e4m3fn documents; documents are " +
                                             dtype_str(s));
  return false;
}

inline void same_dtype_and_dim(const Tensor& q, const Tensor& d, bool compressed) {
  if (d.scalar_type() == at::kByte) return;  // residuals: checked against the centroids' dim
  TORCH_CHECK_TYPE(q.scalar_type() == d.scalar_type() || compressed,
                   "queries and documents must share a dtype, got " + dtype_str(q.scalar_type()) + " and " +
                       dtype_str(d.scalar_type()));
  TORCH_CHECK_VALUE(q.size(-1) == d.size(-1), "queries and documents must have the same embedding dim, got " +
                                                  std::to_string(q.size(-1)) + " and " + std::to_string(d.size(-1)));
}

// An index tensor: int32 / int64, of exactly `shape` when given, else 1-D.
inline void index(const char* name, const Tensor& t, std::optional<c10::IntArrayRef> shape) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kInt || s == at::kLong, std::string(name) + " must be int32 or int64, got " + dtype_str(s));
  if (shape.has_value()) {
    TORCH_CHECK_VALUE(t.sizes() == *shape, std::string(name) + " must have shape " + shape_str(*shape) + ", got " +
                                               shape_str(t.sizes()));
  } else {
    TORCH_CHECK_VALUE(t.dim() == 1, std::string(name) + " must have 1 dimension(s), got shape " + shape_str(t.sizes()));
  }
}

// Every present tensor on the first one's device.
inline void same_device(std::initializer_list<std::pair<const char*, const Tensor*>> args) {
  const auto& first = *args.begin();
  const c10::Device dev = first.second->device();
  for (const auto& a : args) {
    if (a.second == nullptr || !a.second->defined()) continue;
    TORCH_CHECK_VALUE(a.second->device() == dev, std::string(a.first) + " is on " + a.second->device().str() + " but " +
                                                     first.first + " is on " + dev.str() +
                                                     "; all arguments must be on one device");
  }
}

inline void lengths_in_range(const char* name, const Tensor& lengths, int64_t upper, const char* upper_name, bool read) {
  if (!read || lengths.numel() == 0) return;
  const auto [low, high] = min_max(lengths);
  TORCH_CHECK_VALUE(low >= 0, std::string(name) + " must be >= 0, found " + std::to_string(low));
  TORCH_CHECK_VALUE(high <= upper, std::string(name) + " must be <= " + upper_name + " (" + std::to_string(upper) +
                                       "), found " + std::to_string(high));
}

inline void offsets(const char* name, const Tensor& offs, int64_t total, const char* total_name, bool read) {
  TORCH_CHECK_VALUE(offs.dim() == 1 && offs.numel() >= 1, std::string(name) +
                                                              " must be 1-D with at least one entry (0), got shape " +
                                                              shape_str(offs.sizes()));
  if (!read) return;
  const Tensor c = offs.is_cpu() ? offs.contiguous() : offs.to(at::kCPU).contiguous();
  const int64_t n = c.numel();
  auto at_ = [&](int64_t i) {
    return c.scalar_type() == at::kInt ? static_cast<int64_t>(c.const_data_ptr<int32_t>()[i]) : c.const_data_ptr<int64_t>()[i];
  };
  const int64_t first = at_(0), last = at_(n - 1);
  TORCH_CHECK_VALUE(first == 0, std::string(name) + " must start at 0, starts at " + std::to_string(first));
  for (int64_t i = 1; i < n; ++i) TORCH_CHECK_VALUE(at_(i) >= at_(i - 1), std::string(name) + " must be non-decreasing");
  TORCH_CHECK_VALUE(last == total, std::string(name) + " must end at " + total_name + " (" + std::to_string(total) +
                                       "), ends at " + std::to_string(last));
}

inline void ids_in_range(const char* name, const Tensor& ids, int64_t count, const char* count_name, bool read) {
  if (!read || ids.numel() == 0) return;
  const auto [low, high] = min_max(ids);
  const int64_t bad = low < 0 ? low : high;
  TORCH_CHECK_VALUE(low >= 0 && high < count, std::string(name) + " must be in [0, " + count_name + ") = [0, " +
                                                  std::to_string(count) + "), found " + std::to_string(bad));
}

// ---- one function per forward op, in the order the checks run ----

inline void padded(const Tensor& q, const Tensor& d, const Tensor& ql, const Tensor& dl, const DocumentStorage& scales) {
  embeddings("queries", q, 3, "[B, Lq, D]");
  const bool compressed = documents(d, 4, "[B, C, Ld, D]", scales, q);
  same_dtype_and_dim(q, d, compressed);
  const int64_t b = q.size(0), lq = q.size(1);
  TORCH_CHECK_VALUE(d.size(0) == b, "documents must have B = " + std::to_string(b) + " rows like queries, got shape " +
                                        shape_str(d.sizes()));
  const int64_t c = d.size(1), ld = d.size(2);
  const int64_t bs[1] = {b}, bc[2] = {b, c};
  index("query_lengths", ql, c10::IntArrayRef(bs, 1));
  index("doc_lengths", dl, c10::IntArrayRef(bc, 2));
  same_device({{"queries", &q}, {"documents", &d}, {"query_lengths", &ql}, {"doc_lengths", &dl}});
  const bool read = reads_values(q);
  lengths_in_range("query_lengths", ql, lq, "Lq", read);
  lengths_in_range("doc_lengths", dl, ld, "Ld", read);
}

// Both contrastive surfaces: `segments` are document_offsets (documents packed, PACKED) or
// document_lengths (documents padded).
template <bool PACKED>
inline void contrastive(const Tensor& q, const Tensor& d, const Tensor& segments, const Opt& ql, const DocumentStorage& scales) {
  const char* seg_name = PACKED ? "document_offsets" : "document_lengths";
  embeddings("queries", q, 3, "[Nq, Lq, D]");
  const bool compressed =
      PACKED ? documents(d, 2, "[total_doc_tokens, D]", scales, q) : documents(d, 3, "[Nb, Ld, D]", scales, q);
  same_dtype_and_dim(q, d, compressed);
  const int64_t nb[1] = {d.size(0)}, nq[1] = {q.size(0)};
  if (PACKED) {
    index(seg_name, segments, std::nullopt);
  } else {
    index(seg_name, segments, c10::IntArrayRef(nb, 1));
  }
  if (ql.has_value()) index("query_lengths", *ql, c10::IntArrayRef(nq, 1));
  same_device({{"queries", &q}, {"documents", &d}, {seg_name, &segments}, {"query_lengths", ql ? &*ql : nullptr}});
  const bool read = reads_values(q);
  if (PACKED) {
    offsets(seg_name, segments, d.size(0), "documents.shape[0]", read);
  } else {
    lengths_in_range(seg_name, segments, d.size(1), "Ld", read);
  }
  if (ql.has_value()) lengths_in_range("query_lengths", *ql, q.size(1), "Lq", read);
}

// max_q_len: the argmax width the caller gave, or -1 when it gave none (the Python layer
// then needs no width, or has read the longest query itself).
inline void packed(const Tensor& q, const Tensor& q_offsets, const Tensor& d, const Tensor& d_offsets, const Tensor& pq,
                   const Tensor& pd, int64_t max_q_len, const DocumentStorage& scales) {
  embeddings("queries", q, 2, "[total_query_tokens, D]");
  const bool compressed = documents(d, 2, "[total_doc_tokens, D]", scales, q);
  same_dtype_and_dim(q, d, compressed);
  index("query_offsets", q_offsets, std::nullopt);
  index("document_offsets", d_offsets, std::nullopt);
  index("pair_query_ids", pq, std::nullopt);
  const int64_t p[1] = {pq.size(0)};
  index("pair_document_ids", pd, c10::IntArrayRef(p, 1));
  same_device({{"queries", &q},
               {"query_offsets", &q_offsets},
               {"documents", &d},
               {"document_offsets", &d_offsets},
               {"pair_query_ids", &pq},
               {"pair_document_ids", &pd}});
  const bool read = reads_values(q);
  offsets("query_offsets", q_offsets, q.size(0), "queries.shape[0]", read);
  offsets("document_offsets", d_offsets, d.size(0), "documents.shape[0]", read);
  ids_in_range("pair_query_ids", pq, q_offsets.size(0) - 1, "number of queries", read);
  ids_in_range("pair_document_ids", pd, d_offsets.size(0) - 1, "number of documents", read);
  TORCH_CHECK_VALUE(max_q_len >= -1, "max_q_len must be >= 0, got " + std::to_string(max_q_len));
  if (read && max_q_len >= 0 && q_offsets.numel() > 1) {
    const Tensor c = q_offsets.is_cpu() ? q_offsets.contiguous() : q_offsets.to(at::kCPU).contiguous();
    int64_t longest = 0;
    for (int64_t i = 1; i < c.numel(); ++i) {
      const int64_t len = c.scalar_type() == at::kInt
                              ? int64_t(c.const_data_ptr<int32_t>()[i]) - c.const_data_ptr<int32_t>()[i - 1]
                              : c.const_data_ptr<int64_t>()[i] - c.const_data_ptr<int64_t>()[i - 1];
      longest = len > longest ? len : longest;
    }
    TORCH_CHECK_VALUE(max_q_len >= longest, "max_q_len (" + std::to_string(max_q_len) +
                                                ") is below the longest query segment (" + std::to_string(longest) + ")");
  }
}

// PLAID's centroid-only score: queries [Nq, Lq, D] and centroids [n_centroids, D] in any float
// dtype (the table accumulates in float32 or better), codes cut by document_offsets, and either
// every (query, document) pair or the listed ones.
inline void centroids(const Tensor& q, const Tensor& codes, const Tensor& offs, const Tensor& cents, const Opt& ql,
                      const Opt& pq, const Opt& pd) {
  TORCH_CHECK_VALUE(q.dim() == 3 && q.is_floating_point(), "queries must be a float tensor [Nq, Lq, D], got " +
                                                               dtype_str(q.scalar_type()) + " of shape " +
                                                               shape_str(q.sizes()));
  TORCH_CHECK_VALUE(cents.dim() == 2 && cents.is_floating_point() && cents.size(1) == q.size(2),
                    "centroids must be a float tensor [n_centroids, D = " + std::to_string(q.size(2)) + "], got " +
                        dtype_str(cents.scalar_type()) + " of shape " + shape_str(cents.sizes()));
  index("document_codes", codes, std::nullopt);
  index("document_offsets", offs, std::nullopt);
  TORCH_CHECK_VALUE(pq.has_value() == pd.has_value(), "pair_query_ids and pair_document_ids go together");
  if (pq.has_value()) {
    index("pair_query_ids", *pq, std::nullopt);
    const int64_t p[1] = {pq->size(0)};
    index("pair_document_ids", *pd, c10::IntArrayRef(p, 1));
  }
  const int64_t nq[1] = {q.size(0)};
  if (ql.has_value()) index("query_lengths", *ql, c10::IntArrayRef(nq, 1));
  same_device({{"queries", &q},
               {"document_codes", &codes},
               {"document_offsets", &offs},
               {"centroids", &cents},
               {"query_lengths", ql ? &*ql : nullptr},
               {"pair_query_ids", pq ? &*pq : nullptr},
               {"pair_document_ids", pd ? &*pd : nullptr}});
  const bool read = reads_values(q);
  offsets("document_offsets", offs, codes.size(0), "document_codes.shape[0]", read);
  ids_in_range("document_codes", codes, cents.size(0), "n_centroids", read);
  if (pq.has_value()) {
    ids_in_range("pair_query_ids", *pq, q.size(0), "number of queries", read);
    ids_in_range("pair_document_ids", *pd, offs.size(0) - 1, "number of documents", read);
  }
  if (ql.has_value()) lengths_in_range("query_lengths", *ql, q.size(1), "Lq", read);
}

}  // namespace maxsim_checks
