"""`_train` gradients: vs the backward reference, vs autograd through a naive float64 loop,
gradcheck, padding, determinism, and the refusal to differentiate inference calls."""
import pytest
import torch

from conftest import (
    SURFACES, assert_grads, expected_grads, flat_rows, make_case, make_padded, run_train,
    skip_float64_unsupported, unit,
)

GRAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("surface", SURFACES)
def test_grads_match_backward_reference(device, surface, dtype, rng):
    ms, dev = device
    skip_float64_unsupported(dev, dtype)
    case = make_case(surface, rng, n=5, Lq=17, Ld=90, D=64, dtype=dtype, device=dev)
    g = unit(rng, *case.score_shape).to(dev)  # mixed signs
    scores, gq, gd = run_train(ms, case, g)
    ref_scores, argmax = case.call(ms, "_with_argmax")
    assert torch.equal(scores, ref_scores)
    eq, ed, bq, bd = expected_grads(case, g, argmax)
    assert_grads(gq, eq, bq, dtype)
    assert_grads(gd, ed, bd, dtype)
    assert gq.abs().sum() > 0 and gd.abs().sum() > 0


@pytest.mark.parametrize("surface", SURFACES)
def test_grads_with_many_contributions_per_row(device, surface, rng):
    """Document tokens matched by many queries and pairs (accumulation order matters)."""
    ms, dev = device
    if surface == "padded":
        case = make_padded(rng, 3, 40, 60, 3, 32, device=dev)
    else:
        case = make_case(surface, rng, n=30, Lq=40, Ld=4, D=32, device=dev)
    g = unit(rng, *case.score_shape).to(dev)
    _, gq, gd = run_train(ms, case, g)
    eq, ed, bq, bd = expected_grads(case, g, case.call(ms, "_with_argmax")[1])
    assert_grads(gq, eq, bq, torch.float32)
    assert_grads(gd, ed, bd, torch.float32)


def well_separated(make, margin=1e-4, tries=50):
    """A case whose every row's max beats the runner-up by `margin`, so that float64 and the
    kernel's float32 agree on which token wins (and autograd through torch.max is defined)."""
    for _ in range(tries):
        case = make()
        ok = True
        for sims in case.pair_sims():
            if sims.shape[1] > 1 and sims.shape[0] > 0:
                top2 = sims.topk(2, dim=1).values
                ok &= bool(((top2[:, 0] - top2[:, 1]) > margin).all())
        if ok:
            return case
    raise AssertionError("could not draw well-separated inputs")


@pytest.mark.parametrize("surface", SURFACES)
def test_grads_match_naive_autograd(device, surface, rng):
    """Independent of the references: autograd through a per-pair float64 torch.max loop."""
    ms, dev = device
    dtype = torch.float64 if dev.type == "cpu" else torch.float32
    case = well_separated(lambda: make_case(surface, rng, n=3, Lq=6, Ld=10, D=24, dtype=dtype))
    g = unit(rng, *case.score_shape)
    q64 = case.queries.double().requires_grad_()
    d64 = case.documents.double().requires_grad_()
    naive = case.naive_scores(q64, d64)
    naive.backward(g.double())

    scores, gq, gd = run_train(ms, case.to(dev), g.to(dev))
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores.cpu().double(), naive.detach(), **tol)
    torch.testing.assert_close(gq.cpu().double(), q64.grad, **tol)
    torch.testing.assert_close(gd.cpu().double(), d64.grad, **tol)


@pytest.mark.parametrize("surface", SURFACES)
def test_gradcheck(device, surface, rng):
    """Numerical vs analytical gradients (float64, small shapes)."""
    ms, dev = device
    skip_float64_unsupported(dev, torch.float64)
    case = well_separated(
        lambda: make_case(surface, rng, n=2, Lq=4, Ld=6, D=5, dtype=torch.float64, device=dev),
        margin=1e-3,
    )
    q = case.queries.clone().requires_grad_()
    d = case.documents.clone().requires_grad_()

    def fn(queries, documents):
        scores = case.with_qd(queries, documents).call(ms, "_train")
        # A pair with an empty document scores -inf; finite differences of it are NaN.
        return torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))

    assert torch.autograd.gradcheck(fn, (q, d), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("surface", SURFACES)
def test_backward_through_inference_call_raises(device, surface, rng):
    ms, dev = device
    case = make_case(surface, rng, device=dev)
    q = case.queries.clone().requires_grad_()
    d = case.documents.clone().requires_grad_()
    scores = case.with_qd(q, d).call(ms)
    with pytest.raises(RuntimeError, match="_train"):
        scores.sum().backward()
    assert q.grad is None and d.grad is None


@pytest.mark.parametrize("surface", SURFACES)
def test_graph_only_when_grad_can_flow(device, surface, rng):
    """Under no_grad, or with no input requiring grad, no autograd node is recorded (the
    inference fast path); with grad enabled and an input requiring it, `_train` records one."""
    ms, dev = device
    case = make_case(surface, rng, device=dev)
    q = case.queries.clone().requires_grad_()
    live = case.with_qd(q, case.documents)
    with torch.no_grad():
        for form in ("", "_with_argmax", "_train"):
            out = live.call(ms, form)
            assert (out[0] if form == "_with_argmax" else out).grad_fn is None
    assert case.call(ms, "_train").grad_fn is None
    scores = live.call(ms, "_train")
    assert scores.grad_fn is not None and scores.requires_grad
    expected = case.call(ms)
    assert torch.equal(scores.detach(), expected)


@pytest.mark.parametrize("surface", SURFACES)
def test_padding_and_unmatched_rows_get_exactly_zero(device, surface, rng):
    ms, dev = device
    case = make_case(surface, rng, n=4, Lq=10, Ld=50, D=16, device=dev)
    g = unit(rng, *case.score_shape).to(dev)
    _, gq, gd = run_train(ms, case, g)
    q_used, _ = case.used_rows()
    argmax = case.call(ms, "_with_argmax")[1].cpu()
    matched_doc_rows = torch.zeros(flat_rows(case.documents).shape[0], dtype=torch.bool)
    for p, (qs, ql, ds, dl) in enumerate(case.segments()):
        a = argmax.reshape(len(case.segments()), -1)[p]
        matched_doc_rows[ds + a[a >= 0]] = True
    gq, gd = flat_rows(gq).cpu(), flat_rows(gd).cpu()
    assert (gq[~q_used] == 0).all() and (gd[~matched_doc_rows] == 0).all()
    assert (gq[q_used] != 0).any(dim=1).all()        # every used query row gets gradient
    assert (gd[matched_doc_rows] != 0).any(dim=1).all()


@pytest.mark.parametrize("need", ["queries", "documents"])
@pytest.mark.parametrize("surface", SURFACES)
def test_gradient_for_one_input_only(device, surface, need, rng):
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=8, Ld=20, D=16, device=dev)
    g = unit(rng, *case.score_shape).to(dev)
    _, gq, gd = run_train(ms, case, g, need_q=need == "queries", need_d=need == "documents")
    eq, ed, bq, bd = expected_grads(case, g, case.call(ms, "_with_argmax")[1])
    if need == "queries":
        assert gd is None
        assert_grads(gq, eq, bq, torch.float32)
    else:
        assert gq is None
        assert_grads(gd, ed, bd, torch.float32)


@pytest.mark.parametrize("surface", SURFACES)
def test_grads_are_deterministic(device, surface, rng):
    ms, dev = device
    case = make_case(surface, rng, n=8, Lq=30, Ld=200, D=64, device=dev, dtype=torch.bfloat16)
    g = unit(rng, *case.score_shape).to(dev)
    _, gq0, gd0 = run_train(ms, case, g)
    for _ in range(3):
        _, gq, gd = run_train(ms, case, g)
        assert torch.equal(gq.view(torch.int16), gq0.view(torch.int16))
        assert torch.equal(gd.view(torch.int16), gd0.view(torch.int16))


@pytest.mark.parametrize("surface", SURFACES)
def test_non_contiguous_inputs_and_grad_scores(device, surface, rng):
    """Strided leaf views and a strided upstream gradient give the contiguous run's grads."""
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=8, Ld=20, D=16, device=dev)
    g = unit(rng, *case.score_shape).to(dev)
    _, gq_ref, gd_ref = run_train(ms, case, g)

    q_big = torch.zeros(*case.queries.shape[:-1], 2 * case.dim, device=dev)
    d_big = torch.zeros(*case.documents.shape[:-1], 2 * case.dim, device=dev)
    q_big[..., 1::2] = case.queries
    d_big[..., 1::2] = case.documents
    q_big.requires_grad_()
    d_big.requires_grad_()
    scores = case.with_qd(q_big[..., 1::2], d_big[..., 1::2]).call(ms, "_train")
    g_strided = torch.stack([g, torch.full_like(g, 7.0)], dim=-1)[..., 0]
    assert not g_strided.is_contiguous() or g.numel() <= 1
    (scores * g_strided).sum().backward()
    assert torch.equal(q_big.grad[..., 1::2], gq_ref) and torch.equal(d_big.grad[..., 1::2], gd_ref)
    assert (q_big.grad[..., ::2] == 0).all() and (d_big.grad[..., ::2] == 0).all()
