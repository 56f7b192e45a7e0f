"""Fake (meta) kernels for the compiled ops, so torch.compile and FakeTensor can trace them.

The forward fakes run the ops' metadata checks (the C++ ones, checks.h, in Python), so a
call that reaches them (meta tensors, or tracing) raises what the compiled op would.

The ops return (scores, argmax). Autograd is registered in C++ (torch-ext/autograd.cpp):
it saves only the int32 argmax; the `_train` entry points ask the forward op for it, the
inference ones do not, and backward through an inference call raises instead of guessing.
"""
from __future__ import annotations

import torch

from . import _validate as check
from ._ops import add_op_namespace_prefix


def _score_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _argmax_like(x: torch.Tensor, shape, with_argmax: bool) -> torch.Tensor:
    return x.new_empty(shape if with_argmax else (0,), dtype=torch.int32)


def _grads_like(queries, documents, need_q: bool, need_d: bool):
    gq = torch.empty_like(queries) if need_q else queries.new_empty((0,))
    gd = torch.empty_like(documents) if need_d else documents.new_empty((0,))
    return gq, gd


@torch.library.register_fake(add_op_namespace_prefix("padded_forward"))
def _(queries, documents, query_lengths, doc_lengths, with_argmax, document_scales=None,
      document_codes=None, centroids=None, bucket_weights=None, normalize=True):
    check.padded_call(queries, documents, query_lengths, doc_lengths,
                      (document_scales, document_codes, centroids, bucket_weights, normalize))
    b, c = documents.shape[0], documents.shape[1]
    scores = queries.new_empty((b, c), dtype=_score_dtype(queries))
    return scores, _argmax_like(queries, (b, c, queries.shape[1]), with_argmax)


@torch.library.register_fake(add_op_namespace_prefix("contrastive_forward"))
def _(queries, documents, document_offsets, query_lengths, with_argmax, document_scales=None,
      document_codes=None, centroids=None, bucket_weights=None, normalize=True):
    check.contrastive_call(queries, documents, document_offsets, query_lengths,
                           (document_scales, document_codes, centroids, bucket_weights, normalize), True)
    nq, nb = queries.shape[0], document_offsets.shape[0] - 1
    scores = queries.new_empty((nq, nb), dtype=_score_dtype(queries))
    return scores, _argmax_like(queries, (nq, nb, queries.shape[1]), with_argmax)


@torch.library.register_fake(add_op_namespace_prefix("contrastive_padded_forward"))
def _(queries, documents, document_lengths, query_lengths, with_argmax, document_scales=None,
      document_codes=None, centroids=None, bucket_weights=None, normalize=True):
    check.contrastive_call(queries, documents, document_lengths, query_lengths,
                           (document_scales, document_codes, centroids, bucket_weights, normalize), False)
    nq, nb = queries.shape[0], documents.shape[0]
    scores = queries.new_empty((nq, nb), dtype=_score_dtype(queries))
    return scores, _argmax_like(queries, (nq, nb, queries.shape[1]), with_argmax)


@torch.library.register_fake(add_op_namespace_prefix("packed_forward"))
def _(queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids,
      max_q_len, with_argmax, document_scales=None,
      document_codes=None, centroids=None, bucket_weights=None, normalize=True):
    check.packed_call(queries, query_offsets, documents, document_offsets, pair_query_ids,
                      pair_document_ids,
                      (document_scales, document_codes, centroids, bucket_weights, normalize))
    p = pair_query_ids.shape[0]
    scores = queries.new_empty((p,), dtype=_score_dtype(queries))
    return scores, _argmax_like(queries, (p, max(max_q_len, 0)), with_argmax)


@torch.library.register_fake(add_op_namespace_prefix("padded_backward"))
def _(grad_scores, queries, documents, query_lengths, doc_lengths, argmax, need_q, need_d, document_scales=None,
      document_codes=None, centroids=None, bucket_weights=None, normalize=True):
    return _grads_like(queries, documents, need_q, need_d)


@torch.library.register_fake(add_op_namespace_prefix("contrastive_backward"))
def _(grad_scores, queries, documents, document_offsets, query_lengths, argmax, need_q, need_d, document_scales=None,
      document_codes=None, centroids=None, bucket_weights=None, normalize=True):
    return _grads_like(queries, documents, need_q, need_d)


@torch.library.register_fake(add_op_namespace_prefix("contrastive_padded_backward"))
def _(grad_scores, queries, documents, document_lengths, query_lengths, argmax, need_q, need_d, document_scales=None,
      document_codes=None, centroids=None, bucket_weights=None, normalize=True):
    return _grads_like(queries, documents, need_q, need_d)


@torch.library.register_fake(add_op_namespace_prefix("packed_backward"))
def _(grad_scores, queries, query_offsets, documents, document_offsets, pair_query_ids,
      pair_document_ids, argmax, pairs_by_query, query_pair_offsets, pairs_by_document,
      document_pair_offsets, need_q, need_d, document_scales=None,
      document_codes=None, centroids=None, bucket_weights=None, normalize=True):
    return _grads_like(queries, documents, need_q, need_d)


@torch.library.register_fake(add_op_namespace_prefix("centroid_forward"))
def _(table, document_codes, document_offsets, query_lengths=None, pair_query_ids=None, pair_document_ids=None):
    if pair_query_ids is not None:
        return table.new_empty((pair_query_ids.shape[0],))
    return table.new_empty((table.shape[0], document_offsets.shape[0] - 1))


@torch.library.register_fake(add_op_namespace_prefix("centroid_table"))
def _(queries, centroids):
    nq, nc, lq = queries.shape[0], centroids.shape[0], queries.shape[1]
    return queries.new_empty_strided((nq, nc, lq), (lq, nq * lq, 1), dtype=torch.float32)


@torch.library.register_fake(add_op_namespace_prefix("centroid_score"))
def _(queries, document_codes, document_offsets, centroids, query_lengths=None, pair_query_ids=None,
      pair_document_ids=None):
    check.centroid_call(queries, document_codes, document_offsets, centroids, query_lengths,
                        pair_query_ids, pair_document_ids)
    if pair_query_ids is not None:
        return queries.new_empty(tuple(pair_query_ids.shape), dtype=torch.float32)
    return queries.new_empty((queries.shape[0], document_offsets.shape[0] - 1), dtype=torch.float32)
