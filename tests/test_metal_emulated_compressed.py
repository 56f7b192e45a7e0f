"""Compressed documents on the Metal backend's kernels, run on the Linux MSL emulator
(tools/metal_emu/): int8 (symmetric) and float8 e4m3fn document values with one float32
scale per document row, float32 / float16 / bfloat16 queries.

The contract is the CPU backend's: sim(i, j) = scale_j * <q_i, v_j> accumulated in float32,
the scale applied to each similarity before the max, then every rule of float documents;
grad_queries only (grad_q[i] += g_p * scale[a_i] * v[a_i]). Everything is checked against
the float64 reference on the dequantised documents (values.double() * scales.double()[..., None]).
As in tests/test_metal_emulated.py, every kernel launch runs in forward, reverse and random
thread order with two poison patterns over threadgroup memory and outputs, and must give the
same bits each time; under .ci/metal.sh every buffer (the scales included) is exactly its
tensor's size under AddressSanitizer.
"""
from __future__ import annotations

import ctypes
import sys

import pytest
import torch

from conftest import (
    SURFACES, Packed, as_padded_documents, assert_argmax, assert_grads, assert_scores,
    expected_grads, flat_rows, ids, lattice, make_case, make_contrastive, make_packed,
    make_padded, unit,
)
import metal_emulator as emu
from test_metal_emulated import _plan, bits

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the MSL emulator runs on Linux")

FORMATS = {"int8": torch.int8, "float8_e4m3fn": torch.float8_e4m3fn}
QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LENGTHS = (0, 1, 7, 8, 9, 33)
TOP = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}  # largest value of each format


@pytest.fixture(scope="module")
def ms():
    return emu.EmulatedMaxsim()


# ---- compressed cases -----------------------------------------------------------------------

def quantise(documents: torch.Tensor, fmt: torch.dtype):
    """(values, scales): symmetric per-row quantisation, documents ~ values * scales[..., None].
    All-zero rows (and D == 0) get scale 1."""
    x = documents.double()
    amax = x.abs().amax(dim=-1) if x.shape[-1] > 0 else x.new_zeros(x.shape[:-1])
    scales = torch.where(amax > 0, amax / TOP[fmt], torch.ones_like(amax)).float()
    y = x / scales.double()[..., None]
    values = y.round().clamp(-127, 127).to(torch.int8) if fmt == torch.int8 else y.to(fmt)
    return values, scales


def dequantise(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return values.double() * scales.double()[..., None]


class Compressed:
    """A conftest Case whose documents are compressed: `case` holds the values (what the
    kernels read), `deq` the same case with the dequantised float64 documents (what the
    reference and the checks read), `scales` one float32 per document row."""

    def __init__(self, case, values, scales):
        self.case = case.with_qd(case.queries, values)
        self.scales = scales
        self.deq = case.with_qd(case.queries, dequantise(values, scales))

    def call(self, ms, form=""):
        c = self.case
        return getattr(ms, c.fn + form)(*c.args(), document_scales=self.scales, **c.kwargs())


def compress(case, fmt: torch.dtype, gen, *, spread=True) -> Compressed:
    """Quantises the case's documents (padding included: its garbage stays garbage). With
    spread, rows are first scaled by factors in [0.5, 2] so that the scales differ a lot."""
    docs = case.documents.double()
    if spread and docs.numel():
        docs = docs * (0.5 + 1.5 * torch.rand(docs.shape[:-1], generator=gen, dtype=torch.float64))[..., None]
    return Compressed(case, *quantise(docs, fmt))


def check_forward(ms, cc: Compressed, *, exact=False):
    expected, _ = cc.deq.reference()
    scores, argmax = cc.call(ms, "_with_argmax")
    assert_scores(scores, cc.deq, expected, exact=exact)
    assert_argmax(argmax, cc.deq, exact=exact)
    assert torch.equal(bits(cc.call(ms, "")), bits(scores))
    return scores, argmax


def check_query_gradient(ms, cc: Compressed, scores, argmax, gen):
    grad_scores = torch.randn(scores.shape, generator=gen, dtype=torch.float64).float()
    gq, gd = ms.backward(cc.case, grad_scores, argmax, document_scales=cc.scales)
    assert gd is None
    eq, _, bq, _ = expected_grads(cc.deq, grad_scores, argmax)
    assert_grads(gq, eq, bq, cc.case.queries.dtype)
    return gq


def check_all(ms, cc: Compressed, gen, *, exact=False):
    scores, argmax = check_forward(ms, cc, exact=exact)
    return scores, argmax, check_query_gradient(ms, cc, scores, argmax, gen)


# ---- every surface, format and query dtype --------------------------------------------------

@pytest.mark.parametrize("dtype", QUERY_DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("surface", SURFACES)
def test_surfaces(ms, surface, fmt, dtype, rng):
    """Ragged lengths over two query chunks and two document tiles, an odd dim."""
    index_dtype = torch.int32 if dtype == torch.bfloat16 else torch.int64
    case = make_case(surface, rng, n=3, Lq=37, Ld=41, D=37, dtype=dtype, index_dtype=index_dtype)
    check_all(ms, compress(case, FORMATS[fmt], rng), rng)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("surface", SURFACES)
def test_lengths(ms, surface, fmt, rng):
    """Every (query length, document length) in LENGTHS x LENGTHS."""
    n, top = len(LENGTHS), max(LENGTHS)
    if surface == "padded":
        case = make_padded(rng, n, n, top, top, 11, q_lens=list(LENGTHS), d_lens=[list(LENGTHS)] * n)
    elif surface in ("contrastive", "contrastive_padded"):
        case = make_contrastive(rng, n, top, list(LENGTHS), 11, q_lens=list(LENGTHS))
        if surface == "contrastive_padded":
            case = as_padded_documents(case)
    else:
        case = make_packed(rng, list(LENGTHS), list(LENGTHS), 11)
    check_all(ms, compress(case, FORMATS[fmt], rng), rng)


@pytest.mark.parametrize("dim", (1, 3, 8, 37, 100, 300))
@pytest.mark.parametrize("fmt", FORMATS)
def test_dims(ms, fmt, dim, rng):
    """Any dim: zero-filled to a multiple of 8, staged 32 columns at a time."""
    k = (1, 3, 8, 37, 100, 300).index(dim)
    surface, dtype = SURFACES[k % len(SURFACES)], QUERY_DTYPES[k % len(QUERY_DTYPES)]
    case = make_case(surface, rng, n=2, Lq=10, Ld=12, D=dim, dtype=dtype)
    check_all(ms, compress(case, FORMATS[fmt], rng), rng)


@pytest.mark.parametrize("fmt", FORMATS)
def test_long_rows(ms, fmt, rng):
    """Lq = 70 (three query chunks) against Ld = 300 (ten document tiles)."""
    case = make_padded(rng, 1, 2, 70, 300, 40, dtype=torch.float16, q_lens=[70], d_lens=[[300, 257]])
    check_all(ms, compress(case, FORMATS[fmt], rng), rng)


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_inputs(ms, fmt, rng):
    f = FORMATS[fmt]
    for case in (make_padded(rng, 2, 2, 5, 4, 0),                  # D == 0: every max is 0
                 make_packed(rng, [3, 0], [2, 4], 16, pairs=[]),    # no pairs
                 make_padded(rng, 0, 3, 5, 4, 16),                 # B == 0
                 make_contrastive(rng, 2, 6, [], 16),               # no documents
                 make_contrastive(rng, 2, 6, [0, 3, 0], 16)):       # empty documents: -inf
        check_all(ms, compress(case, f, rng), rng)


# ---- values: exact ties, NaN bytes, special scales --------------------------------------------

def lattice_compressed(case, fmt: torch.dtype, gen) -> Compressed:
    """Documents on the lattice (multiples of 1/4 in [-3/4, 3/4]) stored exactly, each row
    with scale 1/4 or 1/8 (int8 values 4x or 8x the lattice) or 1 or 1/2 (e4m3fn values the
    lattice, or twice it); rows off the lattice (padding garbage) are quantised as usual.
    Every similarity and score is then exact, and one value has two encodings."""
    d = flat_rows(case.documents.double())
    on = ((d * 4).round() == d * 4).all(dim=-1) & (d.abs() <= 0.75).all(dim=-1)
    values, scales = quantise(d, fmt)
    m = torch.randint(1, 3, (d.shape[0],), generator=gen).double()  # 1 or 2 per row
    if fmt == torch.int8:
        lv, ls = (d * 4 * m[:, None]).round().to(torch.int8), (1 / (4 * m)).float()
    else:
        lv, ls = (d * m[:, None]).to(fmt), (1 / m).float()
    values = torch.where(on[:, None], lv.view(torch.uint8), values.view(torch.uint8)).view(fmt)
    scales = torch.where(on, ls, scales)
    shape = case.documents.shape
    return Compressed(case, values.reshape(shape), scales.reshape(shape[:-1]))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("surface", SURFACES)
def test_ties_exact(ms, surface, fmt, rng):
    """Lattice values, ties everywhere, some between rows encoded with different scales: the
    lowest index must win and scores must equal the reference bit for bit."""
    case = make_case(surface, rng, n=3, Lq=19, Ld=45, D=12, values=lattice, dtype=torch.float16)
    cc = lattice_compressed(case, FORMATS[fmt], rng)
    v, s = flat_rows(cc.case.documents), cc.scales.reshape(-1)
    v[3::4], s[3::4] = v[1], s[1]  # forced ties with row 1 across tiles, same encoding
    if v.shape[0] > 6 and v.shape[1] > 0:  # row 6: row 1's value, the other encoding
        wider = v[1].view(torch.uint8).view(FORMATS[fmt]).double() * 2
        if (wider.abs() <= TOP[FORMATS[fmt]]).all() and s[1] > 0:
            v[6], s[6] = wider.to(FORMATS[fmt]), s[1] / 2
    cc = Compressed(case, cc.case.documents, cc.scales)
    check_forward(ms, cc, exact=True)


@pytest.mark.parametrize("surface", SURFACES)
def test_e4m3fn_nan_bytes(ms, surface, rng):
    """S.1111.111 decodes to NaN (0x7f and 0xff); a NaN similarity wins like torch.max (the
    first NaN's index); a NaN byte in padding changes nothing."""
    case = make_case(surface, rng, n=3, Lq=10, Ld=40, D=16)
    cc = compress(case, torch.float8_e4m3fn, rng)
    raw = flat_rows(cc.case.documents).view(torch.uint8)
    raw[1, 3] = 0x7F
    raw[min(5, raw.shape[0] - 1), 0] = 0xFF
    raw[-1, 2] = 0xFF  # for padded surfaces usually a padding row
    cc = Compressed(case, cc.case.documents, cc.scales)
    assert torch.isnan(cc.deq.documents).any()
    scores, argmax = check_forward(ms, cc)
    assert torch.isnan(scores).any()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("surface", SURFACES)
def test_special_scales(ms, surface, fmt, rng):
    """A NaN scale makes its row's similarities NaN (scaled before the max, so NaN wins);
    a zero scale makes them 0; a large one makes its row win. Padding rows' scales (NaN
    included) change nothing."""
    case = make_case(surface, rng, n=3, Lq=10, Ld=40, D=16)
    cc = compress(case, FORMATS[fmt], rng)
    s = cc.scales.reshape(-1)
    if s.numel() >= 8:
        s[2], s[4], s[7] = float("nan"), 0.0, 1e6
        s[-1] = float("nan")
    cc = Compressed(case, cc.case.documents, cc.scales)
    check_forward(ms, cc)


@pytest.mark.parametrize("query_dtype", QUERY_DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_byte_decodes(ms, fmt, query_dtype):
    """All 256 byte values as one-row, one-column documents against the query 1.0 with scale
    1: each score is the decoded value, bit for bit as torch converts it (NaN for e4m3fn's
    S.1111.111; e4m3fn subnormals m * 2^-9; int8 as signed)."""
    f = FORMATS[fmt]
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(f).reshape(256, 1)
    case = make_contrastive(torch.Generator().manual_seed(0), 1, 1, [1] * 256, 1, dtype=query_dtype,
                            q_lens=None)
    case = case.with_qd(torch.ones(1, 1, 1, dtype=query_dtype), values)
    scores = ms.score_contrastive(case.queries, values, case.document_offsets,
                                  document_scales=torch.ones(256))
    expected = values.reshape(-1).float()
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(scores[0]), nan)
    # exact values; -0 (byte 0x80) scores +0, as every score sums its row maxima from 0
    assert torch.equal(scores[0][~nan], expected[~nan])
    assert int(nan.sum()) == (2 if f == torch.float8_e4m3fn else 0)


# ---- bad values: clamped lengths, out-of-range offsets / ids ----------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_padded_lengths_are_clamped(ms, fmt, rng):
    case = make_padded(rng, 2, 2, 9, 11, 16, q_lens=[-3, 50], d_lens=[[40, -1], [11, 4]])
    check_all(ms, compress(case, FORMATS[fmt], rng), rng)


@pytest.mark.parametrize("fmt", FORMATS)
def test_packed_bad_ids_and_offsets(ms, fmt, rng):
    """Bad pairs get NaN and argmax -1 and give no gradient; the good ones are unaffected."""
    q_lens, d_lens = [5, 9, 4], [7, 3, 6]
    pairs = [(0, 0), (3, 1), (-1, 0), (1, 3), (2, -5), (1, 2), (2, 1), (0, 1 << 20)]
    good = torch.tensor([0, 5, 6])
    cc = compress(make_packed(rng, q_lens, d_lens, 16, pairs=pairs, index_dtype=torch.int32, max_q_len=9),
                  FORMATS[fmt], rng)
    scores, argmax = cc.call(ms, "_with_argmax")
    bad = torch.tensor([p for p in range(len(pairs)) if p not in good.tolist()])
    assert torch.isnan(scores[bad]).all() and (argmax[bad] == -1).all()
    c = cc.case
    ref = Packed(c.queries, c.query_offsets, c.documents, c.document_offsets, c.pair_query_ids[good],
                 c.pair_document_ids[good], 9)
    ref_scores, ref_argmax = ms.score_pairs_packed_with_argmax(*ref.args(), max_q_len=9,
                                                               document_scales=cc.scales)
    assert torch.equal(bits(scores[good]), bits(ref_scores))
    assert torch.equal(argmax[good], ref_argmax)
    g = torch.rand(len(pairs), generator=rng) + 0.5
    gq, _ = ms.backward(c, g, argmax, document_scales=cc.scales)
    rq, _ = ms.backward(ref, g[good], argmax[good], document_scales=cc.scales)
    assert torch.equal(bits(gq), bits(rq))


@pytest.mark.parametrize("fmt", FORMATS)
def test_contrastive_bad_offsets(ms, fmt, rng):
    case = make_contrastive(rng, 2, 6, [5, 4, 3], 16, q_lens=None)
    case.document_offsets = ids([0, 5, 3, 100])  # doc 1 decreasing, doc 2 past T
    cc = compress(case, FORMATS[fmt], rng)
    scores, argmax = cc.call(ms, "_with_argmax")
    assert torch.isnan(scores[:, 1:]).all() and (argmax[:, 1:] == -1).all()
    good = compress(make_contrastive(rng, 2, 6, [5], 16, q_lens=None), FORMATS[fmt], rng)
    good = Compressed(good.case.with_qd(case.queries, case.documents[:5]), cc.case.documents[:5],
                      cc.scales[:5])
    assert torch.equal(bits(scores[:, 0]), bits(good.call(ms, "")[:, 0]))
    # must not touch memory it does not own (exact-size buffers under ASan)
    gq, _ = ms.backward(cc.case, torch.ones(2, 3), argmax, document_scales=cc.scales)
    assert torch.isfinite(gq).all()


# ---- the _train forms: autograd reaches the queries only --------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("surface", SURFACES)
def test_train_forms(ms, surface, fmt, rng):
    case = make_case(surface, rng, n=3, Lq=11, Ld=14, D=24, dtype=torch.float16)
    cc = compress(case, FORMATS[fmt], rng)
    g = unit(rng, *case.score_shape)  # mixed signs
    q = cc.case.queries.detach().clone().requires_grad_(True)
    c = cc.case.with_qd(q, cc.case.documents)
    scores = getattr(ms, c.fn + "_train")(*c.args(), document_scales=cc.scales, **c.kwargs())
    scores.backward(g.to(scores.dtype))
    ref_scores, argmax = cc.call(ms, "_with_argmax")
    assert torch.equal(bits(scores.detach()), bits(ref_scores))
    eq, _, bq, _ = expected_grads(cc.deq, g, argmax)
    assert_grads(q.grad, eq, bq, q.dtype)
    assert q.grad.abs().sum() > 0


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("surface", SURFACES)
def test_no_document_gradient(ms, surface, fmt, rng):
    """grad_documents of compressed documents is an error (the glue refuses it likewise)."""
    case = make_case(surface, rng, n=2, Lq=5, Ld=6, D=8)
    cc = compress(case, FORMATS[fmt], rng)
    scores, argmax = cc.call(ms, "_with_argmax")
    c = cc.case
    g = torch.ones(scores.numel())
    a = argmax.reshape(scores.numel(), -1)
    if surface == "padded":
        args = ("padded", False, c.queries, c.documents, [c.query_lengths, c.doc_lengths, None, None],
                [*c.queries.shape[:2], *c.documents.shape[1:3]], g, a)
    elif surface == "contrastive":
        args = ("contrastive", False, c.queries, c.documents,
                [c.document_offsets, c.query_lengths, None, None],
                [*c.queries.shape[:2], c.documents.shape[0]], g, a)
    elif surface == "contrastive_padded":
        args = ("contrastive_padded", False, c.queries, c.documents,
                [c.document_lengths, c.query_lengths, None, None],
                [*c.queries.shape[:2], *c.documents.shape[:2]], g, a)
    else:
        pairs_by, offsets = emu.owner_lists(c.pair_document_ids, c.document_offsets.numel() - 1)
        args = ("packed", False, c.queries, c.documents,
                [c.query_offsets, c.document_offsets, c.pair_query_ids, c.pair_document_ids],
                [c.queries.shape[0], c.documents.shape[0], a.shape[-1]], g, a, pairs_by, offsets)
    with pytest.raises(emu.EmulatorError, match="compressed documents get no gradient"):
        ms.gradient(*args, document_scales=cc.scales)


# ---- the launch plan: a pipeline for every format, and no other ------------------------------

def _registered(ms, name: str) -> bool:
    """Whether the emulator registered a [[host_name]] `name` (a launch of zero groups)."""
    err = ctypes.create_string_buffer(512)
    opts = emu.EmuOptions(emu.FORWARD, 0, emu.POISON_A, 0)
    return ms.lib.emu_launch(name.encode(), 0, 128, 0, None, 0, ctypes.byref(opts), err, 512) == 0


def test_pipeline_names(ms):
    sizes, idx = [2, 2, 5, 7], [ids([5, 5]), ids([7] * 4), None, None]
    names = set()
    for surface in SURFACES:
        for dtype, tname in zip(QUERY_DTYPES, ("float", "half", "bfloat")):
            for fmt, suffix in ((0, ""), (1, "_int8"), (2, "_e4m3fn")):
                fwd = _plan(ms, surface, sizes, 16, idx, dtype=dtype, doc_format=fmt)["kernel"]
                gq = _plan(ms, surface, sizes, 16, idx, backward=True, to_query=True, dtype=dtype,
                           doc_format=fmt)["kernel"]
                gd = _plan(ms, surface, sizes, 16, idx, backward=True, dtype=dtype, doc_format=fmt)["kernel"]
                assert fwd == f"maxsim_forward_{surface}_{tname}{suffix}"
                assert gq == f"maxsim_grad_queries_{surface}_{tname}{suffix}"
                assert _registered(ms, fwd) and _registered(ms, gq)
                # compressed documents have no grad_documents pipeline
                assert _registered(ms, gd) == (fmt == 0), gd
                names |= {fwd, gq}
    assert len(names) == 4 * 3 * 3 * 2
    assert not _registered(ms, "maxsim_forward_padded_float_int4")


# ---- mutations the checks above must catch ---------------------------------------------------

COMPRESSED_MUTATIONS = {
    # the running max sees unscaled similarities; the scale is applied to the tile's winner
    "scale applied after the max": [
        ("forward.metal",
         "x.value = Docs::kRowNorm ? sim * row_factor[c] : Docs::scaled(sim, documents, docx, s.drow + j0 + c);",
         "x.value = sim;"),
        ("forward.metal", "      cand = shuffle_better(cand, 2);\n",
         "      cand = shuffle_better(cand, 2);\n"
         "      cand.value = Docs::scaled(cand.value, documents, docx, s.drow + cand.index);\n"),
    ],
    "e4m3fn exponent bias off by one": [("tiles.h", "((e + 120u) << 23)", "((e + 121u) << 23)")],
    "int8 widened as unsigned": [("tiles.h", "static float widen(char v) { return float(v); }",
                                  "static float widen(char v) { return float(uchar(v)); }")],
    "grad_queries scale dropped": [
        ("backward.metal", "    weight = Docs::scaled(weight, documents, docx, src);\n", "")],
}


@pytest.mark.parametrize("mutation", list(COMPRESSED_MUTATIONS))
def test_suite_catches_compressed_mutations(tmp_path, mutation, rng):
    mutant = emu.mutant(tmp_path, mutation.replace(" ", "_"), COMPRESSED_MUTATIONS[mutation])
    case = make_contrastive(rng, len(LENGTHS), 33, list(LENGTHS), 20, q_lens=list(LENGTHS))
    failures = []
    for fmt in FORMATS.values():
        try:
            check_all(mutant, compress(case, fmt, rng), rng)
        except AssertionError as e:
            failures.append(f"{fmt}: {str(e).splitlines()[0]}")
    assert failures, f"{mutation}: the compressed checks did not notice"
    print(f"{mutation}: {failures[0]}")
