"""Public entry points: a thin call of the op for the tensors' device.

Each surface has three forms sharing one op: the score, the score with the winning
document-token index per query token (`_with_argmax`), and a differentiable score
(`_train`) whose backward is driven by that argmax. The ops check their arguments in C++
(torch-ext/checks.h) and make them contiguous; what stays here is what only Python can
see: that an argument is a tensor at all, the caller's grad mode for compressed documents,
and the packed surface's optional max_q_len.
"""
from __future__ import annotations

import torch

from . import _validate as check
from ._ops import ops
from ._residual import ResidualCodec
from . import _registration  # noqa: F401  (registers the fake kernels)


def _call(op, args, qi, di):
    """Run `op` on args (queries at args[qi], documents at args[di]), skipping the autograd
    kernel when no gradient can flow.

    The autograd kernel is needed only when an embedding requires grad, where it wires
    backward (or, for inference entry points, refuses it with a clear error); skipping it
    saves a dispatcher pass on every inference call. Under torch.compile the op is traced
    through the normal dispatch.
    """
    queries, documents = args[qi], args[di]
    if (torch.is_grad_enabled() and (queries.requires_grad or documents.requires_grad)) \
            or torch.compiler.is_compiling():
        return op(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def _tensor(name, t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")


def _index(name, t):
    if t is not None and not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 or int64, got {type(t).__name__}")


def _storage(document_scales, document_codes, residual_codec):
    """The ops' trailing storage arguments: (document_scales, document_codes, centroids,
    bucket_weights, normalize)."""
    if document_codes is None and residual_codec is None:
        return (document_scales, None, None, None, True)
    if document_codes is None or residual_codec is None:
        raise ValueError("residual documents need both document_codes= and residual_codec=")
    if not isinstance(residual_codec, ResidualCodec):
        raise TypeError(f"residual_codec must be a maxsim.ResidualCodec, got {type(residual_codec).__name__}")
    if not isinstance(document_codes, torch.Tensor):
        raise TypeError(f"document_codes must be a torch.Tensor of int32 or int64, got "
                        f"{type(document_codes).__name__}")
    c = residual_codec
    if torch.is_grad_enabled() and (c.centroids.requires_grad or c.bucket_weights.requires_grad):
        raise ValueError("residual documents (the codec's centroids and bucket_weights) are frozen "
                         "storage and get no gradient; detach them, or train on float documents")
    return (document_scales, document_codes, c.centroids, c.bucket_weights, c.normalize)


def _python_checks(queries, q_what, documents, d_what, document_scales, *indices):
    """What the op cannot see: every argument a tensor (`indices`: (name, tensor or None)
    pairs), and compressed documents' scales a tensor with the documents frozen storage."""
    _tensor("queries", queries, q_what)
    _tensor("documents", documents, d_what)
    for name, t in indices:
        _index(name, t)
    if document_scales is not None:
        check.compressed_grad(documents, document_scales)


# ---- padded ------------------------------------------------------------------------------

def _padded_args(queries, documents, query_lengths, doc_lengths, document_scales):
    _python_checks(queries, "[B, Lq, D]", documents, "[B, C, Ld, D]", document_scales,
                   ("query_lengths", query_lengths), ("doc_lengths", doc_lengths))
    return queries, documents, query_lengths, doc_lengths


def score_candidates_padded(queries, documents, query_lengths, doc_lengths, *,
                            document_scales=None,
                            document_codes=None, residual_codec=None):
    """MaxSim of each query against its candidates.

    queries [B, Lq, D], documents [B, C, Ld, D], query_lengths [B], doc_lengths [B, C]
    -> scores [B, C] float32.
    """
    args = _padded_args(queries, documents, query_lengths, doc_lengths, document_scales)
    return _call(ops.padded_forward, (*args, False, *_storage(document_scales, document_codes, residual_codec)), 0, 1)[0]


def score_candidates_padded_with_argmax(queries, documents, query_lengths, doc_lengths, *,
                                        document_scales=None,
                                        document_codes=None, residual_codec=None):
    """Like score_candidates_padded, plus argmax [B, C, Lq] int32 (-1 where unmatched)."""
    args = _padded_args(queries, documents, query_lengths, doc_lengths, document_scales)
    return _call(ops.padded_forward, (*args, True, *_storage(document_scales, document_codes, residual_codec)), 0, 1)


def score_candidates_padded_train(queries, documents, query_lengths, doc_lengths, *,
                                  document_scales=None,
                                  document_codes=None, residual_codec=None):
    """Differentiable score_candidates_padded (gradients for queries and documents)."""
    args = _padded_args(queries, documents, query_lengths, doc_lengths, document_scales)
    return _call(ops.padded_forward, (*args, True, *_storage(document_scales, document_codes, residual_codec)), 0, 1)[0]


# ---- contrastive -------------------------------------------------------------------------

def _contrastive_args(queries, documents, document_offsets, query_lengths, document_scales):
    _python_checks(queries, "[Nq, Lq, D]", documents, "[total_doc_tokens, D]", document_scales,
                   ("document_offsets", document_offsets), ("query_lengths", query_lengths))
    return queries, documents, document_offsets, query_lengths


def score_contrastive(queries, documents, document_offsets, *, query_lengths=None,
                      document_scales=None,
                      document_codes=None, residual_codec=None):
    """Every query against every document.

    queries [Nq, Lq, D], documents [total_doc_tokens, D] packed, document_offsets [Nb + 1],
    optional query_lengths [Nq] (default: all Lq positions count) -> scores [Nq, Nb] float32.
    """
    args = _contrastive_args(queries, documents, document_offsets, query_lengths, document_scales)
    return _call(ops.contrastive_forward, (*args, False, *_storage(document_scales, document_codes, residual_codec)), 0, 1)[0]


def score_contrastive_with_argmax(queries, documents, document_offsets, *, query_lengths=None,
                                  document_scales=None,
                                  document_codes=None, residual_codec=None):
    """Like score_contrastive, plus argmax [Nq, Nb, Lq] int32 (-1 where unmatched)."""
    args = _contrastive_args(queries, documents, document_offsets, query_lengths, document_scales)
    return _call(ops.contrastive_forward, (*args, True, *_storage(document_scales, document_codes, residual_codec)), 0, 1)


def score_contrastive_train(queries, documents, document_offsets, *, query_lengths=None,
                            document_scales=None,
                            document_codes=None, residual_codec=None):
    """Differentiable score_contrastive, e.g. for in-batch-negative (InfoNCE) training."""
    args = _contrastive_args(queries, documents, document_offsets, query_lengths, document_scales)
    return _call(ops.contrastive_forward, (*args, True, *_storage(document_scales, document_codes, residual_codec)), 0, 1)[0]


# ---- contrastive over padded documents ---------------------------------------------------

def _contrastive_padded_args(queries, documents, document_lengths, query_lengths,
                             document_scales):
    _python_checks(queries, "[Nq, Lq, D]", documents, "[Nb, Ld, D]", document_scales,
                   ("document_lengths", document_lengths), ("query_lengths", query_lengths))
    return queries, documents, document_lengths, query_lengths


def score_contrastive_padded(queries, documents, document_lengths, *, query_lengths=None,
                             document_scales=None,
                             document_codes=None, residual_codec=None):
    """Every query against every document, documents padded (no packing copy needed).

    queries [Nq, Lq, D], documents [Nb, Ld, D], document_lengths [Nb] (tokens at or past a
    document's length do not count), optional query_lengths [Nq] -> scores [Nq, Nb] float32.
    """
    args = _contrastive_padded_args(queries, documents, document_lengths, query_lengths,
                                    document_scales)
    return _call(ops.contrastive_padded_forward, (*args, False, *_storage(document_scales, document_codes, residual_codec)), 0, 1)[0]


def score_contrastive_padded_with_argmax(queries, documents, document_lengths, *,
                                         query_lengths=None, document_scales=None,
                                         document_codes=None, residual_codec=None):
    """Like score_contrastive_padded, plus argmax [Nq, Nb, Lq] int32 (-1 where unmatched)."""
    args = _contrastive_padded_args(queries, documents, document_lengths, query_lengths,
                                    document_scales)
    return _call(ops.contrastive_padded_forward, (*args, True, *_storage(document_scales, document_codes, residual_codec)), 0, 1)


def score_contrastive_padded_train(queries, documents, document_lengths, *, query_lengths=None,
                                   document_scales=None,
                                   document_codes=None, residual_codec=None):
    """Differentiable score_contrastive_padded (gradients for queries and documents)."""
    args = _contrastive_padded_args(queries, documents, document_lengths, query_lengths,
                                    document_scales)
    return _call(ops.contrastive_padded_forward, (*args, True, *_storage(document_scales, document_codes, residual_codec)), 0, 1)[0]


# ---- packed ------------------------------------------------------------------------------

def _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids,
                 pair_document_ids, max_q_len, need_width, storage):
    _python_checks(queries, "[total_query_tokens, D]", documents, "[total_doc_tokens, D]",
                   storage[0], ("query_offsets", query_offsets),
                   ("document_offsets", document_offsets), ("pair_query_ids", pair_query_ids),
                   ("pair_document_ids", pair_document_ids))
    if max_q_len is not None:
        # Type and sign here; whether it covers the longest query, in the op (checks.h).
        check.max_q_len(max_q_len, query_offsets, False)
    elif need_width:
        # The argmax width is the longest query: reading it is a host sync on a GPU, so this
        # path can afford the metadata checks before reading (the op repeats them).
        check.packed_call(queries, query_offsets, documents, document_offsets, pair_query_ids,
                          pair_document_ids, storage)
        n_queries = query_offsets.shape[0] - 1
        max_q_len = int((query_offsets[1:] - query_offsets[:-1]).max()) if n_queries > 0 else 0
    else:
        max_q_len = -1  # not given, no argmax: the op uses no width (it passes 0 on)
    return (queries, query_offsets, documents, document_offsets, pair_query_ids,
            pair_document_ids, max_q_len)


def score_pairs_packed(queries, query_offsets, documents, document_offsets, pair_query_ids,
                       pair_document_ids, *, max_q_len=None, document_scales=None,
                       document_codes=None, residual_codec=None):
    """MaxSim of arbitrary (query, document) pairs over packed ragged segments.

    queries [total_q, D], query_offsets [Nq + 1], documents [total_d, D],
    document_offsets [Nd + 1], pair_query_ids [P], pair_document_ids [P] -> scores [P].
    `max_q_len`, if given, must be at least the longest query segment.
    """
    storage = _storage(document_scales, document_codes, residual_codec)
    args = _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids,
                        pair_document_ids, max_q_len, need_width=False, storage=storage)
    return _call(ops.packed_forward, (*args, False, *storage), 0, 2)[0]


def score_pairs_packed_with_argmax(queries, query_offsets, documents, document_offsets,
                                   pair_query_ids, pair_document_ids, *, max_q_len=None, document_scales=None,
                                   document_codes=None, residual_codec=None):
    """Like score_pairs_packed, plus argmax [P, max_q_len] int32 (-1 where unmatched).

    Without max_q_len the width is read from query_offsets (a host sync on a GPU).
    """
    storage = _storage(document_scales, document_codes, residual_codec)
    args = _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids,
                        pair_document_ids, max_q_len, need_width=True, storage=storage)
    return _call(ops.packed_forward, (*args, True, *storage), 0, 2)


def score_pairs_packed_train(queries, query_offsets, documents, document_offsets,
                             pair_query_ids, pair_document_ids, *, max_q_len=None, document_scales=None,
                             document_codes=None, residual_codec=None):
    """Differentiable score_pairs_packed (gradients for queries and documents)."""
    storage = _storage(document_scales, document_codes, residual_codec)
    args = _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids,
                        pair_document_ids, max_q_len, need_width=True, storage=storage)
    return _call(ops.packed_forward, (*args, True, *storage), 0, 2)[0]


# ---- PLAID's centroid-only score ---------------------------------------------------------

def score_centroids(queries, document_codes, document_offsets, centroids, *, query_lengths=None,
                    pair_query_ids=None, pair_document_ids=None):
    """PLAID's approximate (centroid-only) MaxSim: each document token stands for its centroid.

    queries [Nq, Lq, D], document_codes [total_doc_tokens] (int32 / int64, the residual index's
    codes), document_offsets [Nb + 1], centroids [n_centroids, D]; optional query_lengths [Nq].
    Every query against every document -> [Nq, Nb] float32, or, with pair_query_ids and
    pair_document_ids [P], the listed pairs -> [P]. score = sum_i max_j <q_i, centroids[code_j]>:
    the [Nq, n_centroids, Lq] table of query-centroid similarities is computed once (float32),
    then each pair takes a max over its codes per query token; [Lq, Ld] is never formed.
    """
    _tensor("queries", queries, "[Nq, Lq, D]")
    _tensor("centroids", centroids, "[n_centroids, D]")
    for name, t in (("document_codes", document_codes), ("document_offsets", document_offsets),
                    ("query_lengths", query_lengths), ("pair_query_ids", pair_query_ids),
                    ("pair_document_ids", pair_document_ids)):
        _index(name, t)
    if queries.dim() != 3 or not queries.is_floating_point():
        raise ValueError(f"queries must be a float tensor [Nq, Lq, D], got {queries.dtype} of shape "
                         f"{tuple(queries.shape)}")
    if centroids.dim() != 2 or not centroids.is_floating_point() or centroids.shape[1] != queries.shape[2]:
        raise ValueError(f"centroids must be a float tensor [n_centroids, D = {queries.shape[2]}], got "
                         f"{centroids.dtype} of shape {tuple(centroids.shape)}")
    for name, t in (("document_codes", document_codes), ("document_offsets", document_offsets)):
        check.index(name, t, None)
    if (pair_query_ids is None) != (pair_document_ids is None):
        raise ValueError("pair_query_ids and pair_document_ids go together")
    if pair_query_ids is not None:
        check.index("pair_query_ids", pair_query_ids, None)
        check.index("pair_document_ids", pair_document_ids, tuple(pair_query_ids.shape))
    if query_lengths is not None:
        check.index("query_lengths", query_lengths, (queries.shape[0],))
    check.same_device(("queries", "document_codes", "document_offsets", "centroids", "query_lengths",
                       "pair_query_ids", "pair_document_ids"), queries, document_codes, document_offsets,
                      centroids, query_lengths, pair_query_ids, pair_document_ids)
    read = check.reads_values(queries)
    check.offsets("document_offsets", document_offsets, document_codes.shape[0], "document_codes.shape[0]", read)
    check.ids_in_range("document_codes", document_codes, centroids.shape[0], "n_centroids", read)
    if pair_query_ids is not None:
        check.ids_in_range("pair_query_ids", pair_query_ids, queries.shape[0], "number of queries", read)
        check.ids_in_range("pair_document_ids", pair_document_ids, document_offsets.shape[0] - 1,
                           "number of documents", read)
    if query_lengths is not None:
        check.lengths_in_range("query_lengths", query_lengths, queries.shape[1], "Lq", read)
    with torch.no_grad():
        table = torch.matmul(centroids.float(), queries.float().transpose(1, 2)).contiguous()
    c = lambda t: None if t is None else t.contiguous()  # noqa: E731
    return ops.centroid_forward(table, document_codes.contiguous(), document_offsets.contiguous(),
                                c(query_lengths), c(pair_query_ids), c(pair_document_ids))
