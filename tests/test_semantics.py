"""The rules of docs/design.md's "Semantics every backend implements", one by one."""
import pytest
import torch

from conftest import (
    Contrastive, Packed, Padded, SURFACES, as_padded_documents, assert_argmax, assert_scores,
    flat_rows, ids, lattice, make_case, make_contrastive, make_packed, make_padded, off_sixteen_bytes,
    padded_as_packed, run_train, score_dtype, unit,
)

NAN, INF = float("nan"), float("inf")
FORMS = ("", "_with_argmax", "_train")


def call_all(ms, case):
    """{form: (scores, argmax or None)} for the three forms."""
    out = {}
    for form in FORMS:
        r = case.call(ms, form)
        out[form] = (r[0], r[1]) if form == "_with_argmax" else (r, None)
    return out


def assert_exact_with_and_without_argmax(ms, case):
    """Lattice-valued case: scores and argmax exactly the reference's, and the scores of the
    form without argmax bitwise the same."""
    scores, argmax = case.call(ms, "_with_argmax")
    assert_scores(scores, case, exact=True)
    assert_argmax(argmax, case, exact=True)
    assert_bitwise(case.call(ms, ""), scores, "scores without argmax")


def assert_bitwise(a: torch.Tensor, b: torch.Tensor, what=""):
    assert a.dtype == b.dtype and a.shape == b.shape, what
    if a.is_floating_point():
        a, b = a.view(torch.int32 if a.element_size() == 4 else torch.int64), \
            b.view(torch.int32 if b.element_size() == 4 else torch.int64)
    assert torch.equal(a, b), f"{what}: not bitwise identical"


# ---- padding never counts -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("garbage", [NAN, INF, -INF, 1e4])
@pytest.mark.parametrize("surface", ["padded", "contrastive", "contrastive_padded"])
def test_padding_never_counts(device, surface, garbage, dtype, rng):
    """Rewriting every padding row (queries past their length, documents past theirs) with
    other garbage changes nothing: scores, argmax and the gradients of the real rows. (float16
    takes the tensor-core kernels on a GPU, float32 under "highest" the FFMA ones.)"""
    ms, dev = device
    case = make_case(surface, rng, n=4, Lq=12, Ld=40, D=32, device=dev, dtype=dtype)
    before = call_all(ms, case)
    g = unit(rng, *case.score_shape).to(dev)
    _, gq_before, gd_before = run_train(ms, case, g)

    q_used, d_used = case.used_rows()
    q_pad = torch.arange(case.queries.shape[1]) >= case.query_lengths.cpu()[:, None]
    q2 = case.queries.clone()
    q2[q_pad.to(dev)] = garbage
    d2 = case.documents.clone()
    if surface == "padded":
        d_pad = torch.arange(case.documents.shape[2]) >= case.doc_lengths.cpu()[..., None]
        d2[d_pad.to(dev)] = garbage
        assert d_pad.any()
    elif surface == "contrastive_padded":
        d_pad = torch.arange(case.documents.shape[1]) >= case.document_lengths.cpu()[:, None]
        d2[d_pad.to(dev)] = garbage
        assert d_pad.any()
    assert q_pad.any()
    changed = case.with_qd(q2, d2)
    after = call_all(ms, changed)
    for form in FORMS:
        assert_bitwise(after[form][0], before[form][0], f"scores{form}")
    assert_bitwise(after["_with_argmax"][1], before["_with_argmax"][1], "argmax")
    assert_scores(after[""][0], case)

    _, gq, gd = run_train(ms, changed, g)
    assert_bitwise(gq, gq_before, "grad_queries")
    assert_bitwise(gd, gd_before, "grad_documents")
    assert (flat_rows(gq)[~q_used.to(dev)] == 0).all()
    assert (flat_rows(gd)[~d_used.to(dev)] == 0).all()


# ---- many steps, empty documents among them ------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("surface", ["padded", "packed"])
def test_empty_documents_among_many_steps(device, surface, dtype, rng):
    """2,400 pairs with every other document empty and some of one row. On a GPU the
    persistent grid then gives CTAs runs of several steps, many starting on an empty document,
    whose tile stream goes straight on to the next step's tiles: a load issued for the step it
    skipped would put one document's rows under another's score. Lattice values, so scores and
    argmax must be exactly the reference's."""
    ms, dev = device
    B, C, Lq, Ld, D = 4, 600, 8, 40, 32
    d_lens = torch.randint(2, Ld + 1, (B, C), generator=rng)
    d_lens[:, ::2] = 0
    d_lens[:, 1::14] = 1
    q_lens = torch.tensor([Lq, 3, Lq, 5])
    case = make_padded(rng, B, C, Lq, Ld, D, dtype=dtype, device=dev, q_lens=q_lens, d_lens=d_lens,
                       values=lattice)
    if surface == "packed":
        case = padded_as_packed(case)
    assert_exact_with_and_without_argmax(ms, case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("surface", ["contrastive", "contrastive_padded"])
def test_every_query_against_many_multi_tile_documents(device, surface, dtype, rng):
    """Every query against 200 ragged documents of up to 260 rows (three 128-row tiles), dim
    100 (a partial last K chunk): on a GPU the float32 / float64 FFMA kernel copies each chunk
    into shared memory while the one before is multiplied, so a CTA runs many steps of several
    tiles of several chunks through the same two buffers; a chunk read before it landed, or
    overwritten before it was read, moves a score. Empty and one-row documents among them.
    Lattice values, so scores and argmax must be exactly the reference's."""
    ms, dev = device
    d_lens = torch.randint(1, 261, (200,), generator=rng)
    d_lens[0], d_lens[3::17], d_lens[5::23] = 260, 0, 1
    case = make_contrastive(rng, 24, 8, d_lens, 100, dtype=dtype, device=dev, values=lattice)
    if surface == "contrastive_padded":
        case = as_padded_documents(case)
    assert_exact_with_and_without_argmax(ms, case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("dim", [64, 100])
@pytest.mark.parametrize("surface", SURFACES)
def test_inputs_off_sixteen_bytes(device, surface, dim, dtype, rng):
    """Contiguous queries and documents whose data starts one element past a 16-byte boundary
    (a slice of a larger buffer) score exactly as aligned ones: on a GPU the kernels that copy
    16 bytes at a time must notice and take narrower loads, never a misaligned wide one. dim 64
    keeps every row's offset the same, dim 100 leaves a partial last K chunk. Lattice values,
    so scores and argmax must be exactly the reference's."""
    ms, dev = device
    case = make_case(surface, rng, n=6, Lq=12, Ld=150, D=dim, device=dev, dtype=dtype, values=lattice)
    aligned = case.call(ms, "_with_argmax")
    shifted = case.with_qd(off_sixteen_bytes(case.queries, 1), off_sixteen_bytes(case.documents, 1))
    assert shifted.queries.data_ptr() % 16 != 0 and shifted.documents.data_ptr() % 16 != 0
    scores, argmax = shifted.call(ms, "_with_argmax")
    assert_scores(scores, case, exact=True)
    assert_argmax(argmax, case, exact=True)
    assert_bitwise(scores, aligned[0], "scores against aligned inputs")
    assert_bitwise(argmax, aligned[1], "argmax against aligned inputs")


# ---- empty segments --------------------------------------------------------------------------------

@pytest.mark.parametrize("surface", SURFACES)
def test_empty_query_scores_zero_and_empty_document_minus_inf(device, surface, rng):
    ms, dev = device
    if surface == "padded":
        # rows: (empty query, full doc), (empty query, empty doc), (query, empty doc), (query, doc)
        case = make_padded(rng, 2, 2, 5, 7, 16, q_lens=[0, 5], d_lens=[[7, 0], [0, 7]], device=dev)
        cells = {(0, 0): 0.0, (0, 1): 0.0, (1, 0): -INF}
        real = (1, 1)
    elif surface.startswith("contrastive"):
        case = as_padded_documents(make_contrastive(rng, 2, 5, [7, 0], 16, q_lens=[0, 5],
                                                    device=dev)) \
            if surface == "contrastive_padded" else \
            make_contrastive(rng, 2, 5, [7, 0], 16, q_lens=[0, 5], device=dev)
        cells = {(0, 0): 0.0, (0, 1): 0.0, (1, 1): -INF}
        real = (1, 0)
    else:
        case = make_packed(rng, [0, 5], [7, 0], 16, pairs=[(0, 0), (0, 1), (1, 1), (1, 0)], device=dev)
        cells = {(0,): 0.0, (1,): 0.0, (2,): -INF}
        real = (3,)
    for form, (scores, argmax) in call_all(ms, case).items():
        for cell, value in cells.items():
            assert scores[cell].item() == value, (form, cell, scores[cell].item())
            if argmax is not None:
                assert (argmax[cell] == -1).all()
        assert torch.isfinite(scores[real]), form
        if argmax is not None:
            assert (argmax[real] >= 0).all()
    assert_scores(call_all(ms, case)[""][0], case)

    g = torch.ones(case.score_shape, device=dev)
    g[real] = 0  # only the empty pairs: none of them may produce gradient
    _, gq, gd = run_train(ms, case, g)
    assert (gq == 0).all() and (gd == 0).all()


@pytest.mark.parametrize("surface", SURFACES)
def test_all_minus_inf_similarities_are_matched(device, surface, rng):
    """A row whose every similarity is -inf scores -inf with argmax 0, the lowest j reaching
    the max; that is not an empty document (which gives -1)."""
    ms, dev = device
    dim = 8
    q = unit(rng, 1, 3, dim).abs()
    q[..., 0] = -0.5                      # negative along the +inf coordinate
    d = torch.zeros(6, dim)
    d[:, 0] = INF                         # <q_i, d_j> = -inf for every i, j
    if surface == "padded":
        case = Padded(q, d.reshape(1, 1, 6, dim), ids([3]), ids([[6]]))
    elif surface == "contrastive":
        case = Contrastive(q, d, ids([0, 6]))
    elif surface == "contrastive_padded":
        case = as_padded_documents(Contrastive(q, d, ids([0, 6])))
    else:
        case = Packed(q[0], ids([0, 3]), d, ids([0, 6]), ids([0]), ids([0]))
    scores, argmax = case.to(dev).call(ms, "_with_argmax")
    assert scores.flatten().tolist() == [-INF]
    assert argmax.flatten().tolist() == [0, 0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("surface", SURFACES)
def test_signed_zero_similarities_tie(device, surface, dtype, rng):
    """-0 and +0 are one value to the max, as to torch.max: a row whose best similarity is
    zero, reached by a -0.0 document row and by a +0.0 one, takes the first of them whichever
    sign comes first (every other row is negative); the score is zero."""
    ms, dev = device
    dim = 16
    q = unit(rng, 1, 3, dim).abs() + 0.1
    neg = -(unit(rng, 4, dim).abs() + 0.1)
    z = torch.zeros(1, dim)
    d = torch.cat([neg[:1], -z, z, neg[1:2], z, -z, neg[2:3], z, -z, neg[3:4]])  # zeros at 1, 2, 4, 5, 7, 8
    n = d.shape[0]
    q, d = q.to(dtype), d.to(dtype)
    if surface == "padded":
        case = Padded(q, d.reshape(1, 1, n, dim), ids([3]), ids([[n]]))
    elif surface == "contrastive":
        case = Contrastive(q, d, ids([0, n]))
    elif surface == "contrastive_padded":
        case = as_padded_documents(Contrastive(q, d, ids([0, n])))
    else:
        case = Packed(q[0], ids([0, 3]), d, ids([0, n]), ids([0]), ids([0]))
    scores, argmax = case.to(dev).call(ms, "_with_argmax")
    assert scores.flatten().tolist() == [0.0]
    assert argmax.flatten().tolist() == [1, 1, 1]


# ---- NaN and inf ------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["document", "query", "both"])
@pytest.mark.parametrize("surface", SURFACES)
def test_nan_propagates_like_torch_max(device, surface, where, rng):
    """A NaN similarity wins its row: m_i = NaN, argmax_i = the first NaN's j."""
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=6, Ld=300, D=16)
    q_used, d_used = case.used_rows()
    qf, df = flat_rows(case.queries), flat_rows(case.documents)
    if where in ("document", "both"):
        rows = d_used.nonzero().flatten()
        for r in rows[torch.randperm(len(rows), generator=rng)[:3]]:
            df[r, int(torch.randint(0, 16, (1,), generator=rng))] = NAN
    if where in ("query", "both"):
        rows = q_used.nonzero().flatten()
        qf[rows[torch.randperm(len(rows), generator=rng)[:1]], 3] = NAN
    case = case.with_qd(qf.reshape(case.queries.shape), df.reshape(case.documents.shape)).to(dev)
    expected, _ = case.reference()
    assert torch.isnan(expected).any()
    for form, (scores, argmax) in call_all(ms, case).items():
        assert_scores(scores, case, expected)
        if argmax is not None:
            assert_argmax(argmax, case)


@pytest.mark.parametrize("surface", SURFACES)
def test_infinities(device, surface, rng):
    """+inf/-inf entries in tokens: +inf similarities win (lowest j among them), -inf ones
    never do unless alone, inf - inf makes NaN; all as torch.max over the same sims."""
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=6, Ld=200, D=8)
    q_used, d_used = case.used_rows()
    df = flat_rows(case.documents)
    rows = d_used.nonzero().flatten()
    picks = rows[torch.randperm(len(rows), generator=rng)[:6]]
    for k, r in enumerate(picks):
        df[r, k % 2] = INF if k % 3 else -INF
        if k == 5:
            df[r, 2] = -INF  # some sims become inf - inf = NaN
    case = case.with_qd(case.queries, df.reshape(case.documents.shape)).to(dev)
    expected, _ = case.reference()
    assert torch.isinf(expected).any()
    for form, (scores, argmax) in call_all(ms, case).items():
        assert_scores(scores, case, expected)
        if argmax is not None:
            assert_argmax(argmax, case)


# ---- determinism -------------------------------------------------------------------------------------

@pytest.mark.parametrize("surface", SURFACES)
def test_forward_is_deterministic(device, surface, rng):
    ms, dev = device
    case = make_case(surface, rng, n=6, Lq=40, Ld=500, D=96, device=dev, dtype=torch.float16)
    first = call_all(ms, case)
    for _ in range(3):
        again = call_all(ms, case)
        for form in FORMS:
            assert_bitwise(again[form][0], first[form][0], f"scores{form}")
        assert_bitwise(again["_with_argmax"][1], first["_with_argmax"][1], "argmax")


# ---- empty inputs -------------------------------------------------------------------------------------

def _empty_cases(surface, gen, dev):
    """Cases with a zero-sized extent; each must give empty/zero results, never an error."""
    if surface == "padded":
        shapes = [(0, 3, 4, 5, 8), (2, 0, 4, 5, 8), (2, 3, 0, 5, 8), (2, 3, 4, 0, 8), (2, 3, 4, 5, 0),
                  (0, 0, 0, 0, 0)]
        return [make_padded(gen, *s, device=dev) for s in shapes]
    if surface == "contrastive":
        return [
            make_contrastive(gen, 0, 4, [3, 5], 8, device=dev),          # no queries
            make_contrastive(gen, 3, 4, [], 8, device=dev),              # no documents
            make_contrastive(gen, 3, 4, [0, 0], 8, device=dev),          # empty documents, T = 0
            make_contrastive(gen, 3, 0, [3, 5], 8, device=dev),          # Lq = 0
            make_contrastive(gen, 3, 4, [3, 5], 0, device=dev),          # D = 0
            make_contrastive(gen, 0, 0, [], 0, device=dev, q_lens=None),
        ]
    if surface == "contrastive_padded":
        return [as_padded_documents(c) for c in _empty_cases("contrastive", gen, dev)]
    return [
        make_packed(gen, [3, 4], [5, 6], 8, pairs=[], device=dev),        # no pairs
        make_packed(gen, [], [], 8, pairs=[], device=dev),                # nothing at all
        make_packed(gen, [0, 0], [0, 2], 8, device=dev),                  # empty queries
        make_packed(gen, [2, 3], [0, 0], 8, device=dev),                  # empty documents
        make_packed(gen, [2, 3], [4, 1], 0, device=dev),                  # D = 0
        make_packed(gen, [0, 0], [4, 1], 8, device=dev, max_q_len=0),     # argmax [4, 0]
    ]


@pytest.mark.parametrize("surface", SURFACES)
def test_empty_inputs(device, surface, rng):
    ms, dev = device
    for case in _empty_cases(surface, rng, dev):
        expected, _ = case.reference()
        for form, (scores, argmax) in call_all(ms, case).items():
            assert_scores(scores, case, expected)
            if argmax is not None:
                assert_argmax(argmax, case)
        g = torch.ones(case.score_shape, device=dev)
        scores, gq, gd = run_train(ms, case, g)
        assert gq.shape == case.queries.shape and gd.shape == case.documents.shape
        assert gq.dtype == case.queries.dtype and gd.dtype == case.documents.dtype
        assert (gq == 0).all() and (gd == 0).all()  # no case above has a matched token


def test_score_dtype_follows_input(device, rng):
    """float32 scores for fp16/bf16/fp32 inputs, float64 for float64 (CPU and CUDA)."""
    ms, dev = device
    dtypes = [torch.float16, torch.bfloat16, torch.float32]
    dtypes += [torch.float64] if dev.type in ("cpu", "cuda") else []
    for dtype in dtypes:
        case = make_case("packed", rng, D=4, device=dev, dtype=dtype, values=lattice)
        assert case.call(ms).dtype == score_dtype(dtype)


@pytest.mark.parametrize("surface", SURFACES)
def test_cpu_results_do_not_depend_on_thread_count(device, surface, rng):
    """Each output row has one owner adding in a fixed order: 1 thread == 3 threads, bitwise."""
    ms, dev = device
    if dev.type != "cpu":
        pytest.skip("CPU thread pool")
    case = make_case(surface, rng, n=7, Lq=33, Ld=150, D=64)
    g = unit(rng, *case.score_shape)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            results.append((case.call(ms, "_with_argmax"), case.call(ms), run_train(ms, case, g)))
    finally:
        torch.set_num_threads(before)
    (a1, s1, t1), (a3, s3, t3) = results
    assert_bitwise(a1[0], a3[0], "scores_with_argmax")
    assert_bitwise(a1[1], a3[1], "argmax")
    assert_bitwise(s1, s3, "scores")
    for x, y, what in zip(t1, t3, ("train scores", "grad_queries", "grad_documents")):
        assert_bitwise(x, y, what)
