"""CUDA-only: large shapes, 64-bit indexing, CUDA graphs, streams, determinism at scale.

Skipped unless a CUDA backend was built (see conftest.BACKENDS). Expected values for the
large shapes are computed on the GPU in float64, chunked so no [Lq, Ld] float64 matrix
grows past a few hundred MB.
"""
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import (
    BACKENDS, REF, REPO_ROOT, Contrastive, ContrastivePadded, Padded, SURFACES,
    as_padded_documents, assert_argmax, assert_grads, assert_scores, document_views, expected_grads, ids, lattice,
    kernel_names, load_kernel, make_case, make_contrastive, make_packed, make_padded,
    rounded_as_the_kernels_see_it, run_train, unit,
)

pytestmark = pytest.mark.skipif("cuda" not in BACKENDS, reason="no CUDA backend built")
CUDA = torch.device("cuda")
FORMS = ("", "_with_argmax", "_train")


@pytest.fixture(scope="module")
def ms():
    return load_kernel("cuda")


@pytest.fixture(autouse=True)
def no_value_checks(monkeypatch):
    monkeypatch.delenv("MAXSIM_CHECK_VALUES", raising=False)


def free_gib() -> float:
    return torch.cuda.mem_get_info()[0] / 2**30


# ---- chunked float64 reference on the GPU ----------------------------------------------------

def maxsim_rows(q: torch.Tensor, d: torch.Tensor, chunk=1 << 20):
    """q [M, D], d [N, D] on the GPU -> (best [M], lowest argmax [M], runner-up [M]) in float64,
    computed over document chunks."""
    q = q.double()
    m = q.shape[0]
    best = torch.full((m,), float("-inf"), dtype=torch.float64, device=q.device)
    arg = torch.full((m,), -1, dtype=torch.int64, device=q.device)
    second = best.clone()
    step = max(1, chunk // max(m, 1))
    for s in range(0, d.shape[0], step):
        sims = q @ d[s:s + step].double().T
        top = sims.topk(min(2, sims.shape[1]), dim=1)
        c_best, c_arg = top.values[:, 0], top.indices[:, 0] + s
        c_second = top.values[:, 1] if sims.shape[1] > 1 else torch.full_like(c_best, float("-inf"))
        better = c_best > best
        second = torch.where(better, torch.maximum(best, c_second), torch.maximum(second, c_best))
        arg = torch.where(better, c_arg, arg)
        best = torch.maximum(best, c_best)
    return best, arg, second


def check_pair(score, argmax_row, q, d, dtype):
    """One (query, document) pair of a large case: score within tolerance, argmax exact where
    the max is unique by a margin, a maximal token elsewhere."""
    best, arg, second = maxsim_rows(q, d)
    expected = best.sum().item()
    tol = (1e-4 if dtype != torch.float32 else 1e-5) * (abs(expected) + q.shape[0])
    assert abs(score - expected) <= tol, (score, expected)
    if argmax_row is None:
        return
    a = argmax_row[:q.shape[0]].long()
    assert (argmax_row[q.shape[0]:] == -1).all()
    margin = 4 * torch.finfo(torch.float32).eps * q.shape[1]
    unique = (best - second) > margin
    assert torch.equal(a[unique], arg[unique]), "argmax differs on a unique max"
    got = (q.double() * d[a].double()).sum(-1)
    assert (got >= best - margin).all()


# ---- large shapes -----------------------------------------------------------------------------

@pytest.mark.parametrize("lq,ld", [(2048, 4096), (512, 32768), (2048, 32768)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_long_queries_and_documents(ms, lq, ld, dtype):
    gen = torch.Generator().manual_seed(lq * 7 + ld)
    case = make_padded(gen, 1, 2, lq, ld, 128, dtype=dtype, device=CUDA,
                       q_lens=[lq], d_lens=[[ld, ld - 1000]])
    scores, argmax = case.call(ms, "_with_argmax")
    torch.testing.assert_close(case.call(ms), scores, rtol=1e-5, atol=1e-4)
    for c, dl in enumerate([ld, ld - 1000]):
        check_pair(scores[0, c].item(), argmax[0, c], case.queries[0], case.documents[0, c, :dl], dtype)


# A document of at least BN rows (BN 32, 64 or 128, by kernel shape) is walked in whole tiles:
# its short last tile starts early, over rows of the tile before, to end at the document's last
# row. The lengths below leave last tiles of every size against each BN.
WINDOW_DOC_LENS = [33, 47, 63, 65, 97, 100, 129, 150, 180, 200, 255, 20]
WINDOW_BNS = (32, 64, 128)


def _window_case(rng, surface, dtype, values):
    lens = WINDOW_DOC_LENS
    if surface == "padded":
        return make_padded(rng, 2, len(lens), 32, max(lens), 128, dtype=dtype, device="cuda",
                           d_lens=[lens, lens[::-1]], q_lens=[32, 17], values=values)
    if surface == "contrastive":
        return make_contrastive(rng, 3, 32, lens, 128, dtype=dtype, device="cuda", q_lens=None, values=values)
    return make_packed(rng, [32, 9, 40], lens, 128, dtype=dtype, device="cuda", values=values)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("surface", ["padded", "contrastive", "packed"])
def test_last_tile_rows_taken_again(ms, monkeypatch, rng, surface, dtype):
    """Rows a short last tile may take again (the mma.sync kernels' window; float32 runs the
    FFMA kernels, which keep a masked tile) change nothing: with lattice values (exact ties
    everywhere) the scores are bitwise the reference's and the argmax is the lowest tied row; a
    NaN in such a row is the argmax of every query row, also with a later NaN in the tile."""
    monkeypatch.setenv("MAXSIM_CUDA_FORCE_MMA_SYNC", "1")  # sm_90a: keep the calls off its kernels
    case = _window_case(rng, surface, dtype, lattice)
    for rows, n in document_views(case):
        for bn in WINDOW_BNS:  # a row taken again ties an earlier one
            if n > bn and n % bn:
                rows[n - bn] = rows[(n - bn) // 2]
    scores, argmax = case.call(ms, "_with_argmax")
    assert_scores(scores, case, exact=True)
    assert_argmax(argmax, case, exact=True)
    case = _window_case(rng, surface, dtype, unit)
    for k, (rows, n) in enumerate(document_views(case)):
        bn = WINDOW_BNS[k % len(WINDOW_BNS)]
        if n > bn and n % bn:
            rows[n - bn, 5] = float("nan")
            rows[n - 1, 7] = float("nan")
    scores, argmax = case.call(ms, "_with_argmax")
    assert_scores(scores, case)
    assert_argmax(argmax, case, exact=True)


def test_long_training_step(ms):
    """DocDoc-like: contrastive training with Lq = Ld = 1024, grads vs the reference."""
    gen = torch.Generator().manual_seed(5)
    case = make_contrastive(gen, 8, 1024, [1024, 700, 1024, 1, 512, 1024, 900, 1000], 128,
                            dtype=torch.bfloat16, device=CUDA)
    g = unit(gen, *case.score_shape).to(CUDA)
    scores, gq, gd = run_train(ms, case, g)
    _, argmax = case.call(ms, "_with_argmax")
    q64, d64 = case.queries.double(), case.documents.double()
    eq, ed = REF.score_contrastive_backward_reference(g.double(), q64, d64, case.document_offsets,
                                                       argmax, case.query_lengths)
    bq, bd = REF.score_contrastive_backward_reference(g.double().abs(), q64.abs(), d64.abs(),
                                                       case.document_offsets, argmax, case.query_lengths)
    assert_grads(gq, eq, bq, torch.bfloat16)
    assert_grads(gd, ed, bd, torch.bfloat16)
    expected = REF.score_contrastive_reference(q64, d64, case.document_offsets, case.query_lengths)
    assert_scores(scores, case, expected.cpu())


def grad_documents_case(surface, gen, dtype, dim):
    """Many entries per document row (in-batch training: sorted by the default rule) with
    ragged, empty and one-row documents, short queries and more than one batch of entries."""
    if surface == "padded":
        return make_padded(gen, 6, 5, 40, 70, dim, dtype=dtype, device=CUDA)
    if surface == "packed":
        return make_packed(gen, torch.randint(0, 41, (30,), generator=gen).tolist(),
                           [0, 1, 37, 120, 5, 64, 0, 90], dim, n_pairs=400, dtype=dtype, device=CUDA)
    case = make_contrastive(gen, 90, 40, [0, 1, 37, 150, 5, 64, 129, 0, 90], dim, dtype=dtype, device=CUDA)
    return as_padded_documents(case) if surface == "contrastive_padded" else case


@pytest.mark.parametrize("skew", [0, 4, 50], ids=["even", "skewed", "heavy"])
@pytest.mark.parametrize("dim", [128, 200, 36])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("surface", SURFACES)
def test_grad_documents_kernels_agree(ms, monkeypatch, surface, dtype, dim, skew):
    """grad_documents by the scan and the sorted kernel (MAXSIM_CUDA_GRAD_D forces one), the
    latter also over 184-row windows (MAXSIM_CUDA_GRAD_D_ROWS; the 192-row kernel, float
    accumulators) and with its hits binned by window first (MAXSIM_CUDA_GRAD_D_BINNED;
    contrastive surfaces, float accumulators: at 16 rows the 150-row document's windows take
    three laps of the grid's slots, at 128 one window takes two batches): the same bits (all
    add a row's contributions in entry order), and the float64 reference. Skewed: every fifth
    document row scaled by 4 takes most argmaxes, so the sorted kernel meets rows of many hits
    (groups inside one row) beside rows of one or none (groups that cross rows). Heavy: every
    37th row scaled by 50, so a few rows take most of a batch's hits and the warps' shares of
    the list (batch_rows) fall on very uneven blocks of rows, some of them empty."""
    gen = torch.Generator().manual_seed(dim * 31 + len(surface) + 7 * (skew > 0) + skew // 50)
    case = grad_documents_case(surface, gen, dtype, dim)
    if skew:
        d = case.documents.clone()
        rows = d.view(-1, d.shape[-1])
        rows[::5 if skew == 4 else 37] *= skew
        case = case.with_qd(case.queries, d)
    g = unit(gen, *case.score_shape).to(CUDA)
    grads = {}
    runs = (("scan", "0", "0"), ("sorted", "0", "0"), ("sorted", "184", "0"), ("sorted", "16", "1"),
            ("sorted", "128", "1"))
    for kernel, rows, binned in runs:
        monkeypatch.setenv("MAXSIM_CUDA_GRAD_D", kernel)
        monkeypatch.setenv("MAXSIM_CUDA_GRAD_D_ROWS", rows)
        monkeypatch.setenv("MAXSIM_CUDA_GRAD_D_BINNED", binned)
        _, _, grads[kernel, rows] = run_train(ms, case, g, need_q=False)
    for _, rows, _ in runs[1:]:
        assert torch.equal(grads["scan", "0"], grads["sorted", rows]), rows
    _, ed, _, bd = expected_grads(case, g, case.call(ms, "_with_argmax")[1])
    assert_grads(grads["sorted", "0"], ed, bd, dtype)
    assert grads["sorted", "0"].abs().sum() > 0


@pytest.mark.parametrize("shape", [(24, 32), (769, 1), (32, 32), (1025, 1), (48, 32), (64, 32), (2049, 1),
                                   (96, 33)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=str)
def test_grad_documents_batch_boundaries(ms, monkeypatch, shape, dtype):
    """Contrastive documents whose entry count (queries x query rows) is one batch of the
    sorted kernel, one entry past it, or whole and ragged multiples: 1,024 is the 192-row
    kernel's batch and float64's, 2,048 the 128-row kernel's for 16-bit queries. Each warp's
    run of hits then ends at every offset of the apply's half-groups. The scan kernel's bits
    in both sorted kernels (184-row windows: the 192-row one; 128: the narrow one, two windows
    of the 150-row document), and the float64 reference."""
    nq, lq = shape
    gen = torch.Generator().manual_seed(nq * 64 + lq)
    case = make_contrastive(gen, nq, lq, [180, 1, 0, 37, 150], 128, dtype=dtype, device=CUDA, q_lens=None)
    g = unit(gen, *case.score_shape).to(CUDA)
    grads = {}
    for kernel, rows in (("scan", "0"), ("sorted", "128"), ("sorted", "184")):
        monkeypatch.setenv("MAXSIM_CUDA_GRAD_D", kernel)
        monkeypatch.setenv("MAXSIM_CUDA_GRAD_D_ROWS", rows)
        monkeypatch.setenv("MAXSIM_CUDA_GRAD_D_BINNED", "0")
        _, _, grads[kernel, rows] = run_train(ms, case, g, need_q=False)
    for rows in ("128", "184"):
        assert torch.equal(grads["scan", "0"], grads["sorted", rows]), rows
    _, ed, _, bd = expected_grads(case, g, case.call(ms, "_with_argmax")[1])
    assert_grads(grads["sorted", "184"], ed, bd, dtype)
    assert grads["sorted", "184"].abs().sum() > 0


def scan_and_sorted_agree(ms, monkeypatch, case, gen, launches=None):
    """grad_documents of a bfloat16 contrastive case by the scan kernel and by the sorted one
    as the host configures it by default: the same bits, and the float64 reference; the
    sorted run launches a kernel named `launches` where given."""
    g = unit(gen, *case.score_shape).to(CUDA)
    grads = {}
    for kernel in ("scan", "sorted"):
        monkeypatch.setenv("MAXSIM_CUDA_GRAD_D", kernel)
        (_, _, grads[kernel]), names = kernel_names(lambda: run_train(ms, case, g, need_q=False))
    if launches is not None:
        assert any(launches in n for n in names), names
    assert torch.equal(grads["scan"], grads["sorted"])
    _, ed, _, bd = expected_grads(case, g, case.call(ms, "_with_argmax")[1])
    assert_grads(grads["sorted"], ed, bd, torch.bfloat16)


@pytest.mark.parametrize("surface", ["contrastive", "contrastive_padded"])
def test_grad_documents_one_window_per_passage(ms, monkeypatch, surface):
    """In-batch training over 180-row passages (BigColBERT's shape, scaled down): two
    documents an SM make the cost model take one 184-row window a document (the 192-row
    kernel, two CTAs an SM on sm_90) over the two 96-row windows of the 128-row kernel. Whichever
    runs, the scan kernel's bits and the float64 reference."""
    monkeypatch.delenv("MAXSIM_CUDA_GRAD_D_ROWS", raising=False)
    gen = torch.Generator().manual_seed(184)
    n_docs = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    case = make_contrastive(gen, 48, 32, [180] * n_docs, 128, dtype=torch.bfloat16, device=CUDA)
    if surface == "contrastive_padded":
        case = as_padded_documents(case)
    scan_and_sorted_agree(ms, monkeypatch, case, gen)


@pytest.mark.parametrize("surface", ["contrastive", "contrastive_padded"])
def test_grad_documents_binned_by_default(ms, monkeypatch, surface):
    """Documents of many windows (DocDoc's shape, scaled down: 16 queries of 1,024 rows, so
    16,384 entries a document) take the sorted kernel with its hits binned by window by
    default; the 2,000-row segment is longer than a lap of the grid's windows, so its slots
    hold hits of several windows. The scan kernel's bits and the float64 reference."""
    monkeypatch.delenv("MAXSIM_CUDA_GRAD_D_ROWS", raising=False)
    monkeypatch.delenv("MAXSIM_CUDA_GRAD_D_BINNED", raising=False)
    gen = torch.Generator().manual_seed(1024)
    case = make_contrastive(gen, 16, 1024, [1024, 700, 2000, 1, 512, 1024, 0, 1500], 128,
                            dtype=torch.bfloat16, device=CUDA)
    if surface == "contrastive_padded":
        case = as_padded_documents(case)
    scan_and_sorted_agree(ms, monkeypatch, case, gen, launches="bin_hits_kernel")


@pytest.mark.parametrize("surface", ["contrastive", "contrastive_padded"])
def test_grad_documents_binned_many_slots(ms, monkeypatch, surface):
    """The binning's placing pass with tens of grid slots and several chunks of entries: at
    16-row windows the call has 44 slots a document (packed documents, by their average
    length; the 2,000-row segment takes three laps of them) or 125 (padded to 2,000 rows), many
    empty in any one chunk of 2,048 entries, so the write-out's search over the slots' staging
    starts meets long runs of equal starts; 20 queries of 300 rows are three chunks. The scan
    kernel's bits and the float64 reference."""
    gen = torch.Generator().manual_seed(55)
    case = make_contrastive(gen, 20, 300, [2000, 3, 0, 1500, 17], 128, dtype=torch.bfloat16, device=CUDA)
    if surface == "contrastive_padded":
        case = as_padded_documents(case)
    g = unit(gen, *case.score_shape).to(CUDA)
    grads = {}
    for kernel, binned in (("scan", "0"), ("sorted", "1")):
        monkeypatch.setenv("MAXSIM_CUDA_GRAD_D", kernel)
        monkeypatch.setenv("MAXSIM_CUDA_GRAD_D_ROWS", "16")
        monkeypatch.setenv("MAXSIM_CUDA_GRAD_D_BINNED", binned)
        (_, _, grads[kernel]), names = kernel_names(lambda: run_train(ms, case, g, need_q=False))
        if kernel == "sorted":
            assert any("bin_hits_kernel" in n for n in names), names
    assert torch.equal(grads["scan"], grads["sorted"])
    _, ed, _, bd = expected_grads(case, g, case.call(ms, "_with_argmax")[1])
    assert_grads(grads["sorted"], ed, bd, torch.bfloat16)
    assert grads["sorted"].abs().sum() > 0


@pytest.mark.parametrize("surface", SURFACES)
def test_thousands_of_candidates(ms, surface):
    gen = torch.Generator().manual_seed(11)
    if surface == "padded":
        case = make_padded(gen, 4, 3000, 32, 128, 128, dtype=torch.float16, device=CUDA)
    elif surface.startswith("contrastive"):
        case = make_contrastive(gen, 64, 32, torch.randint(0, 257, (4000,), generator=gen), 128,
                                dtype=torch.float16, device=CUDA)
        if surface == "contrastive_padded":
            case = as_padded_documents(case)
    else:
        case = make_packed(gen, torch.randint(1, 33, (200,), generator=gen).tolist(),
                           torch.randint(0, 257, (3000,), generator=gen).tolist(), 128,
                           n_pairs=20000, dtype=torch.float16, device=CUDA)
    c64 = case.to(CUDA)
    c64 = type(case)(**{k: (v.double() if k in ("queries", "documents") else v)
                        for k, v in vars(c64).items()})
    expected, ref_argmax = getattr(REF, case.fn + "_with_argmax_reference")(*c64.args(), **c64.ref_kwargs())
    scores, argmax = case.call(ms, "_with_argmax")
    assert_scores(scores, case, expected.cpu())
    # argmax: must equal the float64 one except on (rare) near-ties, where it must still be maximal
    diff = (argmax != ref_argmax)
    assert diff.float().mean() < 1e-3, diff.float().mean()
    g = unit(gen, *case.score_shape).to(CUDA)
    _, gq, gd = run_train(ms, case, g)
    eq, ed = getattr(REF, case.fn + "_backward_reference")(*_bwd_args(c64, g.double(), argmax))
    bq, bd = getattr(REF, case.fn + "_backward_reference")(*_bwd_args(_abs(c64), g.double().abs(), argmax))
    assert_grads(gq, eq, bq, torch.float16)
    assert_grads(gd, ed, bd, torch.float16)


def _abs(case):
    return type(case)(**{k: (v.abs() if k in ("queries", "documents") else v) for k, v in vars(case).items()})


def _bwd_args(c, g, argmax):
    if isinstance(c, Padded):
        return g, c.queries, c.documents, c.query_lengths, c.doc_lengths, argmax
    if isinstance(c, Contrastive):
        return g, c.queries, c.documents, c.document_offsets, argmax, c.query_lengths
    if isinstance(c, ContrastivePadded):
        return g, c.queries, c.documents, c.document_lengths, argmax, c.query_lengths
    return (g, c.queries, c.query_offsets, c.documents, c.document_offsets, c.pair_query_ids,
            c.pair_document_ids, argmax)


# ---- 64-bit indexing ---------------------------------------------------------------------------

C_BIG, LD_BIG, DIM_BIG = 4100, 4096, 128  # 2,149,580,800 elements > 2**31


@pytest.fixture(scope="module")
def huge_documents():
    if free_gib() < 14:
        pytest.skip(f"needs ~14 GiB free GPU memory, have {free_gib():.1f}")
    gen = torch.Generator(device=CUDA).manual_seed(3)
    docs = torch.empty(C_BIG * LD_BIG, DIM_BIG, dtype=torch.float16, device=CUDA)
    for s in range(0, docs.shape[0], 1 << 22):
        x = torch.randn(min(1 << 22, docs.shape[0] - s), DIM_BIG, generator=gen, device=CUDA)
        docs[s:s + x.shape[0]] = torch.nn.functional.normalize(x, dim=-1).half()
    assert docs.numel() > 2**31
    yield docs
    del docs
    torch.cuda.empty_cache()


@pytest.mark.parametrize("surface", SURFACES)
def test_64bit_indexing(ms, huge_documents, surface):
    """Document rows beyond element 2**31 must be read where they are (a 32-bit offset would
    wrap around to the start of the tensor)."""
    gen = torch.Generator().manual_seed(17)
    t = huge_documents.shape[0]
    queries = unit(gen, 2, 16, DIM_BIG, dtype=torch.float16, device=CUDA)
    tail = [(t - 3000, 2000), (t - 1000, 1000)]  # (start, length) of documents at the very end
    if surface == "padded":
        docs = huge_documents.view(1, C_BIG, LD_BIG, DIM_BIG)
        d_lens = torch.zeros(1, C_BIG, dtype=torch.int64)
        d_lens[0, -2:] = torch.tensor([LD_BIG, 1000])
        d_lens[0, 0] = 5
        scores, argmax = ms.score_candidates_padded_with_argmax(
            queries[:1], docs, ids([16], device=CUDA), d_lens.to(CUDA))
        pairs = [(scores[0, -2], argmax[0, -2], docs[0, -2]), (scores[0, -1], argmax[0, -1], docs[0, -1, :1000]),
                 (scores[0, 0], argmax[0, 0], docs[0, 0, :5])]
        q_of = [0, 0, 0]
    elif surface == "contrastive_padded":
        docs = huge_documents.view(C_BIG, LD_BIG, DIM_BIG)
        lengths = torch.zeros(C_BIG, dtype=torch.int64)
        lengths[-2:] = torch.tensor([LD_BIG, 1000])
        lengths[0] = 5
        scores, argmax = ms.score_contrastive_padded_with_argmax(queries, docs, lengths.to(CUDA))
        pairs = [(scores[i, n], argmax[i, n], d) for i in range(2)
                 for n, d in ((-2, docs[-2]), (-1, docs[-1, :1000]), (0, docs[0, :5]))]
        q_of = [0, 0, 0, 1, 1, 1]
    elif surface == "contrastive":
        offsets = ids([0, t - 3000, t - 1000, t], device=CUDA)
        scores, argmax = ms.score_contrastive_with_argmax(queries, huge_documents, offsets)
        pairs = [(scores[i, n], argmax[i, n], huge_documents[s:s + n_]) for i in range(2)
                 for n, (s, n_) in ((1, tail[0]), (2, tail[1]))]
        q_of = [0, 0, 1, 1]
    else:
        offsets = ids([0, t - 3000, t - 1000, t], device=CUDA)
        scores, argmax = ms.score_pairs_packed_with_argmax(
            queries.reshape(32, DIM_BIG), ids([0, 16, 32], device=CUDA), huge_documents, offsets,
            ids([0, 1, 1], device=CUDA), ids([2, 1, 2], device=CUDA))
        pairs = [(scores[0], argmax[0], huge_documents[tail[1][0]:]),
                 (scores[1], argmax[1], huge_documents[tail[0][0]:tail[0][0] + 2000]),
                 (scores[2], argmax[2], huge_documents[tail[1][0]:])]
        q_of = [0, 1, 1]
    torch.cuda.synchronize()
    for (score, arg, d), qi in zip(pairs, q_of):
        check_pair(score.item(), arg, queries[qi], d, torch.float16)


# ---- CUDA graphs ---------------------------------------------------------------------------------

def capture_after_warmup(fn, warmup=3):
    """fn run `warmup` times on a side stream (what must not happen inside a capture the first
    time: allocator growth, workspaces), then captured into a CUDA graph: (graph, the captured
    call's output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def _refill(case, gen):
    """New random values in the same input tensors (in place)."""
    with torch.no_grad():
        case.queries.copy_(unit(gen, *case.queries.shape, dtype=case.queries.dtype))
        case.documents.copy_(unit(gen, *case.documents.shape, dtype=case.documents.dtype))


@pytest.mark.parametrize("form", ["", "_with_argmax"])
@pytest.mark.parametrize("surface", SURFACES)
def test_cuda_graph_inference(ms, surface, form):
    gen = torch.Generator().manual_seed(23)
    case = make_case(surface, gen, n=6, Lq=32, Ld=200, D=128, dtype=torch.float16, device=CUDA)
    if surface == "packed":
        case.max_q_len = case.argmax_width  # reading it would sync
    graph, static_out = capture_after_warmup(lambda: case.call(ms, form))
    for _ in range(2):
        _refill(case, gen)
        graph.replay()
        eager = case.call(ms, form)
        torch.cuda.synchronize()
        if form == "_with_argmax":
            assert torch.equal(static_out[0], eager[0]) and torch.equal(static_out[1], eager[1])
        else:
            assert torch.equal(static_out, eager)
    assert_scores(eager[0] if form else eager, case)


def _padded_scores64(ms, q, d, qlen, dlen):
    """The package's reference on float64 copies of the inputs (CPU)."""
    return ms.score_candidates_padded_reference(q.double().cpu(), d.double().cpu(), qlen.cpu(), dlen.cpu())


@pytest.mark.parametrize("pdl", ["1", "0"])
def test_chained_calls_wait_for_the_previous_kernel(ms, monkeypatch, pdl):
    """The forward kernels are launched programmatically (PDL) on sm_90: a call's CTAs may
    start while the previous kernel runs, and must wait before their first global read.
    Here the second call's queries are the first call's scores (float32, the FFMA kernel
    reads them directly, no kernel between), captured back to back in one graph and
    replayed on new inputs: a read before the wait would see the previous replay's scores."""
    monkeypatch.setenv("MAXSIM_CUDA_PDL", pdl)
    gen = torch.Generator().manual_seed(53)
    B1, C1, Lq1, Ld1, D1 = 4, 64, 8, 40, 64  # scores [4, 64] -> queries [2, 2, 64]
    B2, C2, Ld2 = 2, 48, 56
    q1 = unit(gen, B1, Lq1, D1, device=CUDA)
    d1 = unit(gen, B1, C1, Ld1, D1, device=CUDA)
    ql1 = torch.randint(1, Lq1 + 1, (B1,), generator=gen).to(CUDA)
    dl1 = torch.randint(1, Ld1 + 1, (B1, C1), generator=gen).to(CUDA)
    d2 = unit(gen, B2, C2, Ld2, D1, device=CUDA)
    ql2 = torch.full((B2,), 2, dtype=torch.int64, device=CUDA)
    dl2 = torch.randint(0, Ld2 + 1, (B2, C2), generator=gen).to(CUDA)

    def chain():
        s1 = ms.score_candidates_padded(q1, d1, ql1, dl1)
        s2 = ms.score_candidates_padded(s1.view(B2, 2, D1), d2, ql2, dl2)
        return s1, s2

    graph, (s1, s2) = capture_after_warmup(chain)
    for _ in range(4):
        with torch.no_grad():
            q1.copy_(unit(gen, B1, Lq1, D1, device=CUDA))
        graph.replay()
        torch.cuda.synchronize()
        e1 = _padded_scores64(ms, q1, d1, ql1, dl1)
        assert torch.allclose(s1.double().cpu(), e1, rtol=1e-5, atol=1e-5)
        e2 = _padded_scores64(ms, s1.view(B2, 2, D1), d2, ql2, dl2)
        assert torch.allclose(s2.double().cpu(), e2, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("surface", SURFACES)
def test_cuda_graph_train_step(ms, surface):
    """Forward + backward captured in one graph; replays on new values match eager."""
    gen = torch.Generator().manual_seed(29)
    case = make_case(surface, gen, n=6, Lq=32, Ld=200, D=128, dtype=torch.bfloat16, device=CUDA)
    if surface == "packed":
        case.max_q_len = case.argmax_width
    q = case.queries.clone().requires_grad_()
    d = case.documents.clone().requires_grad_()
    live = case.with_qd(q, d)
    g = unit(gen, *case.score_shape).to(CUDA)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            live.call(ms, "_train").backward(g)
            q.grad = d.grad = None
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_scores = live.call(ms, "_train")
        static_scores.backward(g)
    for _ in range(2):
        _refill(live, gen)
        graph.replay()
        torch.cuda.synchronize()
        eager_case = case.with_qd(q.detach().clone(), d.detach().clone())
        eager_scores, gq, gd = run_train(ms, eager_case, g)
        assert torch.equal(static_scores.detach(), eager_scores.detach())
        assert torch.equal(q.grad, gq) and torch.equal(d.grad, gd)


# ---- streams ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("surface", SURFACES)
def test_runs_on_the_current_stream(ms, surface):
    """Inputs written on a side stream after a long sleep: a kernel launched on any other stream
    than the current one would read them before they are there."""
    gen = torch.Generator().manual_seed(31)
    case = make_case(surface, gen, n=4, Lq=16, Ld=100, D=64, device=CUDA)
    expected = {form: case.call(ms, form) for form in FORMS}
    g = unit(gen, *case.score_shape).to(CUDA)
    _, gq_expected, gd_expected = run_train(ms, case, g)
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        q = torch.full_like(case.queries, float("nan"))
        d = torch.full_like(case.documents, float("nan"))
        torch.cuda._sleep(50_000_000)
        q.copy_(case.queries)
        d.copy_(case.documents)
        moved = case.with_qd(q, d)
        got = {form: moved.call(ms, form) for form in FORMS}
        _, gq, gd = run_train(ms, moved, g)
    side.synchronize()
    for form in FORMS:
        if form == "_with_argmax":
            assert torch.equal(got[form][0], expected[form][0]) and torch.equal(got[form][1], expected[form][1])
        else:
            assert torch.equal(got[form], expected[form])
    assert torch.equal(gq, gq_expected) and torch.equal(gd, gd_expected)


# ---- determinism ------------------------------------------------------------------------------------

@pytest.mark.parametrize("surface", SURFACES)
def test_deterministic_at_scale(ms, surface):
    gen = torch.Generator().manual_seed(37)
    case = make_case(surface, gen, n=64, Lq=64, Ld=512, D=128, dtype=torch.float16, device=CUDA)
    g = unit(gen, *case.score_shape).to(CUDA)
    first = case.call(ms, "_with_argmax"), run_train(ms, case, g)
    for _ in range(3):
        again = case.call(ms, "_with_argmax"), run_train(ms, case, g)
        assert torch.equal(again[0][0], first[0][0]) and torch.equal(again[0][1], first[0][1])
        for a, b in zip(again[1], first[1]):
            assert torch.equal(a.view(torch.int16) if a.dtype == torch.float16 else a,
                               b.view(torch.int16) if b.dtype == torch.float16 else b)


# ---- the Ampere code path on this GPU -----------------------------------------------------------
# A build for sm_80 with PTX only (no Hopper machine code): the driver compiles the sm_80 path
# for the GPU at load, so the code Ampere cards run is checked here end to end.

AMPERE_CHECK = textwrap.dedent("""
    import dataclasses, sys, torch
    sys.path.insert(0, sys.argv[1])
    from conftest import (assert_argmax, assert_scores, assert_grads, expected_grads, load_kernel,
                          make_case, run_train, unit, SURFACES)
    ms = load_kernel("cuda")
    gen = torch.Generator().manual_seed(41)
    for surface in SURFACES:
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            case = make_case(surface, gen, n=5, Lq=40, Ld=300, D=128, dtype=dtype, device="cuda")
            scores, argmax = case.call(ms, "_with_argmax")
            assert_scores(scores, case)
            assert_argmax(argmax, case)
            assert_scores(case.call(ms), case)
            g = unit(gen, *case.score_shape).to("cuda")
            _, gq, gd = run_train(ms, case, g)
            eq, ed, bq, bd = expected_grads(case, g, argmax)
            assert_grads(gq, eq, bq, dtype)
            assert_grads(gd, ed, bd, dtype)
    # compressed documents: the sm_80 code widens e4m3 by bit moves (sm_89 and up convert)
    for surface in SURFACES:
        for fmt in ("int8", "float8_e4m3fn"):
            for dtype, lq in ((torch.float32, 20), (torch.float32, 40), (torch.float16, 40)):
                case = make_case(surface, gen, n=5, Lq=lq, Ld=300, D=128, device="cuda")
                values, scales = ms.quantize_documents(case.documents.float(), fmt)
                queries = case.queries.to(dtype)
                expect = dataclasses.replace(case, queries=queries,
                                             documents=values.double() * scales.double().unsqueeze(-1))
                run = dataclasses.replace(case, queries=queries, documents=values)
                scores, argmax = getattr(ms, run.fn + "_with_argmax")(*run.args(), **run.kwargs(),
                                                                      document_scales=scales)
                assert_scores(scores, expect, input_dtype=dtype)
                assert_argmax(argmax, expect)
    print("ok")
""")


def test_ampere_build_runs_on_this_gpu(tmp_path):
    """MAXSIM_TEST_AMPERE_ROOT: a directory whose build/ already holds that variant
    (`tools/device/cli.py suite --ampere-behind DIR` builds it while other tests run), so that
    only the run is left to this test."""
    if os.environ.get("MAXSIM_TEST_AMPERE") != "1":
        pytest.skip("set MAXSIM_TEST_AMPERE=1 (builds a second, Ampere variant: minutes)")
    root = os.environ.get("MAXSIM_TEST_AMPERE_ROOT")
    if root:
        assert (Path(root) / "build").is_dir(), f"MAXSIM_TEST_AMPERE_ROOT={root}: no build/ there"
    else:
        root = str(tmp_path)
        # On a Hopper card the compute_80 code compiled to sm_90 SASS (no JIT at load); on an
        # older card sm_80 SASS plus PTX.
        major, minor = torch.cuda.get_device_capability()
        archs = f"8.0@{major}.{minor}" if major >= 9 else "8.0+PTX"
        subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "build.py"), "--backend", "cuda",
                        "--archs", archs, "--out", str(tmp_path / "build")], check=True, timeout=900)
    env = dict(os.environ, MAXSIM_TEST_REPO=root)
    result = subprocess.run([sys.executable, "-c", AMPERE_CHECK, str(REPO_ROOT / "tests")], env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]


# ---- float32 under torch.set_float32_matmul_precision ----------------------------------------

@pytest.fixture
def matmul_precision():
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def scores_of_rounded(ms, case, precision):
    """The scores (and argmax) of the 16-bit kernels on the roundings, unscaled by 2^-(kq + kd)."""
    q, kq = rounded_as_the_kernels_see_it(case.queries, precision)
    d, kd = rounded_as_the_kernels_see_it(case.documents, precision)
    out = case.with_qd(q, d).call(ms, "_with_argmax")
    return (out[0].double() * 2.0 ** -(kq + kd)).float(), out[1]


@pytest.mark.parametrize("precision", ("high", "medium"))
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("surface", SURFACES)
def test_float32_precision_scores_roundings(ms, surface, form, precision, matmul_precision, rng):
    """"high" / "medium": float32 embeddings score exactly as the 16-bit kernels score their
    float16 (scaled) / bfloat16 roundings, scores float32; `_train` gradients are the float32
    ones for that argmax (the backward gathers the float32 rows); "highest" keeps the float32
    path, which differs."""
    case = make_case(surface, rng, D=64, Lq=20, Ld=70).to(CUDA)
    matmul_precision("highest")
    want, want_argmax = scores_of_rounded(ms, case, precision)
    matmul_precision(precision)
    if form == "_train":
        g = torch.linspace(-1, 1, want.numel(), device=CUDA).reshape(want.shape)
        scores, gq, gd = run_train(ms, case, g)
        exp = expected_grads(case, g, want_argmax)
        assert_grads(gq, exp[0], exp[2], torch.float32)
        assert_grads(gd, exp[1], exp[3], torch.float32)
    else:
        out = case.call(ms, form)
        scores = out[0] if isinstance(out, tuple) else out
        if form == "_with_argmax":
            assert torch.equal(out[1], want_argmax)
    assert scores.dtype == torch.float32
    assert torch.equal(scores.detach().nan_to_num(7.0), want.nan_to_num(7.0))
    matmul_precision("highest")
    exact = case.call(ms, "")
    assert not torch.equal(exact.nan_to_num(7.0), want.nan_to_num(7.0))


@pytest.mark.parametrize("scale", (1.0, 3e3, 5e-4, 1e15, 1e-15, "nonfinite"))
@pytest.mark.parametrize("surface", ("padded", "contrastive"))
def test_float32_high_scales_by_the_largest_finite_value(ms, surface, scale, matmul_precision, rng):
    """"high" picks each tensor's power of two from its largest finite magnitude: inputs far
    from unit size (the second pass re-rounds them), and inf / NaN entries (which it skips)
    score as the float16 roundings of the scaled copies, within TF32's bound of float64."""
    case = make_case(surface, rng, D=32, Lq=12, Ld=40).to(CUDA)
    q, d = case.queries.clone(), case.documents.clone()
    if scale == "nonfinite":
        q.view(-1)[3] = float("nan")
        d.view(-1)[5] = float("inf")
        d.view(-1)[-1] = 3e5  # past float16's range unless scaled
    else:
        q, d = q * scale, d * (1 / scale if abs(math.log10(scale)) < 10 else scale)
    case = case.with_qd(q, d)
    matmul_precision("highest")
    want, want_argmax = scores_of_rounded(ms, case, "high")
    matmul_precision("high")
    got, argmax = case.call(ms, "_with_argmax")
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
    assert torch.equal(argmax, want_argmax)
    if scale != "nonfinite":
        ref = case.reference()[0]
        bound = case.with_qd(q.abs(), d.abs()).reference()[0]  # sum over i of |q_i| . |d_j| at some j
        err = (got.cpu().double() - ref).abs()
        finite = ref.isfinite()
        assert (err[finite] <= 2.0 ** -7 * bound.abs()[finite] + 1e-30).all(), float(err[finite].max())


@pytest.mark.parametrize("fmt", ("int8", "float8_e4m3fn"))
@pytest.mark.parametrize("precision", ("high", "medium"))
def test_float32_precision_rounds_queries_of_compressed_documents(ms, fmt, precision, matmul_precision, rng):
    """float32 queries against int8 / e4m3 documents: "high" / "medium" round the queries
    only, as for float documents."""
    case = make_padded(rng, 3, 4, 10, 50, 64, device=CUDA)
    values, scales = ms.quantize_documents(case.documents, fmt)
    q16, kq = rounded_as_the_kernels_see_it(case.queries * 40.0, precision)
    args = (case.query_lengths, case.doc_lengths)
    matmul_precision("highest")
    want = ms.score_candidates_padded(q16, values, *args, document_scales=scales)
    want = (want.double() * 2.0 ** -kq).float()
    exact = ms.score_candidates_padded(case.queries * 40.0, values, *args, document_scales=scales)
    matmul_precision(precision)
    got = ms.score_candidates_padded(case.queries * 40.0, values, *args, document_scales=scales)
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
    assert not torch.equal(got.nan_to_num(7.0), exact.nan_to_num(7.0))
