"""Fake (meta) kernels and autograd for the compiled ops, registered through torch.library.

The ops return (scores, argmax). Autograd saves only the int32 argmax; the `_train`
entry points ask the forward op for it, the inference ones do not, and backward through
an inference call raises instead of guessing.
"""
from __future__ import annotations

import torch

from ._ops import add_op_namespace_prefix, ops


def _score_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _argmax_like(x: torch.Tensor, shape, with_argmax: bool) -> torch.Tensor:
    return x.new_empty(shape if with_argmax else (0,), dtype=torch.int32)


def _grads_like(queries, documents, need_q: bool, need_d: bool):
    gq = torch.empty_like(queries) if need_q else queries.new_empty((0,))
    gd = torch.empty_like(documents) if need_d else documents.new_empty((0,))
    return gq, gd


@torch.library.register_fake(add_op_namespace_prefix("padded_forward"))
def _(queries, documents, query_lengths, doc_lengths, with_argmax):
    b, c = documents.shape[0], documents.shape[1]
    scores = queries.new_empty((b, c), dtype=_score_dtype(queries))
    return scores, _argmax_like(queries, (b, c, queries.shape[1]), with_argmax)


@torch.library.register_fake(add_op_namespace_prefix("contrastive_forward"))
def _(queries, documents, document_offsets, query_lengths, with_argmax):
    nq, nb = queries.shape[0], document_offsets.shape[0] - 1
    scores = queries.new_empty((nq, nb), dtype=_score_dtype(queries))
    return scores, _argmax_like(queries, (nq, nb, queries.shape[1]), with_argmax)


@torch.library.register_fake(add_op_namespace_prefix("packed_forward"))
def _(queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids,
      max_q_len, with_argmax):
    p = pair_query_ids.shape[0]
    scores = queries.new_empty((p,), dtype=_score_dtype(queries))
    return scores, _argmax_like(queries, (p, max_q_len), with_argmax)


@torch.library.register_fake(add_op_namespace_prefix("padded_backward"))
def _(grad_scores, queries, documents, query_lengths, doc_lengths, argmax, need_q, need_d):
    return _grads_like(queries, documents, need_q, need_d)


@torch.library.register_fake(add_op_namespace_prefix("contrastive_backward"))
def _(grad_scores, queries, documents, document_offsets, query_lengths, argmax, need_q, need_d):
    return _grads_like(queries, documents, need_q, need_d)


@torch.library.register_fake(add_op_namespace_prefix("packed_backward"))
def _(grad_scores, queries, query_offsets, documents, document_offsets, pair_query_ids,
      pair_document_ids, argmax, pairs_by_query, query_pair_offsets, pairs_by_document,
      document_pair_offsets, need_q, need_d):
    return _grads_like(queries, documents, need_q, need_d)


def _require_argmax(ctx) -> None:
    if not ctx.with_argmax:
        raise RuntimeError(
            "maxsim: this score came from an inference entry point, which keeps no state for "
            "backward; use the matching *_train function to differentiate it"
        )


def _setup_padded(ctx, inputs, output):
    queries, documents, query_lengths, doc_lengths, with_argmax = inputs
    ctx.with_argmax = with_argmax
    ctx.save_for_backward(queries, documents, query_lengths, doc_lengths, output[1])


def _backward_padded(ctx, grad_scores, _grad_argmax):
    _require_argmax(ctx)
    queries, documents, query_lengths, doc_lengths, argmax = ctx.saved_tensors
    need_q, need_d = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    gq, gd = ops.padded_backward(
        grad_scores.contiguous(), queries, documents, query_lengths, doc_lengths, argmax,
        need_q, need_d,
    )
    return (gq if need_q else None), (gd if need_d else None), None, None, None


def _setup_contrastive(ctx, inputs, output):
    queries, documents, document_offsets, query_lengths, with_argmax = inputs
    ctx.with_argmax = with_argmax
    ctx.has_query_lengths = query_lengths is not None
    saved = [queries, documents, document_offsets, output[1]]
    if query_lengths is not None:
        saved.append(query_lengths)
    ctx.save_for_backward(*saved)


def _backward_contrastive(ctx, grad_scores, _grad_argmax):
    _require_argmax(ctx)
    queries, documents, document_offsets, argmax, *rest = ctx.saved_tensors
    query_lengths = rest[0] if ctx.has_query_lengths else None
    need_q, need_d = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    gq, gd = ops.contrastive_backward(
        grad_scores.contiguous(), queries, documents, document_offsets, query_lengths, argmax,
        need_q, need_d,
    )
    return (gq if need_q else None), (gd if need_d else None), None, None, None


def _csr_by(ids: torch.Tensor, count: int):
    """Stable grouping of pair indices by id: (order [P] int64, offsets [count+1] int64)."""
    order = torch.argsort(ids, stable=True)
    bounds = torch.arange(count + 1, device=ids.device, dtype=ids.dtype)
    offsets = torch.searchsorted(ids[order], bounds)
    return order, offsets


def _setup_packed(ctx, inputs, output):
    queries, query_offsets, documents, document_offsets, pq, pd, _max_q_len, with_argmax = inputs
    ctx.with_argmax = with_argmax
    ctx.save_for_backward(queries, query_offsets, documents, document_offsets, pq, pd, output[1])


def _backward_packed(ctx, grad_scores, _grad_argmax):
    _require_argmax(ctx)
    queries, query_offsets, documents, document_offsets, pq, pd, argmax = ctx.saved_tensors
    need_q, need_d = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
    by_query, query_ptr = _csr_by(pq, query_offsets.shape[0] - 1)
    by_doc, doc_ptr = _csr_by(pd, document_offsets.shape[0] - 1)
    gq, gd = ops.packed_backward(
        grad_scores.contiguous(), queries, query_offsets, documents, document_offsets, pq, pd,
        argmax, by_query, query_ptr, by_doc, doc_ptr, need_q, need_d,
    )
    return (gq if need_q else None), None, (gd if need_d else None), None, None, None, None, None


_NAMESPACE = add_op_namespace_prefix("").split("::")[0]
_AUTOGRAD_LIB = torch.library.Library(_NAMESPACE, "IMPL")


def _register_autograd(name: str, setup_context, backward) -> None:
    """An Autograd-key kernel that runs the backend op inside an autograd.Function.

    This is what torch.library.register_autograd sets up, minus its per-call re-binding of
    default arguments (about 10 us a call, a third of a small rerank): none of these
    schemas has defaults, so the dispatcher hands over every argument as it is.
    """
    op = getattr(ops, name).default

    def forward(ctx, *args):
        with torch._C._AutoDispatchBelowAutograd():
            out = op(*args)
        ctx.mark_non_differentiable(out[1])
        setup_context(ctx, args, out)
        return out

    function = type(
        f"{name}_autograd",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )

    def autograd_kernel(*args):
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return function.apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    _AUTOGRAD_LIB.impl(name, autograd_kernel, "Autograd")


_register_autograd("padded_forward", _setup_padded, _backward_padded)
_register_autograd("contrastive_forward", _setup_contrastive, _backward_contrastive)
_register_autograd("packed_forward", _setup_packed, _backward_packed)
