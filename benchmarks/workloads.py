"""Workload definitions, input builders and naive baselines shared by the benchmarks.

Imported by `benchmarks/benchmark.py` (the `kernels benchmark` CLI) and by
`benchmarks/compare.py` (the side-by-side comparison), so both time the same inputs.

Conventions (see the workload table in the project's benchmark notes):
- dim D = 128; embeddings are L2-normalised random vectors (drawn in float32, then cast).
- "ragged": query lengths uniform in [Lq/2, Lq], document lengths uniform in [Ld/4, Ld].
  "full": every sequence has its padded length.
- padded rerank: queries [B, Lq, D], documents [B, C, Ld, D] (padding rows hold random
  vectors: they must be ignored). The *Packed workloads hand the same ragged data over
  packed: B query segments, B*C document segments, B*C (query, document) pairs.
- contrastive: queries [Nq, Lq, D] against Nb documents packed [T, D] with offsets.
  A training step is forward + backward of (scores * g).sum() for a fixed random g.

CPU shapes. A 2-core CPU cannot run the GPU shapes in one benchmark run (BigColBERT is
~0.4 TFLOP per forward), so every workload also carries a `cpu` shape that divides the
batch dimensions (B; Nq and Nb; the corpus size) and keeps the per-pair shape
(Lq, Ld, D) that gives the workload its character. `Workload.cpu_scale` is the fraction
of (query, document) pairs kept; it is printed by compare.py and listed here:

    SmallRerank     B 32 -> 32            1        Contrastive   32x32  -> 16x16   1/4
    Rerank          B 32 -> 8             1/4      LongDocs      32x32  -> 8x8     1/16
    HeavyRerank     B 32 -> 4             1/8      BigBatch      64x64  -> 16x16   1/16
    LongDocStress   B  8 -> 2             1/4      ColPali       32x32  -> 8x8     1/16
    ColPaliRerank   B 16 -> 2             1/8      BigColBERT    512x512 -> 32x32  1/256
    SingleQueryRerank C 1000 -> 200      1/5      DocDoc        64x64  -> 4x4     1/256
    (*Packed: same as the padded one)              ColBERTCorpus 32x10000 -> 8x500   1/80
                                                   ColPaliCorpus 8x4096   -> 2x256   1/64

Compressed documents (int8 / float8 e4m3fn, one float32 scale per token): `compress`
turns an `Inputs` into one whose documents are the quantised copy of the very same
float documents (maxsim.quantize_documents, run once, before any timing). COMPRESSED names
the workloads compare.py runs that way by default: the memory-bound rerank shapes, the
one-query rerank, and the corpus shapes.

Residual documents (ColBERTv2 / PLAID: a centroid id and nbits bits per dimension a token;
formats residual1 / residual2 / residual4): `compress` builds a codec from the documents
(RESIDUAL_CENTROIDS centroids drawn from the document tokens, bucket cutoffs and weights at
the quantiles of a sample's residuals, as ColBERTv2 trains them) and compresses the very same
float documents with maxsim.compress_residuals, once, before any timing. The `centroids`
format scores those residual2 codes by their centroids alone (PLAID's first stage).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

DIM = 128


@dataclass(frozen=True)
class Workload:
    name: str
    surface: str           # "padded" | "packed" | "contrastive"
    train: bool            # contrastive only: forward + backward
    shape: dict            # padded/packed: B, C, Lq, Ld; contrastive: Nq, Nb, Lq, Ld
    cpu_shape: dict        # same keys, scaled down for CPU runs
    layout: str = "ragged"  # default layout for this workload ("full" | "ragged")
    gpu_dtype: torch.dtype = torch.float16
    note: str = ""
    dim: int = DIM

    def pairs(self, shape: dict) -> int:
        return shape["B"] * shape["C"] if "B" in shape else shape["Nq"] * shape["Nb"]

    @property
    def cpu_scale(self) -> float:
        return self.pairs(self.cpu_shape) / self.pairs(self.shape)

    def shape_for(self, device) -> dict:
        return self.cpu_shape if torch.device(device).type == "cpu" else self.shape

    def describe(self, shape: dict) -> str:
        return ", ".join(f"{k}={v}" for k, v in shape.items())


def _padded(name, B, C, Lq, Ld, cpu_B, layout="ragged"):
    return Workload(name, "padded", False, dict(B=B, C=C, Lq=Lq, Ld=Ld),
                    dict(B=cpu_B, C=C, Lq=Lq, Ld=Ld), layout)


def _packed(w: Workload) -> Workload:
    return Workload(w.name + "Packed", "packed", False, w.shape, w.cpu_shape, "ragged")


def _train(name, N, Lq, Ld, cpu_N, dtype=torch.float16):
    return Workload(name, "contrastive", True, dict(Nq=N, Nb=N, Lq=Lq, Ld=Ld),
                    dict(Nq=cpu_N, Nb=cpu_N, Lq=Lq, Ld=Ld), "full", dtype)


_PADDED = [
    _padded("SmallRerank", 32, 10, 32, 180, cpu_B=32),
    _padded("Rerank", 32, 50, 32, 180, cpu_B=8),
    _padded("HeavyRerank", 32, 100, 32, 256, cpu_B=4),
    _padded("LongDocStress", 8, 16, 64, 1024, cpu_B=2),
    _padded("ColPaliRerank", 16, 64, 32, 1030, cpu_B=2),
    # One query against a first stage's 1,000 candidates: the whole call is one stream of
    # documents, so it is the shape where halving the document bytes shows most directly.
    Workload("SingleQueryRerank", "padded", False, dict(B=1, C=1000, Lq=32, Ld=300),
             dict(B=1, C=200, Lq=32, Ld=300)),
]

WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    *_PADDED,
    *(_packed(w) for w in _PADDED),
    _train("Contrastive", 32, 32, 80, cpu_N=16),
    _train("LongDocs", 32, 32, 512, cpu_N=8),
    _train("BigBatch", 64, 32, 128, cpu_N=16),
    _train("ColPali", 32, 32, 1030, cpu_N=8),
    _train("BigColBERT", 512, 32, 180, cpu_N=32, dtype=torch.bfloat16),
    _train("DocDoc", 64, 1024, 1024, cpu_N=4, dtype=torch.bfloat16),
    Workload("ColBERTCorpus", "contrastive", False, dict(Nq=32, Nb=10_000, Lq=32, Ld=256),
             dict(Nq=8, Nb=500, Lq=32, Ld=256)),
    Workload("ColPaliCorpus", "contrastive", False, dict(Nq=8, Nb=4096, Lq=32, Ld=1030),
             dict(Nq=2, Nb=256, Lq=32, Ld=1030)),
    # wide embeddings (issue 9's dim targets): Rerank's shape, and an in-batch scoring shape
    *(Workload(f"RerankD{d}", "padded", False, dict(B=32, C=50, Lq=32, Ld=180), dict(B=2, C=50, Lq=32, Ld=180),
               "full", dim=d) for d in (256, 512, 768, 1024)),
    *(Workload(f"ContrastiveD{d}", "contrastive", False, dict(Nq=64, Nb=512, Lq=32, Ld=128),
               dict(Nq=4, Nb=32, Lq=32, Ld=128), "full", torch.bfloat16, dim=d) for d in (256, 512, 768, 1024)),
)}


# Workloads compare.py also runs with compressed documents when no workload list is given.
COMPRESSED = ("HeavyRerank", "ColPaliRerank", "LongDocStress", "SingleQueryRerank",
              "HeavyRerankPacked", "ColPaliRerankPacked", "LongDocStressPacked",
              "SingleQueryRerankPacked", "ColBERTCorpus", "ColPaliCorpus")

# Compressed document formats: name -> element dtype. Each token also carries one float32 scale.
DOCUMENT_FORMATS = {"int8": torch.int8, "float8_e4m3fn": torch.float8_e4m3fn}
SCALE_BYTES = 4
# Residual formats: name -> nbits. "centroids": the residual2 codes scored by centroid alone.
RESIDUAL_FORMATS = {"residual1": 1, "residual2": 2, "residual4": 4}
CENTROID_FORMAT = "centroids"
CENTROID_NBITS = 2  # the index whose codes the centroids rows score
ALL_FORMATS = (*DOCUMENT_FORMATS, *RESIDUAL_FORMATS, CENTROID_FORMAT)
# Centroids of a residual index built here (a GPU index of ~10^5-10^6 tokens has 2^12-2^14;
# fewer on the CPU, where compressing is a matmul against every centroid).
RESIDUAL_CENTROIDS = {"cuda": 4096, "cpu": 1024}
CODE_BYTES = 4  # int32 codes, as colbert-ai's index files store them
# Workloads of the residual rows: the one-query PLAID rerank and the rerank shapes.
RESIDUAL = ("SingleQueryRerank", "HeavyRerank", "ColPaliRerank",
            "SingleQueryRerankPacked", "HeavyRerankPacked", "ColPaliRerankPacked")


def default_dtype(w: Workload, device) -> torch.dtype:
    """fp16 (bf16 where the table says so) on a GPU, float32 on the CPU."""
    return torch.float32 if torch.device(device).type == "cpu" else w.gpu_dtype


# ---- inputs -----------------------------------------------------------------------------

def _unit(gen, shape, dtype, device):
    x = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
    x = torch.nn.functional.normalize(x, dim=-1)
    return x.to(dtype)


def _lengths(gen, n, full_len, low, layout, device):
    if layout == "full":
        return torch.full(n, full_len, dtype=torch.int32, device=device)
    return torch.randint(low, full_len + 1, n, generator=gen, device=device, dtype=torch.int32)


def offsets(lengths):
    off = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    off[1:] = torch.cumsum(lengths.reshape(-1), 0)
    return off


def valid_mask(lengths, width):
    """lengths [...] -> bool [..., width] (True where the position is a real token)."""
    return torch.arange(width, device=lengths.device) < lengths.unsqueeze(-1)


def unpack(tokens, offsets, width):
    """Packed rows [T, D] + offsets [N + 1] -> zero-padded [N, width, D] (no host sync)."""
    off = offsets.to(torch.int64)
    valid = valid_mask(off[1:] - off[:-1], width)
    padded = tokens.new_zeros(valid.shape[0], width, tokens.shape[-1])
    return padded.masked_scatter_(valid.unsqueeze(-1), tokens)


@dataclass
class Inputs:
    """Everything the implementations need, built once per (workload, dtype, layout)."""
    workload: Workload
    shape: dict
    dtype: torch.dtype
    layout: str
    t: dict = field(default_factory=dict)   # the tensors; see build_inputs
    # None for float documents; else a DOCUMENT_FORMATS key, and t holds document_values and
    # document_scales next to the float documents they were quantised from (the peers
    # quantise those with their own quantisers).
    documents_format: str | None = None

    def __getattr__(self, name):
        try:
            return self.__dict__["t"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def device(self) -> torch.device:
        return self.t["queries" if "queries" in self.t else "queries_packed"].device

    def bytes_in(self) -> int:
        """Bytes of the embeddings handed to maxsim for this surface.

        Compressed documents: the stored bytes (values + scales) plus the queries and the
        float32 scores written back, i.e. everything the call must move."""
        q_key = "queries_packed" if self.workload.surface == "packed" else "queries"
        if self.documents_format in RESIDUAL_FORMATS or self.documents_format == CENTROID_FORMAT:
            # codes (+ packed residuals) + queries + scores, and the centroids once (the
            # repeats come from L2)
            keys = (q_key, "document_codes") + (() if self.documents_format == CENTROID_FORMAT
                                                 else ("document_residuals",))
            return sum(_nbytes(self.t[k]) for k in keys) + _nbytes(self.codec.centroids) \
                + 4 * self.num_scores()
        if self.documents_format is not None:
            keys = (q_key, "document_values", "document_scales")
            return sum(_nbytes(self.t[k]) for k in keys) + 4 * self.num_scores()
        keys = (q_key, "documents" if self.workload.surface == "padded" else "documents_packed")
        return sum(_nbytes(self.t[k]) for k in keys)

    def num_scores(self) -> int:
        s = self.shape
        return s["B"] * s["C"] if self.workload.surface in ("padded", "packed") else s["Nq"] * s["Nb"]

    def document_bytes_per_token(self) -> int:
        """Stored bytes of one document token: D elements, plus its scale if compressed."""
        if self.documents_format is None:
            return self.workload.dim * self.dtype.itemsize
        if self.documents_format == CENTROID_FORMAT:
            return CODE_BYTES
        if self.documents_format in RESIDUAL_FORMATS:
            return CODE_BYTES + self.workload.dim * RESIDUAL_FORMATS[self.documents_format] // 8
        return self.workload.dim * DOCUMENT_FORMATS[self.documents_format].itemsize + SCALE_BYTES

    def float_documents(self):
        """The float document tensor of this surface (the one compressed documents replace)."""
        return self.t["documents" if self.workload.surface == "padded" else "documents_packed"]

    def useful_flops(self) -> float:
        """2 * D * sum over pairs of valid q tokens x valid d tokens (one forward)."""
        s = self.t
        if self.workload.surface in ("padded", "packed"):
            return 2.0 * self.workload.dim * float((s["query_lengths"].double()[:, None] * s["doc_lengths"].double()).sum())
        q = s["query_lengths"].double().sum() if s["query_lengths"] is not None else \
            self.shape["Nq"] * self.shape["Lq"]
        return 2.0 * self.workload.dim * float(q) * float(s["doc_lengths"].double().sum())


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def build_inputs(w: Workload, device, dtype=None, layout=None, seed=0, shape=None) -> Inputs:
    device = torch.device(device)
    dtype = dtype or default_dtype(w, device)
    layout = layout or w.layout
    shape = shape or w.shape_for(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    t = {}
    Lq, Ld, D = shape["Lq"], shape["Ld"], w.dim
    if w.surface in ("padded", "packed"):
        B, C = shape["B"], shape["C"]
        t["queries"] = _unit(gen, (B, Lq, D), dtype, device)
        t["documents"] = _unit(gen, (B, C, Ld, D), dtype, device)
        t["query_lengths"] = _lengths(gen, (B,), Lq, Lq // 2, layout, device)
        t["doc_lengths"] = _lengths(gen, (B, C), Ld, Ld // 4, layout, device)
        if w.surface == "packed":
            # Same ragged data, packed: segment b is query b, segment b*C + c its c-th candidate.
            t["queries_packed"] = t["queries"][valid_mask(t["query_lengths"], Lq)]
            t["query_offsets"] = offsets(t["query_lengths"])
            t["documents_packed"] = t["documents"][valid_mask(t["doc_lengths"], Ld)]
            t["document_offsets"] = offsets(t["doc_lengths"])
            t["pair_query_ids"] = torch.arange(B, device=device, dtype=torch.int32).repeat_interleave(C)
            t["pair_document_ids"] = torch.arange(B * C, device=device, dtype=torch.int32)
            del t["queries"], t["documents"]   # the packed surface never sees the padded copies
    else:
        Nq, Nb = shape["Nq"], shape["Nb"]
        t["queries"] = _unit(gen, (Nq, Lq, D), dtype, device)
        q_len = _lengths(gen, (Nq,), Lq, Lq // 2, layout, device)
        t["query_lengths"] = None if layout == "full" else q_len
        t["doc_lengths"] = _lengths(gen, (Nb,), Ld, Ld // 4, layout, device)
        t["document_offsets"] = offsets(t["doc_lengths"])
        total = Nb * Ld if layout == "full" else int(t["document_offsets"][-1])
        t["documents_packed"] = _unit(gen, (total, D), dtype, device)
        if w.train:
            t["grad_weights"] = torch.randn(Nq, Nb, generator=gen, device=device)
    return Inputs(w, shape, dtype, layout, t)


def compress(x: Inputs, kernel, fmt: str) -> Inputs:
    """x with its documents also held compressed: quantised per token
    (kernel.quantize_documents) or as residual codes (compress_residual).

    The float documents stay in x (for the peers' own quantisers); maxsim_call and
    naive_call use document_values / document_scales (document_codes / document_residuals
    and codec for the residual formats)."""
    if fmt in RESIDUAL_FORMATS or fmt == CENTROID_FORMAT:
        return compress_residual(x, kernel, fmt)
    if fmt not in DOCUMENT_FORMATS:
        raise ValueError(f"unknown document format {fmt!r}; known: {', '.join(ALL_FORMATS)}")
    values, scales = kernel.quantize_documents(x.float_documents(), fmt)
    t = dict(x.t, document_values=values, document_scales=scales)
    return Inputs(x.workload, x.shape, x.dtype, x.layout, t, documents_format=fmt)


def residual_codec(kernel, tokens, nbits, n_centroids, seed=1):
    """A ColBERTv2-style codec for `tokens` [T, D]: centroids drawn from the tokens (k-means
    would place them better; the timing does not depend on where they are), and the bucket
    cutoffs and weights at the quantiles of a sample's residuals to their nearest centroid
    (cutoffs at k / 2**nbits, weights at the midpoints between them). The weights are rounded
    to the tokens' dtype and kept float32, as colbert-ai keeps float16 weights on a GPU.
    Returns (codec, bucket_cutoffs)."""
    gen = torch.Generator(device=tokens.device).manual_seed(seed)
    pick = torch.randperm(tokens.shape[0], generator=gen, device=tokens.device)
    centroids = tokens[pick[:n_centroids]].contiguous()
    sample = tokens[pick[:min(tokens.shape[0], 1 << 14)]].float()
    cents = centroids.float()
    nearest = (sample @ cents.T).argmax(dim=-1)
    residual = (sample - cents[nearest]).flatten()[:1 << 24]   # torch.quantile's input limit
    levels = 1 << nbits
    steps = torch.arange(levels, device=tokens.device, dtype=torch.float32)
    cutoffs = torch.quantile(residual, steps[1:] / levels)
    weights = torch.quantile(residual, (steps + 0.5) / levels).to(tokens.dtype).float()
    return kernel.ResidualCodec(centroids, weights, nbits), cutoffs


def compress_residual(x: Inputs, kernel, fmt: str) -> Inputs:
    """x with its documents also held as residual codes of `fmt`'s nbits (centroids: the
    residual2 codes). Padded documents keep their [B, C, Ld] layout (padding rows are coded
    too, as an index would store them); packed ones their [T] rows."""
    docs = x.float_documents()
    tokens = docs.reshape(-1, docs.shape[-1])
    nbits = CENTROID_NBITS if fmt == CENTROID_FORMAT else RESIDUAL_FORMATS[fmt]
    codec, cutoffs = residual_codec(kernel, tokens, nbits, RESIDUAL_CENTROIDS[x.device.type])
    codes, residuals = kernel.compress_residuals(docs, codec, cutoffs)
    t = dict(x.t, document_codes=codes, document_residuals=residuals, codec=codec,
             residual_byte_table=residual_byte_table(codec))
    return Inputs(x.workload, x.shape, x.dtype, x.layout, t, documents_format=fmt)


def colbert_buckets(residuals, nbits, dim):
    """Packed residual bytes in colbert-ai's order -> bucket ids [..., dim] (int64), through a
    256-entry table of each byte value's 8 / nbits bucket ids, as colbert-ai's decompression
    reads them (one gather a byte instead of a shift and a mask a bit)."""
    per_byte = 8 // nbits
    values = torch.arange(256, device=residuals.device)
    bits = (values[:, None] >> torch.arange(7, -1, -1, device=residuals.device)) & 1   # MSB first
    table = (bits.view(256, per_byte, nbits) << torch.arange(nbits, device=residuals.device)).sum(-1)
    return table[residuals.long()].reshape(*residuals.shape[:-1], dim)


def residual_byte_table(codec):
    """Each byte value's 8 / nbits bucket weights (float32, flat [256 * (8 / nbits)]), built once
    per codec, as colbert-ai builds its decompression lookup table when it loads a codec."""
    per_byte = 8 // codec.nbits
    byte_values = torch.arange(256, device=codec.bucket_weights.device, dtype=torch.uint8)[:, None]
    return codec.bucket_weights.float()[colbert_buckets(byte_values, codec.nbits, per_byte)].reshape(-1)


def torch_decompress(codes, residuals, codec, dtype, byte_table=None):
    """Residual documents -> tokens [..., D] in `dtype` in plain PyTorch ops (no checks, no
    host sync: capturable): what a decompress-then-score pipeline writes to memory.
    byte_table: residual_byte_table(codec), made here when not given.

    Each residual byte picks its 8 / nbits bucket weights from the byte table with `take`; a
    row gather of the [256, 8 / nbits] table (embedding, index_select, []) took 15.8 ms on an
    H100 for HeavyRerank's 26 M bytes, `take` 1.1 ms (tools/device/profile_decompress.py)."""
    lead, dim = residuals.shape[:-1], codec.dim
    per_byte = 8 // codec.nbits
    table = residual_byte_table(codec) if byte_table is None else byte_table
    slots = residuals.reshape(-1, residuals.shape[-1]).long().unsqueeze(-1) * per_byte
    weights = table.take(slots + torch.arange(per_byte, device=residuals.device))
    centroids = codec.centroids.float().index_select(0, codes.reshape(-1).long())
    t = (centroids + weights.reshape(-1, dim)).reshape(*lead, dim)
    if codec.normalize:
        t = torch.nn.functional.normalize(t, p=2, dim=-1, eps=1e-12)
    return t.to(dtype)


def little_endian_residuals(residuals, nbits, dim):
    """colbert-ai's packed bucket ids re-packed in late-interaction-kernels' order (feature f
    in byte f // (8 / nbits), at bit (f % (8 / nbits)) * nbits): the same tokens for its
    residual kernels, which read that order."""
    per_byte = 8 // nbits
    b = colbert_buckets(residuals, nbits, dim).reshape(*residuals.shape[:-1], dim // per_byte, per_byte)
    return (b << (torch.arange(per_byte, device=b.device) * nbits)).sum(-1).to(torch.uint8)


def dequantized(x: Inputs) -> Inputs:
    """x with the float documents replaced by its compressed ones read back in the query
    dtype (float32 product of value and scale, then rounded), in plain PyTorch."""
    values, scales = x.document_values, x.document_scales
    docs = (values.to(torch.float32) * scales.unsqueeze(-1)).to(x.dtype)
    key = "documents" if x.workload.surface == "padded" else "documents_packed"
    return Inputs(x.workload, x.shape, x.dtype, x.layout, dict(x.t, **{key: docs}))


def decompressed(x: Inputs, dtype=None) -> Inputs:
    """x with the float documents replaced by its residual documents decompressed in plain
    PyTorch (torch_decompress) in the query dtype (or `dtype`)."""
    docs = torch_decompress(x.document_codes, x.document_residuals, x.codec, dtype or x.dtype,
                            x.t.get("residual_byte_table"))
    key = "documents" if x.workload.surface == "padded" else "documents_packed"
    t = {k: v for k, v in x.t.items()
         if k not in ("document_codes", "document_residuals", "codec", "residual_byte_table")}
    return Inputs(x.workload, x.shape, x.dtype, x.layout, dict(t, **{key: docs}))


def padded_documents(x: Inputs):
    """Contrastive documents as [Nb, Ld, D] (a view for the full layout, else a padded copy)."""
    Ld = x.shape["Ld"]
    if x.layout == "full":
        return x.documents_packed.view(-1, Ld, x.workload.dim)
    return unpack(x.documents_packed, x.document_offsets, Ld)


def packed_queries(x: Inputs):
    """Contrastive queries as packed rows [Tq, D] + offsets [Nq + 1] (for the peers' varlen APIs)."""
    Nq, Lq = x.shape["Nq"], x.shape["Lq"]
    if x.query_lengths is None:
        lengths = torch.full((Nq,), Lq, dtype=torch.int32, device=x.queries.device)
        return x.queries.reshape(Nq * Lq, x.workload.dim), offsets(lengths)
    return x.queries[valid_mask(x.query_lengths, Lq)], offsets(x.query_lengths)


# ---- maxsim calls ---------------------------------------------------------------------

def maxsim_call(kernel, x: Inputs, leaves=None):
    """The maxsim entry point for this workload; returns scores (grads are side effects)."""
    w = x.workload
    if x.documents_format == CENTROID_FORMAT:
        return centroid_call(kernel, x)
    if x.documents_format in RESIDUAL_FORMATS:
        docs, extra = x.document_residuals, dict(document_codes=x.document_codes, residual_codec=x.codec)
    elif x.documents_format is not None:
        docs, extra = x.document_values, dict(document_scales=x.document_scales)
    else:
        docs, extra = x.float_documents(), {}
    if w.surface == "padded":
        return kernel.score_candidates_padded(x.queries, docs, x.query_lengths, x.doc_lengths, **extra)
    if w.surface == "packed":
        return kernel.score_pairs_packed(
            x.queries_packed, x.query_offsets, docs, x.document_offsets,
            x.pair_query_ids, x.pair_document_ids, max_q_len=x.shape["Lq"], **extra)
    if not w.train:
        return kernel.score_contrastive(x.queries, docs, x.document_offsets,
                                        query_lengths=x.query_lengths, **extra)
    q, d = leaves
    scores = kernel.score_contrastive_train(q, d, x.document_offsets, query_lengths=x.query_lengths)
    torch.autograd.grad((scores * x.grad_weights).sum(), (q, d))
    return scores.detach()


def flat_codes(x: Inputs):
    """A residual row's codes as a flat [T] of the real tokens + document offsets [N + 1] (for
    the padded layout a copy without the padding rows; packed: as stored)."""
    if x.workload.surface == "packed":
        return x.document_codes, x.document_offsets
    return x.document_codes[valid_mask(x.doc_lengths, x.shape["Ld"])], offsets(x.doc_lengths)


def padded_codes(x: Inputs):
    """A residual row's codes as [B, C, Ld] (packed rows: padded with code 0 past each length)."""
    if x.workload.surface == "padded":
        return x.document_codes
    B, C, Ld = x.shape["B"], x.shape["C"], x.shape["Ld"]
    return unpack(x.document_codes.unsqueeze(-1), x.document_offsets, Ld).view(B, C, Ld)


def centroid_call(kernel, x: Inputs):
    """maxsim.score_centroids over the row's (query, candidate) pairs -> [B, C] (padded) or
    [P] (packed). Flat codes, pair ids and padded queries are built on the first call and
    kept in x (outside the timed calls)."""
    if "centroid_args" not in x.t:
        codes, offs = flat_codes(x)
        B, C = x.shape["B"], x.shape["C"]
        pq = torch.arange(B, device=codes.device, dtype=torch.int32).repeat_interleave(C)
        pd = torch.arange(B * C, device=codes.device, dtype=torch.int32)
        q = x.queries if x.workload.surface == "padded" else \
            unpack(x.queries_packed, x.query_offsets, x.shape["Lq"])
        x.t["centroid_args"] = (q, codes, offs, pq, pd)
    q, codes, offs, pq, pd = x.t["centroid_args"]
    scores = kernel.score_centroids(q, codes, offs, x.codec.centroids, query_lengths=x.query_lengths,
                                    pair_query_ids=pq, pair_document_ids=pd)
    return scores.view(x.shape["B"], x.shape["C"]) if x.workload.surface == "padded" else scores


def naive_centroids(x: Inputs):
    """The centroid-only score in plain PyTorch: the [B, n_centroids, Lq] table, gathered by
    code into [B, C, Ld, Lq], masked, max over tokens, sum over the valid query tokens."""
    Lq, Ld, B = x.shape["Lq"], x.shape["Ld"], x.shape["B"]
    q = unpack(x.queries_packed, x.query_offsets, Lq) if x.workload.surface == "packed" else x.queries
    codes = padded_codes(x)
    table = torch.einsum("kd,bid->bki", x.codec.centroids.float(), q.float())   # [B, K, Lq]
    g = table[torch.arange(B, device=table.device)[:, None, None], codes.long()]   # [B, C, Ld, Lq]
    g = g.masked_fill(~valid_mask(x.doc_lengths, Ld).unsqueeze(-1), float("-inf"))
    best = g.amax(dim=2).masked_fill(~valid_mask(x.query_lengths, Lq).unsqueeze(1), 0.0)
    scores = best.sum(dim=-1)
    return scores if x.workload.surface == "padded" else scores.flatten()


def raw_training_ops(kernel, name):
    """A training workload's pieces through the raw contrastive ops (no autograd): the forward
    with its argmax, and backward(need_grad_queries, need_grad_documents) on that argmax."""
    ops = kernel._ops.ops
    x = build_inputs(WORKLOADS[name], "cuda")
    q, d, off, ql, g = x.queries, x.documents_packed, x.document_offsets, x.query_lengths, x.grad_weights
    _, argmax = ops.contrastive_forward(q, d, off, ql, True)
    return (lambda: ops.contrastive_forward(q, d, off, ql, True),
            lambda need_q, need_d: ops.contrastive_backward(g, q, d, off, ql, argmax, need_q, need_d))


def train_leaves(x: Inputs, padded_docs=False):
    """Fresh leaf tensors (requires_grad) for one training implementation."""
    d = padded_documents(x) if padded_docs else x.documents_packed
    return x.queries.detach().requires_grad_(), d.detach().clone().requires_grad_()


def reference(kernel, x: Inputs, max_bytes=1 << 30):
    """The package's *_reference scores, computed in query chunks to bound memory."""
    w = x.workload
    if w.surface == "padded":
        per = x.documents.shape[1] * x.shape["Lq"] * x.shape["Ld"] * 4 * 3
        step = max(1, max_bytes // per)
        return torch.cat([kernel.score_candidates_padded_reference(
            x.queries[i:i + step], x.documents[i:i + step], x.query_lengths[i:i + step],
            x.doc_lengths[i:i + step]) for i in range(0, x.shape["B"], step)])
    if w.surface == "packed":
        return kernel.score_pairs_packed_reference(
            x.queries_packed, x.query_offsets, x.documents_packed, x.document_offsets,
            x.pair_query_ids, x.pair_document_ids, max_q_len=x.shape["Lq"])
    per = x.shape["Nb"] * x.shape["Lq"] * x.shape["Ld"] * 4 * 3
    step = max(1, max_bytes // per)
    out = []
    for i in range(0, x.shape["Nq"], step):
        ql = None if x.query_lengths is None else x.query_lengths[i:i + step]
        out.append(kernel.score_contrastive_reference(
            x.queries[i:i + step], x.documents_packed, x.document_offsets, ql))
    return torch.cat(out)


# ---- naive PyTorch: materialise the similarities in the input dtype ------------------------

def _reduce(sims, q_valid, d_valid):
    """sims [..., Lq, Ld] in the input dtype -> float32 scores; masks may be None (full)."""
    if d_valid is not None:
        sims = sims.masked_fill(~d_valid.unsqueeze(-2), float("-inf"))
    best = sims.amax(dim=-1).float()
    if q_valid is not None:
        best = best.masked_fill(~q_valid, 0.0)
    return best.sum(dim=-1)


def naive_padded(q, d, q_len=None, d_len=None):
    sims = torch.einsum("bqd,bcld->bcql", q, d)
    qv = None if q_len is None else valid_mask(q_len, q.shape[1]).unsqueeze(1)
    dv = None if d_len is None else valid_mask(d_len, d.shape[2])
    return _reduce(sims, qv, dv)


def naive_contrastive(q, d_padded, q_len=None, d_len=None):
    sims = torch.einsum("qid,njd->qnij", q, d_padded)
    qv = None if q_len is None else valid_mask(q_len, q.shape[1]).unsqueeze(1)
    dv = None if d_len is None else valid_mask(d_len, d_padded.shape[1]).unsqueeze(0)
    return _reduce(sims, qv, dv)


def naive_call(x: Inputs, leaves=None):
    """What a PyTorch user writes without a kernel. Packed inputs are padded first;
    compressed documents are read back in the query dtype first (part of the call)."""
    if x.documents_format == CENTROID_FORMAT:
        return naive_centroids(x)
    if x.documents_format in RESIDUAL_FORMATS:
        return naive_call(decompressed(x), leaves)
    if x.documents_format is not None:
        return naive_call(dequantized(x), leaves)
    w, ragged = x.workload, x.layout == "ragged"
    ql = x.query_lengths if ragged else None
    if w.surface == "padded":
        return naive_padded(x.queries, x.documents, ql, x.doc_lengths if ragged else None)
    if w.surface == "packed":
        Lq, Ld = x.shape["Lq"], x.shape["Ld"]
        q = unpack(x.queries_packed, x.query_offsets, Lq)[x.pair_query_ids.long()]
        d = unpack(x.documents_packed, x.document_offsets, Ld)[x.pair_document_ids.long()]
        sims = torch.einsum("pid,pjd->pij", q, d)
        q_len = x.query_lengths[x.pair_query_ids.long()]
        return _reduce(sims, valid_mask(q_len, Lq), valid_mask(x.doc_lengths.reshape(-1), Ld))
    dl = x.doc_lengths if ragged else None
    if not w.train:
        return naive_contrastive(x.queries, padded_documents(x), ql, dl)
    q, d = leaves
    scores = naive_contrastive(q, d, ql, dl)
    torch.autograd.grad((scores * x.grad_weights).sum(), (q, d))
    return scores.detach()


def resolve(names: str) -> list[Workload]:
    if names in ("all", ""):
        return list(WORKLOADS.values())
    out = []
    for n in names.split(","):
        if n not in WORKLOADS:
            raise SystemExit(f"unknown workload {n!r}; known: {', '.join(WORKLOADS)}")
        out.append(WORKLOADS[n])
    return out


def fmt_bytes(n: float) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
