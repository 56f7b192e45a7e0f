"""maxsim.compat: each adapter against the library semantics it replaces.

Every adapter is compared with a plain-PyTorch re-implementation of PyLate's / colpali-engine's
scoring (tests/compat_semantics.py, float64, no library needed), and, where the library is
installed, with the library's own torch path. Inputs are unnormalised (where maxsim's own
surfaces, which exclude padding, would disagree on most short-document scores), Lq and Ld run
from 1 to 300, D over {1, 8, 32, 128}, masks are prefixes, have holes or mask a whole
document, and come as bool / int / float. Scores use Gaussian values; gradients use lattice
values (exact in every dtype, so every tie, including ties with the zero candidates, must
resolve exactly as `torch.max` does) and float64 Gaussians.
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import compat_semantics as sem

# (Lq, Ld); 300 x 300 runs once per adapter (test_long_queries_and_documents): the float64
# per-pair reference is what costs
SHAPES = ((1, 1), (2, 300), (300, 2), (17, 17), (40, 129))


@dataclasses.dataclass
class Spec:
    """One adapter: how to draw its inputs and what it must equal."""
    name: str
    masked: bool             # takes PyLate masks (else: zero padding, colpali-style)
    draw: callable           # (gen, lq, ld, dim, values) -> list of float64 embedding tensors
    mask_shapes: callable    # (embeddings) -> shapes of (query mask, document mask)
    adapter: callable        # (compat, embeddings, masks) -> scores
    reference: callable      # (float64 embeddings, float64 masks) -> scores
    library: callable        # (embeddings, masks) -> scores, the library's own torch path


def _draw_all_vs_all(gen, lq, ld, dim, values):
    return [values(gen, 3, lq, dim), values(gen, 4, ld, dim)]


def _draw_per_query(gen, lq, ld, dim, values):
    return [values(gen, 3, lq, dim), values(gen, 3, 2, ld, dim)]


def _draw_ragged(gen, lq, ld, dim, values):
    """Three queries and five pages of lengths up to (lq, ld), the first of each that long."""
    q_lens = [lq] + torch.randint(1, lq + 1, (2,), generator=gen).tolist()
    d_lens = [ld] + torch.randint(1, ld + 1, (4,), generator=gen).tolist()
    return [values(gen, n, dim) for n in q_lens] + [values(gen, n, dim) for n in d_lens]


def _masks_of(emb):
    return [tuple(emb[0].shape[:-1]), tuple(emb[1].shape[:-1])]


def _pylate(name):
    def call(emb, masks):
        scores = sem.import_library("pylate.scores.colbert")
        fn = scores.ColBERTScores() if name == "ColBERTScores" else getattr(scores, name)
        return fn(*emb, *masks, backend="torch")
    return call


def _colpali(name):
    def call(emb, masks):
        return getattr(sem.import_library("colpali_engine.utils.maxsim"), name)(*emb)
    return call


def _pylate_pairwise(emb, masks):
    return sem.import_library("pylate.scores.colbert").colbert_scores_pairwise(
        emb[:3], emb[3:6], backend="torch")


def _colpali_multi_vector(emb, masks):
    processing = sem.import_library("colpali_engine.utils.processing_utils")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("COLPALI_SCORES_BACKEND", "torch")
        return processing.BaseVisualRetrieverProcessor.score_multi_vector(
            emb[:3], emb[3:], batch_size=2, device=emb[0].device)


SPECS = [
    Spec("colbert_scores", True, _draw_all_vs_all, _masks_of,
         lambda c, e, m: c.colbert_scores(*e, *m), lambda e, m: sem.colbert_scores(*e, *m),
         _pylate("colbert_scores")),
    Spec("colbert_kd_scores", True, _draw_per_query, _masks_of,
         lambda c, e, m: c.colbert_kd_scores(*e, *m), lambda e, m: sem.colbert_kd_scores(*e, *m),
         _pylate("colbert_kd_scores")),
    Spec("ColBERTScores", True, _draw_per_query, _masks_of,
         lambda c, e, m: c.ColBERTScores()(*e, *m), lambda e, m: sem.colbert_grouped_scores(*e, *m),
         _pylate("ColBERTScores")),
    Spec("colbert_scores_pairwise", False, _draw_ragged, None,
         lambda c, e, m: c.colbert_scores_pairwise(e[:3], e[3:6]),
         lambda e, m: sem.pairwise_scores(e[:3], e[3:6]), _pylate_pairwise),
    Spec("maxsim_inbatch", False, _draw_all_vs_all, _masks_of,
         lambda c, e, m: c.maxsim_inbatch(*e), lambda e, m: sem.colbert_scores(*e),
         _colpali("_torch_maxsim")),
    Spec("maxsim_kd", False, _draw_per_query, _masks_of,
         lambda c, e, m: c.maxsim_kd(*e), lambda e, m: sem.colbert_kd_scores(*e),
         _colpali("_torch_maxsim_kd")),
    Spec("score_multi_vector", False, _draw_ragged, None,
         lambda c, e, m: c.score_multi_vector(e[:3], e[3:], batch_size=2, device=e[0].device),
         lambda e, m: sem.multi_vector_scores(e[:3], e[3:], batch_size=2),
         _colpali_multi_vector),
]
MASKED = [s for s in SPECS if s.masked]
PADDED = [s for s in SPECS if not s.masked and s.mask_shapes is not None]
RAGGED = [s for s in SPECS if s.mask_shapes is None]


def _inputs(spec, gen, lq, ld, dim, kind, mask_dtype, values):
    """float64 embeddings, the masks to pass, and the masks to zero the embeddings with
    (zero-padding specs: colpali-style padding, at either end or anywhere, applied inside the
    graph as the models do, so that gradients reach the raw values only through it)."""
    emb = spec.draw(gen, lq, ld, dim, values)
    if spec.mask_shapes is None:
        return emb, [], []
    masks = [sem.mask(gen, shape, kind, torch.float64) for shape in spec.mask_shapes(emb)]
    if spec.masked:
        return emb, [None if m is None else m.to(mask_dtype) for m in masks], []
    return emb, [], masks


def _zeroed(emb, zero_masks):
    if not zero_masks:
        return emb
    return [e if m is None else e * m.to(e.device, e.dtype).unsqueeze(-1)
            for e, m in zip(emb, zero_masks)]


def _cases(spec, shapes=SHAPES):
    kinds = sem.MASK_KINDS if spec.mask_shapes is not None else ("none",)
    return itertools.product(shapes, kinds)


def _expected_dtype(spec, dtype, masks):
    if spec.name == "score_multi_vector":
        return torch.float32
    for m in masks:
        if m is not None:
            dtype = torch.promote_types(dtype, m.dtype)
    return dtype


def _upcast(tensors):
    return [None if t is None else t.detach().cpu().double() for t in tensors]


def _check_scores(spec, target, dtype, dim, mask_dtype, rng, against, shapes=SHAPES):
    for (lq, ld), kind in _cases(spec, shapes):
        emb, masks, zero_masks = _inputs(spec, rng, lq, ld, dim, kind, mask_dtype, sem.gaussian)
        emb = _zeroed([e.to(device=target.device, dtype=dtype) for e in emb], zero_masks)
        masks = [None if m is None else m.to(target.device) for m in masks]
        got = spec.adapter(target.ms.compat, emb, masks)
        assert got.dtype == _expected_dtype(spec, dtype, masks), (spec.name, got.dtype)
        if against == "semantics":
            want = spec.reference(_upcast(emb), _upcast(masks))
        else:
            want = spec.library(emb, masks).double().cpu()
        bound = _bound(spec, _upcast(emb))
        tol = sem.tolerance(want, bound, got.dtype, dim)
        if dtype in (torch.float16, torch.bfloat16):  # winners rounded as the library does
            tol = tol + torch.finfo(dtype).eps * bound
        if against == "library":  # the library sums in the input dtype
            tol = tol + 4 * torch.finfo(dtype).eps * bound * max(lq, 1)
        err = (got.double().cpu() - want).abs()
        assert (err <= tol).all(), (spec.name, lq, ld, kind, float((err - tol).max()))


def _bound(spec, emb):
    """A bound on |q_i . d_j| summed over a query, per score (ragged specs: one for all)."""
    if spec.mask_shapes is None:
        queries, documents = emb[:3], emb[3:]
        longest = max(float(q.norm(dim=-1).sum()) for q in queries)
        return torch.tensor(longest * max(float(d.norm(dim=-1).max()) for d in documents))
    documents = emb[1]
    if spec.name == "ColBERTScores":  # [G, N, Ld, H] scored as G * N documents
        documents = documents.reshape(-1, *documents.shape[2:])
    return sem.magnitude(emb[0], documents)


# ---- scores ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mask_dtype", sem.MASK_DTYPES, ids=str)
@pytest.mark.parametrize("dim", sem.DIMS)
@pytest.mark.parametrize("dtype", sem.EMBEDDING_DTYPES, ids=str)
@pytest.mark.parametrize("spec", MASKED, ids=lambda s: s.name)
def test_masked_adapter_scores_match_pylate_semantics(device, spec, dtype, dim, mask_dtype, rng):
    _check_scores(spec, device, dtype, dim, mask_dtype, rng, "semantics")


@pytest.mark.parametrize("dim", sem.DIMS)
@pytest.mark.parametrize("dtype", sem.EMBEDDING_DTYPES, ids=str)
@pytest.mark.parametrize("spec", PADDED + RAGGED, ids=lambda s: s.name)
def test_padded_adapter_scores_match_library_semantics(device, spec, dtype, dim, rng):
    _check_scores(spec, device, dtype, dim, None, rng, "semantics")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_long_queries_and_documents(device, spec, rng):
    _check_scores(spec, device, torch.bfloat16, 32, torch.int64, rng, "semantics",
                  shapes=((300, 300),))


def test_semantics_differ_from_excluding_padding(device):
    """Guards the test inputs: a masked token with similarity 0 must change the result, or
    the comparisons above could not tell the library's semantics from maxsim's exclusion."""
    q = torch.tensor([[[1.0]]])
    d = torch.tensor([[[-2.0], [5.0]]])
    m = torch.tensor([[True, False]])
    got = device.ms.compat.colbert_scores(q.to(device.device), d.to(device.device), None,
                                          m.to(device.device))
    assert got.item() == 0.0  # excluded, the score would be -2


# ---- gradients -------------------------------------------------------------------------------

def _check_grads(spec, target, dtype, dim, mask_dtype, gen, values, against):
    for (lq, ld), kind in _cases(spec):
        emb, masks, zero_masks = _inputs(spec, gen, lq, ld, dim, kind, mask_dtype, values)
        leaves = [e.to(device=target.device, dtype=dtype).requires_grad_() for e in emb]
        masks = [None if m is None else m.to(target.device) for m in masks]
        got = spec.adapter(target.ms.compat, _zeroed(leaves, zero_masks), masks)
        weights = values(gen, *got.shape)  # lattice weights keep lattice gradients exact
        torch.autograd.backward(got, weights.to(dtype=got.dtype, device=got.device))
        if against == "semantics":
            ref_leaves = [e.detach().cpu().double().requires_grad_() for e in leaves]
            want = spec.reference(_zeroed(ref_leaves, zero_masks), _upcast(masks))
        else:
            ref_leaves = [e.detach().clone().requires_grad_() for e in leaves]
            want = spec.library(_zeroed(ref_leaves, zero_masks), masks)
        torch.autograd.backward(want, weights.to(dtype=want.dtype, device=want.device))
        for i, (mine, theirs) in enumerate(zip(leaves, ref_leaves)):
            if mine.grad is None and theirs.grad is None:
                continue  # an input no score reads (pairwise: pages past the shorter list)
            g, w = mine.grad.double().cpu(), theirs.grad.double().cpu()
            tol = 4 * torch.finfo(dtype).eps * w.abs() + 1e-5 * (dtype != torch.float64)
            assert ((g - w).abs() <= tol + 1e-12).all(), (spec.name, lq, ld, kind, i)


GRAD_DTYPES = sem.EMBEDDING_DTYPES + (torch.float64,)


@pytest.mark.parametrize("dim", sem.DIMS)
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("spec", SPECS[:-1], ids=lambda s: s.name)  # score_multi_vector: no grad
def test_adapter_gradients_match_library_semantics(device, spec, dtype, dim, rng):
    values = sem.gaussian if dtype == torch.float64 else sem.lattice
    mask_dtype = sem.MASK_DTYPES[dim % len(sem.MASK_DTYPES)]
    _check_grads(spec, device, dtype, dim, mask_dtype, rng, values, "semantics")


def test_inference_call_needs_no_autograd(device, rng):
    """Without a gradient to compute, the adapters take the inference forms (no argmax)."""
    q = sem.gaussian(rng, 2, 3, 8).float().to(device.device)
    d = sem.gaussian(rng, 2, 4, 8).float().to(device.device)
    assert not device.ms.compat.colbert_scores(q, d).requires_grad
    with torch.no_grad():
        assert not device.ms.compat.colbert_scores(q.requires_grad_(), d).requires_grad


# ---- against the installed libraries (integration runs; skipped or failed without them) -----

@pytest.mark.parametrize("dim", sem.DIMS)
@pytest.mark.parametrize("dtype", sem.EMBEDDING_DTYPES, ids=str)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_adapter_scores_match_library(device, spec, dtype, dim, rng):
    mask_dtype = sem.MASK_DTYPES[dim % len(sem.MASK_DTYPES)]
    _check_scores(spec, device, dtype, dim, mask_dtype, rng, "library")


@pytest.mark.parametrize("dim", sem.DIMS)
@pytest.mark.parametrize("spec", SPECS[:-1], ids=lambda s: s.name)
def test_adapter_gradients_match_library(device, spec, dim, rng):
    """float64 Gaussians, plus lattice values for PyLate (its `max` resolves ties as maxsim
    does; colpali-engine's `amax` splits ties, which only lattice inputs produce)."""
    mask_dtype = sem.MASK_DTYPES[dim % len(sem.MASK_DTYPES)]
    _check_grads(spec, device, torch.float64, dim, mask_dtype, rng, sem.gaussian, "library")
    if spec.masked:
        _check_grads(spec, device, torch.float32, dim, mask_dtype, rng, sem.lattice, "library")


# ---- errors ----------------------------------------------------------------------------------

def test_errors_name_the_argument(device):
    c = device.ms.compat
    q, d = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match="documents_embeddings"):
        c.colbert_scores(q, d[0])
    with pytest.raises(ValueError, match="backend"):
        c.colbert_scores(q, d, backend="flash")
    with pytest.raises(IndexError, match="doc"):
        c.maxsim_inbatch(q, d[:, :0])
    with pytest.raises(ValueError, match="No passages"):
        c.score_multi_vector([q[0]], [])
    with pytest.raises(IndexError, match=r"ps\[0:1\]"):  # a chunk of empty pages
        c.score_multi_vector([q[0]], [d[0, :0], d[1]], batch_size=1)
