"""ColBERTv2 / PLAID residual documents (uint8 packed bucket ids + a centroid id per token) on
every surface and form of every backend that scores them, against the float64 reference on the
decoded tokens.

The contract (torch-ext/maxsim/_residual.py): a token is t = centroid + bucket weight, summed in
float32 and rounded once to the queries' dtype; its similarity is (q . t) summed in float32,
times 1 / max(||t||, 1e-12) when the codec normalises, before the max. The expectations here are
the float64 MaxSim over t / ||t|| (t as the kernel rounds it), so the usual tolerances apply.
The bit order is checked by hand here and against colbert-ai's own codec in
tests/integrations/test_residual_codecs.py.
"""
import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from conftest import (
    SURFACES, assert_argmax, assert_grads, assert_scores, expected_grads, make_case, make_padded,
    rounded_as_the_kernels_see_it, unit,
)

_path = Path(__file__).resolve().parent.parent / "torch-ext" / "maxsim" / "_residual.py"
_spec = importlib.util.spec_from_file_location("maxsim_residual_src", _path)
RES = importlib.util.module_from_spec(_spec)
sys.modules["maxsim_residual_src"] = RES
_spec.loader.exec_module(RES)

QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NBITS = (1, 2, 4)


def residual_backends(device):
    ms, dev = device
    if dev.type not in ("cpu", "cuda", "mps"):
        pytest.skip(f"residual documents are not scored on {dev.type} yet")
    return ms, dev


def make_codec(ms, rng, dim, nbits, *, n_centroids=37, dtype=torch.float16, normalize=True, device="cpu"):
    centroids = unit(rng, n_centroids, dim).to(dtype)
    weights = torch.sort(torch.randn(1 << nbits, generator=rng) * 0.05).values.to(dtype)
    return ms.ResidualCodec(centroids.to(device), weights.to(device), nbits, normalize)


def encode(ms, case, rng, nbits, *, query_dtype=torch.float16, centroid_dtype=torch.float16, normalize=True,
           n_centroids=37):
    """(run_case, storage kwargs, expect_case): `case` with random residual documents of its
    shape, queries of query_dtype, and the same case over the decoded tokens in float64."""
    dev = case.queries.device
    codec = make_codec(ms, rng, case.dim, nbits, n_centroids=n_centroids, dtype=centroid_dtype,
                       normalize=normalize, device=dev)
    tokens = case.documents.shape[:-1]
    codes = torch.randint(0, n_centroids, tokens, generator=rng).to(torch.int32).to(dev)
    residuals = torch.randint(0, 256, (*tokens, case.dim * nbits // 8), generator=rng).to(torch.uint8).to(dev)
    queries = case.queries.to(query_dtype)
    t, factor = RES.residual_tokens(codes.cpu(), residuals.cpu(), codec.to("cpu"), query_dtype)
    decoded = t.double() * factor.double().unsqueeze(-1)
    expect = dataclasses.replace(case, queries=queries, documents=decoded.to(dev))
    run = dataclasses.replace(case, queries=queries, documents=residuals)
    return run, {"document_codes": codes, "residual_codec": codec}, expect


def call(ms, case, storage, form=""):
    return getattr(ms, case.fn + form)(*case.args(), **case.kwargs(), **storage)


# ---- the codec itself (pure PyTorch) ------------------------------------------------------

def test_bit_order_by_hand():
    # nbits 2: dimension d's bucket bits go lowest first; a byte fills from its top bit.
    # buckets [1, 2, 3, 0 | 0, 1, 0, 2]: stream 10 01 11 00 | 00 10 00 01
    res = torch.tensor([[0b10011100, 0b00100001]], dtype=torch.uint8)
    assert RES.unpack_buckets(res, 2).tolist() == [[1, 2, 3, 0, 0, 1, 0, 2]]
    # nbits 1: bit d of the stream is dimension d, top bit first
    assert RES.unpack_buckets(torch.tensor([[0b10000001]], dtype=torch.uint8), 1).tolist() == [[1, 0, 0, 0, 0, 0, 0, 1]]
    # nbits 4: the low nibble of the bucket id comes first, bit-reversed into the byte's top
    assert RES.unpack_buckets(torch.tensor([[0b10000100]], dtype=torch.uint8), 4).tolist() == [[1, 2]]


@pytest.mark.parametrize("nbits", NBITS)
def test_pack_unpack_round_trip(nbits, rng):
    buckets = torch.randint(0, 1 << nbits, (5, 64), generator=rng)
    packed = RES.pack_buckets(buckets, nbits)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 64 * nbits // 8)
    assert torch.equal(RES.unpack_buckets(packed, nbits), buckets)


@pytest.mark.parametrize("nbits", NBITS)
def test_compress_decompress_clustered(cpu_kernel, nbits, rng):
    """compress_residuals then decompress_residuals stays within the buckets' resolution on
    clustered embeddings."""
    ms = cpu_kernel
    dim = 64
    centroids = unit(rng, 16, dim)
    x = centroids[torch.randint(0, 16, (200,), generator=rng)] + 0.03 * torch.randn(200, dim, generator=rng)
    x = torch.nn.functional.normalize(x, dim=-1)
    spread = torch.quantile((x - centroids[(x @ centroids.T).argmax(-1)]).flatten(),
                            torch.linspace(0, 1, (1 << nbits) + 1)[1:-1])
    levels = torch.quantile((x - centroids[(x @ centroids.T).argmax(-1)]).flatten(),
                            (torch.arange(1 << nbits) + 0.5) / (1 << nbits))
    codec = ms.ResidualCodec(centroids, levels, nbits)
    codes, residuals = ms.compress_residuals(x, codec, spread)
    assert codes.dtype == torch.int32 and residuals.shape == (200, dim * nbits // 8)
    back = ms.decompress_residuals(codes, residuals, codec)
    cos = (back * x).sum(-1)
    assert cos.min() > {1: 0.95, 2: 0.98, 4: 0.995}[nbits], cos.min()


def test_codec_errors(cpu_kernel):
    ms = cpu_kernel
    c = torch.randn(5, 32)
    with pytest.raises(ValueError, match="nbits must be 1, 2 or 4"):
        ms.ResidualCodec(c, torch.zeros(8), 3)
    with pytest.raises(ValueError, match="2\\*\\*nbits = 4 entries"):
        ms.ResidualCodec(c, torch.zeros(3), 2)
    with pytest.raises(ValueError, match="multiple of 8 \\* nbits = 32"):
        ms.ResidualCodec(torch.randn(5, 48), torch.zeros(16), 4)
    with pytest.raises(TypeError, match="centroids must be a 2-D"):
        ms.ResidualCodec(torch.randn(5, 32).long(), torch.zeros(4), 2)


# ---- every surface, form and query dtype ----------------------------------------------------

@pytest.mark.parametrize("query_dtype", QUERY_DTYPES, ids=str)
@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("surface", SURFACES)
def test_scores_and_argmax(device, surface, nbits, query_dtype, rng):
    ms, dev = residual_backends(device)
    case = make_case(surface, rng, n=4, Lq=11, Ld=70, D=32, device=dev)
    # centroids of the queries' dtype: CUDA's tensor-core decode for 16-bit queries, its FFMA
    # path for float32 (other pairs: test_dims_centroid_types_and_normalize)
    run, storage, expect = encode(ms, case, rng, nbits, query_dtype=query_dtype, centroid_dtype=query_dtype)
    scores = call(ms, run, storage)
    both, argmax = call(ms, run, storage, "_with_argmax")
    assert torch.equal(scores, both)
    assert_scores(scores, expect, input_dtype=query_dtype)
    assert_argmax(argmax, expect)
    # the references take the residual form too, with the same result
    on_cpu = run.to("cpu")
    cpu_storage = {"document_codes": storage["document_codes"].cpu(),
                   "residual_codec": storage["residual_codec"].to("cpu")}
    ref = getattr(ms, case.fn + "_reference")(*on_cpu.args(), **on_cpu.kwargs(), **cpu_storage)
    assert_scores(ref, expect.to("cpu"), input_dtype=query_dtype)


@pytest.mark.parametrize("centroid_dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("normalize", (True, False))
@pytest.mark.parametrize("dim", (8, 64, 128, 256, 272, 528))
def test_dims_centroid_types_and_normalize(device, dim, normalize, centroid_dtype, rng):
    """Every query dtype against every centroid dtype, dims up to past the tensor-core decode's
    256 (CUDA takes those, and every pair of unequal dtypes, on its FFMA path)."""
    ms, dev = residual_backends(device)
    nbits = 1 if dim == 8 else 2
    case = make_padded(rng, 3, 5, 33, 75, dim, device=dev)
    for query_dtype in QUERY_DTYPES:
        run, storage, expect = encode(ms, case, rng, nbits, query_dtype=query_dtype,
                                      centroid_dtype=centroid_dtype, normalize=normalize, n_centroids=300)
        scores, argmax = call(ms, run, storage, "_with_argmax")
        assert_scores(scores, expect, input_dtype=query_dtype)
        assert_argmax(argmax, expect)


@pytest.mark.parametrize("padded_lq", (1, 40, 100))
@pytest.mark.parametrize("weights", ("values_of_queries_dtype", "float32"))
@pytest.mark.parametrize("query_dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("nbits", NBITS)
def test_decoded_values_exact(device, nbits, query_dtype, weights, padded_lq, rng):
    """Every decoded value, bit for bit: query b is the one-hot e_b and each candidate one token,
    so score[b, c] = t_cb (one exact product). Weights that are values of the queries' dtype take
    the CUDA kernel's 16-bit adds, others its float32 route; padded_lq picks its 32, 64 and
    128-row query blocks. Normalised, the scores are t_cb / ||t_c|| to float32 rounding."""
    ms, dev = residual_backends(device)
    D, tokens, n_cent = 64, 150, 40
    centroids = (torch.randn(n_cent, D, generator=rng) * 0.3).to(query_dtype)
    w = torch.randn(1 << nbits, generator=rng, dtype=torch.float64) * 0.05
    # float32 storage either way; values with bits below the queries' dtype make the sum round
    w = w.to(query_dtype).float() if weights == "values_of_queries_dtype" else (w * (1 + 2.0 ** -12)).float()
    codes = torch.randint(0, n_cent, (tokens,), generator=rng, dtype=torch.int32)
    residuals = torch.randint(0, 256, (tokens, D * nbits // 8), generator=rng).to(torch.uint8)
    queries = torch.zeros(D, padded_lq, D, dtype=query_dtype)
    queries[:, 0] = torch.eye(D, dtype=query_dtype)
    docs = residuals.view(1, tokens, 1, -1).repeat(D, 1, 1, 1)
    doc_codes = codes.view(1, tokens, 1).repeat(D, 1, 1)
    q_lens = torch.ones(D, dtype=torch.int64)
    d_lens = torch.ones(D, tokens, dtype=torch.int64)
    for normalize in (False, True):
        codec = ms.ResidualCodec(centroids, w, nbits, normalize)
        t, factor = RES.residual_tokens(codes, residuals, codec, query_dtype)
        scores = ms.score_candidates_padded(
            queries.to(dev), docs.to(dev), q_lens.to(dev), d_lens.to(dev),
            document_codes=doc_codes.to(dev), residual_codec=codec.to(dev)).cpu()
        if normalize:
            torch.testing.assert_close(scores.double(), (t.double() * factor.double()[:, None]).T,
                                       rtol=1e-5, atol=0)
        else:
            assert torch.equal(scores, t.float().T)


@pytest.mark.parametrize("query_dtype", QUERY_DTYPES, ids=str)
@pytest.mark.parametrize("surface", SURFACES)
def test_query_gradient(device, surface, query_dtype, rng):
    ms, dev = residual_backends(device)
    case = make_case(surface, rng, n=4, Lq=9, Ld=50, D=64, device=dev)
    run, storage, expect = encode(ms, case, rng, 2, query_dtype=query_dtype)
    q = run.queries.detach().clone().requires_grad_()
    scores = call(ms, dataclasses.replace(run, queries=q), storage, "_train")
    g = unit(rng, *case.score_shape).to(dev)
    scores.backward(g.to(scores.dtype))
    inference, argmax = call(ms, run, storage, "_with_argmax")
    assert torch.equal(scores.detach(), inference)
    eq, _, bq, _ = expected_grads(expect, g, argmax)
    assert_grads(q.grad, eq, bq, query_dtype)
    assert q.grad.abs().sum() > 0
    # the backward references take the residual form and give no document gradient
    r = run.to("cpu")
    cpu_storage = {"document_codes": storage["document_codes"].cpu(),
                   "residual_codec": storage["residual_codec"].to("cpu")}
    # (in the queries' dtype: the tokens round to it, as the kernels round them)
    gq_ref, gd_ref = getattr(ms, case.fn + "_backward_reference")(
        g.float().cpu(), *r.args(), argmax.cpu(), **cpu_storage)
    assert gd_ref is None
    assert_grads(gq_ref, eq, bq, query_dtype)


@pytest.mark.parametrize("surface", SURFACES)
def test_ties_resolve_exactly(device, surface, rng):
    """Centroids and bucket weights on a lattice, no normalisation: every similarity is exact,
    so scores and argmax equal the reference bitwise, ties (plentiful) to the lowest token."""
    ms, dev = residual_backends(device)
    case = make_case(surface, rng, n=4, Lq=10, Ld=40, D=16, device=dev)
    codec = ms.ResidualCodec((torch.randint(-3, 4, (6, 16), generator=rng) / 4).to(dev),
                             torch.tensor([-0.25, 0.0, 0.25, 0.5]).to(dev), 2, normalize=False)
    tokens = case.documents.shape[:-1]
    codes = torch.randint(0, 6, tokens, generator=rng).to(dev)
    residuals = torch.randint(0, 256, (*tokens, 4), generator=rng).to(torch.uint8).to(dev)
    decoded = ms.decompress_residuals(codes.cpu(), residuals.cpu(), codec.to("cpu"), torch.float64)
    q = (torch.randint(-3, 4, case.queries.shape, generator=rng) / 4).to(dev)
    run = dataclasses.replace(case, queries=q, documents=residuals)
    expect = dataclasses.replace(case, queries=q, documents=decoded.to(dev))
    for query_dtype in QUERY_DTYPES:
        # float32 centroids, and centroids of the queries' dtype (CUDA: the FFMA path and, for
        # 16-bit queries, the tensor-core decode): the lattice is exact in every dtype
        for c in (codec, ms.ResidualCodec(codec.centroids.to(query_dtype), codec.bucket_weights, 2, normalize=False)):
            storage = {"document_codes": codes, "residual_codec": c}
            r = dataclasses.replace(run, queries=q.to(query_dtype))
            scores, argmax = call(ms, r, storage, "_with_argmax")
            assert_scores(scores, expect, input_dtype=query_dtype, exact=True)
            assert_argmax(argmax, expect, exact=True)


def test_empty_and_degenerate(device, rng):
    ms, dev = residual_backends(device)
    # empty queries (score 0), empty documents (-inf), and a zero token (factor of eps: 0)
    case = make_padded(rng, 3, 4, 5, 6, 16, device=dev, q_lens=[0, 5, 2],
                       d_lens=[[0, 6, 3, 1], [6, 0, 2, 5], [1, 1, 6, 0]])
    codec = ms.ResidualCodec(torch.zeros(2, 16, device=dev, dtype=torch.float16), torch.zeros(4, device=dev), 2)
    codes = torch.zeros(case.documents.shape[:-1], dtype=torch.int64, device=dev)
    residuals = torch.zeros(*case.documents.shape[:-1], 4, dtype=torch.uint8, device=dev)
    run = dataclasses.replace(case, queries=case.queries.half(), documents=residuals)
    scores, argmax = call(ms, run, {"document_codes": codes, "residual_codec": codec}, "_with_argmax")
    expect = dataclasses.replace(case, documents=torch.zeros_like(case.documents))
    assert_scores(scores, expect, input_dtype=torch.float16)
    assert_argmax(argmax, expect)
    # no documents at all
    empty = make_padded(rng, 2, 0, 4, 3, 16, device=dev)
    e_run = dataclasses.replace(empty, queries=empty.queries.half(),
                                documents=torch.zeros(2, 0, 3, 4, dtype=torch.uint8, device=dev))
    out = call(ms, e_run, {"document_codes": torch.zeros(2, 0, 3, dtype=torch.int64, device=dev),
                           "residual_codec": codec})
    assert out.shape == (2, 0)


@pytest.mark.parametrize("query_dtype", (torch.float16, torch.float32), ids=str)
def test_bad_codes(device, query_dtype, rng):
    """A code out of range: a named error where values can be read (CPU), NaN for the pairs
    that read it on a GPU (both of CUDA's decodes: float32 queries take the FFMA one) and for
    no other pair, and never an out-of-bounds read."""
    ms, dev = residual_backends(device)
    case = make_padded(rng, 2, 3, 4, 8, 32, device=dev)
    run, storage, _ = encode(ms, case, rng, 2, query_dtype=query_dtype)
    codes = storage["document_codes"].clone()
    codes[1, 2, 0] = 37  # == n_centroids
    codes[0, 1, 3] = -5
    bad = dict(storage, document_codes=codes)
    if dev.type == "cpu":
        with pytest.raises(ValueError, match=r"document_codes must be in \[0, n_centroids\) = \[0, 37\)"):
            call(ms, run, bad)
        return
    scores = call(ms, run, bad)
    d_lens = case.doc_lengths
    want = torch.zeros(2, 3, dtype=torch.bool)
    want[1, 2] = bool(d_lens[1, 2] > 0 and case.query_lengths[1] > 0)
    want[0, 1] = bool(d_lens[0, 1] > 3 and case.query_lengths[0] > 0)
    assert torch.equal(torch.isnan(scores).cpu(), want)


def test_errors(cpu_kernel, rng):
    ms = cpu_kernel
    case = make_padded(rng, 2, 3, 4, 8, 32, device="cpu")
    run, storage, _ = encode(ms, case, rng, 2)
    codes, codec = storage["document_codes"], storage["residual_codec"]
    args = run.args()
    q, res = args[0], args[1]

    def score(*a, **kw):
        return ms.score_candidates_padded(*a, **kw)

    with pytest.raises(ValueError, match="uint8 documents are ColBERTv2 residuals"):
        score(*args)
    with pytest.raises(ValueError, match="need both document_codes= and residual_codec="):
        score(*args, document_codes=codes)
    with pytest.raises(TypeError, match="residual_codec must be a maxsim.ResidualCodec"):
        score(*args, document_codes=codes, residual_codec=(codec.centroids, codec.bucket_weights))
    with pytest.raises(ValueError, match="D \\* nbits / 8 = 8 bytes per token"):
        score(q, res[..., :6], *args[2:], document_codes=codes, residual_codec=codec)
    with pytest.raises(ValueError, match="document_codes must have shape"):
        score(*args, document_codes=codes[:, :2], residual_codec=codec)
    with pytest.raises(TypeError, match="document_codes must be int32 or int64"):
        score(*args, document_codes=codes.float(), residual_codec=codec)
    with pytest.raises(TypeError, match="residual documents pair with float16, bfloat16 or float32 queries"):
        score(q.double(), *args[1:], document_codes=codes, residual_codec=codec)
    with pytest.raises(ValueError, match="same embedding dim"):
        score(torch.cat([q, q], -1), *args[1:], document_codes=codes, residual_codec=codec)
    with pytest.raises(ValueError, match="document_scales is only for int8"):
        score(*args, document_codes=codes, residual_codec=codec,
              document_scales=torch.ones(codes.shape))
    with pytest.raises(TypeError, match="document_codes is only for residual documents"):
        score(q, case.documents.half(), *args[2:], document_codes=codes, residual_codec=codec)
    frozen = ms.ResidualCodec(codec.centroids.float().requires_grad_(), codec.bucket_weights, 2)
    with pytest.raises(ValueError, match="frozen"):
        ms.score_candidates_padded_train(*args, document_codes=codes, residual_codec=frozen)


def _cuda_kernel_names(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, " ".join(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


@pytest.mark.parametrize("surface", SURFACES)
def test_cuda_ffma_route(device, surface, rng):
    """CUDA's two decodes on the same tokens: 16-bit queries with centroids of their dtype on
    16-byte rows take the tensor-core decode; the same centroids one element off 16 bytes, and
    float32 queries, the FFMA path (the profiler names the mainloop, so a route that silently
    changed fails here). Both within float32 accumulation of the float64 reference, the same
    argmax, and gradients through both."""
    ms, dev = device
    if dev.type != "cuda":
        pytest.skip("CUDA only")
    case = make_case(surface, rng, n=4, Lq=9, Ld=70, D=64, device=dev)
    run, storage, expect = encode(ms, case, rng, 2, query_dtype=torch.float16, centroid_dtype=torch.float16)
    codec = storage["residual_codec"]
    cents = codec.centroids
    shifted = torch.empty(cents.numel() + 1, dtype=cents.dtype, device=dev)[1:].view_as(cents)
    shifted.copy_(cents)
    assert shifted.data_ptr() % 16 != 0
    unaligned = dict(storage, residual_codec=ms.ResidualCodec(shifted, codec.bucket_weights, 2))
    (fast, fast_argmax), names = _cuda_kernel_names(lambda: call(ms, run, storage, "_with_argmax"))
    assert "MmaMainloop" in names and "SimtMainloop" not in names, names
    (ffma, ffma_argmax), names = _cuda_kernel_names(lambda: call(ms, run, unaligned, "_with_argmax"))
    assert "SimtMainloop" in names and "MmaMainloop" not in names, names
    for scores, argmax in ((fast, fast_argmax), (ffma, ffma_argmax)):
        assert_scores(scores, expect, input_dtype=torch.float16)
        assert_argmax(argmax, expect)
    f32 = dataclasses.replace(run, queries=run.queries.float())
    _, names = _cuda_kernel_names(lambda: call(ms, f32, storage))
    assert "SimtMainloop" in names, names
    g = unit(rng, *case.score_shape).to(dev)
    for st, argmax in ((storage, fast_argmax), (unaligned, ffma_argmax)):
        q = run.queries.detach().clone().requires_grad_()
        scores = call(ms, dataclasses.replace(run, queries=q), st, "_train")
        scores.backward(g.to(scores.dtype))
        eq, _, bq, _ = expected_grads(expect, g, argmax)
        assert_grads(q.grad, eq, bq, torch.float16)


@pytest.mark.parametrize("precision", ("high", "medium"))
def test_float32_matmul_precision_rounds_the_queries(device, precision, rng):
    """float32 queries under "high" / "medium" score as their float16 (scaled) / bfloat16
    roundings do, the residual bytes unchanged: the tensor-core decode when the centroids are
    of the rounding's dtype ("high" with float16 centroids), else the FFMA path; "highest"
    keeps float32 tokens and products."""
    ms, dev = device
    if dev.type != "cuda":
        pytest.skip("CUDA only (the CPU stays exact: test_forward)")
    case = make_padded(rng, 3, 4, 10, 50, 64, device=dev)
    run, storage, _ = encode(ms, case, rng, 2, query_dtype=torch.float32, centroid_dtype=torch.float16)
    q = run.queries * 40.0
    q16, kq = rounded_as_the_kernels_see_it(q, precision)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        want = call(ms, dataclasses.replace(run, queries=q16), storage)
        want = (want.double() * 2.0 ** -kq).float()
        exact = call(ms, dataclasses.replace(run, queries=q), storage)
        torch.set_float32_matmul_precision(precision)
        got, names = _cuda_kernel_names(lambda: call(ms, dataclasses.replace(run, queries=q), storage))
    finally:
        torch.set_float32_matmul_precision(before)
    assert ("MmaMainloop" if precision == "high" else "SimtMainloop") in names, names
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
    assert not torch.equal(got.nan_to_num(7.0), exact.nan_to_num(7.0))
    # _train: the scores of the rounded queries, the gradient the float32 one for their argmax
    # (the backward decodes float32 tokens, as it gathers float32 rows for float documents)
    qt = q.detach().clone().requires_grad_()
    g = unit(rng, *case.score_shape).to(dev)
    try:
        torch.set_float32_matmul_precision(precision)
        scores = call(ms, dataclasses.replace(run, queries=qt), storage, "_train")
        scores.backward(g)
        _, argmax = call(ms, dataclasses.replace(run, queries=q), storage, "_with_argmax")
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(scores.detach().nan_to_num(7.0), want.nan_to_num(7.0))
    t, factor = RES.residual_tokens(storage["document_codes"].cpu(), run.documents.cpu(),
                                    storage["residual_codec"].to("cpu"), torch.float32)
    expect = dataclasses.replace(case, queries=q, documents=(t.double() * factor.double().unsqueeze(-1)).to(dev))
    eq, _, bq, _ = expected_grads(expect, g, argmax)
    assert_grads(qt.grad, eq, bq, torch.float32)


def test_empty_centroids_with_tokens(device, rng):
    """A codec without centroids cannot decode a token: a named error on every backend (the
    kernels would have no centroid 0 to read for a bad code)."""
    ms, dev = residual_backends(device)
    case = make_padded(rng, 2, 3, 4, 8, 32, device=dev)
    run, storage, _ = encode(ms, case, rng, 2)
    codec = storage["residual_codec"]
    empty = ms.ResidualCodec(codec.centroids[:0], codec.bucket_weights, 2)
    with pytest.raises(ValueError, match="residual_codec.centroids has no rows"):
        call(ms, run, dict(storage, residual_codec=empty))


def test_cuda_graph_capture(device, rng):
    """No host sync on the residual path: a captured call replays to the eager result."""
    ms, dev = device
    if dev.type != "cuda":
        pytest.skip("CUDA only")
    case = make_case("packed", rng, n=5, Lq=9, Ld=60, D=64, device=dev)
    run, storage, _ = encode(ms, case, rng, 2)
    eager = call(ms, run, storage)
    kw = dict(run.kwargs(), max_q_len=run.argmax_width)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        getattr(ms, run.fn)(*run.args(), **kw, **storage)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = getattr(ms, run.fn)(*run.args(), **kw, **storage)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


# ---- PLAID's centroid-only score ------------------------------------------------------------

def centroid_case(rng, dev, *, nq=3, lq=11, n_cent=40, dim=32, lens=(0, 5, 70, 33, 1, 12)):
    q = unit(rng, nq, lq, dim).to(dev)
    centroids = unit(rng, n_cent, dim).to(dev)
    lengths = torch.tensor(lens)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(dev)
    codes = torch.randint(0, n_cent, (int(lengths.sum()),), generator=rng).to(dev)
    return q, centroids, codes, offsets


@pytest.mark.parametrize("query_dtype", QUERY_DTYPES, ids=str)
def test_centroid_score_every_pair(device, query_dtype, rng):
    ms, dev = residual_backends(device)
    q, centroids, codes, offsets = centroid_case(rng, dev)
    q = q.to(query_dtype)
    ql = torch.tensor([11, 0, 4], device=dev)
    scores = ms.score_centroids(q, codes, offsets, centroids.to(query_dtype), query_lengths=ql)
    ref = RES.score_centroids_reference(q.cpu().double(), codes.cpu(), offsets.cpu(),
                                        centroids.to(query_dtype).cpu().double(), query_lengths=ql.cpu())
    assert scores.shape == (3, 6) and scores.dtype == torch.float32
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isinf(scores.cpu()), torch.isinf(ref))
    assert (scores.cpu()[:, 0] == float("-inf"))[ql.cpu() > 0].all()   # empty document
    assert (scores.cpu()[1] == 0).all()                                 # empty query
    torch.testing.assert_close(scores.cpu().double()[finite], ref[finite], rtol=1e-5, atol=1e-5)


def test_centroid_score_pairs_and_bad_inputs(device, rng):
    ms, dev = residual_backends(device)
    q, centroids, codes, offsets = centroid_case(rng, dev, lq=45, dim=64)  # 45 > 32: two lane chunks
    pq = torch.tensor([0, 2, 1, 2, 0], device=dev)
    pd = torch.tensor([2, 2, 3, 5, 4], device=dev)
    scores = ms.score_centroids(q, codes, offsets, centroids, pair_query_ids=pq, pair_document_ids=pd)
    ref = RES.score_centroids_reference(q.cpu().double(), codes.cpu(), offsets.cpu(), centroids.cpu().double(),
                                        pair_query_ids=pq.cpu(), pair_document_ids=pd.cpu())
    torch.testing.assert_close(scores.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    # the same pairs from the every-pair grid
    grid = ms.score_centroids(q, codes, offsets, centroids)
    assert torch.equal(grid[pq, pd], scores)
    bad = codes.clone()
    bad[7] = centroids.shape[0]
    bad_pd = pd.clone()
    bad_pd[1] = 6
    if dev.type == "cpu":
        with pytest.raises(ValueError, match=r"document_codes must be in \[0, n_centroids\)"):
            ms.score_centroids(q, bad, offsets, centroids)
        with pytest.raises(ValueError, match="pair_document_ids must be in"):
            ms.score_centroids(q, codes, offsets, centroids, pair_query_ids=pq, pair_document_ids=bad_pd)
    else:  # no reads out of bounds: NaN for the pairs that meet them
        out = ms.score_centroids(q, bad, offsets, centroids)
        assert torch.isnan(out[:, 2]).all() and not torch.isnan(out[:, 3]).any()
        out = ms.score_centroids(q, codes, offsets, centroids, pair_query_ids=pq, pair_document_ids=bad_pd)
        assert torch.isnan(out[1]) and not torch.isnan(out[[0, 2, 3, 4]]).any()
    with pytest.raises(ValueError, match="pair_query_ids and pair_document_ids go together"):
        ms.score_centroids(q, codes, offsets, centroids, pair_query_ids=pq)
    with pytest.raises(ValueError, match="centroids must be a float tensor"):
        ms.score_centroids(q, codes, offsets, centroids[:, :10])


@pytest.mark.parametrize("code_dtype", (torch.int32, torch.int64), ids=str)
@pytest.mark.parametrize("lq", (1, 32, 45, 68))
def test_centroid_score_long_documents(device, code_dtype, lq, rng):
    """Documents from empty to past several of the GPU's 32-token blocks per warp, queries over
    one and several 32-token chunks, mixed query / centroid dtypes, and the same bits twice."""
    ms, dev = residual_backends(device)
    lens = (0, 1, 31, 32, 33, 127, 128, 129, 300, 513, 1030)
    q, centroids, codes, offsets = centroid_case(rng, dev, nq=2, lq=lq, n_cent=5000, dim=72, lens=lens)
    codes = codes.to(code_dtype)
    for query_dtype, centroid_dtype in ((torch.float16, torch.float16), (torch.bfloat16, torch.float32),
                                        (torch.float32, torch.float16)):
        qq, cc = q.to(query_dtype), centroids.to(centroid_dtype)
        ql = torch.tensor([lq, max(lq - 7, 0)], device=dev)
        scores = ms.score_centroids(qq, codes, offsets, cc, query_lengths=ql)
        ref = RES.score_centroids_reference(qq.cpu().double(), codes.cpu(), offsets.cpu(), cc.cpu().double(),
                                            query_lengths=ql.cpu())
        finite = torch.isfinite(ref)
        assert torch.equal(scores.cpu()[~finite], ref[~finite].float())
        torch.testing.assert_close(scores.cpu().double()[finite], ref[finite], rtol=1e-5, atol=1e-5)
        assert torch.equal(ms.score_centroids(qq, codes, offsets, cc, query_lengths=ql), scores)


def test_centroid_score_ignores_matmul_precision(device, rng):
    """The table accumulates in float32 even where the caller lets float32 matmuls round their
    inputs (TF32 on CUDA, which would move these scores by ~1e-3; bfloat16 through oneDNN on
    CPUs that have it)."""
    ms, dev = residual_backends(device)
    if dev.type not in ("cuda", "cpu"):
        pytest.skip("a CUDA / CPU setting")
    q, centroids, codes, offsets = centroid_case(rng, dev, nq=2, lq=32, n_cent=300, dim=256)
    q, centroids = q * 3, centroids * 3
    ref = RES.score_centroids_reference(q.cpu().double(), codes.cpu(), offsets.cpu(), centroids.cpu().double())
    saved = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.set_float32_matmul_precision("medium")
        scores = ms.score_centroids(q, codes, offsets, centroids)
        tf32_table = torch.matmul(centroids, q.transpose(1, 2)).contiguous()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])
    finite = torch.isfinite(ref)
    tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores.cpu().double()[finite], ref[finite], **tol)
    if dev.type == "cuda":  # what TF32 would have scored: the test can tell
        tf32 = ms._api.ops.centroid_forward(tf32_table, codes, offsets, None, None, None)
        assert not torch.allclose(tf32.cpu().double()[finite], ref[finite], **tol)


def test_centroid_score_graph_capture(device, rng):
    ms, dev = residual_backends(device)
    if dev.type != "cuda":
        pytest.skip("CUDA graphs")
    q, centroids, codes, offsets = centroid_case(rng, dev, lq=40, n_cent=700, dim=64)
    eager = ms.score_centroids(q.half(), codes, offsets, centroids.half())
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = ms.score_centroids(q.half(), codes, offsets, centroids.half())
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


@pytest.mark.parametrize("lq", (31, 32))
def test_centroid_score_many_pairs(device, lq, rng):
    """More pairs than the GPU holds at once (every-pair grid, 4,500 pairs; 2,501 listed ones),
    short and empty documents among them; listed pairs score bit for bit as in the grid."""
    ms, dev = residual_backends(device)
    lens = tuple(torch.randint(0, 70, (1500,), generator=rng).tolist())
    q, centroids, codes, offsets = centroid_case(rng, dev, nq=3, lq=lq, n_cent=900, dim=40, lens=lens)
    codes = codes.int()
    scores = ms.score_centroids(q, codes, offsets, centroids)
    ref = RES.score_centroids_reference(q.cpu().double(), codes.cpu(), offsets.cpu(), centroids.cpu().double())
    finite = torch.isfinite(ref)
    assert torch.equal(scores.cpu()[~finite], ref[~finite].float())
    torch.testing.assert_close(scores.cpu().double()[finite], ref[finite], rtol=1e-5, atol=1e-5)
    pq = torch.randint(0, 3, (2501,), generator=rng).to(dev)
    pd = torch.randint(0, 1500, (2501,), generator=rng).to(dev)
    listed = ms.score_centroids(q, codes, offsets, centroids, pair_query_ids=pq, pair_document_ids=pd)
    assert torch.equal(listed, scores[pq, pd])


@pytest.mark.parametrize("query_dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("dim", (16, 80, 128))
def test_centroid_score_table_bound(device, query_dtype, dim, rng):
    """CUDA's 16-bit table (cuBLAS with float32 output) within float32 accumulation's bound of
    the float64 products, and the scores against the float64 reference: centroid counts and
    Nq * Lq off any block size, several queries, short query lengths."""
    ms, dev = residual_backends(device)
    if dev.type != "cuda":
        pytest.skip("CUDA's table")
    lens = (0, 3, 65, 300, 1, 1100)
    q, centroids, codes, offsets = centroid_case(rng, dev, nq=3, lq=37, n_cent=1000, dim=dim, lens=lens)
    q, centroids = q.to(query_dtype), centroids.to(query_dtype)
    ql = torch.tensor([37, 5, 0], device=dev)
    ref = RES.score_centroids_reference(q.cpu().double(), codes.cpu(), offsets.cpu(), centroids.cpu().double(),
                                        query_lengths=ql.cpu())
    finite = torch.isfinite(ref)
    table64 = torch.matmul(centroids.double(), q.double().transpose(1, 2))
    table = ms._api.ops.centroid_table(q, centroids)
    assert table.shape == (3, 1000, 37) and table.dtype == torch.float32
    # float32 accumulation of exact 16-bit products: within dim ulps of the sum of |terms|
    bound = dim * 2.0 ** -23 * torch.matmul(centroids.double().abs(), q.double().abs().transpose(1, 2))
    assert ((table.double() - table64).abs() <= bound + 1e-30).all()
    scores = ms.score_centroids(q, codes, offsets, centroids, query_lengths=ql)
    assert torch.equal(scores.cpu()[~finite], ref[~finite].float())
    torch.testing.assert_close(scores.cpu().double()[finite], ref[finite], rtol=1e-5, atol=1e-5)
    assert torch.equal(ms.score_centroids(q, codes, offsets, centroids, query_lengths=ql), scores)


def test_centroid_score_reads_fresh_inputs(device, rng):
    """Codes, offsets and pair ids each written by the kernel right before the call, eagerly
    and in a CUDA graph: the op's table and gather read them as written."""
    ms, dev = residual_backends(device)
    if dev.type != "cuda":
        pytest.skip("CUDA streams and graphs")
    lens = tuple(torch.randint(1, 400, (300,), generator=rng).tolist())
    q, centroids, codes, offsets = centroid_case(rng, dev, nq=2, lq=32, n_cent=4096, dim=128, lens=lens)
    q, centroids = q.half(), centroids.half()
    pq = torch.randint(0, 2, (500,), generator=rng).to(dev)
    pd = torch.randint(0, 300, (500,), generator=rng).to(dev)
    want = ms.score_centroids(q, codes, offsets, centroids, pair_query_ids=pq, pair_document_ids=pd)
    src = [codes.clone(), offsets.clone(), pq.clone(), pd.clone()]
    dst = [torch.zeros_like(t) for t in src]

    def call():
        for d, s in zip(dst, src):  # each a kernel right before the call
            d.copy_(s)
        return ms.score_centroids(q, dst[0], dst[1], centroids, pair_query_ids=dst[2], pair_document_ids=dst[3])

    for _ in range(3):
        for d in dst:
            d.zero_()
        assert torch.equal(call(), want)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = call()
    for _ in range(3):
        for d in dst:
            d.zero_()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


def test_centroid_score_compiled(device, rng):
    """torch.compile(fullgraph=True) traces score_centroids through its fake kernel."""
    ms, dev = residual_backends(device)
    q, centroids, codes, offsets = centroid_case(rng, dev)
    pq = torch.tensor([0, 2, 1], device=dev)
    pd = torch.tensor([2, 2, 5], device=dev)
    for kwargs in ({}, dict(pair_query_ids=pq, pair_document_ids=pd)):
        eager = ms.score_centroids(q, codes, offsets, centroids, **kwargs)
        fn = lambda *a, **k: ms.score_centroids(*a, **k)  # noqa: E731
        traced = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, codes, offsets, centroids, **kwargs)
        assert torch.equal(eager, traced)


def test_centroid_score_argument_errors(device, rng):
    ms, dev = residual_backends(device)
    q, centroids, codes, offsets = centroid_case(rng, dev)
    with pytest.raises(TypeError, match="document_codes must be a torch.Tensor"):
        ms.score_centroids(q, None, offsets, centroids)
    with pytest.raises(TypeError, match="document_codes must be int32 or int64"):
        ms.score_centroids(q, codes.float(), offsets, centroids)
    with pytest.raises(ValueError, match="queries must be a float tensor"):
        ms.score_centroids(q[0], codes, offsets, centroids)
    with pytest.raises(ValueError, match=r"query_lengths must have shape \(3,\)"):
        ms.score_centroids(q, codes, offsets, centroids, query_lengths=torch.tensor([1, 2], device=dev))
    with pytest.raises(ValueError, match="pair_document_ids must have shape"):
        ms.score_centroids(q, codes, offsets, centroids, pair_query_ids=torch.tensor([0, 1], device=dev),
                           pair_document_ids=torch.tensor([0], device=dev))
    if dev.type == "cpu":
        with pytest.raises(ValueError, match="document_offsets must end at document_codes.shape"):
            ms.score_centroids(q, codes[:-1], offsets, centroids)
        with pytest.raises(ValueError, match="query_lengths must be <= Lq"):
            ms.score_centroids(q, codes, offsets, centroids, query_lengths=torch.tensor([1, 2, 99]))
