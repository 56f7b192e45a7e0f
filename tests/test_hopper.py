"""The sm_90a kernel (warp-specialised, TMA + wgmma; contrastive, padded and packed surfaces) against
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
    BACKENDS, as_padded_documents, assert_argmax, assert_grads, assert_scores, document_views, expected_grads,
    kernel_names,
    lattice, load_kernel, make_contrastive, make_packed, make_padded, padded_as_packed, rand_lengths,
    run_train, unit,
)

pytestmark = pytest.mark.skipif(
    "cuda" not in BACKENDS or not torch.cuda.is_available()
    or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a compute capability 9.0 GPU and the CUDA build")


@pytest.fixture(scope="module")
def ms():
    return load_kernel("cuda")


@pytest.fixture(autouse=True)
def hopper_padded_always(monkeypatch):
    """By default padded and packed calls with short documents (Ld, or the average packed
    document, < 256 rows at dim <= 128) stay on the mma.sync kernels, where they are faster;
    here every such call this kernel can run takes it, so the short shapes test it too."""
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_PADDED", "1")
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_PACKED", "1")


def assert_exact_ties(ms, monkeypatch, case):
    """Lattice values tie exactly: the scores bit for bit and the lowest tied row as argmax,
    against the reference and against the mma.sync kernels."""
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_scores(s_h, case, exact=True)
    assert_argmax(a_h, case, exact=True)
    assert torch.equal(s_h, s_m) and torch.equal(a_h, a_m)


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


# Documents whose last tile is empty, narrow (<= 64 rows: the m64n64 MMA) or wide (> 64).
STEP_SUM_LENGTHS = [0, 1, 64, 65, 128, 129, 192, 193, 256, 50, 100, 180]


@pytest.mark.parametrize("consumers", ["2", "3", "4"], ids=["c2", "c3", "c4"])
@pytest.mark.parametrize("lq", [20, 64])
def test_step_sums_across_many_steps(ms, monkeypatch, rng, lq, consumers):
    """Each step's epilogue shares a warpgroup's shared memory with the steps around it. Many
    steps a CTA over every kind of last tile, stacked queries with random lengths (zeros
    too), and the last set's idle warpgroups: every score against the reference and the
    mma.sync kernels, the score-only form bit for bit the argmax form's, and a second call
    bit for bit the first."""
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_CONSUMERS", consumers)
    d_lens = STEP_SUM_LENGTHS * 30
    case = make_contrastive(rng, 23, lq, d_lens, 128, dtype=torch.float16, device="cuda")
    (s_h, a_h), (s_m, _) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_scores(s_h, case)
    assert_argmax(a_h, case)
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4, equal_nan=True)
    assert torch.equal(case.call(ms, ""), s_h)
    again = case.call(ms, "_with_argmax")
    assert torch.equal(again[0], s_h) and torch.equal(again[1], a_h)


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
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
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
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: bad.call(ms, "_with_argmax"))
    assert torch.equal(s_h.isnan(), s_m.isnan()) and s_h.isnan().any()
    assert bool((a_h[s_h.isnan()] == -1).all())
    torch.testing.assert_close(s_h.nan_to_num(), s_m.nan_to_num(), rtol=1e-5, atol=1e-4)
    good = ~s_h.isnan()
    assert (a_h[good] == a_m[good]).float().mean() > 0.99


# ---- a short last tile's window -------------------------------------------------------------
# A document's last tile with fewer rows than its MMA takes (32, 64 or 128 wide) is loaded from
# len - width on, so that the MMA covers document rows only and the fold needs no mask; the
# rows before the tile's start were folded in the tile before and come again. Lengths: 180
# (a 52-row tail, 64 wide: 12 rows again), 150 (22 rows: 32 wide on the bounded grid at one
# CTA an SM, else 64 wide: 42 rows again, or left in place where that needs another 32-row
# box), 240 (112 rows: 128 wide) and 200 (72 rows: 128 wide, or in place on the bounded grid,
# whose window would take a fourth box).
WINDOW_LENS = [180, 150, 240, 200]
# (row, earlier row it repeats): a repeated row tying an earlier one (the earlier wins), and a
# later row tying a repeated one (the repeated one wins)
WINDOW_TIES = {180: [(120, 10), (170, 125)], 150: [(130, 3), (149, 140)], 240: [(120, 2), (230, 126)],
               200: [(100, 90), (199, 127)]}
# (NaN row, later NaN row): the first, in the repeated rows, is every query row's argmax
WINDOW_NANS = {180: (125, 170), 150: (140, 149), 240: (126, 230), 200: (127, 199)}


def _window_case(rng, surface, dim, values):
    if surface == "contrastive":
        return make_contrastive(rng, 3, 32, WINDOW_LENS, dim, dtype=torch.float16, device="cuda", q_lens=None,
                                values=values)
    return make_padded(rng, 2, 4, 32, 240, dim, dtype=torch.float16, device="cuda",
                       d_lens=[WINDOW_LENS, WINDOW_LENS[::-1]], q_lens=[32, 32], values=values)


@pytest.mark.parametrize("dim", [128, 256])
@pytest.mark.parametrize("surface,ctas", [("contrastive", None), ("padded", "2"), ("padded", "1"),
                                          ("padded", "2-resident"), ("padded", "1-resident")])
def test_last_tile_window_repeats_rows(ms, monkeypatch, rng, surface, ctas, dim):
    """Rows a last tile's window repeats change nothing: exact ties (lattice values) between a
    repeated row and an earlier or a later one go to the lower row, bit for bit as the
    reference and the mma.sync kernels have them; a NaN in a repeated row is the argmax of
    every query row even with a later NaN in the window."""
    if ctas is not None:
        strided_shape(monkeypatch, ctas)
    case = _window_case(rng, surface, dim, lattice)
    for rows, n in document_views(case):
        for row, earlier in WINDOW_TIES[n]:
            rows[row] = rows[earlier]
    assert_exact_ties(ms, monkeypatch, case)
    case = _window_case(rng, surface, dim, unit)
    for rows, n in document_views(case):
        for row in WINDOW_NANS[n]:
            rows[row, 7] = float("nan")
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert s_h.isnan().all() and s_m.isnan().all()
    first = [WINDOW_NANS[n][0] for _, n in document_views(case)]
    expected = torch.tensor(first, device="cuda")
    expected = expected.expand(s_h.shape) if surface == "contrastive" else expected.reshape(s_h.shape)
    assert (a_h == expected[..., None]).all(), a_h[..., 0].tolist()
    assert torch.equal(a_h, a_m)


# ---- padded (rerank) surface ----------------------------------------------------------------
# One consumer warpgroup per CTA, each step its own query and document (steps strided over the
# CTAs), the query chunk in every ring slot. Bounded loads: a document's last tile arrives as
# ceil(rows / 32) boxes of 32 rows and the query block as the 32-row boxes covering Lq; the
# slot rows past them hold whatever an earlier tile left there. Tails of <= 32 / <= 64 rows run
# m64n32 / m64n64 MMAs. The lengths below sit on and around every box and MMA-width edge.
EDGE_LENS = [0, 1, 31, 32, 33, 63, 64, 65, 95, 96, 97, 127, 128, 129, 159, 160, 161, 191, 192, 193]

PADDED_SHAPES = [
    # B, C, Lq, Ld, D, document lengths (None: random up to Ld, the first and the last full)
    (3, 20, 32, 261, 128, [EDGE_LENS, EDGE_LENS[::-1], [261] * 20]),
    (5, 7, 32, 180, 128, None),             # SmallRerank-like ragged rows
    (4, 3, 64, 300, 96, None),              # Lq = 64: two query boxes, zero-filled columns
    (3, 4, 33, 97, 64, None),               # Lq = 33: a second query box of one row
    (2, 3, 100, 129, 64, None),             # 64-row query chunks: 2 + 2 boxes
    (2, 3, 70, 200, 128, None),             # chunks of 64 and 6 rows: 2 + 1 boxes
    (4, 5, 20, 70, 8, None),                # the last query's box runs past the tensor
    (2, 4, 1, 33, 40, [[33, 32, 31, 1], [0, 33, 2, 33]]),
    # streamed past 128 columns (K-chunks; the last one of 8 real columns at 136 / 520)
    (3, 20, 32, 261, 256, [EDGE_LENS, EDGE_LENS[::-1], [261] * 20]),
    (3, 6, 32, 200, 136, None),
    (2, 3, 70, 130, 520, None),
    (3, 2, 32, 128, 1024, [[128, 127], [1, 0], [64, 65]]),
]


# Both shapes: two CTAs per SM with 4-slot rings (the default), or one with 8 slots (the
# only one with the m64n32 tail).
# The strided grids' shapes: CTAs an SM, and (dim <= 256) the query streamed beside every
# K-chunk or resident in query buffers the producer fills a step ahead (at 128 < dim <= 256
# the 256-column resident shapes: one CTA with two buffers for ctas1, else two CTAs with one);
# three CTAs an SM at 64-row tiles: streamed (any dim), or resident with one query buffer, or
# with two (q2; 64 < dim <= 128; at dim <= 64 the knob leaves the two-CTA resident shape).
PADDED_CTAS = pytest.mark.parametrize(
    "ctas", ["2", "1", "3", "2-resident", "1-resident", "3-resident", "3-resident-q2"],
    ids=["ctas2", "ctas1", "ctas3", "ctas2_resident", "ctas1_resident", "ctas3_resident",
         "ctas3_resident_qbufs2"])


def strided_shape(monkeypatch, ctas):
    count, *layout = ctas.split("-")
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_PADDED_CTAS", count)
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_RESIDENT", "1" if "resident" in layout else "0")
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_QUERY_BUFS", "2" if "q2" in layout else "1")


def _padded(rng, shape, dtype, **kw):
    B, C, lq, ld, dim, d_lens = shape
    if d_lens is None:
        d_lens = rand_lengths(rng, (B, C), ld)
        d_lens[-1, -1] = ld  # the tensor's last rows: its last box reads past the end
    return make_padded(rng, B, C, lq, ld, dim, dtype=dtype, device="cuda", d_lens=d_lens, **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", PADDED_SHAPES, ids=[f"b{s[0]}_c{s[1]}_lq{s[2]}_ld{s[3]}_d{s[4]}" for s in PADDED_SHAPES])
@PADDED_CTAS
def test_padded_matches_reference_and_mma_sync(ms, monkeypatch, rng, shape, dtype, ctas):
    """Against the float64 reference and the mma.sync kernels; padding rows hold large
    garbage (make_padded), so a column past a length that got into a max would show."""
    strided_shape(monkeypatch, ctas)
    case = _padded(rng, shape, dtype)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_scores(s_h, case)
    assert_argmax(a_h, case)
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4, equal_nan=True)
    assert (a_h == a_m).float().mean() > 0.99
    s_plain, _ = both_paths(monkeypatch, lambda: case.call(ms, ""))
    torch.testing.assert_close(s_plain, s_h, rtol=0, atol=0, equal_nan=True)
    again = case.call(ms, "_with_argmax")
    assert torch.equal(again[0], s_h) and torch.equal(again[1], a_h)  # deterministic


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("dim", [64, 128, 520])
@PADDED_CTAS
def test_padded_exact_ties(ms, monkeypatch, rng, dim, dtype, ctas):
    """Lattice values: every similarity and score is exact, so scores must equal the reference
    bit for bit and every argmax must be the lowest tied row, in full tiles, in tails of each
    MMA width, and across tile and box boundaries."""
    strided_shape(monkeypatch, ctas)
    lens = [[0, 1, 31, 32, 33, 63], [64, 65, 127, 128, 129, 300], [150, 200, 255, 256, 257, 300]]
    case = make_padded(rng, 3, 6, 32, 300, dim, dtype=dtype, device="cuda", d_lens=lens, values=lattice)
    docs = case.documents
    docs[1, 5, 140] = docs[1, 5, 12]   # across the first tile boundary
    docs[2, 0, 149] = docs[2, 0, 130]  # inside a 22-row tail (m64n32)
    docs[0, 5, 40] = docs[0, 5, 20]    # inside a 63-row tail (m64n64), across a box boundary
    docs[1, 2, 100] = docs[1, 2, 3]    # inside a 127-row tail of 4 boxes
    docs[2, 1, 190] = docs[2, 1, 129]  # inside a 72-row tail of 3 boxes
    assert_exact_ties(ms, monkeypatch, case)


@pytest.mark.parametrize("dim", [128, 256])
@PADDED_CTAS
def test_padded_nan_in_padding_and_documents(ms, monkeypatch, rng, dim, ctas):
    """NaN in every padding row (queries and documents): the rows past a length that a box
    loads must not reach a score (stale slot rows: test_padded_stale_nan_rows). A NaN in a
    real row must: the score is NaN and the argmax of every query row is its position, in
    each tail width (32 at one CTA per SM, 64, 128) and a full tile."""
    strided_shape(monkeypatch, ctas)
    lens = [[97, 10, 40, 100, 140, 256], [70, 20, 62, 200, 256, 33]]
    case = make_padded(rng, 2, 6, 32, 256, dim, dtype=torch.float16, device="cuda", d_lens=lens,
                       q_lens=[30, 32])
    q_pad = torch.arange(32, device="cuda") >= case.query_lengths[:, None]
    d_pad = torch.arange(256, device="cuda") >= case.doc_lengths[..., None]
    case.queries[q_pad] = float("nan")
    case.documents[d_pad] = float("nan")
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert not s_h.isnan().any()
    assert_scores(s_h, case)
    assert_argmax(a_h, case)
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4)
    hits = {(1, 1): 19, (1, 2): 35, (1, 3): 197, (1, 4): 7}  # 32-, 64-, 128-wide tail, full tile
    for (b, c), row in hits.items():
        case.documents[b, c, row, 5] = float("nan")
    s_h, a_h = case.call(ms, "_with_argmax")
    for (b, c), row in hits.items():
        assert s_h[b, c].isnan() and (a_h[b, c, :32] == row).all(), (b, c, a_h[b, c].tolist())
    others = torch.ones_like(s_h, dtype=torch.bool)
    for b, c in hits:
        others[b, c] = False
    assert not s_h[others].isnan().any()
    assert_argmax(a_h, case)


def test_padded_many_steps(ms, monkeypatch, rng):
    """More steps than the grid has CTAs many times over (the strided walk, the ring wrapping),
    ragged and near-empty documents, int32 lengths, against the mma.sync kernels."""
    B, C, lq, ld = 24, 64, 32, 300
    d_lens = rand_lengths(rng, (B, C), ld)
    d_lens[torch.rand(B, C, generator=rng) < 0.2] = 1
    d_lens[-1, -1] = ld
    case = make_padded(rng, B, C, lq, ld, 128, dtype=torch.bfloat16, device="cuda", d_lens=d_lens,
                       index_dtype=torch.int32)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4)
    assert (a_h == a_m).float().mean() > 0.99
    again = case.call(ms, "_with_argmax")
    assert torch.equal(again[0], s_h) and torch.equal(again[1], a_h)


@pytest.mark.parametrize("dim", [128, 320])
def test_padded_train_gradients(ms, rng, dim):
    """The training form's forward runs here too; the backward consumes its argmax."""
    lens = [[90, 130, 1, 64, 0], [33, 200, 31, 129, 96]]
    case = make_padded(rng, 2, 5, 32, 200, dim, dtype=torch.bfloat16, device="cuda", d_lens=lens)
    grad = unit(rng, *case.score_shape, device="cuda")
    scores, gq, gd = run_train(ms, case, grad)
    assert_scores(scores, case)
    _, argmax = case.call(ms, "_with_argmax")
    eq, ed, bound_q, bound_d = expected_grads(case, grad, argmax)
    assert_grads(gq, eq, bound_q, case.queries.dtype)
    assert_grads(gd, ed, bound_d, case.queries.dtype)



@pytest.mark.parametrize("dim", [128, 64])
@pytest.mark.parametrize("surface", ["padded", "packed"])
def test_default_rule_takes_sm90a_kernel_for_many_steps(ms, monkeypatch, rng, surface, dim):
    """Unforced, 180-row documents at dim 128 or 64 take the sm_90a kernel (its resident shape,
    the default at these dims) when the call has at least four steps an SM (Rerank: 1,600) and stay
    on the mma.sync kernels below that, where those are faster; at dim 128 calls of at most six
    steps an SM (SmallRerank: 320) take its three-CTA shapes, down to 32-row documents at up
    to three steps an SM. The profiler sees which kernel ran: it elides template arguments from
    long names, so the sm_90a kernel is told by its parameters (HopperParams)."""
    for knob in ("MAXSIM_CUDA_HOPPER_PADDED", "MAXSIM_CUDA_HOPPER_PACKED", "MAXSIM_CUDA_HOPPER_RESIDENT",
                 "MAXSIM_CUDA_HOPPER_PADDED_CTAS", "MAXSIM_CUDA_HOPPER_QUERY_BUFS"):
        monkeypatch.delenv(knob, raising=False)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for cands, ld, hopper in ((4 * sms // 32 + 1, 180, True), (4 * sms // 32 - 1, 180, dim == 128),
                              (3 * sms // 32 + 2, 180, dim == 128), (3 * sms // 32 + 2, 64, False),
                              (3 * sms // 32, 180, dim == 128), (2 * sms // 32, 180, dim == 128),
                              (1, 180, dim == 128), (3 * sms // 32, 40, dim == 128), (2, 24, False)):
        case = make_padded(rng, 32, cands, 32, ld, dim, dtype=torch.float16, device="cuda",
                           d_lens=torch.full((32, cands), ld))
        if surface == "packed":
            case = padded_as_packed(case)
        (scores, argmax), names = kernel_names(lambda c=case: c.call(ms, "_with_argmax"))
        assert any("HopperParams" in n for n in names) == hopper, (cands, sorted(names))
        assert_scores(scores, case)
        assert_argmax(argmax, case)


@pytest.mark.parametrize("surface", ["padded", "packed"])
def test_wide_default_rule_matches_streamed_shape(ms, monkeypatch, rng, surface):
    """128 < dim <= 256 by the default rule (hopper_wide_shape): the two-CTA streamed shape up
    to two steps an SM, three streamed CTAs an SM up to three, and at more steps of documents
    under 512 rows three streamed CTAs up to dim 192 and the resident 256-column shape above,
    the two-CTA streamed shape for longer ones. Each
    takes the streamed shape's MMAs in the same order, so its scores and argmax must equal that
    shape's bit for bit, on both sides of every threshold, and the reference."""
    for knob in ("MAXSIM_CUDA_HOPPER_RESIDENT", "MAXSIM_CUDA_HOPPER_PADDED_CTAS", "MAXSIM_CUDA_HOPPER_QUERY_BUFS"):
        monkeypatch.delenv(knob, raising=False)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (candidates a query, Ld, dim, every document full): full 600-row and 300-row documents
    # cross the rule's row thresholds, random lengths average half of Ld
    for cands, ld, dim, full in ((2 * sms // 32, 180, 256, False), (2 * sms // 32 + 2, 180, 256, True),
                                 (3 * sms // 32, 300, 192, False), (3 * sms // 32 + 2, 180, 256, False),
                                 (4 * sms // 32 + 1, 200, 136, True), (4 * sms // 32 + 1, 200, 224, True),
                                 (3 * sms // 32 + 2, 600, 256, True), (2 * sms // 32, 300, 256, True),
                                 (6, 70, 256, False)):
        d_lens = torch.full((32, cands), ld) if full else rand_lengths(rng, (32, cands), ld)
        case = make_padded(rng, 32, cands, 32, ld, dim, dtype=torch.bfloat16, device="cuda", d_lens=d_lens)
        if surface == "packed":
            case = padded_as_packed(case)
        monkeypatch.delenv("MAXSIM_CUDA_HOPPER_RESIDENT", raising=False)
        scores, argmax = case.call(ms, "_with_argmax")
        assert_scores(scores, case)
        assert_argmax(argmax, case)
        monkeypatch.setenv("MAXSIM_CUDA_HOPPER_RESIDENT", "0")
        streamed = case.call(ms, "_with_argmax")
        assert torch.equal(scores, streamed[0]) and torch.equal(argmax, streamed[1]), (cands, ld, dim)


def test_padded_few_long_pairs(ms, monkeypatch, rng):
    """LongDocStress-like: fewer pairs than SMs, 1030-row documents (eight full tiles and a
    6-row tail)."""
    lens = [[1030, 1029, 1024, 1000], [7, 1030, 640, 0]]
    case = make_padded(rng, 2, 4, 32, 1030, 128, dtype=torch.float16, device="cuda", d_lens=lens)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_scores(s_h, case)
    assert_argmax(a_h, case)
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4, equal_nan=True)


@PADDED_CTAS
def test_padded_stale_nan_rows(ms, monkeypatch, rng, ctas):
    """Many steps per CTA (the ring's slots reused) of 100-, 70-, 40- and 10-row documents
    with NaN padding: a 100-row tile loads four boxes (NaN in rows 100..127), and a later
    70-row tile in the same slots loads three and reads rows 96..127 stale in its m64n128 MMA;
    a 40-row tile leaves NaN in rows 40..63, which a later 10-row tile's m64n64 MMA (two CTAs
    per SM) reads stale. No score may turn NaN, and every one must match the reference."""
    strided_shape(monkeypatch, ctas)
    B, C, lq, ld = 8, 100, 32, 128
    choice = torch.randint(0, 4, (B, C), generator=rng)
    d_lens = torch.tensor([100, 70, 40, 10])[choice]
    case = make_padded(rng, B, C, lq, ld, 128, dtype=torch.bfloat16, device="cuda", d_lens=d_lens)
    d_pad = torch.arange(ld, device="cuda") >= case.doc_lengths[..., None]
    case.documents[d_pad] = float("nan")
    s_h, a_h = case.call(ms, "_with_argmax")
    assert not s_h.isnan().any()
    assert_scores(s_h, case)
    assert_argmax(a_h, case)


# ---- packed surface -------------------------------------------------------------------------
# The padded grid's kernel with pair p as a query of one document (PackedGrid): the producer
# reads the pair's ids and both segments a step ahead and loads the query boxes at the query's
# first row; a block holds max_q_len rows (64-row chunks past 64), and chunks without query
# rows load no document. The kernel needs max_q_len: calls without it (plain scores) stay on
# the mma.sync kernels, so every call here passes it. Neighbouring segments are real rows, so
# a box or tile running past a segment reads another query's or document's tokens.

PACKED_SHAPES = [
    # query lengths, document lengths, D, pairs (None: every (q, d); n: n random ones, repeats
    # included), max_q_len (None: the longest query)
    ([32, 1, 31, 33, 0, 20], EDGE_LENS + [261], 128, None, None),
    ([64, 63, 65, 1, 128, 129, 0, 100], [0, 1, 64, 65, 128, 129, 300], 128, 60, None),  # 3 chunks
    ([17, 32, 9], EDGE_LENS, 64, None, 40),          # max_q_len above the longest: 2 box block
    ([20, 3, 40, 64], [180] * 7 + [0, 5], 96, 50, 64),
    ([70, 6, 3, 0], [200, 130, 33, 1], 8, None, 150),  # chunks past every query: no rows
    ([1] * 9, [97, 1, 128, 31], 40, 30, None),
    ([20], [300, 0, 257, 65, 1], 128, None, 32),   # one query, max_q_len past its 20 rows
    # streamed past 128 columns
    ([32, 1, 33, 0], EDGE_LENS + [261], 256, 90, None),
    ([70, 64, 1, 65], [130, 64, 31, 0, 257], 520, None, None),
    ([9], [300, 130, 0, 64], 256, None, 32),       # one short query, streamed
]


def _packed(rng, shape, dtype, **kw):
    q_lens, d_lens, dim, n_pairs, max_q_len = shape
    case = make_packed(rng, q_lens, d_lens, dim, n_pairs=n_pairs, dtype=dtype, device="cuda", **kw)
    case.max_q_len = max(q_lens) if max_q_len is None else max_q_len
    return case


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", PACKED_SHAPES,
                         ids=[f"nq{len(s[0])}_nd{len(s[1])}_d{s[2]}_lq{s[4] or max(s[0])}" for s in PACKED_SHAPES])
@PADDED_CTAS
def test_packed_matches_reference_and_mma_sync(ms, monkeypatch, rng, shape, dtype, ctas):
    """Ragged queries (empty ones, lengths 1..max_q_len, across the 32-row box and 64-row
    chunk edges) against ragged documents (edges at 32 / 64 / 128 rows, empty ones, the last
    one's box past the tensor), repeated pairs; the float64 reference and the mma.sync
    kernels; plain scores (with max_q_len) equal to the argmax form's bit for bit."""
    strided_shape(monkeypatch, ctas)
    case = _packed(rng, shape, dtype)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_scores(s_h, case)
    assert_argmax(a_h, case)
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4, equal_nan=True)
    assert (a_h == a_m).float().mean() > 0.99
    s_plain, _ = both_paths(monkeypatch, lambda: case.call(ms, ""))
    torch.testing.assert_close(s_plain, s_h, rtol=0, atol=0, equal_nan=True)
    without = dataclasses.replace(case, max_q_len=None)  # max_q_len 0: the mma.sync kernels
    torch.testing.assert_close(without.call(ms, ""), s_h, rtol=1e-5, atol=1e-4, equal_nan=True)
    again = case.call(ms, "_with_argmax")
    assert torch.equal(again[0], s_h) and torch.equal(again[1], a_h)  # deterministic


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("dim", [64, 128, 256, 520])
@PADDED_CTAS
def test_packed_exact_ties(ms, monkeypatch, rng, dim, dtype, ctas):
    """Lattice values: exact scores bit for bit, and the lowest tied row as argmax, in full
    tiles, in each tail width and across tile and box boundaries."""
    strided_shape(monkeypatch, ctas)
    d_lens = [63, 300, 150, 127, 200, 22, 0, 1]
    case = make_packed(rng, [32, 5, 70, 1], d_lens, dim, n_pairs=40, dtype=dtype, device="cuda",
                       values=lattice, max_q_len=70)
    starts = case.document_offsets.tolist()
    docs = case.documents
    for n, (a, b) in enumerate([(20, 40), (12, 140), (130, 149), (3, 100), (129, 190), (2, 21)]):
        docs[starts[n] + b] = docs[starts[n] + a]
    assert_exact_ties(ms, monkeypatch, case)


@pytest.mark.parametrize("dim", [128, 256])
@PADDED_CTAS
def test_packed_nan_neighbours_and_documents(ms, monkeypatch, rng, dim, ctas):
    """Every scored segment sits between NaN-filled segments no pair uses: the query boxes
    and document tiles that run past a segment read NaN rows, which must not reach a score.
    A NaN in a scored document row must: the score is NaN and every query row's argmax is
    that row (in tails of 32, 64 and 128 rows and in a full tile)."""
    strided_shape(monkeypatch, ctas)
    q_real, d_real = [30, 1, 64, 33], [97, 10, 40, 100, 140, 256, 20]
    q_lens = [n for r in q_real for n in (r, 40)]  # odd segments: NaN
    d_lens = [n for r in d_real for n in (r, 90)]
    pairs = [(2 * q, 2 * d) for q in range(len(q_real)) for d in range(len(d_real))]
    case = make_packed(rng, q_lens, d_lens, dim, pairs=pairs, dtype=torch.float16, device="cuda",
                       max_q_len=64)
    qo, do = case.query_offsets.tolist(), case.document_offsets.tolist()
    for k in range(1, len(q_lens), 2):
        case.queries[qo[k]:qo[k + 1]] = float("nan")
    for k in range(1, len(d_lens), 2):
        case.documents[do[k]:do[k + 1]] = float("nan")
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert not s_h.isnan().any()
    assert_scores(s_h, case)
    assert_argmax(a_h, case)
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4)
    hits = {1: 19, 2: 35, 3: 97, 5: 197}  # 10-row tail (m64n32 at one CTA), 40 (m64n64), 100, full
    for d, row in hits.items():
        case.documents[do[2 * d] + min(row, d_real[d] - 1), 5] = float("nan")
    s_h, a_h = case.call(ms, "_with_argmax")
    for p, (q, d) in enumerate(pairs):
        d //= 2
        if d in hits:
            ql = q_real[q // 2]
            assert s_h[p].isnan() and (a_h[p, :ql] == min(hits[d], d_real[d] - 1)).all(), (p, a_h[p].tolist())
        else:
            assert not s_h[p].isnan()
    assert_argmax(a_h, case)


def test_packed_bad_ids_and_offsets(ms, monkeypatch, rng):
    """Ids out of range and offsets that are decreasing or past the tensor (not checked on a
    GPU without MAXSIM_CHECK_VALUES): those pairs score NaN with argmax -1, the others as
    the reference says, and nothing reads or writes out of bounds."""
    monkeypatch.delenv("MAXSIM_CHECK_VALUES", raising=False)
    q_lens, d_lens = [5, 40, 4, 64], [300, 3, 6, 129, 70]
    pairs = [(0, 0), (4, 1), (-1, 0), (1, 5), (2, -5), (1, 3), (2, 1), (0, 1 << 20), (3, 2),
             (1 << 40, 3), (3, 4), (1, 4)]
    case = make_packed(rng, q_lens, d_lens, 128, pairs=pairs, dtype=torch.float16, device="cuda",
                       max_q_len=64)
    good = [p for p, (q, d) in enumerate(pairs) if 0 <= q < 4 and 0 <= d < 5]
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    torch.cuda.synchronize()
    bad = torch.ones(len(pairs), dtype=torch.bool, device="cuda")
    bad[good] = False
    assert s_h[bad].isnan().all() and (a_h[bad] == -1).all()
    assert torch.equal(s_h.isnan(), s_m.isnan())
    ref = dataclasses.replace(case, pair_query_ids=case.pair_query_ids[good],
                              pair_document_ids=case.pair_document_ids[good])
    assert_scores(s_h[good], ref)
    assert_argmax(a_h[good], ref)
    # decreasing offsets (document 3, query 2), a segment past the tensor (document 4);
    # documents 2 and query 1 grow into their neighbours' rows but stay valid (query 1 within
    # max_q_len, so the mma.sync kernels agree on every pair)
    offs = case.document_offsets.clone()
    offs[3] = offs[4] + 1
    offs[5] = offs[5] + 7
    qoffs = case.query_offsets.clone()
    qoffs[2] = qoffs[3] + 1
    broken = dataclasses.replace(case, document_offsets=offs, query_offsets=qoffs)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: broken.call(ms, "_with_argmax"))
    torch.cuda.synchronize()
    nan = torch.tensor([p not in good or q == 2 or d in (3, 4) for p, (q, d) in enumerate(pairs)])
    assert torch.equal(s_h.isnan().cpu(), nan) and torch.equal(s_m.isnan().cpu(), nan)
    assert (a_h[nan.cuda()] == -1).all()
    keep = (~nan).nonzero().flatten().tolist()
    end = offs.clone()
    end[5] = case.document_offsets[5]  # document 4 is not kept; the reference cannot read past Td
    ok = dataclasses.replace(broken, document_offsets=end, pair_query_ids=broken.pair_query_ids[keep],
                             pair_document_ids=broken.pair_document_ids[keep])
    assert_scores(s_h[keep], ok)
    assert_argmax(a_h[keep], ok)
    torch.testing.assert_close(s_h.nan_to_num(), s_m.nan_to_num(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_index_reads_of_either_width(ms, monkeypatch, rng, index_dtype):
    """The sm_90a producer reads a step's lengths, offsets and pair ids a step before it looks
    at them, each width into its own register (IndexView::issue): int32 and int64 indices,
    lengths past either end (clamped), empty documents and queries, packed ids and offsets
    that make a pair bad, over many steps a CTA (the reads wrap the walk), against the float64
    reference and the mma.sync kernels, and nothing read or written out of bounds."""
    monkeypatch.delenv("MAXSIM_CHECK_VALUES", raising=False)
    B, C, lq, ld, dim = 8, 90, 32, 180, 256
    d_lens = rand_lengths(rng, (B, C), ld)
    flat = d_lens.view(-1)
    flat[1::7], flat[2::11], flat[3::13] = -5, ld + 70, 0
    q_lens = torch.tensor([lq, -2, lq + 9, 0, 17, 1, lq, 5])
    case = make_padded(rng, B, C, lq, ld, dim, dtype=torch.float16, device="cuda", q_lens=q_lens,
                       d_lens=d_lens, index_dtype=index_dtype)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    torch.cuda.synchronize()
    clamped = dataclasses.replace(case, query_lengths=case.query_lengths.clamp(0, lq),
                                  doc_lengths=case.doc_lengths.clamp(0, ld))
    assert_scores(s_h, clamped)
    assert_argmax(a_h, clamped)
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4)

    d_real = rand_lengths(rng, (40,), 300).tolist()
    contrastive = make_contrastive(rng, 6, lq, d_real, dim, dtype=torch.bfloat16, device="cuda",
                                   index_dtype=index_dtype)
    (s_h, a_h), _ = both_paths(monkeypatch, lambda: contrastive.call(ms, "_with_argmax"))
    assert_scores(s_h, contrastive)
    assert_argmax(a_h, contrastive)

    q_real, d_real = [5, 40, 0, 64, 32], [300, 3, 6, 129, 70, 0, 180]
    pairs = [(q, d) for q in range(5) for d in range(7)] * 9
    pairs[::17] = [(-1, 0)] * len(pairs[::17])
    pairs[5::23] = [(1, 7)] * len(pairs[5::23])
    packed = make_packed(rng, q_real, d_real, dim, pairs=pairs, dtype=torch.float16, device="cuda",
                         index_dtype=index_dtype, max_q_len=64)
    offs = packed.document_offsets.clone()
    offs[3] = offs[4] + 1  # document 3 ends before it starts (bad); document 2 grows, valid
    broken = dataclasses.replace(packed, document_offsets=offs)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: broken.call(ms, "_with_argmax"))
    torch.cuda.synchronize()
    nan = torch.tensor([not (0 <= q < 5 and 0 <= d < 7) or d == 3 for q, d in pairs])
    assert torch.equal(s_h.isnan().cpu(), nan) and torch.equal(s_m.isnan().cpu(), nan)
    assert (a_h[nan.cuda()] == -1).all()
    keep = (~nan).nonzero().flatten().tolist()
    ok = dataclasses.replace(broken, pair_query_ids=broken.pair_query_ids[keep],
                             pair_document_ids=broken.pair_document_ids[keep])
    assert_scores(s_h[keep], ok)
    assert_argmax(a_h[keep], ok)


def test_packed_query_longer_than_max_q_len(ms, monkeypatch, rng):
    """max_q_len below the longest query (not checked on a GPU): the kernel's chunks cannot
    hold that query, so its pairs score NaN with argmax -1 here (the mma.sync kernels score
    them); every other pair is exact, and nothing reads or writes out of bounds."""
    monkeypatch.delenv("MAXSIM_CHECK_VALUES", raising=False)
    case = make_packed(rng, [32, 90, 7], [200, 64, 1], 128, dtype=torch.bfloat16, device="cuda",
                       max_q_len=64)
    s_h, a_h = case.call(ms, "_with_argmax")
    torch.cuda.synchronize()
    long_q = case.pair_query_ids == 1
    assert s_h[long_q].isnan().all() and (a_h[long_q] == -1).all()
    ok = ~long_q
    ref = dataclasses.replace(case, pair_query_ids=case.pair_query_ids[ok],
                              pair_document_ids=case.pair_document_ids[ok])
    assert_scores(s_h[ok], ref)
    assert_argmax(a_h[ok], ref)


@pytest.mark.parametrize("max_q_len", [32, 100])
@PADDED_CTAS
def test_packed_many_steps(ms, monkeypatch, rng, max_q_len, ctas):
    """Many more steps than CTAs (each CTA's producer reads ids two steps and segments one
    step ahead, over many steps), random repeated pairs, ragged and near-empty segments,
    int32 indices, a sprinkling of bad ids, against the mma.sync kernels (the float64
    reference at this size costs more than the rest of the file)."""
    strided_shape(monkeypatch, ctas)
    monkeypatch.delenv("MAXSIM_CHECK_VALUES", raising=False)
    q_lens = rand_lengths(rng, (50,), max_q_len)
    q_lens[torch.rand(50, generator=rng) < 0.1] = 0
    d_lens = rand_lengths(rng, (400,), 300)
    d_lens[torch.rand(400, generator=rng) < 0.2] = 1
    case = make_packed(rng, q_lens.tolist(), d_lens.tolist(), 128, n_pairs=3000, dtype=torch.bfloat16,
                       device="cuda", index_dtype=torch.int32, max_q_len=max_q_len)
    pq, pd = case.pair_query_ids.clone(), case.pair_document_ids.clone()
    pq[::97] = -3
    pd[5::89] = 400
    case = dataclasses.replace(case, pair_query_ids=pq, pair_document_ids=pd)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    bad = torch.zeros(3000, dtype=torch.bool, device="cuda")
    bad[::97] = True
    bad[5::89] = True
    assert torch.equal(s_h.isnan(), bad) and torch.equal(s_m.isnan(), bad)
    assert (a_h[bad] == -1).all()
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4, equal_nan=True)
    assert (a_h == a_m).float().mean() > 0.99
    again = case.call(ms, "_with_argmax")  # deterministic, NaN (the bad pairs) included
    assert torch.equal(again[0].isnan(), s_h.isnan()) and torch.equal(again[0].nan_to_num(), s_h.nan_to_num())
    assert torch.equal(again[1], a_h)


@pytest.mark.parametrize("run", ["1", "3", "4"])
@pytest.mark.parametrize("ctas", ["2", "1"], ids=["ctas2", "ctas1"])
def test_resident_runs_share_queries(ms, monkeypatch, rng, run, ctas):
    """The resident strided shape loads a query once for a run of steps that share it (a
    padded query's candidates; consecutive packed pairs with the same query rows) and into
    two buffers in turn: lattice values, so the scores and argmax must equal the reference
    and the mma.sync kernels bit for bit, with runs that cut across queries, pair lists
    grouped by query and shuffled, repeated pairs, empty queries and documents."""
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_RUN", run)
    strided_shape(monkeypatch, f"{ctas}-resident")
    d_lens = rand_lengths(rng, (9, 7), 300)
    d_lens[0, :3] = torch.tensor([0, 1, 300])
    q_lens = rand_lengths(rng, (9,), 32)
    q_lens[4] = 0
    padded = make_padded(rng, 9, 7, 32, 300, 128, dtype=torch.float16, device="cuda", d_lens=d_lens,
                         q_lens=q_lens, values=lattice)
    assert_exact_ties(ms, monkeypatch, padded)
    q_lens = rand_lengths(rng, (12,), 64).tolist()
    q_lens[3] = 0
    d_lens = rand_lengths(rng, (40,), 260).tolist()
    d_lens[7] = 0
    grouped = [(q, d) for q in range(12) for d in torch.randint(0, 40, (9,), generator=rng).tolist()]
    grouped += [grouped[-1]] * 3
    order = torch.randperm(len(grouped), generator=rng).tolist()
    for pairs in (grouped, [grouped[i] for i in order]):
        packed = make_packed(rng, q_lens, d_lens, 128, pairs=pairs, dtype=torch.bfloat16, device="cuda",
                             max_q_len=64, values=lattice)
        assert_exact_ties(ms, monkeypatch, packed)


@pytest.mark.parametrize("dim", [128, 320])
def test_packed_train_gradients(ms, rng, dim):
    """The training form's forward runs here (it passes max_q_len); the backward consumes its
    argmax."""
    case = make_packed(rng, [32, 0, 70, 1], [90, 130, 1, 64, 0, 257], dim, n_pairs=30,
                       dtype=torch.bfloat16, device="cuda", max_q_len=70)
    grad = unit(rng, *case.score_shape, device="cuda")
    scores, gq, gd = run_train(ms, case, grad)
    assert_scores(scores, case)
    _, argmax = case.call(ms, "_with_argmax")
    eq, ed, bound_q, bound_d = expected_grads(case, grad, argmax)
    assert_grads(gq, eq, bound_q, case.queries.dtype)
    assert_grads(gd, ed, bound_d, case.queries.dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_packed_equals_padded(ms, monkeypatch, rng, dtype):
    """The same tokens handed over padded and packed run the same MMAs on the same rows:
    the same scores and argmax bit for bit."""
    case = make_padded(rng, 4, 6, 32, 300, 128, dtype=dtype, device="cuda",
                       d_lens=[[0, 1, 32, 33, 64, 65], [127, 128, 129, 256, 257, 300]] * 2)
    packed = padded_as_packed(case)
    s_pad, a_pad = case.call(ms, "_with_argmax")
    s_pk, a_pk = packed.call(ms, "_with_argmax")
    assert torch.equal(s_pk, s_pad.reshape(-1)) and torch.equal(a_pk, a_pad.reshape(-1, 32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_packed_long_documents(ms, monkeypatch, rng, dtype):
    """LongDocStressPacked-like: 128 pairs (16 queries of 64 rows, each against 8 documents
    of 256..1024 rows), by the default rule (average document >= 256 rows), both ways."""
    monkeypatch.delenv("MAXSIM_CUDA_HOPPER_PACKED")
    d_lens = torch.randint(256, 1025, (128,), generator=rng).tolist()
    pairs = [(p // 8, p) for p in range(128)]
    case = make_packed(rng, [64] * 16, d_lens, 128, pairs=pairs, dtype=dtype, device="cuda", max_q_len=64)
    (s_h, a_h), (s_m, a_m) = both_paths(monkeypatch, lambda: case.call(ms, "_with_argmax"))
    assert_scores(s_h, case)
    assert_argmax(a_h, case)
    torch.testing.assert_close(s_h, s_m, rtol=1e-5, atol=1e-4)
    assert (a_h == a_m).float().mean() > 0.99
