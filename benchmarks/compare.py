#!/usr/bin/env python3
"""Side-by-side benchmark: maxsim vs naive PyTorch vs the peer packages, in one process.

    python3 benchmarks/compare.py --device cpu                      # CPU rerank table, fp32 + bf16
    python3 benchmarks/compare.py --device cuda --workloads all --json out.json
    python3 benchmarks/compare.py --device cpu --workloads Rerank,Contrastive --dtype float32 --iters 20
    python3 benchmarks/compare.py --device cpu --workloads SingleQueryRerank --documents plain,int8,float8_e4m3fn
    python3 benchmarks/render_tables.py --json out.json            # the benchmark tables

Implementations (each wrapped so a failure is reported as n/a with its reason):
- maxsim: this repository's build, loaded with kernels.get_local_kernel(<repo root>).
- naive:  torch.einsum materialising the similarity tensor in the input dtype, masked_fill
          for padding, amax, sum; for training steps autograd of that. Packed inputs are
          first scattered into padded tensors (part of the timed call).
- LIK:    late-interaction-kernels (late_interaction_kernels.maxsim with 4-D documents for
          padded rerank, score_pairs.score_pairs_packed, maxsim_varlen for corpus scoring).
- FM:     flash-maxsim (flash_maxsim_rerank_padded, flash_maxsim_varlen with every pair's query
          copied next to its document (the copy is made before timing), flash_maxsim_batched
          [_train] with padded documents).
  Both peers are Triton packages: they run on CUDA only.

Compressed documents (--documents; default "auto": on CUDA plain, int8 and float8_e4m3fn
rows for the workloads workloads.COMPRESSED names and plain rows elsewhere, on the CPU plain
rows only; formats named explicitly apply to every scoring workload named in --workloads). A compressed row
scores the same float documents as the plain row before it, quantised once with
maxsim.quantize_documents (one float32 scale per token) before any timing, the queries in
the row's dtype. Implementations:
- maxsim: the same entry point with document_scales=.
- naive: the documents read back in the query dtype (values * scales, in the timed call),
         then as above.
- LIK-fp8: late_interaction_kernels.fp8.maxsim_inference_fp8 (float8 rows), documents AND
         queries quantised per token with its quantize_fp8_per_token: both operands fp8, so
         its scores differ from maxsim's by the queries' quantisation too.
- FM-int8, FM-int8-affine: flash_maxsim_int8_symmetric / flash_maxsim_int8 (int8 rows), the
         documents quantised by its quantize_int8_symmetric (int8, fp16 scale) /
         quantize_int8 (uint8, fp16 scale and minimum), queries in float16.
Residual documents (--documents residual1, residual2, residual4, centroids; opt-in: ColBERTv2 /
PLAID codes, a centroid id and nbits bits per dimension a token, built from the same float
documents by workloads.compress before any timing, see workloads.py). Implementations:
- maxsim: the same entry point with document_codes= and residual_codec= (centroids rows:
         maxsim.score_centroids over the row's pairs, its query-centroid table included).
- maxsim-decompress: decompress-then-score: the tokens decompressed in PyTorch ops into the
         query dtype, then maxsim's float call (both in the timed call): what fusion saves.
- naive: the same PyTorch decompression, then the naive scoring (centroids rows: the
         query-centroid table gathered by code, masked max and sum in PyTorch).
- LIK-residual: late_interaction_kernels.plaid.maxsim_residual (padded) /
         maxsim_residual_varlen (packed, max_seqlen_d given: no host sync), one query a call
         at its real length (both score every query against every document, and take no query
         lengths), the residual bytes re-packed in its bit order beforehand
         (workloads.little_endian_residuals); it also L2-normalises the queries, which are unit
         vectors here, so its scores differ from maxsim's by that rounding. nbits 2 and 4 (it has
         no 1-bit path).
- LIK-centroids: plaid_approx_score, each query's [n_centroids, Lq] table (a float32 matmul)
         and its padded codes, the table inside the timed call as maxsim's is.
A residual row's bytes are codes (int32) + packed residuals + queries + scores + the centroids
once; a centroids row's leave the residuals out.

  The peers' compressed entry points take one query against a padded batch of documents
  (FM) or every query against every document (LIK): a padded rerank with B > 1 queries is a
  Python loop of B calls (each query against its own candidates), corpus scoring with FM a
  loop over the queries; their result says so in "note". They have no packed form (n/a).
A compressed row's bytes are what the call moves: values + scales + queries + the float32
scores. It also holds documents (the format), document_bytes_per_token, plain_ms and
plain_graph_ms (maxsim's times on the plain row: the same documents in the query dtype),
maxsim_over_plain / maxsim_graph_over_plain (time ratios) and max_err_vs_plain (largest
score change from quantisation on these random inputs). Every row holds copy_ms (its bytes
at the measured copy bandwidth) and every implementation of_copy / graph_of_copy
(copy_ms / time: the fraction of copy bandwidth reached). Plain rows hold documents = their
dtype.

Every implementation gets the same inputs (benchmarks/workloads.py). Training rows time
forward + backward of (scores * g).sum(). Scores are checked against maxsim's ("max err").

Time: median (and min) over --iters calls after --warmup calls; CUDA events on a GPU,
time.perf_counter on the CPU. The load average is printed and saved: CPU times taken
while other processes run are not clean.

Eager and GPU-only time (CUDA). The eager time ("ms") is CUDA events around one call as
Python issues it, so it includes launch overhead: the Python wrapper, argument checks and
kernel launches, which dominate small workloads. The GPU-only time ("graph_ms") removes
that: the same callable, closed over the same input tensors, is warmed up (3 calls) on a
side stream, captured in a torch.cuda.CUDAGraph, and the replays are timed with CUDA
events (same --warmup / --iters; median, and min in "graph_min_ms"). A graph holds
"graph_calls" calls back to back (enough for ~1 ms of eager time, at most 32) and the times
are per call: timing one call per replay would count the host's launch of the graph, 5-15 us
on an H100, as GPU time, which is most of a small call's. A call that cannot be
captured (a host sync inside it, a peer that launches outside the current stream) gets
graph_ms null and the reason in "graph_error"; the run goes on. Training rows capture the
whole step (forward + torch.autograd.grad). The replay's scores are checked against
maxsim's eager scores ("graph_max_err"). --no-graph skips it; on the CPU it is not run and
every graph field is null.

Memory ("peak extra"): the memory a call needs beyond its inputs.
- CUDA: torch.cuda.max_memory_allocated() during one call minus memory_allocated() before it.
- CPU:  each (workload, dtype, layout, implementation) runs once in a fresh subprocess, which
  builds the inputs, resets the kernel's peak-RSS counter (writes 5 to /proc/self/clear_refs),
  then reports VmHWM after the call minus VmRSS before it. The child runs with
  MALLOC_MMAP_THRESHOLD_=65536 so large buffers are mmapped and returned on free and freed
  input-building memory cannot hide the call's allocations. Where clear_refs is not writable
  it falls back to ru_maxrss growth (then input building can mask small peaks).

Floors, measured at start: copy bandwidth (a large device-to-device copy, read + write
bytes / time) and the matmul rate of each dtype (a large square matmul). The floor of a row
is max(input bytes / bandwidth, useful forward FLOPs / matmul rate), where useful FLOPs =
2 * D * sum over pairs of valid query tokens x valid document tokens (training rows use the
forward FLOPs too). "of floor" = floor / maxsim time.

JSON (--json): info (run metadata: device, device_name, torch, cuda, date, git_commit,
git_dirty, peer versions, iters, warmup, graph), floors (copy_bytes_per_s,
matmul_flops_per_s per dtype: what the floors were computed from), results (one per
workload, layout, dtype and document format) and table (the printed Markdown). A result row holds bytes, flops,
floor_ms, the maxsim summary (maxsim_GBps, maxsim_TFLOPs, of_floor: eager; graph_of_floor:
GPU-only) and impls.<name>, either {"na": reason} or ms, min_ms, max_err, peak_bytes, plus
for every implementation:
- graph_ms, graph_min_ms, graph_error, graph_max_err: GPU-only time (null where not measured);
- eager_over_graph: ms / graph_ms (the launch overhead factor);
- achieved rates, for the eager and the GPU-only time: rerank rows (padded, packed), which
  read every document once, in input TB/s (TBps, graph_TBps); the other rows in useful
  TFLOP/s (TFLOPs, graph_TFLOPs); of_floor and graph_of_floor = floor_ms / time.
benchmarks/render_tables.py renders the benchmark tables (docs/benchmarks.md, the README summary) and the chart from this JSON.

On the CPU every workload runs its scaled-down shape (see workloads.py; `scale` column =
fraction of the (query, document) pairs kept), and the default workload set is the rerank
workloads (padded, full and ragged, and packed) in float32 and bfloat16.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
IMPLS = ("maxsim", "naive", "LIK", "FM")
# Implementations of a compressed-documents row, and the formats each one takes. --impls
# names them by their package (LIK, FM), or by these names.
_RESIDUAL = tuple(W.RESIDUAL_FORMATS)
COMPRESSED_IMPLS = {"maxsim": ("int8", "float8_e4m3fn", *_RESIDUAL, W.CENTROID_FORMAT),
                    "naive": ("int8", "float8_e4m3fn", *_RESIDUAL, W.CENTROID_FORMAT),
                    "maxsim-decompress": _RESIDUAL,
                    "LIK-fp8": ("float8_e4m3fn",), "FM-int8": ("int8",),
                    "FM-int8-affine": ("int8",), "LIK-residual": _RESIDUAL,
                    "LIK-centroids": (W.CENTROID_FORMAT,)}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
RERANK = ("SmallRerank", "Rerank", "HeavyRerank", "LongDocStress", "ColPaliRerank")


# ---- implementations -------------------------------------------------------------------

def load_kernel(device, path=REPO):
    try:
        from kernels import get_local_kernel
    except ImportError:   # a bare GPU box without the `kernels` package: import the build directly
        return _import_variant(Path(path), device)
    return get_local_kernel(Path(path), backend="cpu" if device == "cpu" else None)


def _import_variant(path, device):
    import importlib.util
    import platform
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    tag = "cpu" if device == "cpu" else "cu" + torch.version.cuda.replace(".", "")
    variant = path / "build" / f"torch{major}{minor}-cxx11-{tag}-{platform.machine()}-linux"
    name = json.loads((variant / "metadata.json").read_text())["id"]
    spec = importlib.util.spec_from_file_location(
        name, variant / "__init__.py", submodule_search_locations=[str(variant)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    print(f"(kernels package not installed: imported {variant} directly)", flush=True)
    return module


def _train_step(score_fn, q, d, g):
    scores = score_fn(q, d)
    torch.autograd.grad((scores * g).sum(), (q, d))
    return scores.detach()


def _cuda_only(x):
    if x.device.type != "cuda":
        raise RuntimeError("Triton kernels, CUDA only")


def lik_fn(x: W.Inputs):
    import late_interaction_kernels as lik
    _cuda_only(x)
    w, s, ragged = x.workload, x.shape, x.layout == "ragged"
    Lq, Ld = s["Lq"], s["Ld"]
    if w.surface == "padded":
        qm = W.valid_mask(x.query_lengths, Lq) if ragged else None
        dm = W.valid_mask(x.doc_lengths, Ld) if ragged else None
        return lambda: lik.maxsim(x.queries, x.documents, qm, dm)
    if w.surface == "packed":
        from late_interaction_kernels.score_pairs import score_pairs_packed
        return lambda: score_pairs_packed(
            x.queries_packed, x.documents_packed, x.query_offsets, x.document_offsets,
            x.pair_query_ids, x.pair_document_ids, max_seqlen_q=Lq, max_seqlen_d=Ld)
    if w.train:
        q, d = W.train_leaves(x, padded_docs=True)
        qm = None if x.query_lengths is None else W.valid_mask(x.query_lengths, Lq)
        dm = W.valid_mask(x.doc_lengths, Ld) if ragged else None
        return lambda: _train_step(lambda a, b: lik.maxsim(a, b, qm, dm), q, d, x.grad_weights)
    q_packed, q_off = W.packed_queries(x)
    return lambda: lik.maxsim_varlen(q_packed, x.documents_packed, q_off, x.document_offsets,
                                     max_seqlen_q=Lq, max_seqlen_d=Ld)


def fm_fn(x: W.Inputs):
    import flash_maxsim as fm
    _cuda_only(x)
    w, s, ragged = x.workload, x.shape, x.layout == "ragged"
    Lq, Ld = s["Lq"], s["Ld"]
    if w.surface == "padded":
        ql, dl = (x.query_lengths, x.doc_lengths) if ragged else (None, None)
        return lambda: fm.flash_maxsim_rerank_padded(x.queries, x.documents, ql, dl)
    if w.surface == "packed":
        # flash_maxsim_varlen scores pair n = (query segment n, document segment n): give every
        # pair its own copy of its query (built here, outside the timed call).
        pq = x.pair_query_ids.long()
        q_len = x.query_lengths[pq]
        q_pairs = W.unpack(x.queries_packed, x.query_offsets, Lq)[pq][W.valid_mask(q_len, Lq)]
        q_off = W.offsets(q_len)
        return lambda: fm.flash_maxsim_varlen(q_pairs, x.documents_packed, q_off,
                                              x.document_offsets, Lq, Ld)
    dl = x.doc_lengths if ragged else None
    if w.train:
        q, d = W.train_leaves(x, padded_docs=True)
        return lambda: _train_step(
            lambda a, b: fm.flash_maxsim_batched_train(a, b, shared_docs=True, doc_lengths=dl,
                                                       query_lengths=x.query_lengths),
            q, d, x.grad_weights)
    d_pad = W.padded_documents(x)
    return lambda: fm.flash_maxsim_batched(x.queries, d_pad, doc_lengths=dl, shared_docs=True,
                                           query_lengths=x.query_lengths)


class NoEntryPoint(RuntimeError):
    """The package has no entry point for this surface."""


def _per_query_note(calls):
    return f"per-query loop ({calls} calls)" if calls > 1 else None


def lik_fp8_fn(x: W.Inputs):
    """late-interaction-kernels' fp8 inference: (callable, note). Both operands fp8."""
    from late_interaction_kernels.fp8 import maxsim_inference_fp8, quantize_fp8_per_token
    _cuda_only(x)
    w, s, ragged = x.workload, x.shape, x.layout == "ragged"
    Lq, Ld, D = s["Lq"], s["Ld"], w.dim
    if w.surface == "packed":
        raise NoEntryPoint("no packed fp8 entry point (padded [N, L, d] only)")
    if w.surface == "padded":
        B, C = s["B"], s["C"]
        q8, sq = quantize_fp8_per_token(x.queries)                          # [B, Lq, D], [B, Lq]
        d8, sd = quantize_fp8_per_token(x.documents.reshape(B * C, Ld, D))
        d8, sd = d8.view(B, C, Ld, D), sd.view(B, C, Ld)
        qm = W.valid_mask(x.query_lengths, Lq) if ragged else None
        dm = W.valid_mask(x.doc_lengths, Ld) if ragged else None
        # maxsim_inference_fp8 scores every query against every document: one call per
        # query against its own C candidates (slices built here, outside the timed call).
        calls = [dict(Q=q8[b:b + 1], D=d8[b], scale_Q=sq[b:b + 1], scale_D=sd[b],
                      q_mask=None if qm is None else qm[b:b + 1],
                      d_mask=None if dm is None else dm[b]) for b in range(B)]
        if B == 1:
            return (lambda: maxsim_inference_fp8(**calls[0]).view(1, C)), None
        return (lambda: torch.cat([maxsim_inference_fp8(**c) for c in calls])), _per_query_note(B)
    q8, sq = quantize_fp8_per_token(x.queries)
    d8, sd = quantize_fp8_per_token(W.padded_documents(x))
    qm = None if x.query_lengths is None else W.valid_mask(x.query_lengths, Lq)
    dm = W.valid_mask(x.doc_lengths, Ld) if ragged else None
    return (lambda: maxsim_inference_fp8(q8, d8, scale_Q=sq, scale_D=sd, q_mask=qm, d_mask=dm)), None


def fm_int8_fn(x: W.Inputs, affine=False):
    """flash-maxsim's int8 entry points: (callable, note). One query per call."""
    import flash_maxsim as fm
    _cuda_only(x)
    w, s, ragged = x.workload, x.shape, x.layout == "ragged"
    Lq, Ld = s["Lq"], s["Ld"]
    if w.surface == "packed":
        raise NoEntryPoint("no packed int8 entry point (one query x padded [B, Ld, d] only)")
    quantize = fm.quantize_int8 if affine else fm.quantize_int8_symmetric
    score = fm.flash_maxsim_int8 if affine else fm.flash_maxsim_int8_symmetric
    # Query slices at their real lengths (the int8 entry points take no query length).
    if w.surface == "padded":
        q_len = x.query_lengths.tolist() if ragged else [Lq] * s["B"]
        per_query = [(x.queries[b, :n], x.documents[b], x.doc_lengths[b] if ragged else None)
                     for b, n in enumerate(q_len)]
    else:
        docs = W.padded_documents(x)
        q_len = x.query_lengths.tolist() if x.query_lengths is not None else [Lq] * s["Nq"]
        per_query = [(x.queries[n, :k], docs, x.doc_lengths if ragged else None)
                     for n, k in enumerate(q_len)]
    calls, quantized = [], {}
    for q, d, dl in per_query:
        key = id(d)   # corpus: every query shares one quantised copy
        if key not in quantized:
            quantized[key] = quantize(d)
        calls.append((q, *quantized[key], dl))
    if len(calls) == 1:
        return (lambda: score(*calls[0]).unsqueeze(0)), None
    return (lambda: torch.stack([score(*c) for c in calls])), _per_query_note(len(calls))


def _per_query_slices(x: W.Inputs):
    """For a padded or packed rerank row: per query b, (its rows at their real length, and
    where its C candidates' tokens lie: padded index b, or the packed token range and
    its candidates' offsets from 0). Built outside the timed calls."""
    s = x.shape
    B, C, Lq = s["B"], s["C"], s["Lq"]
    q_len = x.query_lengths.tolist()
    if x.workload.surface == "padded":
        return [(x.queries[b, :q_len[b]], b) for b in range(B)]
    queries = W.unpack(x.queries_packed, x.query_offsets, Lq)
    off = x.document_offsets.tolist()
    out = []
    for b in range(B):
        t0, t1 = off[b * C], off[(b + 1) * C]
        cu = (x.document_offsets[b * C:(b + 1) * C + 1] - t0).to(torch.int32)
        out.append((queries[b, :q_len[b]], (t0, t1, cu)))
    return out


def _per_query_call(calls, one, padded, C):
    """(callable, note) running one(*c) for every query's arguments, stacked into the row's
    score shape ([B, C] padded, [B * C] packed)."""
    if len(calls) == 1:
        return (lambda: one(*calls[0]).reshape(1, C) if padded else one(*calls[0]).reshape(-1)), None
    join = torch.stack if padded else torch.cat
    return (lambda: join([one(*c) for c in calls])), _per_query_note(len(calls))


def lik_residual_fn(x: W.Inputs):
    """late-interaction-kernels' residual kernels on the row's codes: (callable, note)."""
    from late_interaction_kernels.plaid import maxsim_residual, maxsim_residual_varlen
    _cuda_only(x)
    nbits = W.RESIDUAL_FORMATS[x.documents_format]
    if nbits not in (2, 4, 8):
        raise NoEntryPoint(f"no {nbits}-bit residuals (2, 4 or 8 bits)")
    padded = x.workload.surface == "padded"
    s = x.shape
    res = W.little_endian_residuals(x.document_residuals, nbits, x.workload.dim)
    cents, weights = x.codec.centroids, x.codec.bucket_weights.float()
    calls = []
    for q, where in _per_query_slices(x):
        if padded:
            calls.append((q, x.document_codes[where], res[where], x.doc_lengths[where].long()))
        else:
            t0, t1, cu = where
            calls.append((q, x.document_codes[t0:t1], res[t0:t1], cu))
    if padded:
        def one(q, codes, r, lengths):
            return maxsim_residual(q, codes, r, lengths, cents, weights, nbits)
    else:
        def one(q, codes, r, cu):
            return maxsim_residual_varlen(q, codes, r, cu, cents, weights, nbits, max_seqlen_d=s["Ld"])
    return _per_query_call(calls, one, padded, s["C"])


def lik_centroids_fn(x: W.Inputs):
    """late-interaction-kernels' plaid_approx_score, each query's table computed in the call."""
    from late_interaction_kernels.plaid import plaid_approx_score
    _cuda_only(x)
    padded = x.workload.surface == "padded"
    s = x.shape
    B, C = s["B"], s["C"]
    codes = W.padded_codes(x)
    lengths = x.doc_lengths.reshape(B, C).long()
    cents = x.codec.centroids.float()
    calls = [(q.float(), codes[b], lengths[b]) for b, (q, _) in enumerate(_per_query_slices(x))]

    def one(q, c, lengths_b):
        return plaid_approx_score(cents @ q.T, c, lengths_b)
    return _per_query_call(calls, one, padded, C)


def make_impl(name, x: W.Inputs, kernel):
    """A zero-argument callable returning the scores, or raises with the reason it can't run."""
    return make_impl_noted(name, x, kernel)[0]


def make_impl_noted(name, x: W.Inputs, kernel):
    """(callable, note): note says how the call maps onto the implementation, or None."""
    if name == "LIK-fp8":
        return lik_fp8_fn(x)
    if name == "LIK-residual":
        return lik_residual_fn(x)
    if name == "LIK-centroids":
        return lik_centroids_fn(x)
    if name == "maxsim-decompress":
        return (lambda: W.maxsim_call(kernel, W.decompressed(x))), None
    if name in ("FM-int8", "FM-int8-affine"):
        return fm_int8_fn(x, affine=name == "FM-int8-affine")
    return make_plain_impl(name, x, kernel), None


def make_plain_impl(name, x: W.Inputs, kernel):
    if name == "maxsim":
        leaves = W.train_leaves(x) if x.workload.train else None
        return lambda: W.maxsim_call(kernel, x, leaves)
    if name == "naive":
        leaves = W.train_leaves(x, padded_docs=True) if x.workload.train else None
        return lambda: W.naive_call(x, leaves)
    return lik_fn(x) if name == "LIK" else fm_fn(x)


def _reason(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:100]


# ---- measurement -----------------------------------------------------------------------------

def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device, warmup, iters, stat=statistics.median, all_times=None):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    if device == "cuda":
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    if all_times is not None:
        all_times.extend(times)
    return stat(times)


def cuda_peak_bytes(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


# Graph fields of an implementation whose GPU-only time was not measured.
NO_GRAPH = dict(graph_ms=None, graph_min_ms=None, graph_error=None, graph_max_err=None, graph_calls=None)


def graph_calls(eager_ms):
    """Calls captured back to back in one graph: enough that a replay runs ~1 ms of eager
    time, so the host's launch of the graph (~5-15 us) stops counting as GPU time."""
    return max(1, min(32, int(1.0 / eager_ms))) if eager_ms else 1


def _capture(fn, side, calls=1):
    """`calls` calls of fn captured into a new CUDAGraph on stream `side`; returns (graph,
    the last call's output)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin()
        try:
            for _ in range(calls):
                out = fn()
        except BaseException:
            # torch.cuda.graph's __exit__ would raise from capture_end and skip restoring the
            # current stream; ending the capture here takes the stream out of capture mode
            # (even an invalidated one) and keeps the call's own error as the reason.
            try:
                graph.capture_end()
            except Exception:  # noqa: BLE001 - the invalidated capture's error says less
                pass
            raise
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            graph.capture_end()
    # A call that launches on another stream without joining it leaves an empty graph whose
    # replays time nothing: not a GPU-only time.
    if any("Graph is empty" in str(w.message) for w in caught):
        raise RuntimeError("captured graph is empty (the call does not run on the current stream)")
    return graph, out


def _replay_times(fn, warmup, iters, expected, calls):
    side = torch.cuda.Stream()
    # Warm up on the capture stream: one-time work (cuBLAS workspaces are per stream, Triton
    # compiles and autotunes, the allocator grows) must happen before the capture.
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()   # what the warm-up cached on `side` cannot serve the graph's pool
    graph, out = _capture(fn, side, calls)
    times = []
    time_ms(graph.replay, "cuda", warmup, iters, all_times=times)
    times = [t / calls for t in times]
    return dict(graph_ms=statistics.median(times), graph_min_ms=min(times), graph_error=None,
                graph_max_err=float((out.float() - expected).abs().max()), graph_calls=calls)


def graph_times(fn, warmup, iters, expected, calls=1):
    """GPU-only time of one call of fn (CUDA): graph_ms, graph_min_ms, graph_max_err,
    graph_error, graph_calls (calls per captured graph; the times are per call).

    fn is called as is, so the graph reads and writes the very tensors it closes over, and
    its replays compute what the eager calls did (graph_max_err checks the scores).
    """
    try:
        r = _replay_times(fn, warmup, iters, expected, calls)
    except Exception as e:  # noqa: BLE001 - an uncapturable call is a result, not a crash
        r = dict(NO_GRAPH, graph_error=_reason(e))
        try:
            torch.cuda.synchronize()   # raises if a stream is still capturing or the context is lost
        except Exception as e2:  # noqa: BLE001
            raise SystemExit(f"CUDA unusable after a failed graph capture ({r['graph_error']}): "
                             f"{_reason(e2)}") from e2
    # The graph and its output are gone with _replay_times' frame: return its private pool.
    torch.cuda.empty_cache()
    return r


def add_rates(row, r):
    """Achieved rates and fractions of the floor of one implementation, eager and GPU-only.

    Rerank rows read every document for one query only, so bandwidth bounds them: rate in
    input TB/s. Contrastive rows reuse each document across queries: useful TFLOP/s.
    """
    rerank = row["surface"] in ("padded", "packed")
    unit, work = ("TBps", row["bytes"]) if rerank else ("TFLOPs", row["flops"])
    for prefix, ms in (("", r.get("ms")), ("graph_", r.get("graph_ms"))):
        r[prefix + unit] = work / (ms * 1e-3) / 1e12 if ms else None
        r[prefix + "of_floor"] = row["floor_ms"] / ms if ms else None
    r["eager_over_graph"] = r["ms"] / r["graph_ms"] if r.get("ms") and r.get("graph_ms") else None
    if row.get("copy_ms") is not None:
        for prefix, ms in (("", r.get("ms")), ("graph_", r.get("graph_ms"))):
            r[prefix + "of_copy"] = row["copy_ms"] / ms if ms else None


def _status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def cpu_child(spec: dict) -> dict:
    """Runs in a fresh process: one call of one implementation, peak RSS growth over it."""
    torch.set_num_threads(spec["threads"])
    w = W.WORKLOADS[spec["workload"]]
    x = W.build_inputs(w, "cpu", DTYPES[spec["dtype"]], spec["layout"])
    fmt = spec.get("documents")
    kernel = load_kernel("cpu", spec["kernel"]) if spec["impl"] == "maxsim" or fmt else None
    if fmt:
        x = W.compress(x, kernel, fmt)
    fn = make_impl(spec["impl"], x, kernel)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        method, before = "VmHWM", _status_kib("VmRSS")
    except OSError:
        method, before = "ru_maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn()
    after = _status_kib("VmHWM") if method == "VmHWM" else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_bytes": (after - before) * 1024, "method": method}


def cpu_peak_bytes(workload, dtype, layout, impl, kernel_path, documents=None):
    spec = dict(workload=workload, dtype=dtype, layout=layout, impl=impl, kernel=str(kernel_path),
                threads=torch.get_num_threads(), documents=documents)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, __file__, "--_child", json.dumps(spec)], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError((out.stderr.strip().splitlines() or ["child failed"])[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]


def measure_floors(device, dtypes):
    """Copy bandwidth (bytes/s) and matmul rate per dtype (FLOP/s) of this device."""
    # CPU: short calls, best of many, so a busy machine's preemptions do not lower the floor.
    n = (1 << 30 if device == "cuda" else 1 << 26) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t = time_ms(lambda: dst.copy_(src), device, 3, 20, stat=min)   # best: the hardware's limit
    floors = {"copy_bytes_per_s": 2 * src.numel() * 4 / (t * 1e-3), "matmul_flops_per_s": {}}
    del src, dst
    m = 8192 if device == "cuda" else 1024
    for name in dtypes:
        a = torch.randn(m, m, device=device).to(DTYPES[name])
        b = torch.randn(m, m, device=device).to(DTYPES[name])
        t = time_ms(lambda: a @ b, device, 2, 20, stat=min)
        floors["matmul_flops_per_s"][name] = 2 * m ** 3 / (t * 1e-3)
    return floors


# ---- driver --------------------------------------------------------------------------------

def rows_to_run(args):
    device = args.device
    if args.workloads == "default":
        names = ",".join(RERANK + tuple(n + "Packed" for n in RERANK)) if device == "cpu" else "all"
    else:
        names = args.workloads
    rows = []
    for w in W.resolve(names):
        if args.dtype == "auto":
            dtypes = ["float32", "bfloat16"] if device == "cpu" else \
                [{torch.float16: "float16", torch.bfloat16: "bfloat16"}[w.gpu_dtype]]
        else:
            dtypes = args.dtype.split(",")
        if args.layout == "table":
            layouts = ["full", "ragged"] if w.surface == "padded" else [w.layout]
        elif args.layout == "default":
            layouts = [w.layout]
        else:
            layouts = ["full", "ragged"] if args.layout == "both" else [args.layout]
        if w.surface == "packed":
            layouts = ["ragged"]
        # --documents auto: compressed rows only on the workloads W.COMPRESSED names; a
        # format named explicitly applies to every scoring workload asked for.
        formats = [None]
        named = args.documents != "auto" and args.workloads not in ("all", "default")
        if not w.train and (w.name in W.COMPRESSED or named):
            formats = document_formats(args.documents, device)
        rows += [(w, dt, lay, fmt) for dt in dtypes for lay in layouts for fmt in formats]
    return rows


def document_formats(spec, device):
    """--documents -> [None (plain), format, ...] for a workload that takes compressed ones."""
    if spec == "auto":
        spec = "plain,int8,float8_e4m3fn" if device == "cuda" else "plain"
    out = []
    for name in spec.split(","):
        if name not in ("plain", *W.ALL_FORMATS):
            raise SystemExit(f"unknown --documents entry {name!r}; known: plain, "
                             + ", ".join(W.ALL_FORMATS))
        out.append(None if name == "plain" else name)
    return out


def compressed_impls(fmt, wanted):
    """Implementations of a row with documents in format fmt, in order, filtered by --impls."""
    def on(name):
        return name in wanted or name.split("-")[0] in wanted
    return [n for n, formats in COMPRESSED_IMPLS.items() if fmt in formats and on(n)]


def run(args):
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False")
    plan = rows_to_run(args)
    graph = device == "cuda" and not args.no_graph
    kernel = load_kernel(device, args.kernel)
    floors = measure_floors(device, sorted({dt for _, dt, _, _ in plan}))
    bw = floors["copy_bytes_per_s"]
    print(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU, %d threads' % torch.get_num_threads()}), "
          f"torch {torch.__version__}; copy {bw / 1e9:.1f} GB/s, matmul "
          + ", ".join(f"{k} {v / 1e12:.3f} TFLOP/s" for k, v in floors["matmul_flops_per_s"].items()),
          flush=True)
    if device == "cpu" and os.getloadavg()[0] > 0.5:
        print(f"warning: load average {os.getloadavg()[0]:.1f}: other processes share the CPU, "
              "so the CPU times are not clean", flush=True)
    results = []
    plain = {}   # (workload, dtype, layout) -> the plain row's maxsim scores and row
    for w, dt, layout, fmt in plan:
        x = W.build_inputs(w, device, DTYPES[dt], layout)
        row = dict(workload=w.name, surface=w.surface, train=w.train, layout=layout, dtype=dt,
                   documents=fmt or dt, shape=x.shape, scale=w.cpu_scale if device == "cpu" else 1.0,
                   impls={})
        names = [n for n in IMPLS if n in args.impls]
        try:
            if fmt is not None:
                names = compressed_impls(fmt, args.impls)
                x = W.compress(x, kernel, fmt)   # once, outside every timed call
        except Exception as e:  # noqa: BLE001 - no quantize_documents: every impl is n/a
            names, why = [], _reason(e)
            row["impls"] = {n: dict(na=why, **NO_GRAPH) for n in compressed_impls(fmt, args.impls)}
        row.update(bytes=x.bytes_in(), flops=x.useful_flops(),
                   document_bytes_per_token=x.document_bytes_per_token())
        row["copy_ms"] = 1e3 * row["bytes"] / bw
        row["floor_ms"] = 1e3 * max(row["bytes"] / bw,
                                    row["flops"] / floors["matmul_flops_per_s"][dt])
        expected = None
        for name in names:
            r = {}
            try:
                fn, note = make_impl_noted(name, x, kernel)
                if note:
                    r["note"] = note
                scores = fn()
                sync(device)
                if expected is None:
                    expected = scores.float()
                r["max_err"] = float((scores.float() - expected).abs().max())
                times = []
                r["ms"] = time_ms(fn, device, args.warmup, args.iters, all_times=times)
                r["min_ms"] = min(times)
                if not args.no_memory:
                    r["peak_bytes"] = cuda_peak_bytes(fn) if device == "cuda" else \
                        cpu_peak_bytes(w.name, dt, layout, name, args.kernel, fmt)
                # After the memory measurement: the graph's pool must not count as peak.
                r.update(graph_times(fn, args.warmup, args.iters, expected, graph_calls(r["ms"]))
                         if graph else NO_GRAPH)
                del fn
            except Exception as e:  # noqa: BLE001 - a peer failing is a result, not a crash
                r = dict(na=_reason(e), **NO_GRAPH)
            add_rates(row, r)
            row["impls"][name] = r
        for r in row["impls"].values():
            if "ms" not in r:
                add_rates(row, r)
        m = row["impls"].get("maxsim", {})
        if "ms" in m:
            row["maxsim_GBps"] = row["bytes"] / (m["ms"] * 1e-3) / 1e9
            row["maxsim_TFLOPs"] = row["flops"] / (m["ms"] * 1e-3) / 1e12
            row["of_floor"] = m["of_floor"]  # add_rates computed it
        row["graph_of_floor"] = m.get("graph_of_floor")
        key = (w.name, dt, layout)
        if fmt is None:
            plain[key] = (expected if "ms" in m else None, m)
        else:
            compare_with_plain(row, *plain.get(key, (None, {})), expected if "ms" in m else None)
        results.append(row)
        print(progress_line(row), flush=True)
        del x
        if device == "cuda":
            torch.cuda.empty_cache()
    return floors, results


def compare_with_plain(row, plain_scores, plain_maxsim, scores):
    """A compressed row's maxsim times and scores against its plain row's (None where the
    plain row did not run)."""
    m = row["impls"].get("maxsim", {})
    row["plain_ms"], row["plain_graph_ms"] = plain_maxsim.get("ms"), plain_maxsim.get("graph_ms")
    row["maxsim_over_plain"] = m["ms"] / row["plain_ms"] if m.get("ms") and row["plain_ms"] else None
    row["maxsim_graph_over_plain"] = (m["graph_ms"] / row["plain_graph_ms"]
                                      if m.get("graph_ms") and row["plain_graph_ms"] else None)
    row["max_err_vs_plain"] = (float((scores - plain_scores).abs().max())
                               if scores is not None and plain_scores is not None
                               and scores.numel() else None)


def _ms(r, graph=False):
    """'eager (min)'; with graph, 'eager / GPU-only' (mins are in the JSON)."""
    if "ms" not in r:
        return "n/a"
    if not graph:
        return f"{r['ms']:.3f} ({r['min_ms']:.3f})"
    return f"{r['ms']:.3f} / " + (f"{r['graph_ms']:.3f}" if r.get("graph_ms") is not None else "n/a")


def _graph_measured(results):
    return any(r.get("graph_ms") is not None or r.get("graph_error")
               for row in results for r in row["impls"].values())


def progress_line(row):
    graph = _graph_measured([row])
    parts = [f"{n} {_ms(r, graph)}" for n, r in row["impls"].items()]
    return f"  {row['workload']:<20} {row['layout']:<6} {_dtype_cell(row):<8} " + "  ".join(parts)


def _dtype_cell(row):
    """The dtype, and the document format where the documents are compressed."""
    docs = row.get("documents", row["dtype"])
    return row["dtype"] if docs == row["dtype"] else f"{row['dtype']} / {docs} docs"


def _ratio(x):
    return "n/a" if x is None else f"{x:.2f}x"


def _pct(x):
    return "n/a" if x is None else f"{100 * x:.0f}%"


def markdown(device, floors, results, impls):
    order = list(impls) + [n for n in COMPRESSED_IMPLS if n not in impls]
    ran = [n for n in order if any("ms" in r["impls"].get(n, {}) for r in results)]
    compressed = any(r.get("documents", r["dtype"]) != r["dtype"] for r in results)
    graph = _graph_measured(results)
    lines = []
    head = ["workload", "layout", "dtype"] + (["scale"] if device == "cpu" else []) + \
        [f"{n} ms eager / GPU-only" if graph else f"{n} ms (min)" for n in ran] + \
        ["naive / maxsim"] + [f"{n} peak" for n in ran] + \
        ["floor ms", "maxsim of floor" + (" eager / GPU-only" if graph else ""),
         "maxsim GB/s", "maxsim TFLOP/s", "max err vs maxsim"] + \
        (["maxsim time vs plain docs" + (" eager / GPU-only" if graph else "")] if compressed else [])
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    for row in results:
        im = row["impls"]
        speed = (f"{im['naive']['ms'] / im['maxsim']['ms']:.2f}x"
                 if "ms" in im.get("naive", {}) and "ms" in im.get("maxsim", {}) else "n/a")
        errs = [r[k] for r in im.values() for k in ("max_err", "graph_max_err")
                if r.get(k) is not None]
        of_floor = _pct(row.get("of_floor"))
        if graph:
            of_floor += " / " + _pct(row.get("graph_of_floor"))
        cells = [row["workload"], row["layout"], _dtype_cell(row)]
        if device == "cpu":
            cells.append(f"{row['scale']:.3g}")
        cells += [_ms(im.get(n, {}), graph) for n in ran] + [speed]
        cells += [W.fmt_bytes(im[n]["peak_bytes"]) if "peak_bytes" in im.get(n, {}) else "n/a"
                  for n in ran]
        cells += [f"{row['floor_ms']:.3f}", of_floor,
                  f"{row['maxsim_GBps']:.1f}" if "maxsim_GBps" in row else "n/a",
                  f"{row['maxsim_TFLOPs']:.3f}" if "maxsim_TFLOPs" in row else "n/a",
                  f"{max(errs):.1e}" if errs else "n/a"]
        if compressed:
            ratio = _ratio(row.get("maxsim_over_plain"))
            if graph:
                ratio += " / " + _ratio(row.get("maxsim_graph_over_plain"))
            cells.append(ratio if row.get("documents", row["dtype"]) != row["dtype"] else "")
        lines.append("| " + " | ".join(cells) + " |")
    reasons = {}
    for row in results:
        for n, r in row["impls"].items():
            if "na" in r:
                reasons.setdefault(n, set()).add(r["na"])
            elif r.get("note"):
                reasons.setdefault(f"{n} call", set()).add(r["note"])
            elif r.get("graph_error"):
                reasons.setdefault(f"{n} GPU-only", set()).add(r["graph_error"])
    for n, rs in reasons.items():
        lines.append(f"\n{n}: " + ("" if n.endswith(" call") else "n/a ")
                     + f"({'; '.join(sorted(rs))})")
    lines.append(f"\nfloors: copy {floors['copy_bytes_per_s'] / 1e9:.1f} GB/s; matmul "
                 + ", ".join(f"{k} {v / 1e12:.3f} TFLOP/s"
                             for k, v in floors["matmul_flops_per_s"].items()))
    shapes = {r["workload"]: W.WORKLOADS[r["workload"]].describe(r["shape"]) for r in results}
    lines.append("shapes: " + "; ".join(f"{k} {v}" for k, v in shapes.items()))
    lines.append("peak = memory a call needs beyond its inputs "
                 + ("(torch.cuda.max_memory_allocated)" if device == "cuda"
                    else "(peak RSS growth over one call in a fresh subprocess)"))
    if graph:
        lines.append("eager = CUDA events around one call issued from Python (launch overhead "
                     "included); GPU-only = the same call captured in a CUDA graph (several "
                     "calls back to back for small ones), replayed, per call")
    return "\n".join(lines)


def _git(*cmd):
    # GIT_OPTIONAL_LOCKS=0: `git status` must not take the index lock from a concurrent git.
    try:
        out = subprocess.run(["git", "-C", str(REPO), *cmd], capture_output=True, text=True,
                             timeout=10, env=dict(os.environ, GIT_OPTIONAL_LOCKS="0"))
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def _version(dist):
    import importlib.metadata
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_info(args, started):
    """What a table rendered from the JSON must state: where, with what, when, at which commit."""
    # MAXSIM_BENCH_COMMIT: the commit a copied working tree holds, where its .git (if any)
    # does not describe it (a remote machine that receives the files but not the history).
    commit = os.environ.get("MAXSIM_BENCH_COMMIT") or _git("rev-parse", "HEAD")
    dirty = "" if os.environ.get("MAXSIM_BENCH_COMMIT") else _git("status", "--porcelain", "--untracked-files=no")
    cuda = args.device == "cuda"
    return dict(device=args.device, torch=torch.__version__, iters=args.iters,
                warmup=args.warmup, threads=torch.get_num_threads(),
                loadavg_at_end=os.getloadavg(),
                gpu=torch.cuda.get_device_name() if cuda else None,
                device_name=torch.cuda.get_device_name() if cuda else _cpu_name(),
                cuda=torch.version.cuda if cuda else None,
                date=started, git_commit=commit,
                git_dirty=None if commit is None or dirty is None else bool(dirty),
                graph=cuda and not args.no_graph,
                versions={d: _version(d) for d in
                          ("kernels", "late-interaction-kernels", "flash-maxsim", "triton")})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workloads", default="default",
                   help="'all', 'default' (CPU: the rerank workloads; CUDA: all) or name,name")
    p.add_argument("--dtype", default="auto",
                   help="'auto' (CPU: float32,bfloat16; CUDA: the table's fp16/bf16) or a list")
    p.add_argument("--layout", default="table", choices=("table", "default", "full", "ragged", "both"),
                   help="table: padded rerank in both layouts, the rest as in the table")
    p.add_argument("--impls", default=",".join(IMPLS),
                   help="maxsim,naive,LIK,FM (LIK and FM also select their compressed entry points)")
    p.add_argument("--documents", default="auto",
                   help="plain and/or compressed formats (int8, float8_e4m3fn, residual1, residual2, "
                        "residual4, centroids), comma-separated; 'auto': CUDA plain, int8 and "
                        "float8_e4m3fn on the compressed workloads, CPU plain")
    p.add_argument("--kernel", default=str(REPO), help="kernel repository (default: this one)")
    p.add_argument("--iters", type=int, default=None, help="timed calls (default: CUDA 50, CPU 10)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (CUDA 10, CPU 2)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--no-graph", action="store_true",
                   help="CUDA: skip the GPU-only time (CUDA-graph capture and replay)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        print(json.dumps(cpu_child(json.loads(args._child))))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    args.impls = args.impls.split(",")
    args.iters = args.iters or (50 if args.device == "cuda" else 10)
    args.warmup = args.warmup if args.warmup is not None else (10 if args.device == "cuda" else 2)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    floors, results = run(args)
    table = markdown(args.device, floors, results, args.impls)
    print("\n" + table)
    if args.json:
        info = run_info(args, started)
        Path(args.json).write_text(json.dumps(
            dict(info=info, floors=floors, results=results, table=table), indent=2, default=str))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
