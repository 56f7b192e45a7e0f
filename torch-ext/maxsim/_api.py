"""Public entry points: validate, make contiguous, call the op for the tensors' device.

Each surface has three forms sharing one op: the score, the score with the winning
document-token index per query token (`_with_argmax`), and a differentiable score
(`_train`) whose backward is driven by that argmax.
"""
from __future__ import annotations

import torch

from . import _validate as check
from ._ops import ops
from . import _registration  # noqa: F401  (registers the fake kernels)


def _call(op, args, queries, documents):
    """Run `op`, skipping the autograd kernel when no gradient can flow.

    The autograd kernel is needed only when an embedding requires grad, where it wires
    backward (or, for inference entry points, refuses it with a clear error); skipping it
    saves a dispatcher pass on every inference call. Under torch.compile the op is traced
    through the normal dispatch.
    """
    if (torch.is_grad_enabled() and (queries.requires_grad or documents.requires_grad)) \
            or torch.compiler.is_compiling():
        return op(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


# ---- padded ------------------------------------------------------------------------------

def _scales(document_scales):
    return None if document_scales is None else document_scales.contiguous()


def _padded_args(queries, documents, query_lengths, doc_lengths, document_scales):
    check.embeddings("queries", queries, 3, "[B, Lq, D]")
    compressed = check.documents(documents, 4, "[B, C, Ld, D]", document_scales, queries)
    check.same_dtype_and_dim(queries, documents, compressed)
    b, lq = queries.shape[0], queries.shape[1]
    if documents.shape[0] != b:
        raise ValueError(
            f"documents must have B = {b} rows like queries, got shape {tuple(documents.shape)}"
        )
    c, ld = documents.shape[1], documents.shape[2]
    check.index("query_lengths", query_lengths, (b,))
    check.index("doc_lengths", doc_lengths, (b, c))
    check.same_device(("queries", "documents", "query_lengths", "doc_lengths"),
                      queries, documents, query_lengths, doc_lengths)
    read = check.reads_values(queries)
    check.lengths_in_range("query_lengths", query_lengths, lq, "Lq", read)
    check.lengths_in_range("doc_lengths", doc_lengths, ld, "Ld", read)
    return (queries.contiguous(), documents.contiguous(), query_lengths.contiguous(),
            doc_lengths.contiguous())


def score_candidates_padded(queries, documents, query_lengths, doc_lengths, *,
                            document_scales=None):
    """MaxSim of each query against its candidates.

    queries [B, Lq, D], documents [B, C, Ld, D], query_lengths [B], doc_lengths [B, C]
    -> scores [B, C] float32.
    """
    args = _padded_args(queries, documents, query_lengths, doc_lengths, document_scales)
    return _call(ops.padded_forward, (*args, False, _scales(document_scales)), args[0], args[1])[0]


def score_candidates_padded_with_argmax(queries, documents, query_lengths, doc_lengths, *,
                                        document_scales=None):
    """Like score_candidates_padded, plus argmax [B, C, Lq] int32 (-1 where unmatched)."""
    args = _padded_args(queries, documents, query_lengths, doc_lengths, document_scales)
    return _call(ops.padded_forward, (*args, True, _scales(document_scales)), args[0], args[1])


def score_candidates_padded_train(queries, documents, query_lengths, doc_lengths, *,
                                  document_scales=None):
    """Differentiable score_candidates_padded (gradients for queries and documents)."""
    args = _padded_args(queries, documents, query_lengths, doc_lengths, document_scales)
    return _call(ops.padded_forward, (*args, True, _scales(document_scales)), args[0], args[1])[0]


# ---- contrastive -------------------------------------------------------------------------

def _contrastive_args(queries, documents, document_offsets, query_lengths, document_scales):
    check.embeddings("queries", queries, 3, "[Nq, Lq, D]")
    compressed = check.documents(documents, 2, "[total_doc_tokens, D]", document_scales, queries)
    check.same_dtype_and_dim(queries, documents, compressed)
    check.index("document_offsets", document_offsets, None)
    if query_lengths is not None:
        check.index("query_lengths", query_lengths, (queries.shape[0],))
    check.same_device(("queries", "documents", "document_offsets", "query_lengths"),
                      queries, documents, document_offsets, query_lengths)
    read = check.reads_values(queries)
    check.offsets("document_offsets", document_offsets, documents.shape[0], "documents.shape[0]",
                  read)
    if query_lengths is not None:
        check.lengths_in_range("query_lengths", query_lengths, queries.shape[1], "Lq", read)
        query_lengths = query_lengths.contiguous()
    return queries.contiguous(), documents.contiguous(), document_offsets.contiguous(), query_lengths


def score_contrastive(queries, documents, document_offsets, *, query_lengths=None,
                      document_scales=None):
    """Every query against every document.

    queries [Nq, Lq, D], documents [total_doc_tokens, D] packed, document_offsets [Nb + 1],
    optional query_lengths [Nq] (default: all Lq positions count) -> scores [Nq, Nb] float32.
    """
    args = _contrastive_args(queries, documents, document_offsets, query_lengths, document_scales)
    return _call(ops.contrastive_forward, (*args, False, _scales(document_scales)), args[0],
                 args[1])[0]


def score_contrastive_with_argmax(queries, documents, document_offsets, *, query_lengths=None,
                                  document_scales=None):
    """Like score_contrastive, plus argmax [Nq, Nb, Lq] int32 (-1 where unmatched)."""
    args = _contrastive_args(queries, documents, document_offsets, query_lengths, document_scales)
    return _call(ops.contrastive_forward, (*args, True, _scales(document_scales)), args[0], args[1])


def score_contrastive_train(queries, documents, document_offsets, *, query_lengths=None,
                            document_scales=None):
    """Differentiable score_contrastive, e.g. for in-batch-negative (InfoNCE) training."""
    args = _contrastive_args(queries, documents, document_offsets, query_lengths, document_scales)
    return _call(ops.contrastive_forward, (*args, True, _scales(document_scales)), args[0],
                 args[1])[0]


# ---- contrastive over padded documents ---------------------------------------------------

def _contrastive_padded_args(queries, documents, document_lengths, query_lengths,
                             document_scales):
    check.embeddings("queries", queries, 3, "[Nq, Lq, D]")
    compressed = check.documents(documents, 3, "[Nb, Ld, D]", document_scales, queries)
    check.same_dtype_and_dim(queries, documents, compressed)
    check.index("document_lengths", document_lengths, (documents.shape[0],))
    if query_lengths is not None:
        check.index("query_lengths", query_lengths, (queries.shape[0],))
    check.same_device(("queries", "documents", "document_lengths", "query_lengths"),
                      queries, documents, document_lengths, query_lengths)
    read = check.reads_values(queries)
    check.lengths_in_range("document_lengths", document_lengths, documents.shape[1], "Ld", read)
    if query_lengths is not None:
        check.lengths_in_range("query_lengths", query_lengths, queries.shape[1], "Lq", read)
        query_lengths = query_lengths.contiguous()
    return (queries.contiguous(), documents.contiguous(), document_lengths.contiguous(),
            query_lengths)


def score_contrastive_padded(queries, documents, document_lengths, *, query_lengths=None,
                             document_scales=None):
    """Every query against every document, documents padded (no packing copy needed).

    queries [Nq, Lq, D], documents [Nb, Ld, D], document_lengths [Nb] (tokens at or past a
    document's length do not count), optional query_lengths [Nq] -> scores [Nq, Nb] float32.
    """
    args = _contrastive_padded_args(queries, documents, document_lengths, query_lengths,
                                    document_scales)
    return _call(ops.contrastive_padded_forward, (*args, False, _scales(document_scales)), args[0],
                 args[1])[0]


def score_contrastive_padded_with_argmax(queries, documents, document_lengths, *,
                                         query_lengths=None, document_scales=None):
    """Like score_contrastive_padded, plus argmax [Nq, Nb, Lq] int32 (-1 where unmatched)."""
    args = _contrastive_padded_args(queries, documents, document_lengths, query_lengths,
                                    document_scales)
    return _call(ops.contrastive_padded_forward, (*args, True, _scales(document_scales)), args[0],
                 args[1])


def score_contrastive_padded_train(queries, documents, document_lengths, *, query_lengths=None,
                                   document_scales=None):
    """Differentiable score_contrastive_padded (gradients for queries and documents)."""
    args = _contrastive_padded_args(queries, documents, document_lengths, query_lengths,
                                    document_scales)
    return _call(ops.contrastive_padded_forward, (*args, True, _scales(document_scales)), args[0],
                 args[1])[0]


# ---- packed ------------------------------------------------------------------------------

def _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids,
                 pair_document_ids, max_q_len, need_width, document_scales):
    check.embeddings("queries", queries, 2, "[total_query_tokens, D]")
    compressed = check.documents(documents, 2, "[total_doc_tokens, D]", document_scales, queries)
    check.same_dtype_and_dim(queries, documents, compressed)
    check.index("query_offsets", query_offsets, None)
    check.index("document_offsets", document_offsets, None)
    check.index("pair_query_ids", pair_query_ids, None)
    check.index("pair_document_ids", pair_document_ids, (pair_query_ids.shape[0],))
    check.same_device(("queries", "query_offsets", "documents", "document_offsets",
                       "pair_query_ids", "pair_document_ids"),
                      queries, query_offsets, documents, document_offsets, pair_query_ids,
                      pair_document_ids)
    read = check.reads_values(queries)
    check.offsets("query_offsets", query_offsets, queries.shape[0], "queries.shape[0]", read)
    check.offsets("document_offsets", document_offsets, documents.shape[0], "documents.shape[0]",
                  read)
    n_queries, n_docs = query_offsets.shape[0] - 1, document_offsets.shape[0] - 1
    check.ids_in_range("pair_query_ids", pair_query_ids, n_queries, "number of queries", read)
    check.ids_in_range("pair_document_ids", pair_document_ids, n_docs, "number of documents", read)
    if max_q_len is not None:
        check.max_q_len(max_q_len, query_offsets, read)
    elif need_width:
        # The argmax width is the longest query: reading it is a host sync on a GPU.
        max_q_len = int((query_offsets[1:] - query_offsets[:-1]).max()) if n_queries > 0 else 0
    else:
        max_q_len = 0  # no argmax: the width is unused (and ops reject a negative one)
    return (queries.contiguous(), query_offsets.contiguous(), documents.contiguous(),
            document_offsets.contiguous(), pair_query_ids.contiguous(),
            pair_document_ids.contiguous(), max_q_len)


def score_pairs_packed(queries, query_offsets, documents, document_offsets, pair_query_ids,
                       pair_document_ids, *, max_q_len=None, document_scales=None):
    """MaxSim of arbitrary (query, document) pairs over packed ragged segments.

    queries [total_q, D], query_offsets [Nq + 1], documents [total_d, D],
    document_offsets [Nd + 1], pair_query_ids [P], pair_document_ids [P] -> scores [P].
    `max_q_len`, if given, must be at least the longest query segment.
    """
    args = _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids,
                        pair_document_ids, max_q_len, need_width=False, document_scales=document_scales)
    return _call(ops.packed_forward, (*args, False, _scales(document_scales)), args[0], args[2])[0]


def score_pairs_packed_with_argmax(queries, query_offsets, documents, document_offsets,
                                   pair_query_ids, pair_document_ids, *, max_q_len=None, document_scales=None):
    """Like score_pairs_packed, plus argmax [P, max_q_len] int32 (-1 where unmatched).

    Without max_q_len the width is read from query_offsets (a host sync on a GPU).
    """
    args = _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids,
                        pair_document_ids, max_q_len, need_width=True, document_scales=document_scales)
    return _call(ops.packed_forward, (*args, True, _scales(document_scales)), args[0], args[2])


def score_pairs_packed_train(queries, query_offsets, documents, document_offsets,
                             pair_query_ids, pair_document_ids, *, max_q_len=None, document_scales=None):
    """Differentiable score_pairs_packed (gradients for queries and documents)."""
    args = _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids,
                        pair_document_ids, max_q_len, need_width=True, document_scales=document_scales)
    return _call(ops.packed_forward, (*args, True, _scales(document_scales)), args[0], args[2])[0]
