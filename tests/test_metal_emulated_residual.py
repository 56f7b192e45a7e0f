"""ColBERTv2 / PLAID residual documents on the Metal backend's kernels, run on the Linux MSL
emulator (tools/metal_emu/): uint8 packed bucket ids with a centroid id per token, decoded in
the tile load (ResidualFormat in maxsim_metal/tiles.h), float32 / float16 / bfloat16 queries,
centroids and bucket weights of any of the three types.

The contract is the CPU and CUDA backends' (tests/test_residual.py): t = centroid + bucket
weight summed in float32 and rounded once to the queries' dtype; each similarity (q . t,
float32) times 1 / max(||t||, 1e-12) before the max when the codec normalises; grad_queries
only. Everything is checked against the float64 reference on the decoded tokens. As in the
other emulated suites, every launch runs in three thread orders with two poison patterns
and must give the same bits; under .ci/metal.sh every buffer (codes, centroids and bucket
weights included) is exactly its tensor's size under AddressSanitizer.
"""
from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from conftest import (
    SURFACES, assert_argmax, assert_grads, assert_scores, expected_grads, ids, make_case, make_contrastive,
    make_packed, make_padded, unit,
)
import metal_emulator as emu
from test_metal_emulated import _plan, bits
from test_residual import RES, encode

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the MSL emulator runs on Linux")

QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NBITS = (1, 2, 4)


@pytest.fixture(scope="module")
def ms():
    return emu.EmulatedMaxsim()


def call(ms, case, storage, form=""):
    return getattr(ms, case.fn + form)(*case.args(), **case.kwargs(), **storage)


def check_all(ms, run, storage, expect, gen, *, exact=False):
    """Scores and argmax against the float64 reference on the decoded tokens, the score form
    bitwise equal to _with_argmax, then grad_queries from that argmax."""
    qdtype = run.queries.dtype
    scores, argmax = call(ms, run, storage, "_with_argmax")
    assert_scores(scores, expect, input_dtype=qdtype, exact=exact)
    assert_argmax(argmax, expect, exact=exact)
    assert torch.equal(bits(call(ms, run, storage)), bits(scores))
    g = torch.randn(scores.shape, generator=gen, dtype=torch.float64).float()
    gq, gd = ms.backward(run, g, argmax, **storage)
    assert gd is None
    eq, _, bq, _ = expected_grads(expect, g, argmax)
    assert_grads(gq, eq, bq, qdtype)
    return scores, argmax, gq


# ---- every surface, nbits and query dtype -----------------------------------------------------

@pytest.mark.parametrize("query_dtype", QUERY_DTYPES, ids=str)
@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("surface", SURFACES)
def test_surfaces(ms, surface, nbits, query_dtype, rng):
    """Ragged lengths over two query chunks and two document tiles; dim 64 (two 32-column
    steps, so the row norm spans steps)."""
    index_dtype = torch.int32 if query_dtype == torch.bfloat16 else torch.int64
    case = make_case(surface, rng, n=3, Lq=37, Ld=41, D=64, index_dtype=index_dtype)
    run, storage, expect = encode(RES, case, rng, nbits, query_dtype=query_dtype)
    check_all(ms, run, storage, expect, rng)


@pytest.mark.parametrize("centroid_dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("normalize", (True, False))
@pytest.mark.parametrize("dim", (8, 48, 128))
def test_dims_centroid_types_and_normalize(ms, dim, normalize, centroid_dtype, rng):
    """Centroids and bucket weights of every type with every query type (read by a runtime
    flag, not a pipeline each); dims a multiple of 8 * nbits, 48 ending mid-step."""
    nbits = 1 if dim == 8 else 2
    case = make_padded(rng, 2, 3, 11, 40, dim)
    for query_dtype in QUERY_DTYPES:
        run, storage, expect = encode(RES, case, rng, nbits, query_dtype=query_dtype,
                                      centroid_dtype=centroid_dtype, normalize=normalize, n_centroids=50)
        check_all(ms, run, storage, expect, rng)


def test_codes_of_both_widths_and_weights_of_another_type(ms, rng):
    """int64 codes and bucket weights in float32 beside float16 centroids."""
    case = make_case("packed", rng, n=3, Lq=9, Ld=30, D=32)
    run, storage, expect = encode(RES, case, rng, 4, query_dtype=torch.float16)
    codec = storage["residual_codec"]
    storage = {"document_codes": storage["document_codes"].long(),
               "residual_codec": RES.ResidualCodec(codec.centroids, codec.bucket_weights.float(), 4)}
    check_all(ms, run, storage, expect, rng)


def test_long_rows(ms, rng):
    """Lq = 70 (three query chunks) against Ld = 300 (ten document tiles)."""
    case = make_padded(rng, 1, 2, 70, 300, 32, q_lens=[70], d_lens=[[300, 257]])
    run, storage, expect = encode(RES, case, rng, 2)
    check_all(ms, run, storage, expect, rng)


def test_lengths_and_empty_inputs(ms, rng):
    lengths = [0, 1, 7, 8, 9, 33]
    n = len(lengths)
    for case in (make_padded(rng, n, n, 33, 33, 16, q_lens=lengths, d_lens=[lengths] * n),
                 make_packed(rng, lengths, lengths, 16),
                 make_packed(rng, [3, 0], [2, 4], 16, pairs=[]),   # no pairs
                 make_padded(rng, 0, 3, 5, 4, 16),                 # B == 0
                 make_contrastive(rng, 2, 6, [], 16),               # no documents
                 make_contrastive(rng, 2, 6, [0, 3, 0], 16)):       # empty documents: -inf
        run, storage, expect = encode(RES, case, rng, 2)
        check_all(ms, run, storage, expect, rng)


def test_zero_tokens(ms, rng):
    """A token that decodes to zero has factor 1 / 1e-12 and similarity 0 (not NaN)."""
    case = make_padded(rng, 2, 2, 5, 6, 16, q_lens=[5, 2], d_lens=[[6, 3], [1, 6]])
    codec = RES.ResidualCodec(torch.zeros(2, 16, dtype=torch.float16), torch.zeros(4), 2)
    codes = torch.zeros(case.documents.shape[:-1], dtype=torch.int64)
    residuals = torch.zeros(*case.documents.shape[:-1], 4, dtype=torch.uint8)
    run = dataclasses.replace(case, queries=case.queries.half(), documents=residuals)
    expect = dataclasses.replace(case, documents=torch.zeros_like(case.documents))
    check_all(ms, run, {"document_codes": codes, "residual_codec": codec}, expect, rng)


# ---- exact values: ties, bit order ------------------------------------------------------------

@pytest.mark.parametrize("surface", SURFACES)
def test_ties_exact(ms, surface, rng):
    """Centroids, weights and queries on a lattice, no normalisation: every similarity is
    exact, so scores and argmax equal the reference bitwise, ties to the lowest token."""
    case = make_case(surface, rng, n=4, Lq=10, Ld=40, D=16)
    codec = RES.ResidualCodec(torch.randint(-3, 4, (6, 16), generator=rng) / 4,
                              torch.tensor([-0.25, 0.0, 0.25, 0.5]), 2, normalize=False)
    tokens = case.documents.shape[:-1]
    codes = torch.randint(0, 6, tokens, generator=rng)
    residuals = torch.randint(0, 256, (*tokens, 4), generator=rng).to(torch.uint8)
    decoded = RES.decompress_residuals(codes, residuals, codec, torch.float64)
    q = torch.randint(-3, 4, case.queries.shape, generator=rng) / 4
    expect = dataclasses.replace(case, queries=q, documents=decoded)
    for query_dtype in QUERY_DTYPES:
        run = dataclasses.replace(case, queries=q.to(query_dtype), documents=residuals)
        check_all(ms, run, {"document_codes": codes, "residual_codec": codec}, expect, rng, exact=True)


@pytest.mark.parametrize("nbits", NBITS)
def test_bit_order_one_dimension_at_a_time(ms, nbits):
    """Token t holds bucket id t % 2**nbits at dimension k = t // 2**nbits and 0 elsewhere;
    zero centroids, bucket weight b = b + 1, no normalisation. Pair t scores that token
    against the one-hot query of dimension k, so it must read the weight of that bucket id:
    a wrong bit or byte order shows as a wrong number."""
    dim, buckets = 8 * nbits, 1 << nbits
    n = dim * buckets
    tokens = torch.zeros(n, dim, dtype=torch.long)
    tokens[torch.arange(n), torch.arange(n) // buckets] = torch.arange(n) % buckets
    residuals = RES.pack_buckets(tokens, nbits)
    codec = RES.ResidualCodec(torch.zeros(1, dim), torch.arange(1, buckets + 1).float(), nbits, normalize=False)
    codes = torch.zeros(n, dtype=torch.int32)
    queries = torch.eye(dim)                                       # query k: dimension k only
    steps = torch.arange(0, n + 1, dtype=torch.int64)
    scores = ms.score_pairs_packed(queries, steps[:dim + 1], residuals, steps, torch.arange(n) // buckets,
                                   torch.arange(n), document_codes=codes, residual_codec=codec)
    assert torch.equal(scores, (torch.arange(n) % buckets + 1).float())


# ---- bad codes: NaN for the pairs that read them, no out-of-bounds read ------------------------

@pytest.mark.parametrize("surface", SURFACES)
def test_bad_codes(ms, surface, rng):
    """A code out of range decodes to NaN (its pair scores NaN, the NaN token wins the argmax)
    and is never used as an address (exact-size centroid buffer under ASan); padding tokens'
    codes (out of range too) change nothing."""
    case = make_case(surface, rng, n=3, Lq=6, Ld=20, D=32)
    run, storage, expect = encode(RES, case, rng, 2)
    codes = storage["document_codes"].clone().reshape(-1)
    codes[3] = 37          # == n_centroids
    codes[-1] = -5         # the last token (padding on the padded surfaces)
    codes[min(11, codes.numel() - 1)] = 1 << 30
    bad = dict(storage, document_codes=codes.reshape(storage["document_codes"].shape))
    decoded = expect.documents.clone().reshape(-1, case.dim)
    decoded[codes < 0] = float("nan")
    decoded[codes >= 37] = float("nan")
    expect_bad = dataclasses.replace(expect, documents=decoded.reshape(expect.documents.shape))
    scores, argmax = call(ms, run, bad, "_with_argmax")
    assert_scores(scores, expect_bad, input_dtype=run.queries.dtype)
    assert_argmax(argmax, expect_bad)


# ---- the _train forms: autograd reaches the queries only ----------------------------------------

@pytest.mark.parametrize("surface", SURFACES)
def test_train_forms(ms, surface, rng):
    case = make_case(surface, rng, n=3, Lq=11, Ld=14, D=32)
    run, storage, expect = encode(RES, case, rng, 2, query_dtype=torch.bfloat16, centroid_dtype=torch.float32)
    g = unit(rng, *case.score_shape)
    q = run.queries.detach().clone().requires_grad_(True)
    scores = call(ms, dataclasses.replace(run, queries=q), storage, "_train")
    scores.backward(g.to(scores.dtype))
    ref_scores, argmax = call(ms, run, storage, "_with_argmax")
    assert torch.equal(bits(scores.detach()), bits(ref_scores))
    eq, _, bq, _ = expected_grads(expect, g, argmax)
    assert_grads(q.grad, eq, bq, q.dtype)
    assert q.grad.abs().sum() > 0


def test_no_document_gradient(ms, rng):
    case = make_padded(rng, 2, 2, 5, 6, 16)
    run, storage, _ = encode(RES, case, rng, 2)
    scores, argmax = call(ms, run, storage, "_with_argmax")
    c = run
    args = ("padded", False, c.queries, c.documents, [c.query_lengths, c.doc_lengths, None, None],
            [*c.queries.shape[:2], *c.documents.shape[1:3]], torch.ones(4), argmax.reshape(4, -1))
    with pytest.raises(emu.EmulatorError, match="compressed documents get no gradient"):
        ms.gradient(*args, **storage)


# ---- PLAID's centroid-only score (centroid.metal) ------------------------------------------------

def centroid_case(rng, *, nq=3, lq=150, n_cent=40, dim=32, lens=(0, 5, 70, 33, 1, 12)):
    """lq 150: two 128-row passes of the threadgroup."""
    q = unit(rng, nq, lq, dim)
    centroids = unit(rng, n_cent, dim)
    lengths = torch.tensor(lens)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    codes = torch.randint(0, n_cent, (int(lengths.sum()),), generator=rng)
    return q, centroids, codes, offsets


@pytest.mark.parametrize("query_dtype", QUERY_DTYPES, ids=str)
def test_centroid_score_every_pair(ms, query_dtype, rng):
    q, centroids, codes, offsets = centroid_case(rng)
    q, centroids = q.to(query_dtype), centroids.to(query_dtype)
    ql = torch.tensor([150, 0, 4], dtype=torch.int32)
    scores = ms.score_centroids(q, codes.int(), offsets, centroids, query_lengths=ql)
    ref = RES.score_centroids_reference(q.double(), codes, offsets, centroids.double(), query_lengths=ql)
    assert scores.shape == (3, 6)
    assert (scores[[0, 2], 0] == float("-inf")).all() and (scores[1] == 0).all()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isinf(scores), torch.isinf(ref))
    torch.testing.assert_close(scores.double()[finite], ref[finite], rtol=1e-5, atol=1e-5)


def test_centroid_score_pairs_and_bad_inputs(ms, rng):
    q, centroids, codes, offsets = centroid_case(rng, lq=45, dim=64)
    pq = torch.tensor([0, 2, 1, 2, 0])
    pd = torch.tensor([2, 2, 3, 5, 4], dtype=torch.int32)
    scores = ms.score_centroids(q, codes, offsets, centroids, pair_query_ids=pq, pair_document_ids=pd)
    ref = RES.score_centroids_reference(q.double(), codes, offsets, centroids.double(),
                                        pair_query_ids=pq, pair_document_ids=pd)
    torch.testing.assert_close(scores.double(), ref, rtol=1e-5, atol=1e-5)
    grid = ms.score_centroids(q, codes, offsets, centroids)
    assert torch.equal(grid[pq, pd.long()], scores)  # the same sums in the same order
    # no read out of bounds (exact-size buffers under ASan): NaN for the pairs that meet one
    bad = codes.clone()
    bad[7] = centroids.shape[0]           # document 2 (tokens 5 .. 74)
    bad[-1] = -3                          # document 5
    out = ms.score_centroids(q, bad, offsets, centroids)
    assert torch.isnan(out[:, [2, 5]]).all() and not torch.isnan(out[:, [1, 3, 4]]).any()
    bad_ids = torch.tensor([0, 6, 1, -1, 0]), torch.tensor([2, 2, 9, 5, 4])
    out = ms.score_centroids(q, codes, offsets, centroids, pair_query_ids=bad_ids[0], pair_document_ids=bad_ids[1])
    assert torch.isnan(out[1:4]).all() and torch.equal(out[[0, 4]], scores[[0, 4]])
    bad_offsets = offsets.clone()
    bad_offsets[3] = 1000                 # documents 2 and 3 leave the codes
    out = ms.score_centroids(q, codes, bad_offsets, centroids)
    assert torch.isnan(out[:, 2:4]).all() and torch.equal(out[:, [1, 4, 5]], grid[:, [1, 4, 5]])


def test_centroid_score_nan_and_ties(ms, rng):
    """A NaN in the table wins its row's max (so the score is NaN); equal values are harmless."""
    q, centroids, codes, offsets = centroid_case(rng, lq=9, dim=16)
    centroids[3] = centroids[4]
    centroids[5, 0] = float("nan")
    codes[:] = 4
    codes[10] = 3
    codes[80] = 5                          # document 3 (tokens 75 .. 107)
    scores = ms.score_centroids(q, codes, offsets, centroids)
    ref = RES.score_centroids_reference(q.double(), codes, offsets, centroids.double())
    assert torch.isnan(scores[:, 3]).all()
    keep = torch.isfinite(ref)
    torch.testing.assert_close(scores.double()[keep], ref[keep], rtol=1e-5, atol=1e-5)


# ---- the launch plan: one residual pipeline per surface and query type -------------------------

def test_pipeline_names(ms):
    from test_metal_emulated_compressed import _registered
    sizes, idx = [2, 2, 5, 7], [ids([5, 5]), ids([7] * 4), None, None]
    for surface in SURFACES:
        for tname, dtype in zip(("float", "half", "bfloat"), QUERY_DTYPES):
            fwd = _plan(ms, surface, sizes, 16, idx, dtype=dtype, doc_format=3)["kernel"]
            gq = _plan(ms, surface, sizes, 16, idx, backward=True, to_query=True, dtype=dtype, doc_format=3)["kernel"]
            gd = _plan(ms, surface, sizes, 16, idx, backward=True, dtype=dtype, doc_format=3)["kernel"]
            assert fwd == f"maxsim_forward_{surface}_{tname}_residual"
            assert gq == f"maxsim_grad_queries_{surface}_{tname}_residual"
            assert _registered(ms, fwd) and _registered(ms, gq) and not _registered(ms, gd)


# ---- mutations the checks above must catch ------------------------------------------------------

RESIDUAL_MUTATIONS = {
    "bucket bits not reversed": [
        ("tiles.h", "bucket |= ((field >> uint(x.nbits - 1 - b)) & 1u) << uint(b);",
         "bucket |= ((field >> uint(b)) & 1u) << uint(b);")],
    "bytes read from their low bit": [
        ("tiles.h", "(byte >> uint(8 - int(bit % 8) - x.nbits))", "(byte >> uint(bit % 8))")],
    "norm of the last step only": [
        ("forward.metal", "      float sumsq = 0.0f;", "      float sumsq;"),
        ("forward.metal", "        if (Docs::kRowNorm && tid < uint(kMaxsimDocRows)) {\n",
         "        if (Docs::kRowNorm && tid < uint(kMaxsimDocRows)) {\n          sumsq = 0.0f;\n")],
    "token not rounded to the queries' type": [("tiles.h", "    return float(T(t));", "    return t;")],
    "grad_queries without the factor": [
        ("backward.metal", "    weight = Docs::scaled(weight, documents, docx, src);\n", "")],
}


@pytest.mark.parametrize("mutation", list(RESIDUAL_MUTATIONS))
def test_suite_catches_residual_mutations(tmp_path, mutation, rng):
    mutant = emu.mutant(tmp_path, mutation.replace(" ", "_").replace("'", ""), RESIDUAL_MUTATIONS[mutation])
    case = make_contrastive(rng, 4, 33, [0, 9, 33, 40], 64, q_lens=[0, 5, 33, 20])
    failures = []
    for nbits in NBITS:
        run, storage, expect = encode(RES, case, rng, nbits, query_dtype=torch.float16, centroid_dtype=torch.float32)
        try:
            check_all(mutant, run, storage, expect, rng)
        except AssertionError as e:
            failures.append(f"nbits {nbits}: {str(e).splitlines()[0]}")
    assert failures, f"{mutation}: the residual checks did not notice"
    print(f"{mutation}: {failures[0]}")
