"""Split documents (maxsim_cuda/kernel/doc_split.cuh): padded and packed calls with fewer
pairs than the GPU holds CTAs and long documents are cut into row ranges, one step each, and
merged by a second kernel. The answers must be bitwise those of whole pairs
(MAXSIM_CUDA_DOC_SPLIT=0, read per call) and agree with the float64 reference.

Every case first checks, with the profiler, that the split really ran (merge_doc_parts was
launched), so a change to the split rule cannot turn these tests into comparisons of the
whole-pair path with itself. The mma.sync kernels are forced where a Hopper kernel could
take the call instead. CUDA only (any architecture the build holds).
"""
import dataclasses

import pytest
import torch

from conftest import (
    BACKENDS, assert_argmax, assert_scores, lattice, load_kernel, make_packed, make_padded,
    rand_lengths, unit,
)

pytestmark = pytest.mark.skipif("cuda" not in BACKENDS or not torch.cuda.is_available(),
                                reason="needs a GPU and the CUDA build")


@pytest.fixture(scope="module")
def ms():
    return load_kernel("cuda")


@pytest.fixture(autouse=True)
def mma_sync(monkeypatch):
    monkeypatch.setenv("MAXSIM_CUDA_FORCE_MMA_SYNC", "1")
    monkeypatch.delenv("MAXSIM_CUDA_DOC_SPLIT", raising=False)


def launched(fn):
    """(fn's result, names of the CUDA kernels it launched)"""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, {e.name for e in prof.events()}


def split_and_whole(monkeypatch, fn):
    split, names = launched(fn)
    assert any("merge_doc_parts" in n for n in names), f"the split did not run: {sorted(names)}"
    monkeypatch.setenv("MAXSIM_CUDA_DOC_SPLIT", "0")
    whole, names = launched(fn)
    assert not any("merge_doc_parts" in n for n in names)
    monkeypatch.delenv("MAXSIM_CUDA_DOC_SPLIT")
    return split, whole


def assert_same(a, b):
    for x, y in zip(a, b):
        if x.is_floating_point():
            assert torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())
        else:
            assert torch.equal(x, y)


PADDED = [
    # B, C, Lq, Ld, D
    (2, 3, 32, 1000, 128),
    (1, 5, 64, 1024, 64),
    (2, 2, 100, 777, 96),     # query in two 64-row chunks
    (3, 2, 1, 1500, 128),
    (2, 2, 17, 900, 256),     # KD = 256: 32-row tiles
    (1, 4, 32, 1300, 520),    # K-streamed mainloop (dim > 256)
]


@pytest.mark.parametrize("shape", PADDED, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_padded(ms, monkeypatch, rng, shape, dtype):
    B, C, Lq, Ld, D = shape
    d_lens = rand_lengths(rng, (B, C), Ld)
    d_lens.view(-1)[1] = 0
    d_lens.view(-1)[-1] = 65  # shorter than one part per CTA: most parts empty
    case = make_padded(rng, B, C, Lq, Ld, D, dtype=dtype, device="cuda", d_lens=d_lens)
    split, whole = split_and_whole(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_same(split, whole)
    assert_scores(split[0], case)
    assert_argmax(split[1], case)
    scores, _ = launched(lambda: case.call(ms))
    assert torch.equal(scores, split[0])


def test_padded_ties_and_nan(ms, monkeypatch, rng):
    """Integer-valued embeddings tie across parts (the lowest document row must win, also when
    the tied rows sit in different parts); a NaN in the last part of one document wins its
    rows over every earlier finite value."""
    case = make_padded(rng, 2, 3, 32, 1024, 64, dtype=torch.float16, device="cuda", values=lattice,
                       d_lens=torch.tensor([[1024, 1000, 700], [999, 1024, 513]]))
    case.documents[0, 1, 990, 5] = float("nan")
    split, whole = split_and_whole(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_same(split, whole)
    assert_scores(split[0], case)
    assert_argmax(split[1], case, exact=True)
    assert split[0][0, 1].isnan() and not split[0][0, 0].isnan()


@pytest.mark.parametrize("max_q_len", [None, 70])
def test_packed(ms, monkeypatch, rng, max_q_len):
    q_lens = [70, 1, 33, 0, 64]
    d_lens = [1200, 3, 800, 0, 1030, 640]
    case = make_packed(rng, q_lens, d_lens, 128, dtype=torch.float16, device="cuda",
                       max_q_len=max_q_len)
    split, whole = split_and_whole(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_same(split, whole)
    assert_scores(split[0], case)
    assert_argmax(split[1], case)
    # scores alone (no max_q_len needed: the partial rows then cover every query row)
    plain_split, plain_whole = split_and_whole(monkeypatch, lambda: (case.call(ms),))
    assert_same(plain_split, plain_whole)
    assert_same(plain_split, split[:1])


def test_packed_bad_input(ms, monkeypatch, rng):
    """Ids out of range score NaN in both paths; a query longer than max_q_len (only caught
    with MAXSIM_CHECK_VALUES=1 on a GPU) cannot be merged and scores NaN with argmax -1,
    while every other pair keeps its score; nothing is written out of bounds."""
    case = make_packed(rng, [40, 20], [1000, 900, 1100], 64, dtype=torch.bfloat16, device="cuda",
                       pairs=[(0, 0), (1, 1), (0, 2), (1, 0)], max_q_len=32)
    case.pair_document_ids[3] = 7
    (scores, argmax), _ = split_and_whole(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert scores[[0, 2, 3]].isnan().all() and (argmax[[0, 2, 3]] == -1).all()
    single = dataclasses.replace(case, pair_query_ids=case.pair_query_ids[1:2],
                                 pair_document_ids=case.pair_document_ids[1:2])
    assert_scores(scores[1:2], single)
    assert torch.equal(scores[1:2], single.call(ms))


def test_graph_and_gradients(ms, monkeypatch, rng):
    """The split inside a CUDA graph gives the eager answers; training through it gives the
    whole-pair gradients bit for bit (the backward reads the same argmax)."""
    case = make_padded(rng, 2, 3, 32, 1000, 128, dtype=torch.bfloat16, device="cuda")
    eager = case.call(ms)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        case.call(ms)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = case.call(ms)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)

    grad = unit(rng, *case.score_shape, device="cuda")

    def train():
        q = case.queries.detach().requires_grad_()
        d = case.documents.detach().requires_grad_()
        s = ms.score_candidates_padded_train(q, d, case.query_lengths, case.doc_lengths)
        gq, gd = torch.autograd.grad((s * grad).sum(), (q, d))
        return s.detach(), gq, gd

    split, whole = split_and_whole(monkeypatch, train)
    assert_same(split, whole)
