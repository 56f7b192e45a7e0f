"""Public entry points: a thin call of the op for the tensors' device.

Each surface has three forms sharing one op: the score, the score with the winning
document-token index per query token (`_with_argmax`), and a differentiable score
(`_train`) whose backward is driven by that argmax. The ops check their arguments in C++
(torch-ext/checks.h) and make them contiguous, and their autograd kernel (autograd.cpp)
builds no graph when nothing needs a gradient, so a call of float documents is the op call
and nothing else. What stays here is what only Python can see: which argument the op's
schema refused (named after the fact), the caller's grad mode for compressed documents, and
the packed surface's optional max_q_len.
"""
from __future__ import annotations

import torch

from . import _validate as check
from ._ops import ops
from ._residual import ResidualCodec
from . import _registration  # noqa: F401  (registers the fake kernels)


def _tensor(name, t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")


def _index(name, t):
    if t is not None and not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 or int64, got {type(t).__name__}")


# Each surface's op arguments before max_q_len / with_argmax, for the TypeError that names a
# non-tensor: (name, shape) for embeddings, a bare name for index tensors (None allowed).
_PADDED = (("queries", "[B, Lq, D]"), ("documents", "[B, C, Ld, D]"), "query_lengths", "doc_lengths")
_CONTRASTIVE = (("queries", "[Nq, Lq, D]"), ("documents", "[total_doc_tokens, D]"), "document_offsets",
                "query_lengths")
_CONTRASTIVE_PADDED = (("queries", "[Nq, Lq, D]"), ("documents", "[Nb, Ld, D]"), "document_lengths",
                       "query_lengths")
_PACKED = (("queries", "[total_query_tokens, D]"), "query_offsets", ("documents", "[total_doc_tokens, D]"),
           "document_offsets", "pair_query_ids", "pair_document_ids")


def _check_types(signature, args):
    for spec, value in zip(signature, args):
        if isinstance(spec, tuple):
            _tensor(spec[0], value, spec[1])
        else:
            _index(spec, value)


def _run(op, signature, args, document_scales, document_codes, residual_codec):
    """op(*args, storage...): the one path every entry point takes.

    Float documents (no storage arguments), the common call, go straight to the op: it checks
    everything about tensors in C++, and its autograd kernel steps aside when nothing needs a
    gradient. Only when the op's schema refuses an argument does Python look, to raise the
    TypeError that names it (the schema's own message is about positions and IValues).
    Compressed and residual documents take the checks that need the caller's grad mode first.
    """
    if document_scales is None and document_codes is None and residual_codec is None:
        try:
            return op(*args)
        except RuntimeError as e:
            error = e
        _check_types(signature, args)  # outside the handler, so its TypeError is not chained
        raise error
    _check_types(signature, args)
    if document_scales is not None:
        check.compressed_grad(args[2 if signature is _PACKED else 1], document_scales)
    return op(*args, *_storage(document_scales, document_codes, residual_codec))


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


# ---- padded ------------------------------------------------------------------------------

def score_candidates_padded(queries, documents, query_lengths, doc_lengths, *,
                            document_scales=None,
                            document_codes=None, residual_codec=None):
    """MaxSim of each query against its candidates.

    queries [B, Lq, D], documents [B, C, Ld, D], query_lengths [B], doc_lengths [B, C]
    -> scores [B, C] float32.
    """
    return _run(ops.padded_forward, _PADDED, (queries, documents, query_lengths, doc_lengths, False),
                document_scales, document_codes, residual_codec)[0]


def score_candidates_padded_with_argmax(queries, documents, query_lengths, doc_lengths, *,
                                        document_scales=None,
                                        document_codes=None, residual_codec=None):
    """Like score_candidates_padded, plus argmax [B, C, Lq] int32 (-1 where unmatched)."""
    return _run(ops.padded_forward, _PADDED, (queries, documents, query_lengths, doc_lengths, True),
                document_scales, document_codes, residual_codec)


def score_candidates_padded_train(queries, documents, query_lengths, doc_lengths, *,
                                  document_scales=None,
                                  document_codes=None, residual_codec=None):
    """Differentiable score_candidates_padded (gradients for queries and documents)."""
    return _run(ops.padded_forward, _PADDED, (queries, documents, query_lengths, doc_lengths, True),
                document_scales, document_codes, residual_codec)[0]


# ---- contrastive -------------------------------------------------------------------------

def score_contrastive(queries, documents, document_offsets, *, query_lengths=None,
                      document_scales=None,
                      document_codes=None, residual_codec=None):
    """Every query against every document.

    queries [Nq, Lq, D], documents [total_doc_tokens, D] packed, document_offsets [Nb + 1],
    optional query_lengths [Nq] (default: all Lq positions count) -> scores [Nq, Nb] float32.
    """
    return _run(ops.contrastive_forward, _CONTRASTIVE, (queries, documents, document_offsets, query_lengths, False),
                document_scales, document_codes, residual_codec)[0]


def score_contrastive_with_argmax(queries, documents, document_offsets, *, query_lengths=None,
                                  document_scales=None,
                                  document_codes=None, residual_codec=None):
    """Like score_contrastive, plus argmax [Nq, Nb, Lq] int32 (-1 where unmatched)."""
    return _run(ops.contrastive_forward, _CONTRASTIVE, (queries, documents, document_offsets, query_lengths, True),
                document_scales, document_codes, residual_codec)


def score_contrastive_train(queries, documents, document_offsets, *, query_lengths=None,
                            document_scales=None,
                            document_codes=None, residual_codec=None):
    """Differentiable score_contrastive, e.g. for in-batch-negative (InfoNCE) training."""
    return _run(ops.contrastive_forward, _CONTRASTIVE, (queries, documents, document_offsets, query_lengths, True),
                document_scales, document_codes, residual_codec)[0]


# ---- contrastive over padded documents ---------------------------------------------------

def score_contrastive_padded(queries, documents, document_lengths, *, query_lengths=None,
                             document_scales=None,
                             document_codes=None, residual_codec=None):
    """Every query against every document, documents padded (no packing copy needed).

    queries [Nq, Lq, D], documents [Nb, Ld, D], document_lengths [Nb] (tokens at or past a
    document's length do not count), optional query_lengths [Nq] -> scores [Nq, Nb] float32.
    """
    return _run(ops.contrastive_padded_forward, _CONTRASTIVE_PADDED,
                (queries, documents, document_lengths, query_lengths, False),
                document_scales, document_codes, residual_codec)[0]


def score_contrastive_padded_with_argmax(queries, documents, document_lengths, *,
                                         query_lengths=None, document_scales=None,
                                         document_codes=None, residual_codec=None):
    """Like score_contrastive_padded, plus argmax [Nq, Nb, Lq] int32 (-1 where unmatched)."""
    return _run(ops.contrastive_padded_forward, _CONTRASTIVE_PADDED,
                (queries, documents, document_lengths, query_lengths, True),
                document_scales, document_codes, residual_codec)


def score_contrastive_padded_train(queries, documents, document_lengths, *, query_lengths=None,
                                   document_scales=None,
                                   document_codes=None, residual_codec=None):
    """Differentiable score_contrastive_padded (gradients for queries and documents)."""
    return _run(ops.contrastive_padded_forward, _CONTRASTIVE_PADDED,
                (queries, documents, document_lengths, query_lengths, True),
                document_scales, document_codes, residual_codec)[0]


# ---- packed ------------------------------------------------------------------------------

def _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids,
                 pair_document_ids, max_q_len, with_argmax, document_scales, document_codes, residual_codec):
    """The op's arguments with max_q_len resolved: given (type and sign checked here; whether
    it covers the longest query, in the op), read from query_offsets when an argmax needs a
    width, else -1 (the op then uses no width)."""
    if max_q_len is not None:
        check.max_q_len(max_q_len, query_offsets, False)
    elif with_argmax:
        # Reading the width is a host sync on a GPU, so this path can afford the metadata
        # checks before reading (the op repeats them).
        _check_types(_PACKED, (queries, query_offsets, documents, document_offsets, pair_query_ids,
                               pair_document_ids))
        check.packed_call(queries, query_offsets, documents, document_offsets, pair_query_ids,
                          pair_document_ids, _storage(document_scales, document_codes, residual_codec))
        n_queries = query_offsets.shape[0] - 1
        max_q_len = int((query_offsets[1:] - query_offsets[:-1]).max()) if n_queries > 0 else 0
    else:
        max_q_len = -1
    return (queries, query_offsets, documents, document_offsets, pair_query_ids,
            pair_document_ids, max_q_len, with_argmax)


def score_pairs_packed(queries, query_offsets, documents, document_offsets, pair_query_ids,
                       pair_document_ids, *, max_q_len=None, document_scales=None,
                       document_codes=None, residual_codec=None):
    """MaxSim of arbitrary (query, document) pairs over packed ragged segments.

    queries [total_q, D], query_offsets [Nq + 1], documents [total_d, D],
    document_offsets [Nd + 1], pair_query_ids [P], pair_document_ids [P] -> scores [P].
    `max_q_len`, if given, must be at least the longest query segment.
    """
    args = _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids,
                        max_q_len, False, document_scales, document_codes, residual_codec)
    return _run(ops.packed_forward, _PACKED, args, document_scales, document_codes, residual_codec)[0]


def score_pairs_packed_with_argmax(queries, query_offsets, documents, document_offsets,
                                   pair_query_ids, pair_document_ids, *, max_q_len=None, document_scales=None,
                                   document_codes=None, residual_codec=None):
    """Like score_pairs_packed, plus argmax [P, max_q_len] int32 (-1 where unmatched).

    Without max_q_len the width is read from query_offsets (a host sync on a GPU).
    """
    args = _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids,
                        max_q_len, True, document_scales, document_codes, residual_codec)
    return _run(ops.packed_forward, _PACKED, args, document_scales, document_codes, residual_codec)


def score_pairs_packed_train(queries, query_offsets, documents, document_offsets,
                             pair_query_ids, pair_document_ids, *, max_q_len=None, document_scales=None,
                             document_codes=None, residual_codec=None):
    """Differentiable score_pairs_packed (gradients for queries and documents)."""
    args = _packed_args(queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids,
                        max_q_len, True, document_scales, document_codes, residual_codec)
    return _run(ops.packed_forward, _PACKED, args, document_scales, document_codes, residual_codec)[0]


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
    _tensor("document_codes", document_codes, "of int32 or int64")
    _tensor("document_offsets", document_offsets, "of int32 or int64")
    for name, t in (("query_lengths", query_lengths), ("pair_query_ids", pair_query_ids),
                    ("pair_document_ids", pair_document_ids)):
        _index(name, t)
    # One op: its checks (checks.h), the table in float32 accumulation or better whatever the
    # matmul settings (TF32 on CUDA, bfloat16 through oneDNN on some CPUs would round it), and
    # the gather.
    return ops.centroid_score(queries, document_codes, document_offsets, centroids, query_lengths,
                              pair_query_ids, pair_document_ids)
