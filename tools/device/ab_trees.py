"""GPU time of the same calls on built trees, alternating in one process (CUDA graphs, as
bench_compressed.py times them), for kernel changes that no knob switches: a base and one
candidate (this tree), or several named candidates (--tree NAME=DIR). Each tree's CUDA build
is loaded under its own op namespace; every call is made through its public API.

  python3 tools/device/ab_trees.py --base .base [--group residual[,bytes...]] [--rounds 3]
  python3 tools/device/ab_trees.py --base . --tree a=/tmp/ab/a --tree b=/tmp/ab/b --group ...

The calls are the shapes a change reaches, named in GROUPS below (one group per change
measured this way; each row a name, environment settings and a function from a loaded tree
to the timed call); add to them as needed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compressed import graph_time_ms, knobs  # noqa: E402
from probe_long_steps import packed_call  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import workloads as W  # noqa: E402


def padded(ms, B, C, Lq, Ld, D, qdtype, fmt):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Lq, D, device="cuda", generator=gen).to(qdtype)
    d = torch.randn(B, C, Ld, D, device="cuda", generator=gen)
    ql = torch.full((B,), Lq, device="cuda", dtype=torch.int32)
    dl = torch.full((B, C), Ld, device="cuda", dtype=torch.int32)
    if fmt == "plain":
        d = d.to(qdtype)
        return lambda: ms.score_candidates_padded(q, d, ql, dl)
    if fmt.startswith("residual"):  # residual<nbits>[-<weights dtype>][-raw]: 4,096 centroids
        nbits, wdtype = int(fmt[8]), torch.float16 if "-f16w" in fmt else torch.float32
        centroids = torch.nn.functional.normalize(torch.randn(4096, D, device="cuda", generator=gen), dim=-1)
        weights = (torch.randn(1 << nbits, device="cuda", generator=gen) * 0.05).sort().values.to(wdtype)
        codec = ms.ResidualCodec(centroids.to(qdtype), weights, nbits, normalize="-raw" not in fmt)
        codes = torch.randint(0, 4096, (B, C, Ld), device="cuda", generator=gen, dtype=torch.int32)
        res = torch.randint(0, 256, (B, C, Ld, D * nbits // 8), device="cuda", generator=gen,
                            dtype=torch.int32).to(torch.uint8)
        return lambda: ms.score_candidates_padded(q, res, ql, dl, document_codes=codes, residual_codec=codec)
    v, s = ms.quantize_documents(d, fmt)
    return lambda: ms.score_candidates_padded(q, v, ql, dl, document_scales=s)


# name, env, (B, C, Lq, Ld, D), query dtype, document format
SPILLS_2026_11_26 = [
    # SimtMainloop (FFMA): float32 queries, float32 and int8 documents
    ("HeavyRerank fp32 (FFMA)", {}, (32, 100, 32, 256, 128), torch.float32, "plain"),
    ("HeavyRerank fp32 + int8 (FFMA)", {}, (32, 100, 32, 256, 128), torch.float32, "int8"),
    ("LongDocStress fp32 + int8 (FFMA, BM 64)", {}, (8, 16, 64, 1024, 128), torch.float32, "int8"),
    ("Lq 96, Ld 256, fp32 + int8 (FFMA, BM 128)", {}, (16, 50, 96, 256, 128), torch.float32, "int8"),
    # mma.sync with e4m3 documents at 64-row query blocks (Lq 33-64)
    ("Lq 48, Ld 180, fp16 + e4m3 (mma.sync BM 64)", {}, (32, 50, 48, 180, 128), torch.float16, "float8_e4m3fn"),
    ("Lq 48, Ld 180, D 64, fp16 + e4m3 (mma.sync BM 64)", {}, (32, 50, 48, 180, 64), torch.float16, "float8_e4m3fn"),
    ("Lq 48, Ld 180, fp16 + int8 (control)", {}, (32, 50, 48, 180, 128), torch.float16, "int8"),
    ("HeavyRerank fp16 + e4m3, mma.sync forced (BM 32, control)", {"MAXSIM_CUDA_HOPPER_BYTES": "0"},
     (32, 100, 32, 256, 128), torch.float16, "float8_e4m3fn"),
]

# The residual decode by weight pairs (2026-11-26, 05bd461..8f26fd1): float32 weights take the
# float32 adds, float16 ones (colbert-ai's GPU codec) the 16-bit adds; "-raw" codecs do not
# normalise (then the scores must stay bit for bit). Row names are kept as the stored results
# (benchmarks/results/h200_ab_residual_*.json) name them.
RESIDUAL_PAIRS = [
    ("1 x 1000 x 300, 2 bits, f32 weights", {}, (1, 1000, 32, 300, 128), torch.float16, "residual2"),
    ("1 x 1000 x 300, 2 bits, f16 weights", {}, (1, 1000, 32, 300, 128), torch.float16, "residual2-f16w"),
    ("1 x 1000 x 300, 1 bit, f16 weights", {}, (1, 1000, 32, 300, 128), torch.float16, "residual1-f16w"),
    ("1 x 1000 x 300, 4 bits, f16 weights", {}, (1, 1000, 32, 300, 128), torch.float16, "residual4-f16w"),
    ("1 x 1000 x 300, 2 bits, f16 weights, raw", {}, (1, 1000, 32, 300, 128), torch.float16,
     "residual2-f16w-raw"),
    ("HeavyRerank, 2 bits, f16 weights", {}, (32, 100, 32, 256, 128), torch.float16, "residual2-f16w"),
    ("ColPaliRerank, 2 bits, f16 weights", {}, (16, 64, 32, 1030, 128), torch.float16, "residual2-f16w"),
    ("HeavyRerank, 2 bits, f32 weights, bf16", {}, (32, 100, 32, 256, 128), torch.bfloat16, "residual2"),
    ("Lq 48 (BM 64, norms while decoding), 2 bits, f16 weights", {}, (32, 100, 48, 256, 128), torch.float16,
     "residual2-f16w"),
    ("Lq 96 (BM 128), 2 bits, f32 weights", {}, (16, 50, 96, 256, 128), torch.float16, "residual2"),
]


def backward_raw(ms, name, grad):
    """One gradient ("queries" or "documents") alone of a training workload: the raw
    contrastive backward op, on the argmax of the tree's own forward."""
    _, backward = W.raw_training_ops(ms, name)
    want_q = grad == "queries"
    return lambda: backward(want_q, not want_q)[0 if want_q else 1]


def backward_raw_skewed(ms, name):
    """grad_documents alone of a training workload on a skewed argmax: in each document a
    query token picks row perm[floor(len * u^2)] (u uniform, perm a random permutation of the
    document's rows), so that a few rows take most of the hits, as real ColBERT argmaxes
    concentrate on some tokens, and the popular rows fall anywhere in the document. The
    random embeddings of compare.py spread argmaxes evenly; this row is the uneven case."""
    ops = ms._ops.ops
    x = W.build_inputs(W.WORKLOADS[name], "cuda")
    q, d, off, ql, g = x.queries, x.documents_packed, x.document_offsets, x.query_lengths, x.grad_weights
    _, argmax = ops.contrastive_forward(q, d, off, ql, True)
    gen = torch.Generator(device="cuda").manual_seed(2)
    lens = (off[1:] - off[:-1]).long()                                    # [Nb]
    width = int(lens.max())
    keys = torch.rand(lens.numel(), width, device="cuda", generator=gen)
    keys = keys.masked_fill(torch.arange(width, device="cuda") >= lens[:, None], 2.0)
    perm = keys.argsort(dim=1)                                            # rows < len come first
    u = torch.rand(argmax.shape, device="cuda", generator=gen)
    pos = (u * u * lens.view(1, -1, 1)).long().clamp_max(lens.view(1, -1, 1) - 1).clamp_min(0)
    picked = perm.unsqueeze(0).expand(argmax.shape[0], -1, -1).gather(2, pos)
    skewed = torch.where(argmax >= 0, picked, -1).to(argmax.dtype).contiguous()
    return lambda: ops.contrastive_backward(g, q, d, off, ql, skewed, False, True)[1]


def grad_documents_public(ms, name, layout):
    """Forward + grad_documents through a `_train` entry point (queries without a gradient)."""
    x = W.build_inputs(W.WORKLOADS[name], "cuda", layout=layout)
    if x.workload.surface == "padded":
        d = x.documents.detach().requires_grad_()
        fn = lambda: ms.score_candidates_padded_train(x.queries, d, x.query_lengths, x.doc_lengths)  # noqa: E731
    else:
        d = x.documents_packed.detach().requires_grad_()
        fn = lambda: ms.score_pairs_packed_train(  # noqa: E731
            x.queries_packed, x.query_offsets, d, x.document_offsets, x.pair_query_ids, x.pair_document_ids,
            max_q_len=x.shape["Lq"])
    g = torch.randn(fn().shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    return lambda: torch.autograd.grad(fn(), d, g)[0]


def padded_rows(rows):
    """Rows of padded calls, (name, env, (B, C, Lq, Ld, D), query dtype, document format)."""
    return [(name, env, lambda ms, s=shape, q=qdtype, f=fmt: padded(ms, *s, q, f))
            for name, env, shape, qdtype, fmt in rows]


def shape_row(B, C, Lq, Ld, D=128, dtype=torch.float16, note="", env=None):
    """A padded_rows row of float documents named by its shape, so that the name cannot say
    another: "B x C, Lq .., Ld ..", then the dim unless 128, the query dtype unless float16,
    then the note."""
    name = f"{B} x {C}, Lq {Lq}, Ld {Ld}" + (f", dim {D}" if D != 128 else "")
    name += ("" if dtype == torch.float16 else ", " + str(dtype).removeprefix("torch.")) + note
    return name, env or {}, (B, C, Lq, Ld, D), dtype, "plain"


# grad_documents' sorted kernel and its rule (2026-11-26): the training workloads' raw backward
# op (the dense ones take the sorted kernel), and forward + grad_documents on the padded and
# packed surfaces (the scan kernel, now reading entries through DocEntries).
GRAD_DOCUMENTS = [
    *((f"{n} grad_documents", {}, lambda ms, n=n: backward_raw(ms, n, "documents"))
      for n in ("Contrastive", "LongDocs", "BigBatch", "ColPali", "BigColBERT", "DocDoc")),
    # (a tree without the knob ignores it: there this row is the default's)
    ("BigColBERT grad_documents, 96-row windows", {"MAXSIM_CUDA_GRAD_D_ROWS": "96"},
     lambda ms: backward_raw(ms, "BigColBERT", "documents")),
    ("DocDoc grad_documents, unbinned", {"MAXSIM_CUDA_GRAD_D_BINNED": "0"},
     lambda ms: backward_raw(ms, "DocDoc", "documents")),
    *((f"{n} grad_documents, skewed argmax", {}, lambda ms, n=n: backward_raw_skewed(ms, n))
      for n in ("BigColBERT", "DocDoc")),
    *((f"{n} {lay} forward + grad_documents", {}, lambda ms, n=n, lay=lay: grad_documents_public(ms, n, lay))
      for n, lay in (("Rerank", "ragged"), ("HeavyRerank", "full"), ("RerankPacked", "ragged"),
                     ("ColPaliRerankPacked", "ragged"))),
]

def workload_call(ms, name, layout, fmt=None):
    """A benchmarks/compare.py workload's scoring call as compare.py makes it: float documents,
    or (fmt: int8 / float8_e4m3fn) its documents quantised."""
    x = W.build_inputs(W.WORKLOADS[name], "cuda", layout=layout)
    if fmt is not None:
        x = W.compress(x, ms, fmt)
    return lambda: W.maxsim_call(ms, x)


def workload_rows(calls, env=None, note="", fmt=None):
    """Rows of compare.py workloads: (workload, layout) or (workload, layout, row note) pairs,
    with float16 documents or (fmt) the same documents quantised, each named "<workload>
    <layout> <fmt or float16><note>", under env."""
    return [(f"{c[0]} {c[1]} {fmt or 'float16'}{c[2] if len(c) > 2 else note}", env or {},
             lambda ms, n=c[0], lay=c[1]: workload_call(ms, n, lay, fmt)) for c in calls]


# The sm_90a byte kernel (2026-11-26, ade1a10..9045904 and what follows it): the rerank rows of
# issue 19 in each layout, int8 (float8 e4m3fn within a few percent of it in every run so far).
BYTES = workload_rows((("HeavyRerank", "full"), ("HeavyRerank", "ragged"), ("HeavyRerankPacked", "ragged"),
                       ("ColPaliRerank", "full"), ("ColPaliRerank", "ragged"), ("ColPaliRerankPacked", "ragged"),
                       ("SingleQueryRerank", "full"), ("SingleQueryRerankPacked", "ragged"),
                       ("LongDocStress", "full"), ("LongDocStressPacked", "ragged"), ("SmallRerank", "full")),
                      fmt="int8")

# The byte kernel at 64 query rows (2026-11-28): each half's MMAs as two 32-column chains, a
# fold under the next chain. LongDocStress in each layout (the split shape, one CTA an SM),
# e4m3 beside int8, and Lq 48 / 64 calls of many steps (two CTAs an SM).
BYTES_LQ64 = [
    *((f"{n} {lay} {fmt}", {}, lambda ms, n=n, lay=lay, f=fmt: workload_call(ms, n, lay, f))
      for n, lay, fmt in (("LongDocStress", "full", "int8"), ("LongDocStress", "ragged", "int8"),
                          ("LongDocStressPacked", "ragged", "int8"), ("LongDocStress", "full", "float8_e4m3fn"))),
    *padded_rows([
        ("Lq 64, Ld 512, 32 x 50, int8 (two CTAs an SM)", {}, (32, 50, 64, 512, 128), torch.float16, "int8"),
        ("Lq 48, Ld 300, 32 x 50, bf16 + int8", {}, (32, 50, 48, 300, 128), torch.bfloat16, "int8"),
    ]),
]

# The mma.sync kernels' query load (2026-11-27): a new query read before the wait for its step's
# first tile, and the full-width load (one address a row, no per-word dim checks). The
# one-step-a-CTA rows (issue 22's small rows), many-step rows, and the same kernels forced
# where the sm_90a kernels take a call by default.
MMA = "MAXSIM_CUDA_FORCE_MMA_SYNC"
QUERY_LOAD = [
    *((f"{n} {lay} float16", {}, lambda ms, n=n, lay=lay: workload_call(ms, n, lay))
      for n, lay in (("SmallRerank", "full"), ("SmallRerank", "ragged"), ("SmallRerankPacked", "ragged"),
                     ("Rerank", "full"), ("Rerank", "ragged"), ("RerankPacked", "ragged"),
                     ("HeavyRerankPacked", "ragged"))),
    *((f"{n} {lay} {fmt or 'float16'}, mma.sync forced", {MMA: "1"}, lambda ms, n=n, lay=lay, f=fmt: workload_call(ms, n, lay, f))
      for n, lay, fmt in (("SmallRerank", "full", "int8"), ("SmallRerankPacked", "ragged", "int8"),
                          ("HeavyRerank", "full", None), ("LongDocStress", "full", None),
                          ("ColBERTCorpus", "ragged", None))),
]

# The sm_90a 16-bit consumer (a step epilogue from registers, tried and reverted on 2026-11-27):
# the contrastive forwards (training with argmax, corpus scoring without; int8 through the
# widening kernel; dim 256 streamed), a long-query control (DocDoc: 64-row chunks), and the
# strided padded / packed shapes, which share the consumer.
EPILOGUE = [
    *((f"{n} forward (argmax)", {}, lambda ms, n=n: W.raw_training_ops(ms, n)[0])
      for n in ("BigColBERT", "Contrastive", "DocDoc")),
    *((f"{n} {lay} {fmt or 'float16'}", {}, lambda ms, n=n, lay=lay, f=fmt: workload_call(ms, n, lay, f))
      for n, lay, fmt in (("ColBERTCorpus", "ragged", None), ("ColBERTCorpus", "ragged", "int8"),
                          ("ColPaliCorpus", "ragged", None), ("ContrastiveD256", "full", None),
                          ("HeavyRerank", "full", None), ("HeavyRerankPacked", "ragged", None),
                          ("LongDocStressPacked", "ragged", None), ("ColPaliRerank", "ragged", None))),
]

# grad_queries' gathers, a slot's whole batch of 8 rows in flight for 16-bit rows (2026-11-27):
# the training workloads' raw backward op.
GRAD_QUERIES = [
    *((f"{n} grad_queries", {}, lambda ms, n=n: backward_raw(ms, n, "queries"))
      for n in ("Contrastive", "LongDocs", "BigBatch", "ColPali", "BigColBERT", "DocDoc")),
    # (a tree without the knob ignores it: there this row is the default's)
    ("BigColBERT grad_documents, 96-row windows", {"MAXSIM_CUDA_GRAD_D_ROWS": "96"},
     lambda ms: backward_raw(ms, "BigColBERT", "documents")),
]

# A short last tile's window moved back to end at its document's last row (2026-11-28): the
# calls whose documents end in such tiles on the sm_90a kernels (training forward with argmax,
# corpus scoring, int8 through the widening kernel, the streamed dim-256 shapes, the strided
# rerank shapes in 16 bits and through the byte kernel), and controls without short tails
# (DocDoc's 1,024-row documents; Contrastive's 80-row ones are shorter than any window).
TAIL_WINDOW = [
    *((f"{n} forward (argmax)", {}, lambda ms, n=n: W.raw_training_ops(ms, n)[0])
      for n in ("BigColBERT", "Contrastive", "DocDoc")),
    *((f"{n} {lay} {fmt or 'float16'}", {}, lambda ms, n=n, lay=lay, f=fmt: workload_call(ms, n, lay, f))
      for n, lay, fmt in (("ColBERTCorpus", "ragged", None), ("ColBERTCorpus", "ragged", "int8"),
                          ("ColPaliCorpus", "ragged", None), ("ColPaliCorpus", "ragged", "int8"),
                          ("ContrastiveD256", "full", None), ("Rerank", "full", None),
                          ("RerankD256", "full", None), ("RerankD512", "full", None),
                          ("HeavyRerank", "ragged", None), ("HeavyRerank", "ragged", "int8"),
                          ("HeavyRerankPacked", "ragged", "int8"), ("ColPaliRerank", "ragged", "int8"),
                          ("LongDocStress", "ragged", "int8"))),
]

# The tail window on the mma.sync kernels (2026-11-28, measured as a candidate patch and landed
# the same day): a short last tile of a document of at least BN rows starts early
# and ends at the document's last row, so its fold takes no mask but its copies read rows again.
# The calls sm_90a leaves on those kernels (documents under 256 rows: the small reranks, where
# SmallRerank full is the one row behind a peer), the same kernels forced on longer rows, the
# FFMA path (float32 under "highest"), int8 and residual tiles, and controls whose documents end
# on a tile boundary (LongDocStress: 1,024 rows; Ld 256).
TAIL_WINDOW_MMA = [
    *((f"{n} {lay} {fmt or 'float16'}", {}, lambda ms, n=n, lay=lay, f=fmt: workload_call(ms, n, lay, f))
      for n, lay, fmt in (("SmallRerank", "full", None), ("SmallRerank", "ragged", None),
                          ("SmallRerankPacked", "ragged", None), ("Rerank", "full", None),
                          ("Rerank", "ragged", None), ("RerankPacked", "ragged", None),
                          ("SmallRerank", "full", "int8"), ("Rerank", "full", "int8"))),
    *((f"{n} {lay} float16, mma.sync forced", {MMA: "1"}, lambda ms, n=n, lay=lay: workload_call(ms, n, lay))
      for n, lay in (("HeavyRerank", "ragged"), ("ColBERTCorpus", "ragged"), ("HeavyRerank", "full"),
                     ("LongDocStress", "full"))),
    ("BigColBERT forward (argmax), mma.sync forced", {MMA: "1"}, lambda ms: W.raw_training_ops(ms, "BigColBERT")[0]),
    *padded_rows([
        ("Lq 32, Ld 180, 32 x 50, float32 (FFMA)", {}, (32, 50, 32, 180, 128), torch.float32, "plain"),
        ("Lq 32, Ld 180, 32 x 50, 2 bits, f16 weights", {}, (32, 50, 32, 180, 128), torch.float16, "residual2-f16w"),
        ("Lq 32, Ld 256, 32 x 50, float32 (FFMA, control)", {}, (32, 50, 32, 256, 128), torch.float32, "plain"),
    ]),
]

# The FFMA residual decode's stash in a conflict-free row order (2026-11-28, measured as a
# candidate patch and landed the same day): float32 queries (PyLate's, against a colbert-ai
# index), 1 and 4 bits, 64-row blocks, and dim 384 with float16 queries (dim > 256 decodes on
# FFMA too). Scores change in their last bits (another summation order): bitwise_equal false.
RESIDUAL_FFMA = padded_rows([
    ("1 x 1000 x 300, 2 bits, float32 queries", {}, (1, 1000, 32, 300, 128), torch.float32, "residual2"),
    ("HeavyRerank, 2 bits, float32 queries", {}, (32, 100, 32, 256, 128), torch.float32, "residual2"),
    ("1 x 1000 x 300, 4 bits, float32 queries", {}, (1, 1000, 32, 300, 128), torch.float32, "residual4"),
    ("1 x 1000 x 300, 1 bit, float32 queries", {}, (1, 1000, 32, 300, 128), torch.float32, "residual1"),
    ("Lq 64 (BM 64), Ld 256, 2 bits, float32 queries", {}, (16, 50, 64, 256, 128), torch.float32, "residual2"),
    ("dim 384, 2 bits, float16 queries", {}, (8, 50, 32, 180, 384), torch.float16, "residual2-f16w"),
])

def packed_float32(ms, B, C, Lq, Ld, D, fmt="plain"):
    """The padded grid (B, C, Lq, Ld, D) in float32 as B x C packed pairs (max_q_len given),
    the documents float32 or quantised to fmt (int8 / float8_e4m3fn)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Lq, D, device="cuda", generator=gen)
    d = torch.randn(B, C, Ld, D, device="cuda", generator=gen)
    return packed_call(ms, q, d) if fmt == "plain" else packed_call(ms, q, *ms.quantize_documents(d, fmt))


# Two CTAs an SM for the FFMA mainloop at 32 query rows (2026-11-28, tools/device/candidates/
# simt_two_ctas.patch): padded and packed calls with float32 queries (float, int8 and residual
# documents) and the FFMA residual decode's float16-query shape, then controls on shapes the
# patch leaves at one CTA an SM (64 query rows; float64).
FFMA_TWO_CTAS = [
    *padded_rows([
        ("Lq 32, Ld 180, 32 x 50, float32 (FFMA)", {}, (32, 50, 32, 180, 128), torch.float32, "plain"),
        ("Lq 32, Ld 180, 32 x 8, float32 (256 steps)", {}, (32, 8, 32, 180, 128), torch.float32, "plain"),
        ("Lq 32, Ld 180, 32 x 10, float32", {}, (32, 10, 32, 180, 128), torch.float32, "plain"),
        ("Lq 32, Ld 180, 32 x 12, float32 (384 steps)", {}, (32, 12, 32, 180, 128), torch.float32, "plain"),
        ("Lq 32, Ld 180, 32 x 14, float32 (448 steps)", {}, (32, 14, 32, 180, 128), torch.float32, "plain"),
        ("Lq 32, Ld 180, 32 x 19, float32 (608 steps)", {}, (32, 19, 32, 180, 128), torch.float32, "plain"),
        ("HeavyRerank fp32 (FFMA)", {}, (32, 100, 32, 256, 128), torch.float32, "plain"),
        ("1 x 1000 x 300, float32", {}, (1, 1000, 32, 300, 128), torch.float32, "plain"),
        ("HeavyRerank fp32 + int8 (FFMA)", {}, (32, 100, 32, 256, 128), torch.float32, "int8"),
    ]),
    *(row for row in RESIDUAL_FFMA if row[0] in ("1 x 1000 x 300, 2 bits, float32 queries",
                                                 "HeavyRerank, 2 bits, float32 queries",
                                                 "dim 384, 2 bits, float16 queries")),
    ("32 x 50 packed pairs, Lq 32, Ld 180, float32", {}, lambda ms: packed_float32(ms, 32, 50, 32, 180, 128)),
    *padded_rows([
        ("Lq 48, Ld 180, 32 x 50, float32 (BM 64, control)", {}, (32, 50, 48, 180, 128), torch.float32, "plain"),
        ("Lq 32, Ld 180, 8 x 50, float64 (control)", {}, (8, 50, 32, 180, 128), torch.float64, "plain"),
    ]),
]


def contrastive_float32(ms, Nq, Lq, Nb, Ld, D, argmax=False, fmt="plain"):
    """Every one of Nq float32 queries against Nb packed documents of Ld tokens (FFMA under
    torch's default "highest" precision), the documents float32 or quantised to fmt."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(Nq, Lq, D, device="cuda", generator=gen)
    d = torch.randn(Nb * Ld, D, device="cuda", generator=gen)
    offs = torch.arange(0, (Nb + 1) * Ld, Ld, device="cuda")
    fn = ms.score_contrastive_with_argmax if argmax else ms.score_contrastive
    if fmt == "plain":
        return lambda: fn(q, d, offs)
    v, s = ms.quantize_documents(d, fmt)
    return lambda: fn(q, v, offs, document_scales=s)


# The FFMA mainloop's chunks by cp.async (measured 2026-11-29, landed in the commit after ad6d442):
# float documents with float32 / float64 queries copied element by element into shared memory
# instead of through registers, and the contrastive shapes at 32 query rows then at two CTAs an
# SM. The padded / packed rows of ffma_two_ctas, then contrastive float32 calls: colpali-engine's
# score_multi_vector (one-token queries against packed pages), a PyLate Contrastive step's
# forward and a BigColBERT-sized one (with argmax), 64-row query blocks; the 64-row and float64
# rows named controls there take the copies too, and int8 documents (register path) do not.
FFMA_ASYNC = [
    *(row for row in FFMA_TWO_CTAS if "int8" not in row[0] and "bits" not in row[0]),
    ("colpali-engine float32: 640 one-token queries x 256 pages of 1,030", {},
     lambda ms: contrastive_float32(ms, 640, 1, 256, 1030, 128)),
    ("PyLate Contrastive float32 forward: 64 x 64, Lq 32, Ld 180 (argmax)", {},
     lambda ms: contrastive_float32(ms, 64, 32, 64, 180, 128, argmax=True)),
    ("BigColBERT-sized float32 forward: 128 x 512, Lq 32, Ld 180 (argmax)", {},
     lambda ms: contrastive_float32(ms, 128, 32, 512, 180, 128, argmax=True)),
    ("contrastive float32, Lq 64 (BM 64, one CTA an SM): 64 x 256, Ld 180", {},
     lambda ms: contrastive_float32(ms, 64, 64, 256, 180, 128)),
    *padded_rows([("HeavyRerank fp32 + int8 (register path, control)", {}, (32, 100, 32, 256, 128),
                   torch.float32, "int8")]),
]


# The FFMA async copy's lane map (2026-11-29: a warp copies 4 rows x 8 columns, so its
# transposed stores meet 32 banks instead of 8 four times) and, on top of it, the 64-row padded
# / packed float shapes at two CTAs an SM, or the 32-row float shapes as 128-thread CTAs with
# 4 x 8 thread tiles, four an SM (the three candidates measured that day; the last two landed
# together). Every ffma_async row, then 64-row query blocks (Lq 33-64) at several step counts,
# padded and packed.
FFMA_SECTOR = [
    *FFMA_ASYNC,
    *padded_rows([
        ("Lq 48, Ld 180, 32 x 8, float32 (BM 64, 256 steps)", {}, (32, 8, 48, 180, 128), torch.float32, "plain"),
        ("Lq 64, Ld 180, 32 x 12, float32 (BM 64, 384 steps)", {}, (32, 12, 64, 180, 128), torch.float32, "plain"),
        ("1 x 1000 x 300, Lq 64, float32 (BM 64)", {}, (1, 1000, 64, 300, 128), torch.float32, "plain"),
    ]),
    ("32 x 50 packed pairs, Lq 48, Ld 180, float32 (BM 64)", {}, lambda ms: packed_float32(ms, 32, 50, 48, 180, 128)),
]


# 16-byte cp.async pieces into a swizzled [row][k] chunk (2026-11-29, tools/device/candidates/
# simt_pieces.patch): every ffma_sector row, and two dims beside 128: 96 (whole pieces) and 102
# (rows off 16 bytes: the value-by-value copies into the same layout).
FFMA_PIECES = [
    *FFMA_SECTOR,
    *padded_rows([
        ("Lq 32, Ld 180, 32 x 50, float32, dim 96", {}, (32, 50, 32, 180, 96), torch.float32, "plain"),
        ("Lq 32, Ld 180, 32 x 50, float32, dim 102 (4-byte copies)", {}, (32, 50, 32, 180, 102), torch.float32,
         "plain"),
    ]),
]


# The 128-query-row float32 FFMA shape (256 threads, one CTA an SM) with its k loop unrolled by
# two pieces (2026-11-29, tools/device/candidates/simt_unroll_bm128.patch): the contrastive
# rows whose queries stack into 128-row blocks (colpali-engine, PyLate, BigColBERT-sized, a
# ColBERTCorpus-sized call), padded and packed calls of 96 and 128 query rows, then controls
# on shapes the patch leaves alone (32 and 64 rows, float64). The row named "contrastive
# float32, Lq 64 (BM 64, ...)" (ffma_async) is not a control: the contrastive policy stacks
# its 64-token queries two to a 128-row block, and it moved with the 128-row patch (its name
# is kept so that older JSON rows still match).
FFMA_BM128 = [
    *(row for row in FFMA_ASYNC if "pages" in row[0] or "PyLate" in row[0] or "BigColBERT" in row[0]),
    ("ColBERTCorpus-sized float32: 32 x 10,000, Lq 32, Ld 256", {},
     lambda ms: contrastive_float32(ms, 32, 32, 10_000, 256, 128)),
    *padded_rows([
        ("Lq 96, Ld 180, 32 x 50, float32 (BM 128)", {}, (32, 50, 96, 180, 128), torch.float32, "plain"),
        ("Lq 128, Ld 300, 1 x 1000, float32 (BM 128)", {}, (1, 1000, 128, 300, 128), torch.float32, "plain"),
    ]),
    ("32 x 50 packed pairs, Lq 96, Ld 180, float32 (BM 128)", {}, lambda ms: packed_float32(ms, 32, 50, 96, 180, 128)),
    *(row for row in FFMA_ASYNC if "Lq 64 (BM 64" in row[0]),
    *padded_rows([
        ("HeavyRerank fp32 (BM 32, control)", {}, (32, 100, 32, 256, 128), torch.float32, "plain"),
        ("Lq 96, Ld 180, 8 x 50, float64 (BM 128, control)", {}, (8, 50, 96, 180, 128), torch.float64, "plain"),
    ]),
]


# The FFMA piece loop's shared addresses as one XOR a group of rows (2026-11-29, tools/device/
# candidates/simt_xor_addresses.patch): a short list, so that both trees fit a small device
# call: the 32-, 64- and 128-row float32 shapes, padded, packed and contrastive, float64, and
# the value-by-value copies (dim 102).
FFMA_XOR = [
    *(row for row in FFMA_PIECES if row[0].startswith(("HeavyRerank fp32 (FFMA)", "1 x 1000 x 300, float32",
                                                        "32 x 50 packed pairs, Lq 32", "Lq 48, Ld 180, 32 x 50",
                                                        "colpali-engine", "PyLate", "contrastive float32, Lq 64",
                                                        "Lq 32, Ld 180, 8 x 50, float64"))
      or "dim 102" in row[0]),
    *(row for row in FFMA_BM128 if row[0].startswith("Lq 96, Ld 180, 32 x 50")),
]


# int8 / e4m3 documents with float32 queries on the FFMA piece loop (2026-11-29, tools/device/
# candidates/simt_byte_pieces.patch): the bytes by 16-byte loads, widened into the pieces after
# each chunk's FMAs, the queries by cp.async; 32-row blocks as 128-thread CTAs (four an SM),
# 64-row padded / packed blocks at two. Padded, packed and contrastive calls at 32, 64 and 128
# query rows, dim 96 and 102 (byte by byte), then the float32-document rows they should meet.
FFMA_BYTES = [
    *padded_rows([
        ("HeavyRerank fp32 + int8 (FFMA)", {}, (32, 100, 32, 256, 128), torch.float32, "int8"),
        ("HeavyRerank fp32 + e4m3 (FFMA)", {}, (32, 100, 32, 256, 128), torch.float32, "float8_e4m3fn"),
        ("1 x 1000 x 300, float32 + int8", {}, (1, 1000, 32, 300, 128), torch.float32, "int8"),
        ("LongDocStress fp32 + int8 (FFMA, BM 64)", {}, (8, 16, 64, 1024, 128), torch.float32, "int8"),
        ("Lq 48, Ld 180, 32 x 50, float32 + e4m3 (BM 64)", {}, (32, 50, 48, 180, 128), torch.float32,
         "float8_e4m3fn"),
        ("Lq 96, Ld 256, fp32 + int8 (FFMA, BM 128)", {}, (16, 50, 96, 256, 128), torch.float32, "int8"),
        ("Lq 32, Ld 180, 32 x 50, float32 + int8, dim 96", {}, (32, 50, 32, 180, 96), torch.float32, "int8"),
        ("Lq 32, Ld 180, 32 x 50, float32 + int8, dim 102 (byte loads)", {}, (32, 50, 32, 180, 102),
         torch.float32, "int8"),
    ]),
    ("32 x 50 packed pairs, Lq 32, Ld 180, float32 + int8", {},
     lambda ms: packed_float32(ms, 32, 50, 32, 180, 128, "int8")),
    ("contrastive float32 + int8: 64 x 256, Lq 32, Ld 180", {},
     lambda ms: contrastive_float32(ms, 64, 32, 256, 180, 128, fmt="int8")),
    ("contrastive float32 + e4m3: 128 x 512, Lq 32, Ld 180 (BM 128)", {},
     lambda ms: contrastive_float32(ms, 128, 32, 512, 180, 128, fmt="float8_e4m3fn")),
    *padded_rows([
        ("HeavyRerank fp32 (FFMA, float documents: the mark)", {}, (32, 100, 32, 256, 128), torch.float32,
         "plain"),
        ("1 x 1000 x 300, float32 (float documents: the mark)", {}, (1, 1000, 32, 300, 128), torch.float32,
         "plain"),
    ]),
]


# Residual documents with float32 queries on the FFMA piece loop (2026-11-29, the candidate
# simt_residual_pieces.patch, landed the same day): the decode as before, its values stored into the
# pieces after a chunk's FMAs; 32-row blocks as 128-thread CTAs, three an SM. The residual_ffma
# rows (the float16-query row, on the transposed chunk still, a control), a 128-row block and a
# packed call, then the float documents' row the residual ones should approach.
RESIDUAL_PIECES = [
    *RESIDUAL_FFMA,
    *padded_rows([
        ("Lq 96 (BM 128), Ld 256, 2 bits, float32 queries", {}, (16, 50, 96, 256, 128), torch.float32, "residual2"),
        ("1 x 1000 x 300, float32 (float documents: the mark)", {}, (1, 1000, 32, 300, 128), torch.float32,
         "plain"),
    ]),
]


# The sm_90a producer's index reads a step ahead in two halves (2026-11-30, the candidate
# hopper_index_ahead.patch): every sm_90a surface and document format, the rows behind a peer
# first (the wide full reranks, Rerank full), the packed rows (two dependent reads a step), the
# corpus rows (contrastive offsets), the byte kernel; then the small rows (SmallRerank, Rerank
# ragged: the rule leaves some on the mma.sync kernels, which the patch does not touch) and
# controls on kernels it does not touch (mma.sync forced, float32 on the FFMA path).
INDEX_AHEAD = [
    *((f"{n} {lay} {fmt or 'float16'}", {}, lambda ms, n=n, lay=lay, f=fmt: workload_call(ms, n, lay, f))
      for n, lay, fmt in (("RerankD256", "full", None), ("RerankD512", "full", None),
                          ("RerankD1024", "full", None), ("Rerank", "full", None),
                          ("HeavyRerank", "full", None), ("HeavyRerank", "ragged", None),
                          ("ColPaliRerank", "full", None), ("RerankPacked", "ragged", None),
                          ("HeavyRerankPacked", "ragged", None), ("LongDocStressPacked", "ragged", None),
                          ("SingleQueryRerankPacked", "ragged", None), ("SmallRerankPacked", "ragged", None),
                          ("ColBERTCorpus", "ragged", None), ("ColPaliCorpus", "ragged", None),
                          ("HeavyRerank", "full", "int8"), ("HeavyRerankPacked", "ragged", "int8"),
                          ("LongDocStress", "ragged", "int8"), ("SmallRerank", "full", None),
                          ("SmallRerank", "ragged", None), ("Rerank", "ragged", None),
                          ("SmallRerank", "full", "int8"))),
    ("BigColBERT forward (argmax)", {}, lambda ms: W.raw_training_ops(ms, "BigColBERT")[0]),
    *((f"{n} {lay} float16, mma.sync forced", {MMA: "1"}, lambda ms, n=n, lay=lay: workload_call(ms, n, lay))
      for n, lay in (("HeavyRerank", "full"), ("HeavyRerank", "ragged"), ("HeavyRerankPacked", "ragged"))),
    *padded_rows([("HeavyRerank fp32 (FFMA)", {}, (32, 100, 32, 256, 128), torch.float32, "plain")]),
]


# Three CTAs an SM for the resident strided shape (2026-11-30, tools/device/candidates/
# hopper_three_ctas.patch): 64-row tiles, three slots and one query buffer, for 64 < dim <= 128
# calls of 2-3 steps an SM (SmallRerank's 320 steps), which then run in one wave and leave the
# mma.sync kernels. By the default rule (base: mma.sync below 4 steps an SM), forced on both
# trees (base: its two-CTA shape under the knob), and controls the rule leaves alone.
# At dim > 128 the same knob picks the streamed shape at 64-row tiles, three CTAs an SM.
CTAS3 = {"MAXSIM_CUDA_HOPPER_PADDED_CTAS": "3"}
HOPPER3 = {"MAXSIM_CUDA_HOPPER_PADDED": "1", "MAXSIM_CUDA_HOPPER_PACKED": "1", **CTAS3}
THREE_CTAS = [
    *((f"{n} {lay} float16", {}, lambda ms, n=n, lay=lay: workload_call(ms, n, lay))
      for n, lay in (("SmallRerank", "full"), ("SmallRerank", "ragged"), ("SmallRerankPacked", "ragged"))),
    *((f"{n} {lay} float16, three CTAs forced", HOPPER3, lambda ms, n=n, lay=lay: workload_call(ms, n, lay))
      for n, lay in (("SmallRerank", "full"), ("SmallRerank", "ragged"), ("SmallRerankPacked", "ragged"),
                     ("Rerank", "full"), ("HeavyRerank", "full"))),
    # dim > 128: the streamed shape at 64-row tiles and three CTAs an SM, by the knob only (base:
    # its two-CTA streamed shape under the same knob, so the ratio is the shape's)
    *((f"{n} {lay} float16, three CTAs forced", CTAS3, lambda ms, n=n, lay=lay: workload_call(ms, n, lay))
      for n, lay in (("RerankD256", "full"), ("RerankD512", "full"), ("RerankD1024", "full"),
                     ("RerankD256", "ragged"))),
    *padded_rows([
        ("32 x 9, Lq 32, Ld 180 (288 steps)", {}, (32, 9, 32, 180, 128), torch.float16, "plain"),
        ("32 x 12, Lq 32, Ld 180 (384 steps)", {}, (32, 12, 32, 180, 128), torch.float16, "plain"),
        ("32 x 10, Lq 32, Ld 180, bfloat16", {}, (32, 10, 32, 180, 128), torch.bfloat16, "plain"),
        ("32 x 10, Lq 32, Ld 300 (two-CTA sm_90a before)", {}, (32, 10, 32, 300, 128), torch.float16, "plain"),
        ("32 x 10, Lq 32, Ld 1024", {}, (32, 10, 32, 1024, 128), torch.float16, "plain"),
        ("32 x 10, Lq 64, Ld 180", {}, (32, 10, 64, 180, 128), torch.float16, "plain"),
        ("32 x 10, Lq 32, Ld 180, dim 96", {}, (32, 10, 32, 180, 96), torch.float16, "plain"),
        ("32 x 8, Lq 32, Ld 180 (256 steps, control)", {}, (32, 8, 32, 180, 128), torch.float16, "plain"),
        ("32 x 10, Lq 32, Ld 180, dim 64 (control)", {}, (32, 10, 32, 180, 64), torch.float16, "plain"),
    ]),
    *((f"{n} {lay} float16 (control)", {}, lambda ms, n=n, lay=lay: workload_call(ms, n, lay))
      for n, lay in (("Rerank", "full"), ("HeavyRerank", "full"), ("RerankPacked", "ragged"))),
]

# The three-CTA shape at fewer steps (candidate hopper_three_ctas_rule.patch, 2026-11-30):
# 64 < dim <= 128 calls of at most two steps an SM under 256 rows on average, and short documents
# (32+ rows) at 2-3 steps an SM, which the base leaves on mma.sync; controls: long documents
# (LongDocStress keeps two CTAs an SM), 24-row documents, dim 64, SmallRerank (three CTAs in both).
THREE_CTAS_FEW_STEPS = [
    *padded_rows([
        (f"32 x {c}, Lq 32, Ld 180 ({32 * c} steps)", {}, (32, c, 32, 180, 128), torch.float16, "plain")
        for c in (1, 2, 5, 8)]),
    *padded_rows([
        ("32 x 4, Lq 64, Ld 180, bfloat16", {}, (32, 4, 64, 180, 128), torch.bfloat16, "plain"),
        ("32 x 5, Lq 32, Ld 120, dim 96", {}, (32, 5, 32, 120, 96), torch.float16, "plain"),
        ("32 x 10, Lq 32, Ld 64 (320 steps)", {}, (32, 10, 32, 64, 128), torch.float16, "plain"),
        ("32 x 10, Lq 32, Ld 40", {}, (32, 10, 32, 40, 128), torch.float16, "plain"),
        ("32 x 10, Lq 32, Ld 32", {}, (32, 10, 32, 32, 128), torch.float16, "plain"),
        ("32 x 2, Lq 32, Ld 64", {}, (32, 2, 32, 64, 128), torch.float16, "plain"),
        ("32 x 10, Lq 32, Ld 24 (control)", {}, (32, 10, 32, 24, 128), torch.float16, "plain"),
        ("32 x 2, Lq 32, Ld 180, dim 64 (control)", {}, (32, 2, 32, 180, 64), torch.float16, "plain"),
    ]),
    *workload_rows((("SingleQueryRerankPacked", "ragged"), ("SmallRerank", "full"), ("LongDocStress", "full"),
                    ("LongDocStressPacked", "ragged"), ("Rerank", "full")), note=" (control)"),
]

# Three CTAs an SM with two query buffers (candidate hopper_three_ctas_rule.patch,
# 2026-11-30): 64 < dim <= 128 calls of 3-6 steps an SM, runs of steps a CTA with a query
# loaded once a run. By the default rule (base: mma.sync below 4 steps an SM, two CTAs an SM
# from there), forced on both trees (base: the one-buffer three-CTA shape, which ignores
# MAXSIM_CUDA_HOPPER_QUERY_BUFS), and controls the rule leaves alone.
CTAS3_Q2 = {"MAXSIM_CUDA_HOPPER_PADDED_CTAS": "3", "MAXSIM_CUDA_HOPPER_QUERY_BUFS": "2"}
HOPPER3_Q2 = {"MAXSIM_CUDA_HOPPER_PADDED": "1", "MAXSIM_CUDA_HOPPER_PACKED": "1", **CTAS3_Q2}
THREE_CTAS_TWO_QUERIES = [
    *padded_rows([
        (f"32 x {c}, Lq 32, Ld 180 ({32 * c} steps)", {}, (32, c, 32, 180, 128), torch.float16, "plain")
        for c in (13, 16, 20, 24)]),
    *padded_rows([
        ("32 x 20, Lq 32, Ld 120, bfloat16", {}, (32, 20, 32, 120, 128), torch.bfloat16, "plain"),
        ("16 x 30, Lq 64, Ld 180", {}, (16, 30, 64, 180, 128), torch.float16, "plain"),
        ("32 x 20, Lq 32, Ld 180, three CTAs forced", HOPPER3_Q2, (32, 20, 32, 180, 128), torch.float16, "plain"),
        ("32 x 10, Lq 32, Ld 180, three CTAs forced", HOPPER3_Q2, (32, 10, 32, 180, 128), torch.float16, "plain"),
        ("32 x 26, Lq 32, Ld 180 (832 steps, control)", {}, (32, 26, 32, 180, 128), torch.float16, "plain"),
        ("32 x 20, Lq 32, Ld 300 (control)", {}, (32, 20, 32, 300, 128), torch.float16, "plain"),
        ("32 x 20, Lq 32, Ld 180, dim 64 (control)", {}, (32, 20, 32, 180, 64), torch.float16, "plain"),
    ]),
    *workload_rows((("Rerank", "full"), ("RerankPacked", "ragged")), HOPPER3_Q2, ", three CTAs forced"),
    *workload_rows((("SmallRerank", "full"), ("Rerank", "full"), ("HeavyRerankPacked", "ragged")), note=" (control)"),
]

# The strided shape at 128 < dim <= 256 by a rule (hopper_wide_rule.patch, landed after
# 3fa996f; hopper_wide_rule_one_wave.patch, landed after 132cfd6, limits its first clause to
# more than two steps an SM): three streamed CTAs an SM at 2-3 steps an SM, the resident 256-column
# shape (one CTA, two query buffers) at more steps under 512 rows (above dim 192 since 00b89af;
# three streamed CTAs up to it), streamed two CTAs beyond.
# By the default rule on both trees (base: streamed two CTAs everywhere), then controls the
# rule leaves alone (long documents, dim 512, dim 128).
WIDE_RULE = [
    *padded_rows([shape_row(32, c, 32, 180, 256, note=f" ({32 * c} steps)") for c in (1, 5, 10, 12, 20, 50)]),
    *padded_rows([
        shape_row(32, 50, 32, 300, 256),
        shape_row(32, 50, 32, 180, 192, torch.bfloat16),
        # (three streamed CTAs up to dim 192 since 00b89af: where the probe had it 0.88-0.92x)
        shape_row(32, 50, 32, 256, 192, torch.bfloat16),
        shape_row(32, 50, 32, 256, 160),
        shape_row(16, 50, 64, 180, 256),
        shape_row(32, 10, 32, 180, 136),
        shape_row(32, 50, 32, 1024, 256, note=" (control)"),
        shape_row(32, 50, 32, 180, 512, note=" (control)"),
    ]),
    *workload_rows((("RerankD256", "full"), ("RerankD256", "ragged"), ("RerankD512", "full", " (control)"),
                    ("Rerank", "full", " (control)"), ("SmallRerank", "full", " (control)"))),
]

# A CTA's first tile issued before its lengths are read (hopper_first_tile_ahead.patch,
# 2026-11-30, landed after 3fa996f): padded calls on the resident sm_90a shapes, where a step's query and first
# document rows are placed by arithmetic alone. One-step CTAs (the small calls) first, then
# calls of many steps a CTA (one step in many gains), and controls on other paths (streamed
# shapes at dim 256, packed calls, mma.sync).
FIRST_TILE_AHEAD = [
    *padded_rows([shape_row(32, c, 32, 180, note=f" ({32 * c} steps)") for c in (1, 2, 5, 10, 16, 20)]),
    *padded_rows([
        shape_row(32, 10, 32, 64),
        shape_row(32, 10, 32, 32),
        shape_row(32, 4, 64, 180, dtype=torch.bfloat16),
        shape_row(32, 10, 32, 180, 64),
        shape_row(32, 10, 32, 180, 256, note=" (control: streamed)"),
    ]),
    *workload_rows((("SmallRerank", "full"), ("SmallRerank", "ragged"), ("LongDocStress", "full"),
                    ("Rerank", "full"), ("HeavyRerank", "full"), ("SmallRerankPacked", "ragged", " (control: packed)"),
                    ("RerankD256", "full", " (control: streamed)"))),
]

# The sm_90a producers' dependent-launch signal (2026-12-01): long documents at grids of one to
# ~1.75 CTAs an SM, where the early signal crowded the next call's CTAs (C 5 / 6 at Ld 768+);
# then the grids around the band and shorter steps, where the signal should stay early.
LATE_SIGNAL = [
    *padded_rows([shape_row(32, C, 32, 1024) for C in (2, 4, 5, 6, 7, 8)]),
    *padded_rows([shape_row(32, 5, 32, Ld) for Ld in (300, 512, 768, 1536, 2048)]),
    *padded_rows([shape_row(1, 1, 32, 4096), shape_row(32, 5, 32, 1024, dtype=torch.bfloat16)]),
    *workload_rows((("LongDocStress", "full"), ("HeavyRerank", "full"), ("ColPaliRerank", "full"),
                    ("LongDocStressPacked", "ragged"))),
]

# A CTA's first tile ahead of its lengths on the byte kernel (2026-12-02): the padded calls of
# one step a CTA in int8 (Lq 32 at both tile heights, Lq 64 on the split shape), e4m3 beside
# the longest; then calls of many steps a CTA and the packed grid, which the change leaves.
BYTES_FIRST_TILE = [
    *workload_rows((("SmallRerank", "full"), ("SmallRerank", "ragged"), ("LongDocStress", "full"),
                    ("LongDocStress", "ragged")), fmt="int8"),
    *workload_rows((("LongDocStress", "full"),), fmt="float8_e4m3fn"),
    *padded_rows([
        ("32 x 1, Lq 32, Ld 180, int8 (32 steps)", {}, (32, 1, 32, 180, 128), torch.float16, "int8"),
        ("32 x 5, Lq 32, Ld 180, int8 (160 steps)", {}, (32, 5, 32, 180, 128), torch.float16, "int8"),
        ("32 x 10, Lq 32, Ld 64, int8", {}, (32, 10, 32, 64, 128), torch.float16, "int8"),
        ("8 x 16, Lq 64, Ld 256, int8 (split shape)", {}, (8, 16, 64, 256, 128), torch.float16, "int8"),
        ("32 x 10, Lq 32, Ld 1030, int8 (128-row tiles)", {}, (32, 10, 32, 1030, 128), torch.float16, "int8"),
    ]),
    *workload_rows((("SingleQueryRerank", "full"), ("HeavyRerank", "full"), ("LongDocStressPacked", "ragged")),
                   note=" (control)", fmt="int8"),
]

GROUPS = {"spills": padded_rows(SPILLS_2026_11_26), "residual": padded_rows(RESIDUAL_PAIRS),
          "grad_documents": GRAD_DOCUMENTS, "bytes": BYTES, "query_load": QUERY_LOAD, "epilogue": EPILOGUE,
          "grad_queries": GRAD_QUERIES, "bytes_lq64": BYTES_LQ64, "tail_window": TAIL_WINDOW,
          "tail_window_mma": TAIL_WINDOW_MMA,
          "residual_ffma": RESIDUAL_FFMA,
          "ffma_two_ctas": FFMA_TWO_CTAS, "ffma_async": FFMA_ASYNC,
          "ffma_sector": FFMA_SECTOR, "ffma_pieces": FFMA_PIECES, "ffma_bm128": FFMA_BM128,
          "ffma_xor": FFMA_XOR, "ffma_bytes": FFMA_BYTES,
          "residual_pieces": RESIDUAL_PIECES, "index_ahead": INDEX_AHEAD,
          "three_ctas": THREE_CTAS, "three_ctas_few_steps": THREE_CTAS_FEW_STEPS,
          "three_ctas_two_queries": THREE_CTAS_TWO_QUERIES, "wide_rule": WIDE_RULE,
          "first_tile_ahead": FIRST_TILE_AHEAD, "late_signal": LATE_SIGNAL,
          "bytes_first_tile": BYTES_FIRST_TILE}


def equal(a, b):
    """torch.equal over a call's result: a tensor, or a tuple of them (scores, argmax)."""
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="a candidate tree, built (repeatable; default: this tree, named candidate)")
    ap.add_argument("--group", default="residual",
                    help=f"one of {', '.join(sorted(GROUPS))}, or several, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import kernels

    candidates = [tuple(t.split("=", 1)) for t in args.tree] or [("candidate", ROOT)]
    trees = {"base": kernels.get_local_kernel(args.base, backend="cuda"),
             **{name: kernels.get_local_kernel(Path(d), backend="cuda") for name, d in candidates}}
    names = [name for name, _ in candidates]
    # one candidate named candidate: the keys every stored result has (ratio, bitwise_equal)
    suffix = (lambda n: "") if names == ["candidate"] else (lambda n: f"_{n}")
    torch.set_float32_matmul_precision("highest")
    rows = []
    groups = args.group.split(",")
    for g in groups:
        if g not in GROUPS:
            raise SystemExit(f"--group {g}: not one of {', '.join(sorted(GROUPS))}")
    for name, env, make in [row for g in groups for row in GROUPS[g]]:
        with knobs(env):
            calls = {t: make(ms) for t, ms in trees.items()}
            expected = calls["base"]()
            same = {n: equal(expected, calls[n]()) for n in names}
            times = {t: [] for t in trees}
            for _ in range(args.rounds):
                for t, fn in calls.items():
                    times[t].append(graph_time_ms(fn))
        base_ms = statistics.median(times["base"])
        row = {"call": name, **{f"bitwise_equal{suffix(n)}": same[n] for n in names},
               **{f"{t}_ms": [round(x, 5) for x in v] for t, v in times.items()},
               **{f"ratio{suffix(n)}": statistics.median(times[n]) / base_ms for n in names}}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
