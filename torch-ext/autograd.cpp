// Autograd for the four forward ops, registered at the Autograd key in C++.
//
// A Python autograd.Function costs tens of microseconds of host time per training step
// (its apply, the GIL-holding backward callback, argument boxing), which is most of a
// small step on a GPU. Here forward saves the inputs and the int32 argmax, backward calls
// the matching backward op; both go through the dispatcher, so CPU and CUDA tensors reach
// their own kernels and torch.compile traces them through the fake kernels.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "registration.h"

namespace maxsim_autograd {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Pair = std::tuple<Tensor, Tensor>;

#define MAXSIM_STR2(x) #x
#define MAXSIM_STR(x) MAXSIM_STR2(x)
constexpr const char* kNamespace = MAXSIM_STR(TORCH_EXTENSION_NAME);

// Function::apply runs forward with grad mode off but does not leave the Autograd key, so
// the ops are called below it (otherwise forward would re-enter its own kernel).
template <class Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow((std::string(kNamespace) + "::" + name).c_str(), "")
      .typed<Signature>();
}

// The backend's kernel, below the Autograd key: what each Function's forward runs, and what
// a call that cannot need backward runs without a Function (see needs_graph).
template <class Signature, class... Args>
std::tuple<at::Tensor, at::Tensor> call_below(const c10::TypedOperatorHandle<Signature>& op, const Args&... args) {
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(args...);
}

using Scales = std::optional<Tensor>;
// The schema's trailing storage arguments: document_scales, document_codes, centroids,
// bucket_weights, normalize (torch_binding.cpp).
#define STORAGE_T const Scales&, const Scales&, const Scales&, const Scales&, bool
using PaddedFwd = Pair(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, STORAGE_T);
using PaddedBwd = Pair(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       bool, bool, STORAGE_T);
using ContrastiveFwd = Pair(const Tensor&, const Tensor&, const Tensor&, const std::optional<Tensor>&, bool,
                            STORAGE_T);
using ContrastiveBwd = Pair(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const std::optional<Tensor>&,
                            const Tensor&, bool, bool, STORAGE_T);
using PackedFwd = Pair(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       int64_t, bool, STORAGE_T);
using PackedBwd = Pair(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                       bool, STORAGE_T);
#undef STORAGE_T

// How the documents are stored, as forward got it: saved with the tensors (saved[k..k+3])
// and the normalize flag in saved_data.
struct Storage {
  Scales scales, codes, centroids, weights;
  bool normalize = true;
  std::vector<Tensor> tensors() const {
    return {scales.value_or(Tensor()), codes.value_or(Tensor()), centroids.value_or(Tensor()),
            weights.value_or(Tensor())};
  }
  void save(AutogradContext* ctx) const { ctx->saved_data["normalize"] = normalize; }
  static Storage load(AutogradContext* ctx, const variable_list& s, size_t k);
};

// The inference entry points ask for no argmax, so there is nothing to differentiate with.
void require_argmax(AutogradContext* ctx) {
  TORCH_CHECK(ctx->saved_data["with_argmax"].toBool(),
              "maxsim: this score came from an inference entry point, which keeps no state for "
              "backward; use the matching *_train function to differentiate it");
}

// What forward leaves for backward besides the saved tensors.
void remember(AutogradContext* ctx, bool with_argmax, const Tensor& argmax) {
  ctx->saved_data["with_argmax"] = with_argmax;
  ctx->mark_non_differentiable({argmax});
  ctx->set_materialize_grads(false);  // an unused score gets no gradient buffer
}

// Compressed documents (int8 / float8 with per-token scales, or residuals) are frozen
// storage: scores differentiate to the queries only. (The storage struct is not an autograd
// input, so no edge reaches the scales or the codec's tensors; the Python layer refuses a
// call whose storage asks for a gradient.)
void refuse_compressed_grad(bool need_d, const Storage& st) {
  TORCH_CHECK_VALUE(!(need_d && (st.scales.has_value() || st.codes.has_value())),
                    "maxsim: documents stored as int8 / float8 (document_scales given) are frozen; "
                    "no gradient flows to them. Detach them, or train on float documents");
}
Scales optional(const Tensor& t) { return t.defined() ? Scales(t) : std::nullopt; }

Storage Storage::load(AutogradContext* ctx, const variable_list& s, size_t k) {
  return {optional(s[k]), optional(s[k + 1]), optional(s[k + 2]), optional(s[k + 3]),
          ctx->saved_data["normalize"].toBool()};
}

std::vector<Tensor> with_storage(std::vector<Tensor> saved, const Storage& st) {
  for (auto& t : st.tensors()) saved.push_back(t);
  return saved;
}

// (gq, gd) -> one gradient per forward input: queries at qi, documents at di.
variable_list input_grads(size_t n, size_t qi, size_t di, const Pair& g, bool need_q, bool need_d) {
  variable_list out(n);
  if (need_q) out[qi] = std::get<0>(g);
  if (need_d) out[di] = std::get<1>(g);
  return out;
}

struct PaddedFn : torch::autograd::Function<PaddedFn> {
  static const c10::TypedOperatorHandle<PaddedFwd>& forward_op() {
    static const auto op = op_handle<PaddedFwd>("padded_forward");
    return op;
  }
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& d, const Tensor& ql,
                               const Tensor& dl, bool with_argmax, const Storage& st) {
    auto [scores, argmax] = call_below(forward_op(), q, d, ql, dl, with_argmax, st.scales, st.codes, st.centroids,
                                       st.weights, st.normalize);
    remember(ctx, with_argmax, argmax);
    st.save(ctx);
    ctx->save_for_backward(with_storage({q, d, ql, dl, argmax}, st));
    return {scores, argmax};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    require_argmax(ctx);
    if (!grads[0].defined()) return variable_list(6);
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = op_handle<PaddedBwd>("padded_backward");
    const auto s = ctx->get_saved_variables();
    const Storage st = Storage::load(ctx, s, 5);
    const bool nq = ctx->needs_input_grad(0), nd = ctx->needs_input_grad(1);
    refuse_compressed_grad(nd, st);
    return input_grads(6, 0, 1,
                       op.call(grads[0].contiguous(), s[0], s[1], s[2], s[3], s[4], nq, nd, st.scales, st.codes,
                               st.centroids, st.weights, st.normalize),
                       nq, nd);
  }
};

// The two contrastive surfaces (documents cut by offsets, or padded with lengths) share
// their signatures; `Ops` names the forward and backward ops.
template <class Ops>
struct ContrastiveFn : torch::autograd::Function<ContrastiveFn<Ops>> {
  static const c10::TypedOperatorHandle<ContrastiveFwd>& forward_op() {
    static const auto op = op_handle<ContrastiveFwd>(Ops::kForward);
    return op;
  }
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& d, const Tensor& segments,
                               const std::optional<Tensor>& ql, bool with_argmax, const Storage& st) {
    auto [scores, argmax] = call_below(forward_op(), q, d, segments, ql, with_argmax, st.scales, st.codes,
                                       st.centroids, st.weights, st.normalize);
    remember(ctx, with_argmax, argmax);
    st.save(ctx);
    ctx->save_for_backward(with_storage({q, d, segments, argmax, ql.value_or(Tensor())}, st));
    return {scores, argmax};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    require_argmax(ctx);
    if (!grads[0].defined()) return variable_list(6);
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = op_handle<ContrastiveBwd>(Ops::kBackward);
    const auto s = ctx->get_saved_variables();
    const Storage st = Storage::load(ctx, s, 5);
    const bool nq = ctx->needs_input_grad(0), nd = ctx->needs_input_grad(1);
    refuse_compressed_grad(nd, st);
    return input_grads(6, 0, 1,
                       op.call(grads[0].contiguous(), s[0], s[1], s[2], optional(s[4]), s[3], nq, nd, st.scales,
                               st.codes, st.centroids, st.weights, st.normalize),
                       nq, nd);
  }
};

struct OffsetDocumentOps {
  static constexpr const char* kForward = "contrastive_forward";
  static constexpr const char* kBackward = "contrastive_backward";
};
struct PaddedDocumentOps {
  static constexpr const char* kForward = "contrastive_padded_forward";
  static constexpr const char* kBackward = "contrastive_padded_backward";
};

// Pair indices grouped by id, stably (order [P] int64, offsets [count + 1] int64), so each
// gradient row has one owner that walks its pairs in a fixed order: deterministic.
Pair group_by(const Tensor& ids, int64_t count) {
  auto [sorted, order] = at::sort(ids, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  return {order, at::searchsorted(sorted, at::arange(count + 1, ids.options()))};
}

struct PackedFn : torch::autograd::Function<PackedFn> {
  static const c10::TypedOperatorHandle<PackedFwd>& forward_op() {
    static const auto op = op_handle<PackedFwd>("packed_forward");
    return op;
  }
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& q_offsets, const Tensor& d,
                               const Tensor& d_offsets, const Tensor& pq, const Tensor& pd, int64_t max_q_len,
                               bool with_argmax, const Storage& st) {
    auto [scores, argmax] = call_below(forward_op(), q, q_offsets, d, d_offsets, pq, pd, max_q_len, with_argmax,
                                       st.scales, st.codes, st.centroids, st.weights, st.normalize);
    remember(ctx, with_argmax, argmax);
    st.save(ctx);
    ctx->save_for_backward(with_storage({q, q_offsets, d, d_offsets, pq, pd, argmax}, st));
    return {scores, argmax};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    require_argmax(ctx);
    if (!grads[0].defined()) return variable_list(9);
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = op_handle<PackedBwd>("packed_backward");
    const auto s = ctx->get_saved_variables();
    const auto [by_query, query_ptr] = group_by(s[4], s[1].size(0) - 1);
    const auto [by_doc, doc_ptr] = group_by(s[5], s[3].size(0) - 1);
    const Storage st = Storage::load(ctx, s, 7);
    const bool nq = ctx->needs_input_grad(0), nd = ctx->needs_input_grad(2);
    refuse_compressed_grad(nd, st);
    return input_grads(9, 0, 2,
                       op.call(grads[0].contiguous(), s[0], s[1], s[2], s[3], s[4], s[5], s[6], by_query, query_ptr,
                               by_doc, doc_ptr, nq, nd, st.scales, st.codes, st.centroids, st.weights, st.normalize),
                       nq, nd);
  }
};

Pair as_pair(const variable_list& v) { return {v[0], v[1]}; }

// Whether a call can need backward. Most calls cannot (inference, or grad mode off): they go
// straight to the backend below this key, without an autograd node or the contiguous copies
// that saving for backward asks for, so the Python entry points need not step around this
// kernel themselves (which cost more host time than this test).
bool needs_graph(const Tensor& q, const Tensor& d) {
  return at::GradMode::is_enabled() && (q.requires_grad() || d.requires_grad());
}

// The tensors forward saves are the ones backward hands to the backward ops, which read them
// as contiguous memory: made contiguous here, outside apply, so a strided input still gets
// its gradient through the copy.
Tensor c(const Tensor& t) { return t.contiguous(); }
std::optional<Tensor> c(const std::optional<Tensor>& t) { return t.has_value() ? std::optional<Tensor>(c(*t)) : t; }

#define STORAGE_PARAMS const Scales &ds, const Scales &codes, const Scales &centroids, const Scales &weights, bool normalize
Storage storage(STORAGE_PARAMS) { return {c(ds), c(codes), c(centroids), c(weights), normalize}; }
#define STORAGE_ARGS storage(ds, codes, centroids, weights, normalize)

Pair padded_forward(const Tensor& q, const Tensor& d, const Tensor& ql, const Tensor& dl, bool with_argmax,
                    STORAGE_PARAMS) {
  if (!needs_graph(q, d)) return call_below(PaddedFn::forward_op(), q, d, ql, dl, with_argmax, ds, codes, centroids,
                                            weights, normalize);
  return as_pair(PaddedFn::apply(c(q), c(d), c(ql), c(dl), with_argmax, STORAGE_ARGS));
}
Pair contrastive_forward(const Tensor& q, const Tensor& d, const Tensor& offsets, const std::optional<Tensor>& ql,
                         bool with_argmax, STORAGE_PARAMS) {
  if (!needs_graph(q, d)) return call_below(ContrastiveFn<OffsetDocumentOps>::forward_op(), q, d, offsets, ql,
                                            with_argmax, ds, codes, centroids, weights, normalize);
  return as_pair(ContrastiveFn<OffsetDocumentOps>::apply(c(q), c(d), c(offsets), c(ql), with_argmax, STORAGE_ARGS));
}
Pair contrastive_padded_forward(const Tensor& q, const Tensor& d, const Tensor& lengths,
                                const std::optional<Tensor>& ql, bool with_argmax, STORAGE_PARAMS) {
  if (!needs_graph(q, d)) return call_below(ContrastiveFn<PaddedDocumentOps>::forward_op(), q, d, lengths, ql,
                                            with_argmax, ds, codes, centroids, weights, normalize);
  return as_pair(ContrastiveFn<PaddedDocumentOps>::apply(c(q), c(d), c(lengths), c(ql), with_argmax, STORAGE_ARGS));
}
Pair packed_forward(const Tensor& q, const Tensor& q_offsets, const Tensor& d, const Tensor& d_offsets,
                    const Tensor& pq, const Tensor& pd, int64_t max_q_len, bool with_argmax, STORAGE_PARAMS) {
  if (!needs_graph(q, d)) return call_below(PackedFn::forward_op(), q, q_offsets, d, d_offsets, pq, pd, max_q_len,
                                            with_argmax, ds, codes, centroids, weights, normalize);
  return as_pair(
      PackedFn::apply(c(q), c(q_offsets), c(d), c(d_offsets), c(pq), c(pd), max_q_len, with_argmax, STORAGE_ARGS));
}
#undef STORAGE_PARAMS
#undef STORAGE_ARGS

}  // namespace
}  // namespace maxsim_autograd

TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, Autograd, ops) {
  ops.impl("padded_forward", &maxsim_autograd::padded_forward);
  ops.impl("contrastive_forward", &maxsim_autograd::contrastive_forward);
  ops.impl("contrastive_padded_forward", &maxsim_autograd::contrastive_padded_forward);
  ops.impl("packed_forward", &maxsim_autograd::packed_forward);
}
