"""Pure-PyTorch MaxSim: the executable specification the kernels are tested against.

These functions materialise every similarity matrix, so they are for tests and
small inputs. They follow the same rules as the kernels: padding never counts, ties
go to the lowest document index, NaN propagates like torch.max, an empty query scores
0, a non-empty query against an empty document scores -inf, and unmatched positions
have argmax -1 and no gradient. Arithmetic is float32 (float64 for float64 inputs).

Compressed documents (int8 / float8_e4m3fn values with `document_scales=`, one float32 scale
per token) are scored as the kernels score them: the similarity of the values, then times
the token's scale, then the max. Their backward returns no document gradient (None).
"""
from __future__ import annotations

import torch


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _reduce(sims: torch.Tensor, q_len: torch.Tensor, d_len: torch.Tensor):
    """sims [..., Lq, Ld] -> (scores [...], argmax [..., Lq] int32) under the masking rules."""
    lq, ld = sims.shape[-2], sims.shape[-1]
    q_valid = torch.arange(lq, device=sims.device) < q_len.unsqueeze(-1)  # [..., Lq]
    d_valid = torch.arange(ld, device=sims.device) < d_len.unsqueeze(-1)  # [..., Ld]
    if ld == 0:
        best = torch.full(sims.shape[:-1], float("-inf"), dtype=sims.dtype, device=sims.device)
        arg = torch.full(sims.shape[:-1], -1, dtype=torch.int64, device=sims.device)
    else:
        masked = sims.masked_fill(~d_valid.unsqueeze(-2), float("-inf"))
        best, arg = masked.max(dim=-1)
    has_doc = (d_len > 0).unsqueeze(-1)
    matched = q_valid & has_doc
    arg = torch.where(matched, arg, torch.full_like(arg, -1)).to(torch.int32)
    scores = torch.where(q_valid, best, torch.zeros_like(best)).sum(dim=-1)
    return scores, arg


def _scale_sims(sims: torch.Tensor, scales) -> torch.Tensor:
    """sims [..., Lq, Ld] times per-document-token scales broadcast as [..., 1, Ld]."""
    return sims if scales is None else sims * scales.to(sims.dtype).unsqueeze(-2)


def _dequantized(documents: torch.Tensor, scales, acc: torch.dtype) -> torch.Tensor:
    d = documents.to(acc)
    return d if scales is None else d * scales.to(acc).unsqueeze(-1)


def _segments_to_padded(tokens: torch.Tensor, offsets: torch.Tensor, width: int | None = None):
    """Packed rows + CSR offsets -> ([N, width, D] zero-padded copy, lengths [N])."""
    offsets = offsets.to(torch.int64)
    lengths = offsets[1:] - offsets[:-1]
    n = lengths.numel()
    width = int(lengths.max()) if width is None and n > 0 else (width or 0)
    pos = torch.arange(width, device=tokens.device)
    rows = offsets[:-1].unsqueeze(1) + pos
    valid = pos < lengths.unsqueeze(1)
    rows = torch.where(valid, rows, torch.zeros_like(rows))
    if tokens.shape[0] == 0:
        padded = tokens.new_zeros(n, width, tokens.shape[-1])
    else:
        padded = tokens[rows] * valid.unsqueeze(-1).to(tokens.dtype)
    return padded, lengths


def maxsim_reference(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """MaxSim of one query [Lq, D] against one document [Ld, D] -> 0-d score."""
    acc = _acc_dtype(q)
    scores, _ = _reduce(
        (q.to(acc) @ d.to(acc).T).unsqueeze(0),
        torch.tensor([q.shape[0]], device=q.device),
        torch.tensor([d.shape[0]], device=q.device),
    )
    return scores[0]


# ---- padded: queries [B, Lq, D], documents [B, C, Ld, D] -------------------------------

def score_candidates_padded_with_argmax_reference(queries, documents, query_lengths, doc_lengths,
                                                  *, document_scales=None):
    acc = _acc_dtype(queries)
    sims = torch.einsum("bqd,bcld->bcql", queries.to(acc), documents.to(acc))
    sims = _scale_sims(sims, document_scales)
    q_len = query_lengths.to(torch.int64).unsqueeze(1).expand(doc_lengths.shape)
    return _reduce(sims, q_len, doc_lengths.to(torch.int64))


def score_candidates_padded_reference(queries, documents, query_lengths, doc_lengths, *,
                                      document_scales=None):
    return score_candidates_padded_with_argmax_reference(
        queries, documents, query_lengths, doc_lengths, document_scales=document_scales
    )[0]


def _gather_rows(tokens_by_pair: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    """tokens_by_pair [P, Ld, D], argmax [P, Lq] -> the matched rows [P, Lq, D] (0 where -1)."""
    if tokens_by_pair.shape[1] == 0:  # no document rows (Ld == 0): nothing is matched
        return tokens_by_pair.new_zeros(*argmax.shape, tokens_by_pair.shape[-1])
    safe = argmax.clamp(min=0).to(torch.int64)
    rows = torch.gather(
        tokens_by_pair, 1, safe.unsqueeze(-1).expand(*safe.shape, tokens_by_pair.shape[-1])
    )
    return torch.where((argmax >= 0).unsqueeze(-1), rows, torch.zeros_like(rows))


def score_candidates_padded_backward_reference(
    grad_scores, queries, documents, query_lengths, doc_lengths, argmax, *, document_scales=None
):
    """Gradients of sum(grad_scores * scores) given the forward's argmax."""
    acc = _acc_dtype(queries)
    b, c, ld, dim = documents.shape
    g = grad_scores.to(acc)
    matched = argmax >= 0  # [B, C, Lq]
    lq = argmax.shape[-1]
    docs = _dequantized(documents, document_scales, acc).reshape(b * c, ld, dim)
    rows = _gather_rows(docs, argmax.reshape(b * c, lq)).reshape(b, c, lq, dim)
    grad_q = (g[:, :, None, None] * rows).sum(dim=1)
    contrib = g[:, :, None, None] * queries.to(acc)[:, None]
    contrib = torch.where(matched.unsqueeze(-1), contrib, torch.zeros_like(contrib))
    grad_d = torch.zeros(b * c, ld, dim, dtype=acc, device=queries.device)
    flat_arg = argmax.clamp(min=0).to(torch.int64).reshape(b * c, lq)
    if ld > 0:
        grad_d.scatter_add_(1, flat_arg.unsqueeze(-1).expand(-1, -1, dim), contrib.reshape(b * c, lq, dim))
    if document_scales is not None:
        return grad_q.to(queries.dtype), None
    return grad_q.to(queries.dtype), grad_d.reshape(documents.shape).to(documents.dtype)


# ---- contrastive: queries [Nq, Lq, D] x packed documents -------------------------------

def score_contrastive_with_argmax_reference(queries, documents, document_offsets, query_lengths=None,
                                            *, document_scales=None):
    """The documents padded (a copy), then scored as score_contrastive_padded does."""
    acc = _acc_dtype(queries)
    docs, d_len = _segments_to_padded(documents.to(acc), document_offsets)
    scales = None
    if document_scales is not None:
        scales = _segments_to_padded(document_scales.to(acc).unsqueeze(-1), document_offsets)[0][..., 0]
    return score_contrastive_padded_with_argmax_reference(queries, docs, d_len, query_lengths,
                                                          document_scales=scales)


def score_contrastive_reference(queries, documents, document_offsets, query_lengths=None, *,
                                document_scales=None):
    return score_contrastive_with_argmax_reference(
        queries, documents, document_offsets, query_lengths, document_scales=document_scales
    )[0]


def score_contrastive_backward_reference(
    grad_scores, queries, documents, document_offsets, argmax, query_lengths=None, *,
    document_scales=None,
):
    acc = _acc_dtype(queries)
    nq, nb = grad_scores.shape
    starts = document_offsets.to(torch.int64)[:-1]  # [Nb]
    g = grad_scores.to(acc)
    matched = argmax >= 0  # [Nq, Nb, Lq]
    rows_idx = (starts[None, :, None] + argmax.clamp(min=0).to(torch.int64))  # [Nq, Nb, Lq]
    rows_idx = torch.where(matched, rows_idx, torch.zeros_like(rows_idx))
    docs = _dequantized(documents, document_scales, acc)
    if docs.shape[0] == 0:
        gathered = docs.new_zeros(*rows_idx.shape, docs.shape[-1])
    else:
        gathered = torch.where(matched.unsqueeze(-1), docs[rows_idx], 0.0)
    grad_q = (g[:, :, None, None] * gathered).sum(dim=1)
    contrib = g[:, :, None, None] * queries.to(acc)[:, None]
    contrib = torch.where(matched.unsqueeze(-1), contrib, torch.zeros_like(contrib))
    grad_d = torch.zeros_like(docs)
    if docs.shape[0] > 0:  # no document rows: nothing matched (and index 0 would be out of range)
        grad_d.index_add_(0, rows_idx.reshape(-1), contrib.reshape(rows_idx.numel(), docs.shape[-1]))
    if document_scales is not None:
        return grad_q.to(queries.dtype), None
    return grad_q.to(queries.dtype), grad_d.to(documents.dtype)


# ---- contrastive over padded documents: queries [Nq, Lq, D] x documents [Nb, Ld, D] -------

def score_contrastive_padded_with_argmax_reference(queries, documents, document_lengths,
                                                   query_lengths=None, *, document_scales=None):
    acc = _acc_dtype(queries)
    nq, lq, _ = queries.shape
    sims = torch.einsum("qid,njd->qnij", queries.to(acc), documents.to(acc))
    sims = _scale_sims(sims, document_scales)
    if query_lengths is None:
        query_lengths = torch.full((nq,), lq, dtype=torch.int64, device=queries.device)
    q_len = query_lengths.to(torch.int64).unsqueeze(1).expand(nq, documents.shape[0])
    return _reduce(sims, q_len, document_lengths.to(torch.int64).unsqueeze(0).expand(nq, -1))


def score_contrastive_padded_reference(queries, documents, document_lengths, query_lengths=None, *,
                                       document_scales=None):
    return score_contrastive_padded_with_argmax_reference(
        queries, documents, document_lengths, query_lengths, document_scales=document_scales
    )[0]


def score_contrastive_padded_backward_reference(
    grad_scores, queries, documents, document_lengths, argmax, query_lengths=None, *,
    document_scales=None,
):
    """Document n starts at row n * Ld of the flattened documents: the packed case."""
    nb, ld, dim = documents.shape
    offsets = torch.arange(nb + 1, device=documents.device) * ld
    scales = None if document_scales is None else document_scales.reshape(nb * ld)
    grad_q, grad_d = score_contrastive_backward_reference(
        grad_scores, queries, documents.reshape(nb * ld, dim), offsets, argmax, query_lengths,
        document_scales=scales)
    return grad_q, None if grad_d is None else grad_d.reshape(documents.shape)


# ---- packed: arbitrary (query segment, document segment) pairs --------------------------

def score_pairs_packed_with_argmax_reference(
    queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids,
    *, max_q_len=None, document_scales=None,
):
    acc = _acc_dtype(queries)
    q_pad, q_len = _segments_to_padded(queries.to(acc), query_offsets, max_q_len)
    d_pad, d_len = _segments_to_padded(documents.to(acc), document_offsets)
    qi, di = pair_query_ids.to(torch.int64), pair_document_ids.to(torch.int64)
    sims = torch.einsum("pid,pjd->pij", q_pad[qi], d_pad[di])
    if document_scales is not None:
        s_pad = _segments_to_padded(document_scales.to(acc).unsqueeze(-1), document_offsets)[0][..., 0]
        sims = _scale_sims(sims, s_pad[di])
    return _reduce(sims, q_len[qi], d_len[di])


def score_pairs_packed_reference(
    queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids,
    *, max_q_len=None, document_scales=None,
):
    return score_pairs_packed_with_argmax_reference(
        queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids,
        max_q_len=max_q_len, document_scales=document_scales,
    )[0]


def score_pairs_packed_backward_reference(
    grad_scores, queries, query_offsets, documents, document_offsets,
    pair_query_ids, pair_document_ids, argmax, *, document_scales=None,
):
    acc = _acc_dtype(queries)
    q_start = query_offsets.to(torch.int64)[pair_query_ids.to(torch.int64)]  # [P]
    d_start = document_offsets.to(torch.int64)[pair_document_ids.to(torch.int64)]
    width = argmax.shape[1]
    matched = argmax >= 0  # [P, W]
    q_rows = q_start[:, None] + torch.arange(width, device=queries.device)
    d_rows = d_start[:, None] + argmax.clamp(min=0).to(torch.int64)
    q_rows = torch.where(matched, q_rows, torch.zeros_like(q_rows)).reshape(-1)
    d_rows = torch.where(matched, d_rows, torch.zeros_like(d_rows)).reshape(-1)
    g = grad_scores.to(acc)[:, None].expand(matched.shape).reshape(-1, 1)
    keep = matched.reshape(-1, 1)
    q, d = queries.to(acc), _dequantized(documents, document_scales, acc)
    grad_q, grad_d = torch.zeros_like(q), torch.zeros_like(d)
    if matched.any():
        grad_q.index_add_(0, q_rows, torch.where(keep, g * d[d_rows], 0.0))
        grad_d.index_add_(0, d_rows, torch.where(keep, g * q[q_rows], 0.0))
    if document_scales is not None:
        return grad_q.to(queries.dtype), None
    return grad_q.to(queries.dtype), grad_d.to(documents.dtype)


# ---- residual documents ------------------------------------------------------------------
# Every reference above also takes ColBERTv2 residual documents: `documents` the packed
# bucket ids (uint8), with document_codes= and residual_codec=. They are scored as the kernels
# score them (torch-ext/maxsim/_residual.py): the token centroid + bucket weight rounded once
# to the queries' dtype, its similarity times 1 / ||token|| when the codec normalises.

def _accepting_residuals(fn):
    import functools
    import inspect

    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapped(*args, document_codes=None, residual_codec=None, **kwargs):
        if document_codes is None and residual_codec is None:
            return fn(*args, **kwargs)
        from ._residual import check_codec, residual_tokens

        codec = check_codec(residual_codec)
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("document_scales") is not None:
            raise ValueError("document_scales is only for int8 / float8_e4m3fn documents")
        queries = bound.arguments["queries"]
        dtype = torch.float32 if queries.dtype == torch.float64 else queries.dtype
        tokens, factor = residual_tokens(document_codes, bound.arguments["documents"], codec, dtype)
        bound.arguments["documents"] = tokens
        bound.arguments["document_scales"] = factor  # ones without normalising: frozen storage either way
        return fn(*bound.args, **bound.kwargs)

    return wrapped


for _name in [n for n, f in list(globals().items())
              if n.endswith("_reference") and n.startswith("score_") and callable(f)]:
    globals()[_name] = _accepting_residuals(globals()[_name])
del _name
