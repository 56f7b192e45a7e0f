"""torch.compile(fullgraph=True) traces every public function and matches eager.

The fake (meta) kernels and the autograd registration make the ops traceable; value checks
are skipped while compiling, and packed forms that need the argmax width get an explicit
max_q_len (reading it from the offsets would be a data-dependent graph break).
"""
import pytest
import torch

from conftest import SURFACES, assert_scores, make_case, unit

FORMS = ("", "_with_argmax", "_train")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_call(ms, case, form, backend):
    fn = getattr(ms, case.fn + form)
    return torch.compile(fn, fullgraph=True, backend=backend)(*case.args(), **case.kwargs())


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("surface", SURFACES)
def test_compiled_forward_matches_eager(device, surface, form, rng):
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=7, Ld=19, D=32, device=dev)
    if surface == "packed":
        case.max_q_len = case.argmax_width + 2
    eager = case.call(ms, form)
    compiled = compiled_call(ms, case, form, "aot_eager")
    if form == "_with_argmax":
        assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
        assert compiled[1].shape[-1] == case.argmax_width
    else:
        assert torch.equal(compiled, eager)
    assert_scores(compiled[0] if form == "_with_argmax" else compiled, case)


@pytest.mark.parametrize("surface", SURFACES)
def test_compiled_train_forward_backward(device, surface, rng):
    """Forward and backward of a compiled training step, inductor included."""
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=7, Ld=19, D=32, device=dev)
    if surface == "packed":
        case.max_q_len = case.argmax_width
    g = unit(rng, *case.score_shape).to(dev)

    def step(q, d):
        scores = case.with_qd(q, d).call(ms, "_train")
        return (scores * g).sum()

    grads = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        q = case.queries.clone().requires_grad_()
        d = case.documents.clone().requires_grad_()
        loss = fn(q, d)
        loss.backward()
        grads.append((loss.detach(), q.grad, d.grad))
    (l0, gq0, gd0), (l1, gq1, gd1) = grads
    torch.testing.assert_close(l1, l0, rtol=1e-6, atol=1e-6)
    assert torch.equal(gq1, gq0) and torch.equal(gd1, gd0)
    assert gq0.abs().sum() > 0 and gd0.abs().sum() > 0


def test_compiled_inference_with_inductor(device, rng):
    """One inference call through the default (inductor) backend, surrounded by other ops."""
    ms, dev = device
    case = make_case("padded", rng, n=3, Lq=7, Ld=19, D=32, device=dev)

    def rerank(q, d, ql, dl):
        q = torch.nn.functional.normalize(q, dim=-1)
        return ms.score_candidates_padded(q, d, ql, dl).softmax(dim=-1)

    eager = rerank(*case.args())
    compiled = torch.compile(rerank, fullgraph=True)(*case.args())
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-7)
