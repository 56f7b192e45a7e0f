"""MaxSim across processes on torch.distributed (NCCL on GPUs, gloo on CPUs).

Two pieces:

- `gather_documents` / `score_contrastive_train_global`: in-batch negatives from every
  rank. Each rank holds its own queries and packed documents; the documents of all ranks
  are gathered (differentiably) and each rank scores its local queries against all of
  them. In backward, each document's gradient returns to the rank that owns it, summed
  over the ranks in rank order, so results are the same from run to run.
- `search_sharded`: the same queries on every rank, the corpus split over the ranks; each
  rank keeps a top-k of its shard and the lists are merged into a global top-k with global
  document ids.

Without an initialised process group (or with one rank) everything runs as a single rank.
Every call is collective: all ranks of `group` must make it, in the same order, and every
rank must run backward through a gathered result (as DDP requires of its forward outputs).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from . import _validate as check
from ._api import score_contrastive, score_contrastive_train

__all__ = ["GatheredDocuments", "GlobalScores", "SearchResult", "gather_documents",
           "score_contrastive_train_global", "search_sharded"]

# Codes exchanged between ranks so that mismatched inputs fail on every rank alike.
_EMBEDDING_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _rank_and_world(group) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _all_gather_equal(output: torch.Tensor, tensor: torch.Tensor, group) -> None:
    """Every rank's equally shaped `tensor`, concatenated along dim 0 into `output`."""
    # torch >= 2.13 names it all_gather_single; older releases all_gather_into_tensor.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, tensor, group=group)


def _exchange(values: list[int], device, group, world: int) -> torch.Tensor:
    """[world, len(values)] int64 on `device`: every rank's `values`."""
    mine = torch.tensor(values, dtype=torch.int64)
    if device.type == "cuda":  # a blocking copy from pageable memory would wait for the GPU
        mine = mine.pin_memory()
    mine = mine.to(device, non_blocking=True)
    every = mine.new_empty(world * len(values))
    _all_gather_equal(every, mine, group)
    return every.view(world, len(values))


def _gather_ragged_rows(rows: torch.Tensor, counts: list[int], group, world: int) -> torch.Tensor:
    """Rank r's rows[:counts[r]], concatenated in rank order. Collectives need one shape on
    every rank, so each rank sends its rows padded to the largest count."""
    width = max(counts)
    if width == 0:
        return rows.new_empty((0, *rows.shape[1:]))
    if rows.shape[0] < width:
        padded = rows.new_zeros((width, *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        rows = padded
    out = rows.new_empty((world * width, *rows.shape[1:]))
    _all_gather_equal(out, rows.contiguous(), group)
    if all(c == width for c in counts):
        return out
    return torch.cat([out[r * width: r * width + c] for r, c in enumerate(counts)])


class _GatherDocumentRows(torch.autograd.Function):
    """Forward: every rank's document rows in rank order. Backward: rank r receives from
    every rank s the rows of s's gradient that belong to r (one all_to_all) and adds them in
    order s = 0, 1, ... in float32 (float64 for float64), rounding once at the end."""

    @staticmethod
    def forward(ctx, rows, counts, rank, world, group):
        ctx.counts, ctx.rank, ctx.world, ctx.group = counts, rank, world, group
        return _gather_ragged_rows(rows, counts, group, world)

    @staticmethod
    def backward(ctx, grad):
        counts, world = ctx.counts, ctx.world
        mine = counts[ctx.rank]
        if max(counts) == 0:
            return grad.new_zeros((0, *grad.shape[1:])), None, None, None, None
        received = grad.new_empty((world * mine, *grad.shape[1:]))
        dist.all_to_all_single(received, grad.contiguous(), output_split_sizes=[mine] * world,
                               input_split_sizes=counts, group=ctx.group)
        parts = received.view(world, mine, *grad.shape[1:])
        accumulate = torch.float64 if grad.dtype == torch.float64 else torch.float32
        total = parts[0].to(accumulate, copy=True)
        for part in parts[1:]:
            total += part
        return total.to(grad.dtype), None, None, None, None


class GatheredDocuments(NamedTuple):
    """Every rank's documents, packed in rank order."""

    documents: torch.Tensor         # [total tokens of all ranks, D], differentiable
    document_offsets: torch.Tensor  # [documents of all ranks + 1], dtype of the local offsets
    document_start: int             # global index of this rank's first document
    document_counts: tuple          # documents per rank


def _check_documents(documents, document_offsets) -> None:
    check.embeddings("documents", documents, 2, "[total_doc_tokens, D]")
    check.index("document_offsets", document_offsets, None)
    check.same_device(("documents", "document_offsets"), documents, document_offsets)
    check.offsets("document_offsets", document_offsets, documents.shape[0], "documents.shape[0]",
                  check.reads_values(documents))


def _check_same_everywhere(sizes: list[list[int]], column: int, what: str) -> None:
    values = [row[column] for row in sizes]
    if len(set(values)) > 1:
        raise ValueError(f"{what} differs between ranks: {values} (rank 0, 1, ...)")


def _gather(documents, document_offsets, group, extra: int):
    """gather_documents, plus every rank's `extra` int (exchanged in the same collective)."""
    rank, world = _rank_and_world(group)
    n_docs = document_offsets.shape[0] - 1
    if world == 1:
        return GatheredDocuments(documents, document_offsets, 0, (n_docs,)), [extra]
    # The one host sync: the gathers below are sized on the host from every rank's counts.
    sizes = _exchange([documents.shape[0], n_docs, documents.shape[1],
                       _EMBEDDING_DTYPES.index(documents.dtype), extra],
                      documents.device, group, world).tolist()
    _check_same_everywhere(sizes, 2, "the embedding dim of documents")
    if len({row[3] for row in sizes}) > 1:
        raise TypeError("documents dtype differs between ranks: "
                        f"{[str(_EMBEDDING_DTYPES[row[3]]) for row in sizes]}")
    tokens, counts = [row[0] for row in sizes], [row[1] for row in sizes]
    if document_offsets.dtype == torch.int32 and sum(tokens) > torch.iinfo(torch.int32).max:
        raise ValueError(f"document_offsets is int32 but all ranks together hold {sum(tokens)} "
                         "document tokens; pass int64 offsets")
    rows = _GatherDocumentRows.apply(documents, tokens, rank, world, group)
    lengths = (document_offsets[1:] - document_offsets[:-1]).to(torch.int64)
    all_lengths = _gather_ragged_rows(lengths, counts, group, world)
    offsets = torch.cat([all_lengths.new_zeros(1), all_lengths.cumsum(0)]).to(document_offsets.dtype)
    gathered = GatheredDocuments(rows, offsets, sum(counts[:rank]), tuple(counts))
    return gathered, [row[4] for row in sizes]


def gather_documents(documents: torch.Tensor, document_offsets: torch.Tensor, *,
                     group=None) -> GatheredDocuments:
    """Every rank's packed documents [tokens, D] and offsets [Nb + 1], concatenated in rank
    order; differentiable with respect to `documents`.

    Ranks may hold different numbers of tokens and documents (none at all, too); they
    must agree on D and dtype. Offsets may be int32 or int64 (the result keeps the local
    dtype). Costs one host sync to exchange sizes, since collective buffers are sized on
    the host; the data itself moves in one all_gather (forward) and one all_to_all
    (backward), padded to the largest rank. In backward, rank r gets the sum over all ranks
    of the gradient of its rows, added in rank order: deterministic.
    """
    _check_documents(documents, document_offsets)
    return _gather(documents, document_offsets, group, 0)[0]


class GlobalScores(NamedTuple):
    """Local queries scored against every rank's documents."""

    scores: torch.Tensor  # [local queries, documents of all ranks], differentiable
    document_start: int   # global index of this rank's first document
    query_start: int      # global index of this rank's first query
    total_queries: int    # queries of all ranks


def score_contrastive_train_global(queries: torch.Tensor, documents: torch.Tensor,
                                   document_offsets: torch.Tensor, *, query_lengths=None,
                                   group=None) -> GlobalScores:
    """`score_contrastive_train` of this rank's queries against every rank's documents.

    queries [Nq, Lq, D] and documents [tokens, D] / document_offsets [Nb + 1] are this
    rank's own. The scores row of local query i equals row `query_start + i` of the scores
    of the concatenated batch on one process, and so do both gradients once every rank has
    run backward. With query i's positive being local document i:

        out = score_contrastive_train_global(q, d, offsets)
        targets = torch.arange(len(q), device=q.device) + out.document_start
        loss = F.cross_entropy(out.scores, targets, reduction="sum") / out.total_queries

    makes the losses of all ranks add up to the single-process mean loss.
    """
    check.embeddings("queries", queries, 3, "[Nq, Lq, D]")
    _check_documents(documents, document_offsets)
    check.same_dtype_and_dim(queries, documents)
    if query_lengths is not None:  # checked here too: an error after the gather would hang the others
        check.index("query_lengths", query_lengths, (queries.shape[0],))
        check.same_device(("queries", "query_lengths"), queries, query_lengths)
        check.lengths_in_range("query_lengths", query_lengths, queries.shape[1], "Lq",
                               check.reads_values(queries))
    gathered, query_counts = _gather(documents, document_offsets, group, queries.shape[0])
    rank, _ = _rank_and_world(group)
    scores = score_contrastive_train(queries, gathered.documents, gathered.document_offsets,
                                     query_lengths=query_lengths)
    return GlobalScores(scores, gathered.document_start, sum(query_counts[:rank]),
                        sum(query_counts))


# ---- sharded search -------------------------------------------------------------------------
#
# A (score, global id) pair is packed into one int64 whose order is "higher score first, then
# lower id": the float32 score's bits made order-preserving in the high 32 bits, 2^32-1-id in
# the low 32. One int64 topk then ranks and breaks ties at once, and one int64 collective
# moves both. NaN ranks above +inf (torch.sort and torch.topk rank it highest too), so a
# broken document surfaces instead of hiding; all NaNs tie and go by id. -0.0 equals +0.0.
# Global ids must stay below 2^32 (4 billion documents).

_LOW_BITS = (1 << 32) - 1
_PAD_KEY = torch.iinfo(torch.int64).min  # below every real key: a slot with no document


def _search_keys(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    bits = (scores + 0.0).view(torch.int32).to(torch.int64)  # + 0.0 turns -0.0 into +0.0
    bits = torch.where(torch.isnan(scores), 0x7FC00000, bits)  # one NaN: the positive quiet one
    ordered = torch.where(bits >= 0, bits, -(bits & 0x7FFFFFFF))
    return ordered * (1 << 32) + (_LOW_BITS - ids)


def _decode_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pad = keys == _PAD_KEY
    ordered = keys >> 32
    bits = torch.where(ordered >= 0, ordered, (-ordered) | 0x80000000)
    bits = torch.where(bits > 0x7FFFFFFF, bits - (1 << 32), bits).to(torch.int32)
    scores = bits.view(torch.float32).masked_fill(pad, float("-inf"))
    ids = (_LOW_BITS - (keys & _LOW_BITS)).masked_fill(pad, -1)
    return scores, ids


def _top_keys(keys: torch.Tensor, k: int) -> torch.Tensor:
    """[N, >= 0] keys -> [N, k], best first, padded with _PAD_KEY."""
    take = min(k, keys.shape[1])
    best = keys.topk(take, dim=1).values if take > 0 else keys[:, :0]
    if take == k:
        return best
    return torch.cat([best, best.new_full((keys.shape[0], k - take), _PAD_KEY)], dim=1)


class SearchResult(NamedTuple):
    scores: torch.Tensor        # [Nq, k] float32, best first
    document_ids: torch.Tensor  # [Nq, k] int64 global document ids


def search_sharded(queries: torch.Tensor, documents: torch.Tensor, document_offsets: torch.Tensor,
                   k: int, *, query_lengths=None, dst: int | None = None,
                   group=None) -> SearchResult | None:
    """Top-k documents per query over a corpus split across ranks.

    Every rank passes the same queries [Nq, Lq, D] (and query_lengths) and its own shard
    documents [tokens, D] / document_offsets [Nb + 1] (Nb may be 0, or less than k).
    Global document ids number the shards' documents in rank order. Returns the k best
    (score, global id) per query, higher score first and on equal scores lower id first,
    which is the top-k of the single-process scores of the concatenated corpus; NaN scores
    rank above all others. Where the whole corpus holds fewer than k documents, the
    remaining slots have id -1 and score -inf. With `dst` (a rank of `group`) only that
    rank gets the result and the others get None; by default every rank gets it.

    float16 / bfloat16 / float32 embeddings (the scores are float32). No host sync: shard
    offsets are exchanged on the device. Ranks must agree on Nq, D, dtype and k; that is
    checked (on every rank alike) where value checks run: on CPU tensors, or with
    MAXSIM_CHECK_VALUES=1.
    """
    check.embeddings("queries", queries, 3, "[Nq, Lq, D]")
    _check_documents(documents, document_offsets)
    check.same_dtype_and_dim(queries, documents)
    if queries.dtype == torch.float64:
        raise TypeError("search_sharded takes float16, bfloat16 or float32 embeddings, "
                        "got float64")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    rank, world = _rank_and_world(group)
    if dst is not None and not (isinstance(dst, int) and 0 <= dst < world):
        raise ValueError(f"dst must be None or a rank in [0, {world}), got {dst!r}")
    device, n_queries, n_docs = queries.device, queries.shape[0], document_offsets.shape[0] - 1

    scores = score_contrastive(queries, documents, document_offsets, query_lengths=query_lengths)
    document_start = 0
    if world > 1:
        sizes = _exchange([n_docs, n_queries, queries.shape[2],
                           _EMBEDDING_DTYPES.index(queries.dtype), k], device, group, world)
        if check.reads_values(queries):
            rows = sizes.tolist()
            for column, what in ((1, "the number of queries"), (2, "the embedding dim"),
                                 (3, "the embedding dtype (index into float32, float16, "
                                     "bfloat16)"), (4, "k")):
                _check_same_everywhere(rows, column, what)
        document_start = sizes[:rank, 0].sum()
    ids = torch.arange(n_docs, device=device) + document_start
    local = _top_keys(_search_keys(scores, ids), k)
    if world == 1 or local.numel() == 0:  # (every rank has the same Nq and k)
        return SearchResult(*_decode_keys(local)) if dst is None or rank == dst else None

    if dst is None:
        every = local.new_empty(world * n_queries, k)
        _all_gather_equal(every, local, group)
    else:
        target = dst if group is None else dist.get_global_rank(group, dst)
        parts = [torch.empty_like(local) for _ in range(world)] if rank == dst else None
        dist.gather(local, parts, dst=target, group=group)
        if rank != dst:
            return None
        every = torch.cat(parts)
    # [world * Nq, k] -> [Nq, world * k]: each query's candidates from every rank side by side
    candidates = every.view(world, n_queries, k).transpose(0, 1).reshape(n_queries, world * k)
    return SearchResult(*_decode_keys(_top_keys(candidates, k)))
