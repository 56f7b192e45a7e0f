"""The sm_90a kernel (warp-specialised, TMA + wgmma; contrastive and padded surfaces) against
the float64 reference and against the mma.sync kernels it replaces on Hopper.

Runs only on a compute capability 9.0 GPU with a CUDA build (elsewhere the mma.sync kernels
are the only path, and the rest of the suite covers them). MAXSIM_CUDA_FORCE_MMA_SYNC=1 is
read on every call, so each case runs both paths in one process. The shapes aim at the
kernel's edges: tiles that end exactly at, just before and just past 64 and 128 document
rows (the narrow-MMA tail and the masked fold), empty documents, query-block counts that leave
warpgroups idle in the last set, query blocks of several queries whose rows do not fill 64,
Lq = 64 (one query a block) and longer queries (64-row chunks summed in order, the last
chunk partly past the query), dims 8..128 not multiples of 64 (zero-filled columns), both
document layouts, and the argmax. dim > 128 runs the streamed shapes (one 64-column K-chunk
of the tile and of every query block per ring slot): 136 and 520 end in a chunk of 8 real
columns, 1024 accumulates over 16 chunks, also with 64-row query chunks.
"""
import dataclasses

import pytest
import torch

from conftest import (
    BACKENDS, as_padded_documents, assert_argmax, assert_grads, assert_scores, expected_grads,
    load_kernel, make_contrastive, make_padded, rand_lengths, run_train, unit,
)

pytestmark = pytest.mark.skipif(
    "cuda" not in BACKENDS or not torch.cuda.is_available()
    or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a compute capability 9.0 GPU and the CUDA build")


@pytest.fixture(scope="module")
def ms():
    return load_kernel("cuda")


def both_paths(monkeypatch, fn):
    monkeypatch.delenv("MAXSIM_CUDA_FORCE_MMA_SYNC", raising=False)
    hopper = fn()
    monkeypatch.setenv("MAXSIM_CUDA_FORCE_MMA_SYNC", "1")
    mma = fn()
    monkeypatch.delenv("MAXSIM_CUDA_FORCE_MMA_SYNC")
    return hopper, mma


SHAPES = [
    # Nq, Lq, document lengths, D
    (3, 32, [1, 63, 64, 65, 127, 128, 129, 0, 191, 192, 193, 300], 128),
    (5, 20, [180] * 7 + [0, 5], 128),       # 3 queries per 64-row block, 2 blocks: one pair
    (7, 64, [100, 256, 17, 129], 96),       # Lq = 64: one query per block, odd block count
    (2, 1, [40, 400, 64], 64),              # KD = 64 shape
    (9, 33, [70, 3, 128, 255], 40),         # one query per block, zero-filled columns
    (4, 32, [130, 66], 8),
    (3, 65, [129, 64, 0, 200], 128),        # two chunks, the second of one row
    (4, 200, [300, 1, 128], 64),
    (2, 1024, [1024, 1000, 77], 128),       # DocDoc-like: 16 chunks
    # streamed (dim > 128)
    (3, 32, [1, 63, 64, 65, 127, 128, 129, 0, 300], 136),
    (7, 64, [100, 256, 17, 129], 256),
    (9, 33, [70, 3, 128, 255], 520),
    (5, 20, [180] * 3 + [0, 5], 768),
    (3, 65, [129, 64, 0, 200], 1024),       # query chunks and K-chunks together
]


@pytest.mark.parametrize("consumers", [None, "2", "3", "4"], ids=["auto", "c2", "c3", "c4"])
@pytest.mark.parametrize("padded_docs", [False, True], ids=["packed_docs", "padded_docs"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"nq{s[0]}_lq{s[1]}_d{s[3]}" for s in SHAPES])
def test_matches_reference_and_mma_sync(ms, monkeypatch, rng, shape, dtype, padded_docs, consumers):
    """Every consumer-warpgroup count (MAXSIM_CUDA_HOPPER_CONSUMERS; by default the kernel
    picks one from the block count)."""
    if consumers is not None:
        monkeypatch.setenv("MAXSIM_CUDA_HOPPER_CONSUMERS", consumers)
    nq, lq, d_lens, dim = shape
    case = make_contrastive(rng, nq, lq, d_lens, dim, dtype=dtype, device="cuda")
    if padded_docs:
        case = as_padded_documents(case)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_scores(s_h, case)
    assert_argmax(a_h, case)
    # The tensor cores may round a dot product differently from mma.sync in the last bit,
    # so the paths agree to fp32 rounding (and the argmax to near-ties, checked above).
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4, equal_nan=True)
    assert (a_h == a_m).float().mean() > 0.99
    s_plain, _ = both_paths(monkeypatch, lambda: case.call(ms, ""))
    torch.testing.assert_close(s_plain, s_h, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dim", [128, 384])
def test_many_blocks_and_documents(ms, monkeypatch, rng, dim):
    """Enough steps that every CTA of the persistent grid walks several query-block pairs
    (the query buffer is reloaded) and the document ring wraps many times."""
    nq, lq = 37, 32
    d_lens = rand_lengths(rng, (300,), 200)
    case = make_contrastive(rng, nq, lq, d_lens, dim, dtype=torch.bfloat16, device="cuda")
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_scores(s_h, case)
    assert_argmax(a_h, case)
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4)
    again = case.call(ms, "_with_argmax")
    assert torch.equal(again[0], s_h) and torch.equal(again[1], a_h)  # deterministic


@pytest.mark.parametrize("dim", [128, 200])
def test_nan_and_ties(ms, monkeypatch, rng, dim):
    """A NaN document token wins its rows at its first position; exact ties go to the lowest
    document row, also across a tile boundary (rows 5 and 133 repeat row 5)."""
    case = make_contrastive(rng, 3, 32, [200, 150], dim, dtype=torch.float16, device="cuda", q_lens=None)
    docs = case.documents
    docs[133] = docs[5]
    docs[200 + 70, 3] = float("nan")
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_argmax(a_h, case)
    assert not (a_h[:, 0] == 133).any()  # row 5 ties it and comes first
    assert (a_h[:, 1] == 70).all()  # every query row of document 1 meets the NaN first
    assert torch.isnan(s_h[:, 1]).all() and not torch.isnan(s_h[:, 0]).any()
    torch.testing.assert_close(s_h[:, 0], s_m[:, 0], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dim", [128, 320])
def test_train_gradients(ms, rng, dim):
    case = make_contrastive(rng, 6, 32, [90, 130, 1, 64], dim, dtype=torch.bfloat16, device="cuda")
    grad = unit(rng, *case.score_shape, device="cuda")
    scores, gq, gd = run_train(ms, case, grad)
    assert_scores(scores, case)
    _, argmax = case.call(ms, "_with_argmax")
    eq, ed, bound_q, bound_d = expected_grads(case, grad, argmax)
    assert_grads(gq, eq, bound_q, case.queries.dtype)
    assert_grads(gd, ed, bound_d, case.queries.dtype)


def _both_kernels(monkeypatch, fn):
    """(this kernel, the mma.sync kernels) on the same call"""
    hopper = fn()
    monkeypatch.setenv("MAXSIM_CUDA_FORCE_MMA_SYNC", "1")
    mma = fn()
    monkeypatch.delenv("MAXSIM_CUDA_FORCE_MMA_SYNC")
    return hopper, mma


@pytest.mark.parametrize("dim", [128, 256])
def test_large_ragged_corpus(ms, monkeypatch, rng, dim):
    """A corpus-sized call (many steps per CTA, 2^20 document rows) of ragged packed
    documents, 600 of them near-empty, against the mma.sync kernels on the same inputs (the
    float64 reference at this size costs more than the rest of the file)."""
    n_docs = 3000
    d_lens = rand_lengths(rng, (n_docs,), 1030)
    d_lens[torch.randperm(n_docs, generator=rng)[:600]] = torch.randint(0, 3, (600,), generator=rng)
    case = make_contrastive(rng, 8, 32, d_lens, dim, dtype=torch.bfloat16, device="cuda")
    assert int(d_lens.sum()) >= 1 << 20
    (s_h, a_h), (s_m, a_m) = _both_kernels(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4)
    assert (a_h == a_m).float().mean() > 0.99


def test_unsorted_offsets(ms, monkeypatch, rng):
    """Offsets that are not sorted (not checked on a GPU without MAXSIM_CHECK_VALUES): the
    documents they make bad score NaN with argmax -1, every other pair keeps its score, and
    no step is lost or repeated (the mma.sync kernels agree pair for pair)."""
    n_docs = 3000
    d_lens = rand_lengths(rng, (n_docs,), 1030)
    case = make_contrastive(rng, 8, 32, d_lens, 128, dtype=torch.float16, device="cuda")
    offsets = case.document_offsets.clone()
    offsets[700] = offsets[1900]  # documents 699 and 700 become bad, and the prefix dips
    offsets[1500] = 5
    bad = dataclasses.replace(case, document_offsets=offsets)
    (s_h, a_h), (s_m, a_m) = _both_kernels(monkeypatch, lambda: bad.call(ms, "_with_argmax"))
    assert torch.equal(s_h.isnan(), s_m.isnan()) and s_h.isnan().any()
    assert bool((a_h[s_h.isnan()] == -1).all())
    torch.testing.assert_close(s_h.nan_to_num(), s_m.nan_to_num(), rtol=1e-5, atol=1e-4)
    good = ~s_h.isnan()
    assert (a_h[good] == a_m[good]).float().mean() > 0.99


PADDED_SHAPES = [
    # B, C, Lq, Ld, D, document lengths (None: random up to Ld)
    (3, 8, 32, 200, 128, [[0, 1, 63, 64, 65, 127, 128, 129], [200] * 8, [129, 5, 0, 200, 64, 65, 1, 2]]),
    (5, 7, 32, 180, 128, None),             # HeavyRerank-like ragged rows
    (4, 3, 64, 300, 96, None),              # Lq = 64, zero-filled columns
    (2, 3, 100, 129, 64, None),             # 64-row query chunks (KD = 64 shape)
    (4, 5, 20, 70, 8, None),
    # streamed (dim > 128)
    (3, 6, 32, 200, 256, None),
    (2, 3, 70, 130, 520, None),
    (3, 2, 32, 128, 1024, [[128, 127], [1, 0], [64, 65]]),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", PADDED_SHAPES, ids=[f"b{s[0]}_c{s[1]}_lq{s[2]}_ld{s[3]}_d{s[4]}" for s in PADDED_SHAPES])
def test_padded_matches_reference_and_mma_sync(ms, monkeypatch, rng, shape, dtype):
    """The padded (rerank) surface on the sm_90a kernel: one consumer warpgroup per CTA, a
    query block holding one query (rows past it belong to the next query and are never
    reported), each query against its own documents."""
    B, C, lq, ld, dim, d_lens = shape
    case = make_padded(rng, B, C, lq, ld, dim, dtype=dtype, device="cuda", d_lens=d_lens)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_scores(s_h, case)
    assert_argmax(a_h, case)
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4, equal_nan=True)
    assert (a_h == a_m).float().mean() > 0.99
    s_plain, _ = both_paths(monkeypatch, lambda: case.call(ms, ""))
    torch.testing.assert_close(s_plain, s_h, rtol=0, atol=0, equal_nan=True)
    again = case.call(ms, "_with_argmax")
    assert torch.equal(again[0], s_h) and torch.equal(again[1], a_h)  # deterministic
