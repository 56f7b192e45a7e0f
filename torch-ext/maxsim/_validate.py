"""Argument checks in Python: for the distributed helpers and the fake kernels, and the
few the scoring entry points keep (the ops check the rest in C++, torch-ext/checks.h, with
the same messages).

Shape, dtype and device checks are free (metadata only) and always run. Checks that
must read tensor values run only where reading is free: on CPU tensors, or on any
device when MAXSIM_CHECK_VALUES=1 (that costs a host sync on a GPU). Without them
the kernels still never touch memory out of bounds: they clamp lengths and give a
pair whose offsets or ids are out of range a NaN score.
"""
from __future__ import annotations

import os

import torch

_EMBEDDING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INDEX_DTYPES = (torch.int32, torch.int64)


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def reads_values(t: torch.Tensor) -> bool:
    """Whether value checks may look at tensors on `t`'s device without stalling a stream.

    Asked once per call (every argument shares the device): the environment lookup costs
    about a microsecond, which small GPU calls feel.
    """
    if _compiling():
        return False
    return t.is_cpu or os.environ.get("MAXSIM_CHECK_VALUES") == "1"


def embeddings(name: str, t, ndim: int, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {what}, got shape {tuple(t.shape)}")
    if t.dtype not in _EMBEDDING_DTYPES:
        raise TypeError(
            f"{name} must be float16, bfloat16 or float32 (float64 on CPU/CUDA), got {t.dtype}"
        )
    if t.dtype == torch.float64 and t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{name} is float64, which is supported on CPU and CUDA only, not {t.device}")


# Compressed document storage: values of one of these dtypes plus one float32 scale per token.
COMPRESSED_DTYPES = (torch.int8, torch.float8_e4m3fn)
_OTHER_FLOAT8 = tuple(getattr(torch, n) for n in (
    "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, n))


def residual_documents(t, ndim: int, what: str, storage, queries) -> None:
    """Residual documents against their codes, centroids and bucket weights (checks.h's
    residual_documents, for the fake kernels)."""
    scales, codes, cents, weights, _ = storage
    if scales is not None:
        raise ValueError("document_scales is only for int8 / float8_e4m3fn documents; residual documents "
                         "take document_codes and residual_codec")
    if cents is None or weights is None:
        raise ValueError("residual documents need residual_codec (centroids and bucket_weights)")
    if t.dim() != ndim:
        raise ValueError(f"documents must have {ndim} dimensions {what} (the last: D * nbits / 8 residual "
                         f"bytes), got shape {tuple(t.shape)}")
    if cents.dim() != 2 or cents.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError("residual_codec.centroids must be a 2-D float16, bfloat16 or float32 tensor "
                        f"[n_centroids, D], got {cents.dtype} of shape {tuple(cents.shape)}")
    if weights.dim() != 1 or weights.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"residual_codec.bucket_weights must be a 1-D float tensor, got {weights.dtype} of "
                        f"shape {tuple(weights.shape)}")
    nw = weights.numel()
    if nw not in (2, 4, 16):
        raise ValueError(f"residual_codec.bucket_weights must have 2**nbits entries (nbits 1, 2 or 4), got {nw}")
    nbits = {2: 1, 4: 2, 16: 4}[nw]
    dim = cents.shape[1]
    if dim % (8 * nbits):
        raise ValueError(f"residual_codec: the embedding dim ({dim}) must be a multiple of 8 * nbits = {8 * nbits}")
    if t.shape[-1] != dim * nbits // 8:
        raise ValueError(f"residual documents must have D * nbits / 8 = {dim * nbits // 8} bytes per token "
                         f"(D {dim}, nbits {nbits}), got {t.shape[-1]}")
    if codes.dtype not in _INDEX_DTYPES:
        raise TypeError(f"document_codes must be int32 or int64, got {codes.dtype}")
    if tuple(codes.shape) != tuple(t.shape[:-1]):
        raise ValueError(f"document_codes must have shape {tuple(t.shape[:-1])} (one code per token), got "
                         f"{tuple(codes.shape)}")
    for name, x in (("document_codes", codes), ("residual_codec.centroids", cents),
                    ("residual_codec.bucket_weights", weights)):
        if x.device != t.device:
            raise ValueError(f"{name} is on {x.device} but documents are on {t.device}")
    if queries.dtype == torch.float64:
        raise TypeError("residual documents pair with float16, bfloat16 or float32 queries, got float64 queries")
    if queries.shape[-1] != dim:
        raise ValueError("queries and residual_codec.centroids must have the same embedding dim, got "
                         f"{queries.shape[-1]} and {dim}")


def documents(t, ndim: int, what: str, storage, queries, grad: bool = True) -> bool:
    """Checks the documents and how they are stored; True when they are not float.

    `storage`: the ops' (document_scales, document_codes, centroids, bucket_weights,
    normalize), or just document_scales. Float documents take no scales; int8 and
    float8_e4m3fn documents need float32 scales shaped like the documents without their last
    dimension, on their device; uint8 documents are residuals with codes and a codec.
    """
    if not isinstance(storage, tuple):
        storage = (storage, None, None, None, True)
    scales, codes = storage[0], storage[1]
    if isinstance(t, torch.Tensor) and (codes is not None or t.dtype == torch.uint8):
        if codes is None:
            raise ValueError("uint8 documents are ColBERTv2 residuals: pass document_codes= and residual_codec=")
        if t.dtype != torch.uint8:
            raise TypeError("document_codes is only for residual documents (uint8 packed bucket ids); "
                            f"documents are {t.dtype}")
        residual_documents(t, ndim, what, storage, queries)
        return True
    if storage[2] is not None or storage[3] is not None:
        raise ValueError("residual_codec is only for residual documents (uint8, with document_codes)")
    if isinstance(t, torch.Tensor) and (t.dtype in COMPRESSED_DTYPES or t.dtype in _OTHER_FLOAT8):
        if t.dtype in _OTHER_FLOAT8:
            raise TypeError(f"float8 documents must be torch.float8_e4m3fn, got {t.dtype}")
        if t.dim() != ndim:
            raise ValueError(f"documents must have {ndim} dimensions {what}, got shape {tuple(t.shape)}")
        if scales is None:
            raise ValueError(
                f"documents are {t.dtype}: pass their per-token scales as document_scales= "
                "(maxsim.quantize_documents returns both)")
        if not isinstance(scales, torch.Tensor):
            raise TypeError(f"document_scales must be a torch.Tensor, got {type(scales).__name__}")
        if scales.dtype != torch.float32:
            raise TypeError(f"document_scales must be float32, got {scales.dtype}")
        if tuple(scales.shape) != tuple(t.shape[:-1]):
            raise ValueError(f"document_scales must have shape {tuple(t.shape[:-1])} (documents' "
                             f"shape without its last dim), got {tuple(scales.shape)}")
        if scales.device != t.device:
            raise ValueError(f"document_scales is on {scales.device} but documents are on {t.device}")
        if isinstance(queries, torch.Tensor) and queries.dtype == torch.float64:
            raise TypeError("compressed documents pair with float16, bfloat16 or float32 queries, "
                            "got float64 queries")
        if grad and (scales.requires_grad or (t.requires_grad and torch.is_grad_enabled())):
            raise ValueError("compressed documents (and their document_scales) are frozen storage and "
                             "get no gradient; detach them, or train on float documents")
        return True
    embeddings("documents", t, ndim, what)
    if scales is not None:
        raise ValueError(f"document_scales is only for int8 / float8_e4m3fn documents; documents are {t.dtype}")
    return False


def compressed_grad(documents, scales) -> None:
    """document_scales given: a tensor, and, for compressed documents, no gradient asked of
    them (this needs the caller's grad mode, which the op no longer sees)."""
    if not isinstance(scales, torch.Tensor):
        raise TypeError(f"document_scales must be a torch.Tensor, got {type(scales).__name__}")
    if documents.dtype in COMPRESSED_DTYPES and (
            scales.requires_grad or (documents.requires_grad and torch.is_grad_enabled())):
        raise ValueError("compressed documents (and their document_scales) are frozen storage and "
                         "get no gradient; detach them, or train on float documents")


def same_dtype_and_dim(queries: torch.Tensor, documents: torch.Tensor,
                       compressed: bool = False) -> None:
    if documents.dtype == torch.uint8:
        return  # residuals: checked against the centroids' dim
    if queries.dtype != documents.dtype and not compressed:
        raise TypeError(
            f"queries and documents must share a dtype, got {queries.dtype} and {documents.dtype}"
        )
    if queries.shape[-1] != documents.shape[-1]:
        raise ValueError(
            "queries and documents must have the same embedding dim, got "
            f"{queries.shape[-1]} and {documents.shape[-1]}"
        )


def index(name: str, t, shape: tuple[int, ...] | None, ndim: int = 1) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 or int64, got {type(t).__name__}")
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if shape is None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")


def same_device(names: tuple[str, ...], *tensors) -> None:
    """All of `tensors` (None entries skipped) on one device; `names` label them in order."""
    device = tensors[0].device
    for name, t in zip(names[1:], tensors[1:]):
        if t is not None and t.device != device:
            raise ValueError(
                f"{name} is on {t.device} but {names[0]} is on {device}; "
                "all arguments must be on one device"
            )


def lengths_in_range(name: str, lengths: torch.Tensor, upper: int, upper_name: str,
                     read: bool) -> None:
    if not read or lengths.numel() == 0:
        return
    low, high = int(lengths.min()), int(lengths.max())
    if low < 0:
        raise ValueError(f"{name} must be >= 0, found {low}")
    if high > upper:
        raise ValueError(f"{name} must be <= {upper_name} ({upper}), found {high}")


def offsets(name: str, offsets: torch.Tensor, total: int, total_name: str, read: bool) -> None:
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"{name} must be 1-D with at least one entry (0), got shape {tuple(offsets.shape)}")
    if not read:
        return
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0:
        raise ValueError(f"{name} must start at 0, starts at {first}")
    if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"{name} must be non-decreasing")
    if last != total:
        raise ValueError(f"{name} must end at {total_name} ({total}), ends at {last}")


def ids_in_range(name: str, ids: torch.Tensor, count: int, count_name: str, read: bool) -> None:
    if not read or ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= count:
        bad = low if low < 0 else high
        raise ValueError(f"{name} must be in [0, {count_name}) = [0, {count}), found {bad}")


def max_q_len(value, query_offsets: torch.Tensor, read: bool) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"max_q_len must be an int or None, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"max_q_len must be >= 0, got {value}")
    if read and query_offsets.numel() > 1:
        longest = int((query_offsets[1:] - query_offsets[:-1]).max())
        if value < longest:
            raise ValueError(
                f"max_q_len ({value}) is below the longest query segment ({longest})"
            )


# ---- the ops' metadata checks (checks.h), for the fake kernels: a call that dispatches to
# them (meta tensors, FakeTensor under torch.compile) raises what the compiled op would ----

def padded_call(q, d, ql, dl, scales) -> None:
    embeddings("queries", q, 3, "[B, Lq, D]")
    compressed = documents(d, 4, "[B, C, Ld, D]", scales, q, grad=False)
    same_dtype_and_dim(q, d, compressed)
    if d.shape[0] != q.shape[0]:
        raise ValueError(
            f"documents must have B = {q.shape[0]} rows like queries, got shape {tuple(d.shape)}")
    index("query_lengths", ql, (q.shape[0],))
    index("doc_lengths", dl, (q.shape[0], d.shape[1]))
    same_device(("queries", "documents", "query_lengths", "doc_lengths"), q, d, ql, dl)


def contrastive_call(q, d, segments, ql, scales, packed: bool) -> None:
    name = "document_offsets" if packed else "document_lengths"
    embeddings("queries", q, 3, "[Nq, Lq, D]")
    compressed = (documents(d, 2, "[total_doc_tokens, D]", scales, q, grad=False) if packed
                  else documents(d, 3, "[Nb, Ld, D]", scales, q, grad=False))
    same_dtype_and_dim(q, d, compressed)
    index(name, segments, None if packed else (d.shape[0],))
    if ql is not None:
        index("query_lengths", ql, (q.shape[0],))
    same_device(("queries", "documents", name, "query_lengths"), q, d, segments, ql)
    if packed:
        offsets(name, segments, d.shape[0], "documents.shape[0]", False)


def packed_call(q, q_offsets, d, d_offsets, pq, pd, scales) -> None:
    embeddings("queries", q, 2, "[total_query_tokens, D]")
    compressed = documents(d, 2, "[total_doc_tokens, D]", scales, q, grad=False)
    same_dtype_and_dim(q, d, compressed)
    index("query_offsets", q_offsets, None)
    index("document_offsets", d_offsets, None)
    index("pair_query_ids", pq, None)
    index("pair_document_ids", pd, (pq.shape[0],))
    same_device(("queries", "query_offsets", "documents", "document_offsets", "pair_query_ids",
                 "pair_document_ids"), q, q_offsets, d, d_offsets, pq, pd)
    offsets("query_offsets", q_offsets, q.shape[0], "queries.shape[0]", False)
    offsets("document_offsets", d_offsets, d.shape[0], "documents.shape[0]", False)


def centroid_call(q, codes, offsets_, cents, ql, pq, pd) -> None:
    """The centroid score's checks, as checks.h's `centroids` runs them (for the fake kernel)."""
    if q.dim() != 3 or not q.is_floating_point():
        raise ValueError(f"queries must be a float tensor [Nq, Lq, D], got {q.dtype} of shape {tuple(q.shape)}")
    if cents.dim() != 2 or not cents.is_floating_point() or cents.shape[1] != q.shape[2]:
        raise ValueError(f"centroids must be a float tensor [n_centroids, D = {q.shape[2]}], got "
                         f"{cents.dtype} of shape {tuple(cents.shape)}")
    index("document_codes", codes, None)
    index("document_offsets", offsets_, None)
    if (pq is None) != (pd is None):
        raise ValueError("pair_query_ids and pair_document_ids go together")
    if pq is not None:
        index("pair_query_ids", pq, None)
        index("pair_document_ids", pd, tuple(pq.shape))
    if ql is not None:
        index("query_lengths", ql, (q.shape[0],))
    same_device(("queries", "document_codes", "document_offsets", "centroids", "query_lengths",
                 "pair_query_ids", "pair_document_ids"), q, codes, offsets_, cents, ql, pq, pd)
    offsets("document_offsets", offsets_, codes.shape[0], "document_codes.shape[0]", False)
