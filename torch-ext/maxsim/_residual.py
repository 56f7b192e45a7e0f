"""ColBERTv2 / PLAID residual documents: a centroid id and nbits per dimension for each token.

A token is stored as `code` (an index into `centroids [n_centroids, D]`) and
`D * nbits / 8` bytes of packed bucket ids; it stands for

    t = centroids[code] + bucket_weights[bucket]      (per dimension)
    token = t / max(||t||, 1e-12)                      (normalize=True, as ColBERTv2 does)

The bit order is colbert-ai's ResidualCodec's: dimension d's bucket id is split into its
nbits bits lowest first, the bits of consecutive dimensions follow each other, and every 8 of
them fill a byte from its most significant bit down (numpy.packbits order).

How maxsim scores them, on every backend: `t` is summed in float32 and rounded once to the
type the products use (the queries' dtype: float16 / bfloat16 tensor-core operands, float32
for float32 queries), the similarity q . t accumulates in float32, and normalisation is one
float32 factor per token, 1 / max(||t||, 1e-12), multiplied into the similarity before the max
(the per-token scale of int8 documents). Decompressed tokens never reach global memory.
`residual_tokens` returns exactly those (t, factor) pairs, which is what the references and
the tests score.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INDEX = (torch.int32, torch.int64)
NORM_EPS = 1e-12  # torch.nn.functional.normalize's default, which colbert-ai uses


@dataclass(frozen=True)
class ResidualCodec:
    """What decodes residual documents: centroids [n_centroids, D] (float16, bfloat16 or
    float32), bucket_weights [2**nbits] (float), nbits 1, 2 or 4, and whether tokens are
    L2-normalised after decompression (ColBERTv2 does; `normalize=False` scores the raw
    centroid + residual)."""

    centroids: torch.Tensor
    bucket_weights: torch.Tensor
    nbits: int
    normalize: bool = True

    def __post_init__(self):
        c, w = self.centroids, self.bucket_weights
        if not isinstance(c, torch.Tensor) or c.dim() != 2 or c.dtype not in _FLOATS:
            raise TypeError("residual_codec.centroids must be a 2-D float16, bfloat16 or float32 "
                            f"tensor [n_centroids, D], got {_describe(c)}")
        if isinstance(self.nbits, bool) or self.nbits not in (1, 2, 4):
            raise ValueError(f"residual_codec.nbits must be 1, 2 or 4, got {self.nbits!r}")
        if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() != 1:
            raise TypeError(f"residual_codec.bucket_weights must be a 1-D float tensor, got {_describe(w)}")
        if w.numel() != 1 << self.nbits:
            raise ValueError(f"residual_codec.bucket_weights must have 2**nbits = {1 << self.nbits} "
                             f"entries, got {w.numel()}")
        if w.device != c.device:
            raise ValueError(f"residual_codec.bucket_weights is on {w.device} but centroids are on {c.device}")
        if c.shape[1] % (8 * self.nbits) != 0:
            raise ValueError(f"residual_codec: the embedding dim ({c.shape[1]}) must be a multiple of "
                             f"8 * nbits = {8 * self.nbits}")
        if not isinstance(self.normalize, bool):
            raise TypeError(f"residual_codec.normalize must be a bool, got {type(self.normalize).__name__}")

    @property
    def dim(self) -> int:
        return self.centroids.shape[1]

    @property
    def residual_bytes(self) -> int:
        """Bytes of packed bucket ids per token."""
        return self.dim * self.nbits // 8

    def to(self, device) -> "ResidualCodec":
        return ResidualCodec(self.centroids.to(device), self.bucket_weights.to(device), self.nbits,
                             self.normalize)


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} of shape {tuple(t.shape)}"
    return type(t).__name__


def check_codec(codec) -> ResidualCodec:
    if not isinstance(codec, ResidualCodec):
        raise TypeError(f"residual_codec must be a maxsim.ResidualCodec, got {type(codec).__name__}")
    return codec


def check_residual_documents(residuals, codes, codec: ResidualCodec, what: str) -> None:
    """Shapes and dtypes of residual documents against their codec (metadata only)."""
    if not isinstance(residuals, torch.Tensor) or residuals.dtype != torch.uint8:
        raise TypeError(f"residual documents must be a uint8 tensor {what} of packed bucket ids, "
                        f"got {_describe(residuals)}")
    if residuals.shape[-1] != codec.residual_bytes:
        raise ValueError(f"residual documents must have D * nbits / 8 = {codec.residual_bytes} bytes "
                         f"per token (D {codec.dim}, nbits {codec.nbits}), got {residuals.shape[-1]}")
    if not isinstance(codes, torch.Tensor) or codes.dtype not in _INDEX:
        raise TypeError(f"document_codes must be an int32 or int64 tensor, got {_describe(codes)}")
    if tuple(codes.shape) != tuple(residuals.shape[:-1]):
        raise ValueError(f"document_codes must have shape {tuple(residuals.shape[:-1])} (one code per "
                         f"token), got {tuple(codes.shape)}")
    for name, t in (("document_codes", codes), ("residual_codec.centroids", codec.centroids)):
        if t.device != residuals.device:
            raise ValueError(f"{name} is on {t.device} but documents are on {residuals.device}")


def unpack_buckets(residuals: torch.Tensor, nbits: int) -> torch.Tensor:
    """Packed residual bytes [..., D * nbits / 8] -> bucket ids [..., D] (int64)."""
    shifts = torch.arange(7, -1, -1, device=residuals.device, dtype=torch.uint8)
    bits = (residuals.unsqueeze(-1) >> shifts) & 1  # the byte's bits, most significant first
    bits = bits.reshape(*residuals.shape[:-1], residuals.shape[-1] * 8 // nbits, nbits).to(torch.int64)
    weights = torch.tensor([1 << j for j in range(nbits)], device=residuals.device)
    return (bits * weights).sum(-1)


def pack_buckets(buckets: torch.Tensor, nbits: int) -> torch.Tensor:
    """Bucket ids [..., D] (each < 2**nbits) -> packed bytes [..., D * nbits / 8] uint8."""
    b = buckets.to(torch.int64)
    bits = (b.unsqueeze(-1) >> torch.arange(nbits, device=b.device)) & 1  # lowest bit first
    bits = bits.reshape(*b.shape[:-1], b.shape[-1] * nbits // 8, 8)
    weights = torch.tensor([1 << (7 - i) for i in range(8)], device=b.device)
    return (bits * weights).sum(-1).to(torch.uint8)


def residual_tokens(codes: torch.Tensor, residuals: torch.Tensor, codec: ResidualCodec,
                    dtype: torch.dtype):
    """The tokens as the kernels score them: (t [..., D] in `dtype`, factor [...] float32).

    t = centroid + bucket weight, summed in float32 and rounded once to `dtype`; factor =
    1 / max(||t||, 1e-12) (||t|| of the rounded t, in float64 here) when the codec normalises,
    else 1. A code outside [0, n_centroids) gives a NaN token.
    """
    n = codec.centroids.shape[0]
    codes = codes.to(torch.int64)
    bad = (codes < 0) | (codes >= n)
    c = codec.centroids.float()[codes.clamp(0, max(n - 1, 0))] if n > 0 else \
        codec.centroids.new_zeros(*codes.shape, codec.dim, dtype=torch.float32)
    w = codec.bucket_weights.float()[unpack_buckets(residuals, codec.nbits)]
    t = (c + w).to(dtype)
    t = torch.where(bad.unsqueeze(-1), torch.full_like(t, float("nan")), t)
    if codec.normalize:
        norm = t.double().norm(dim=-1)
        factor = (1.0 / norm.clamp(min=NORM_EPS)).float()
    else:
        factor = torch.ones(codes.shape, dtype=torch.float32, device=codes.device)
    factor = torch.where(bad, torch.full_like(factor, float("nan")), factor)
    return t, factor


def decompress_residuals(codes: torch.Tensor, residuals: torch.Tensor, codec: ResidualCodec,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Residual documents -> dense tokens [..., D] in `dtype`: centroid + bucket weights, then
    L2-normalised when the codec normalises (computed in float32, as colbert-ai's CPU path).
    For checking and for paths maxsim does not cover; the scoring entry points take the
    codes and residuals themselves."""
    codec = check_codec(codec)
    check_residual_documents(residuals, codes, codec, "[..., D * nbits / 8]")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= codec.centroids.shape[0]):
        raise ValueError(f"document_codes must be in [0, n_centroids) = [0, {codec.centroids.shape[0]})")
    c = codec.centroids.float()[codes.to(torch.int64)]
    t = c + codec.bucket_weights.float()[unpack_buckets(residuals, codec.nbits)]
    if codec.normalize:
        t = torch.nn.functional.normalize(t, p=2, dim=-1, eps=NORM_EPS)
    return t.to(dtype)


@torch.no_grad()
def compress_residuals(embeddings: torch.Tensor, codec: ResidualCodec, bucket_cutoffs: torch.Tensor):
    """Dense tokens [..., D] -> (codes [...] int32, residuals [..., D * nbits / 8] uint8), as
    ColBERTv2 compresses: the centroid of largest dot product, then each dimension of the
    residual bucketed by `bucket_cutoffs` [2**nbits - 1] (torch.bucketize, right=False)."""
    codec = check_codec(codec)
    if not isinstance(embeddings, torch.Tensor) or not embeddings.is_floating_point():
        raise TypeError(f"embeddings must be a float tensor [..., D], got {_describe(embeddings)}")
    if embeddings.shape[-1] != codec.dim:
        raise ValueError(f"embeddings must have dim {codec.dim} like the centroids, got {embeddings.shape[-1]}")
    if not isinstance(bucket_cutoffs, torch.Tensor) or bucket_cutoffs.numel() != (1 << codec.nbits) - 1:
        raise ValueError(f"bucket_cutoffs must be a tensor of 2**nbits - 1 = {(1 << codec.nbits) - 1} entries")
    x = embeddings.float().reshape(-1, codec.dim)
    cents = codec.centroids.float()
    # nearest centroids a block of rows at a time: [rows, n_centroids] scores stay small
    step = max(1, (1 << 24) // max(cents.shape[0], 1))
    codes = torch.cat([(x[i:i + step] @ cents.T).argmax(dim=-1) for i in range(0, x.shape[0], step)]) \
        if x.shape[0] else torch.zeros(0, dtype=torch.int64, device=x.device)
    buckets = torch.bucketize(x - cents[codes], bucket_cutoffs.float().to(x.device))
    residuals = pack_buckets(buckets, codec.nbits)
    shape = embeddings.shape[:-1]
    return codes.to(torch.int32).reshape(shape), residuals.reshape(*shape, codec.residual_bytes)


def score_centroids_reference(queries, document_codes, document_offsets, centroids, *, query_lengths=None,
                              pair_query_ids=None, pair_document_ids=None):
    """maxsim.score_centroids in plain PyTorch (float64 for float64 inputs, else float32): a
    per-pair loop over the decoded centroid tokens, for tests and reading."""
    acc = torch.float64 if queries.dtype == torch.float64 else torch.float32
    nq, lq = queries.shape[0], queries.shape[1]
    offsets = document_offsets.tolist()
    nb = len(offsets) - 1
    if pair_query_ids is None:
        pairs = [(q, n) for q in range(nq) for n in range(nb)]
    else:
        pairs = list(zip(pair_query_ids.tolist(), pair_document_ids.tolist()))
    out = []
    for q, n in pairs:
        qlen = lq if query_lengths is None else max(0, min(int(query_lengths[q]), lq))
        codes = document_codes[offsets[n]:offsets[n + 1]].long()
        if qlen == 0:
            out.append(0.0)
        elif codes.numel() == 0:
            out.append(float("-inf"))
        else:
            sims = queries[q, :qlen].to(acc) @ centroids[codes].to(acc).T
            out.append(float(sims.max(dim=1).values.sum()))
    scores = torch.tensor(out, dtype=acc, device=queries.device)
    return scores if pair_query_ids is not None else scores.reshape(nq, nb)
