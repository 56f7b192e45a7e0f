"""Property-based fuzzing of shapes, lengths, dims, dtypes and index widths, all three
surfaces, against the float64 reference (scores, argmax and gradients)."""
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import (
    Contrastive, Packed, Padded, assert_argmax, assert_grads, assert_scores, expected_grads,
    ids, lattice, run_train, unit,
)

SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DIMS = st.sampled_from([1, 2, 3, 8, 17, 64, 100])
INDEX = st.sampled_from([torch.int32, torch.int64])


def common(data, dev):
    dtypes = [torch.float32, torch.float16, torch.bfloat16] + ([torch.float64] if dev.type == "cpu" else [])
    dtype = data.draw(st.sampled_from(dtypes), label="dtype")
    values = data.draw(st.sampled_from([unit, lattice]), label="values")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="seed"))
    return dtype, values, gen


def lengths(data, n, upper, label):
    return data.draw(st.lists(st.integers(0, upper), min_size=n, max_size=n), label=label)


def check(ms, case, gen):
    # Multiples of 1/4 (lattice values; also +-1 at dim 1): every result is exact.
    exact = bool((case.queries.double() * 4 % 1 == 0).all() and (case.documents.double() * 4 % 1 == 0).all())
    scores, argmax = case.call(ms, "_with_argmax")
    assert_scores(scores, case, exact=exact)
    assert_argmax(argmax, case, exact=exact)
    assert_scores(case.call(ms), case, exact=exact)
    g = unit(gen, *case.score_shape).to(case.queries.device)
    train_scores, gq, gd = run_train(ms, case, g)
    assert torch.equal(train_scores, scores)
    eq, ed, bq, bd = expected_grads(case, g, argmax)
    assert_grads(gq, eq, bq, case.queries.dtype)
    assert_grads(gd, ed, bd, case.documents.dtype)


@SETTINGS
@given(data=st.data(), b=st.integers(0, 3), c=st.integers(0, 4), lq=st.integers(0, 12),
       ld=st.integers(0, 40), dim=DIMS, index=INDEX)
def test_padded_properties(device, data, b, c, lq, ld, dim, index):
    ms, dev = device
    dtype, values, gen = common(data, dev)
    q_lens = lengths(data, b, lq, "query_lengths")
    d_lens = [lengths(data, c, ld, f"doc_lengths[{i}]") for i in range(b)]
    q = values(gen, b, lq, dim, dtype=dtype, device=dev)
    d = values(gen, b, c, ld, dim, dtype=dtype, device=dev)
    case = Padded(q, d, ids(q_lens, index, dev), ids(d_lens, index, dev).reshape(b, c))
    check(ms, case, gen)


@SETTINGS
@given(data=st.data(), nq=st.integers(0, 4), lq=st.integers(0, 12), nb=st.integers(0, 5),
       ld=st.integers(0, 40), dim=DIMS, index=INDEX, with_lengths=st.booleans())
def test_contrastive_properties(device, data, nq, lq, nb, ld, dim, index, with_lengths):
    ms, dev = device
    dtype, values, gen = common(data, dev)
    d_lens = lengths(data, nb, ld, "document lengths")
    offsets = torch.tensor([0] + d_lens).cumsum(0)
    q_lens = ids(lengths(data, nq, lq, "query_lengths"), index, dev) if with_lengths else None
    case = Contrastive(values(gen, nq, lq, dim, dtype=dtype, device=dev),
                       values(gen, int(offsets[-1]), dim, dtype=dtype, device=dev),
                       ids(offsets, index, dev), q_lens)
    check(ms, case, gen)


@SETTINGS
@given(data=st.data(), nq=st.integers(0, 4), nd=st.integers(0, 5), lq=st.integers(0, 12),
       ld=st.integers(0, 40), dim=DIMS, index=INDEX, widen=st.sampled_from([None, 0, 3]))
def test_packed_properties(device, data, nq, nd, lq, ld, dim, index, widen):
    ms, dev = device
    dtype, values, gen = common(data, dev)
    q_lens, d_lens = lengths(data, nq, lq, "query lengths"), lengths(data, nd, ld, "doc lengths")
    pairs = data.draw(st.lists(st.tuples(st.integers(0, nq - 1), st.integers(0, nd - 1)), max_size=12)
                      if nq and nd else st.just([]), label="pairs")
    q_off, d_off = torch.tensor([0] + q_lens).cumsum(0), torch.tensor([0] + d_lens).cumsum(0)
    case = Packed(values(gen, int(q_off[-1]), dim, dtype=dtype, device=dev), ids(q_off, index, dev),
                  values(gen, int(d_off[-1]), dim, dtype=dtype, device=dev), ids(d_off, index, dev),
                  ids([p[0] for p in pairs], index, dev), ids([p[1] for p in pairs], index, dev),
                  None if widen is None else max(q_lens, default=0) + widen)
    check(ms, case, gen)
