"""argmax exactness: the lowest index reaching the max, -1 where nothing matched."""
import pytest
import torch

from conftest import (
    Contrastive, Packed, Padded, SURFACES, as_padded_documents, assert_argmax, assert_scores, ids,
    lattice, lowest_argmax, make_case, make_contrastive, make_packed, make_padded, unit,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("surface", SURFACES)
def test_argmax_random(device, surface, dtype, rng):
    """Unique maxima must match exactly; near-ties must point at a maximal similarity."""
    ms, dev = device
    case = make_case(surface, rng, n=4, Lq=33, Ld=300, D=64, dtype=dtype, device=dev)
    scores, argmax = case.call(ms, "_with_argmax")
    assert_argmax(argmax, case)
    assert_scores(scores, case)


@pytest.mark.parametrize("dim", [1, 3, 64])
@pytest.mark.parametrize("surface", SURFACES)
def test_argmax_with_natural_ties(device, surface, dim, rng):
    """Lattice values tie constantly (dim 1: every row has a handful of equal sims); the
    lowest index must win every time, across tile boundaries too."""
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=20, Ld=700, D=dim, device=dev, values=lattice)
    _, argmax = case.call(ms, "_with_argmax")
    assert_argmax(argmax, case, exact=True)


@pytest.mark.parametrize("positions", [(0, 1), (5, 1500), (1500, 1700, 1999), (63, 64),
                                       (127, 128, 129), (1023, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_duplicated_tokens_tie_to_lowest_index(device, positions, dtype, rng):
    """Exact copies of a token at several positions (near and far apart, across likely tile
    boundaries) tie bit for bit: candidate i holds query row i's own vector at `positions`,
    so <q_i, q_i> ~ 1 beats every random token and the lowest position must win."""
    ms, dev = device
    lq, ld, dim = 4, 2000, 64
    q = unit(rng, 1, lq, dim, dtype=dtype)
    d = unit(rng, 1, lq, ld, dim, dtype=dtype)
    for i in range(lq):
        for j in positions:
            d[0, i, j] = q[0, i]
    case = Padded(q.to(dev), d.to(dev), ids([lq], device=dev), ids([[ld] * lq], device=dev))
    scores, argmax = case.call(ms, "_with_argmax")
    assert argmax[0].diagonal().tolist() == [min(positions)] * lq
    assert_argmax(argmax, case)
    assert_scores(scores, case)


@pytest.mark.parametrize("surface", SURFACES)
def test_all_tokens_identical(device, surface, rng):
    """A document made of one token repeated: every argmax is 0 (or the segment's first row)."""
    ms, dev = device
    dim, ld = 32, 300
    token = unit(rng, dim)
    queries = unit(rng, 2, 5, dim)
    if surface == "padded":
        case = Padded(queries, token.expand(2, 2, ld, dim).clone(), ids([5, 3]), ids([[ld, 7], [1, ld]]))
    elif surface.startswith("contrastive"):
        case = Contrastive(queries, token.expand(2 * ld, dim).clone(), ids([0, ld, 2 * ld]))
    else:
        case = Packed(queries.reshape(10, dim), ids([0, 5, 10]), token.expand(2 * ld, dim).clone(),
                      ids([0, ld, 2 * ld]), ids([0, 1, 1]), ids([1, 0, 1]))
    if surface == "contrastive_padded":
        case = as_padded_documents(case)
    case = case.to(dev)
    _, argmax = case.call(ms, "_with_argmax")
    assert_argmax(argmax, case, exact=True)
    valid = argmax >= 0
    assert valid.any() and (argmax[valid] == 0).all()


@pytest.mark.parametrize("surface", SURFACES)
def test_minus_one_for_padding_and_empty_documents(device, surface, rng):
    ms, dev = device
    if surface == "padded":
        case = make_padded(rng, 2, 3, 6, 10, 16, q_lens=[4, 0], d_lens=[[10, 0, 3], [5, 5, 0]], device=dev)
        expect_minus_one = [(0, 0, slice(4, None)), (0, 1, slice(None)), (0, 2, slice(4, None)),
                            (1, 0, slice(None)), (1, 1, slice(None)), (1, 2, slice(None))]
    elif surface.startswith("contrastive"):
        case = make_contrastive(rng, 2, 6, [10, 0, 3], 16, q_lens=[4, 6], device=dev)
        if surface == "contrastive_padded":
            case = as_padded_documents(case)
        expect_minus_one = [(0, 0, slice(4, None)), (0, 1, slice(None)), (1, 1, slice(None))]
    else:
        case = make_packed(rng, [4, 0, 6], [10, 0], 16, pairs=[(0, 0), (0, 1), (1, 0), (2, 1), (2, 0)],
                           device=dev)
        expect_minus_one = [(0, slice(4, None)), (1, slice(None)), (2, slice(None)), (3, slice(None))]
    _, argmax = case.call(ms, "_with_argmax")
    for index in expect_minus_one:
        assert (argmax[index] == -1).all(), (index, argmax[index])
    assert (argmax >= 0).any()
    assert_argmax(argmax, case)


def test_lowest_argmax_helper():
    """The helper every argmax check relies on: first NaN, else the lowest maximal index."""
    nan, inf = float("nan"), float("inf")
    sims = torch.tensor([[1., 3., 3., 2.], [0., nan, 5., nan], [-inf, -inf, -inf, -inf],
                         [inf, 1., inf, 0.], [2., 2., 2., 2.]], dtype=torch.float64)
    assert lowest_argmax(sims).tolist() == [1, 1, 0, 0, 0]
