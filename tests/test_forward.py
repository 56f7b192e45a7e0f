"""Every entry point against the float64 reference on fresh random ragged inputs."""
import pytest
import torch

from conftest import (
    FLOAT_DTYPES, INDEX_DTYPES, REF, SURFACES, Contrastive, as_padded_documents, assert_argmax,
    assert_scores, lattice, make_case, make_contrastive, make_packed, make_padded, padded_as_packed,
    poison_allocator, rand_lengths, run_train, skip_float64_unsupported, unit,
)

DIMS = (1, 3, 64, 96, 100, 128, 256, 300, 520)  # > 256: the K-chunked tensor-core path on CUDA
FORMS = ("", "_with_argmax", "_train")


def check_all_forms(ms, case, *, exact=False):
    """Calls the three forms; each must match the reference, the argmax must be right."""
    expected, _ = case.reference()
    for form in FORMS:
        poison_allocator(case.queries.device)
        out = case.call(ms, form)
        scores = out[0] if form == "_with_argmax" else out
        assert_scores(scores, case, expected, exact=exact)
        if form == "_with_argmax":
            assert_argmax(out[1], case, exact=exact)


# ---- the references themselves (no build needed) ---------------------------------------------

@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("values", ["unit", "lattice"])
def test_reference_matches_naive_loop(surface, values, rng):
    gen_values = unit if values == "unit" else lattice
    case = make_case(surface, rng, n=4, Lq=7, Ld=11, D=5, dtype=torch.float64, values=gen_values)
    scores, argmax = case.reference()
    naive = case.naive_scores(*case.as_float64_cpu().flat())
    torch.testing.assert_close(scores, naive, rtol=1e-12, atol=1e-12)
    assert_argmax(argmax, case.as_float64_cpu(), exact=True)


def test_maxsim_reference_single_pair(rng):
    q, d = unit(rng, 5, 8, dtype=torch.float64), unit(rng, 7, 8, dtype=torch.float64)
    expected = sum(max(float(q[i] @ d[j]) for j in range(7)) for i in range(5))
    assert abs(REF.maxsim_reference(q, d).item() - expected) < 1e-12
    assert REF.maxsim_reference(q[:0], d).item() == 0.0
    assert REF.maxsim_reference(q, d[:0]).item() == float("-inf")


# ---- dims x dtypes x surfaces -----------------------------------------------------------------

@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("surface", SURFACES)
def test_dims_and_dtypes(device, surface, dtype, dim, rng):
    ms, dev = device
    skip_float64_unsupported(dev, dtype)
    case = make_case(surface, rng, n=3, Lq=21, Ld=37, D=dim, dtype=dtype, device=dev)
    check_all_forms(ms, case)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("surface", SURFACES)
def test_exact_on_lattice_values(device, surface, dim, rng):
    """Dyadic inputs make every score exact: the kernel must agree bit for bit, ties included."""
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=19, Ld=45, D=dim, device=dev, values=lattice)
    check_all_forms(ms, case, exact=True)


@pytest.mark.parametrize("lq,ld", [(1, 1), (1, 2000), (300, 1), (300, 2000), (129, 1025),
                                   (33, 257), (2, 63), (65, 17)])
@pytest.mark.parametrize("surface", SURFACES)
def test_long_sequences(device, surface, lq, ld, rng):
    ms, dev = device
    dtype = torch.bfloat16 if (lq + ld) % 2 else torch.float32
    if surface == "padded":
        case = make_padded(rng, 2, 2, lq, ld, 128, dtype=dtype, device=dev)
    elif surface.startswith("contrastive"):
        case = make_contrastive(rng, 2, lq, [ld, max(ld // 3, 1), 0], 128, dtype=dtype, device=dev)
    else:
        case = make_packed(rng, [lq, max(lq // 2, 1), 0], [ld, 1, max(ld // 2, 1)], 128,
                           pairs=[(0, 0), (1, 2), (0, 1), (2, 0), (0, 2), (1, 0)],
                           dtype=dtype, device=dev)
    if surface == "contrastive_padded":
        case = as_padded_documents(case)
    check_all_forms(ms, case)


@pytest.mark.parametrize("surface", SURFACES)
def test_many_pairs(device, surface, rng):
    """Enough pairs to spread over every thread / block, with short ragged segments."""
    ms, dev = device
    if surface == "padded":
        case = make_padded(rng, 7, 60, 12, 40, 64, device=dev)
    elif surface.startswith("contrastive"):
        case = make_contrastive(rng, 40, 12, rand_lengths(rng, (50,), 40), 64, device=dev)
    else:
        case = make_packed(rng, rand_lengths(rng, (30,), 12).tolist(),
                           rand_lengths(rng, (40,), 40).tolist(), 64, n_pairs=500, device=dev)
    if surface == "contrastive_padded":
        case = as_padded_documents(case)
    check_all_forms(ms, case)


# ---- index dtypes -------------------------------------------------------------------------------

@pytest.mark.parametrize("first", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("second", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("surface", SURFACES)
def test_index_dtypes(device, surface, first, second, rng):
    """int32 and int64 index tensors, mixed within one call."""
    ms, dev = device
    case = make_case(surface, rng, n=4, Lq=10, Ld=30, D=32, device=dev)
    if surface == "padded":
        case.query_lengths = case.query_lengths.to(first)
        case.doc_lengths = case.doc_lengths.to(second)
    elif surface == "contrastive":
        case.document_offsets = case.document_offsets.to(first)
        case.query_lengths = case.query_lengths.to(second)
    elif surface == "contrastive_padded":
        case.document_lengths = case.document_lengths.to(first)
        case.query_lengths = case.query_lengths.to(second)
    else:
        case.query_offsets = case.query_offsets.to(first)
        case.pair_query_ids = case.pair_query_ids.to(first)
        case.document_offsets = case.document_offsets.to(second)
        case.pair_document_ids = case.pair_document_ids.to(second)
    check_all_forms(ms, case)


@pytest.mark.parametrize("padded_documents", [False, True])
def test_contrastive_without_query_lengths(device, padded_documents, rng):
    ms, dev = device
    case = make_contrastive(rng, 5, 17, [3, 0, 40, 1], 48, q_lens=None, device=dev)
    if padded_documents:
        case = as_padded_documents(case)
    check_all_forms(ms, case)


def test_packed_max_q_len_wider_than_longest(device, rng):
    """An explicit max_q_len only widens the argmax; the extra columns are -1."""
    ms, dev = device
    case = make_packed(rng, [3, 5, 0], [4, 9], 24, device=dev, max_q_len=11)
    check_all_forms(ms, case)
    scores, argmax = case.call(ms, "_with_argmax")
    assert argmax.shape == (6, 11)
    assert (argmax[:, 5:] == -1).all()


# ---- layouts -------------------------------------------------------------------------------------

def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous tensor (every other element of a bigger one, with
    the last dim moved in memory)."""
    big = torch.full((*t.shape[:-1], t.shape[-1] * 2), float("nan"), dtype=t.dtype, device=t.device)
    big[..., ::2] = t
    view = big[..., ::2]
    assert not view.is_contiguous() or view.numel() <= 1
    return view


def strided_index(t: torch.Tensor) -> torch.Tensor:
    big = torch.full((*t.shape, 3), -7, dtype=t.dtype, device=t.device)
    big[..., 1] = t
    return big[..., 1]


@pytest.mark.parametrize("surface", SURFACES)
def test_non_contiguous_inputs(device, surface, rng):
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=9, Ld=21, D=40, device=dev)
    expected, _ = case.reference()
    view = case.__class__(**{k: (strided(v) if k in ("queries", "documents") else
                                 strided_index(v) if isinstance(v, torch.Tensor) else v)
                             for k, v in vars(case).items()})
    assert not view.queries.is_contiguous() and not view.documents.is_contiguous()
    for form in FORMS:
        out = view.call(ms, form)
        assert_scores(out[0] if form == "_with_argmax" else out, case, expected)


def one_element_in(t: torch.Tensor) -> torch.Tensor:
    """The same values, contiguous, starting one element into a NaN-filled buffer: a base
    address aligned to the element size only (the vector-load paths must notice)."""
    buf = torch.full((t.numel() + 1,), float("nan"), dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("dim", (64, 130, 33, 300), ids=lambda d: f"D{d}")
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("surface", SURFACES)
def test_element_aligned_bases(device, surface, dtype, dim, rng):
    """Queries and documents that start one element past an aligned address give the same
    scores, argmax and gradients, bit for bit, as aligned copies of the same values."""
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=9, Ld=40, D=dim, dtype=dtype, device=dev)
    shifted = case.with_qd(one_element_in(case.queries), one_element_in(case.documents))
    assert shifted.queries.data_ptr() % 16 != 0 and shifted.queries.is_contiguous()
    aligned_scores, aligned_argmax = case.call(ms, "_with_argmax")
    assert_scores(aligned_scores, case)
    scores, argmax = shifted.call(ms, "_with_argmax")
    assert torch.equal(scores, aligned_scores)
    assert torch.equal(argmax, aligned_argmax)
    g = unit(rng, *case.score_shape).to(dev)
    _, gq, gd = run_train(ms, case, g)
    q = one_element_in(case.queries).requires_grad_()  # no clone: that would realign
    d = one_element_in(case.documents).requires_grad_()
    assert q.data_ptr() % 16 != 0
    shifted.with_qd(q, d).call(ms, "_train").backward(g)
    assert torch.equal(q.grad, gq) and torch.equal(d.grad, gd)


def test_transposed_documents(device, rng):
    """documents given as a transpose of [B, C, D, Ld] (stride 1 along Ld, not D)."""
    ms, dev = device
    case = make_padded(rng, 2, 3, 8, 50, 33, device=dev)
    docs_t = case.documents.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not docs_t.is_contiguous()
    scores = ms.score_candidates_padded(case.queries, docs_t, case.query_lengths, case.doc_lengths)
    assert_scores(scores, case)


def test_expanded_queries(device, rng):
    """A broadcast (stride-0) query batch: every row of the batch is the same query."""
    ms, dev = device
    case = make_padded(rng, 4, 3, 6, 20, 16, device=dev, q_lens=[6, 6, 6, 6])
    case.queries = case.queries[:1].expand(4, -1, -1)
    scores = case.call(ms)
    assert_scores(scores, case)


# ---- one set of tokens, every surface ----------------------------------------------------------

@pytest.mark.parametrize("values", ["unit", "lattice"])
def test_packed_and_contrastive_equal_padded(device, values, rng):
    """The same tokens given padded, packed and (for full-length queries) contrastive, with
    documents packed or padded."""
    ms, dev = device
    gen_values = unit if values == "unit" else lattice
    b, c = 3, 4
    case = make_padded(rng, b, c, 12, 30, 64, device=dev, values=gen_values,
                       q_lens=[12, 12, 12])
    padded_scores, padded_argmax = case.call(ms, "_with_argmax")
    packed = padded_as_packed(case)
    packed_scores, packed_argmax = packed.call(ms, "_with_argmax")
    contrastive = Contrastive(case.queries, packed.documents, packed.document_offsets)
    contrastive_scores, contrastive_argmax = contrastive.call(ms, "_with_argmax")
    # Contrastive scores every query against every document; pick each query's own ones.
    own = torch.arange(b * c, device=dev).reshape(b, c)
    picked = contrastive_scores.gather(1, own)
    picked_argmax = contrastive_argmax[torch.arange(b, device=dev)[:, None], own]
    # ... and with the padded documents as they are (a view, no packing copy)
    ld, dim = case.documents.shape[2:]
    grid_scores, grid_argmax = ms.score_contrastive_padded_with_argmax(
        case.queries, case.documents.view(b * c, ld, dim), case.doc_lengths.view(b * c))
    picked_grid = grid_scores.gather(1, own)
    picked_grid_argmax = grid_argmax[torch.arange(b, device=dev)[:, None], own]

    assert_scores(padded_scores, case, exact=values == "lattice")
    for other in (packed_scores.reshape(b, c), picked, picked_grid):
        torch.testing.assert_close(other, padded_scores, rtol=2e-6, atol=2e-6)
    if values == "lattice":  # exact arithmetic: all four must agree bit for bit
        assert torch.equal(packed_scores.reshape(b, c), padded_scores)
        assert torch.equal(picked, padded_scores)
        assert torch.equal(picked_grid, padded_scores)
        assert torch.equal(packed_argmax.reshape(b, c, -1), padded_argmax)
        assert torch.equal(picked_argmax, padded_argmax)
        assert torch.equal(picked_grid_argmax, padded_argmax)


def test_float32_matmul_precision_leaves_the_cpu_exact(cpu_kernel, rng):
    """torch.set_float32_matmul_precision("high" / "medium") lets a GPU score float32 as
    float16 / bfloat16 roundings; the CPU path stays float32 under every setting."""
    case = make_case("padded", rng, D=32)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        exact = case.call(cpu_kernel, "_with_argmax")
        for precision in ("high", "medium"):
            torch.set_float32_matmul_precision(precision)
            rounded = case.call(cpu_kernel, "_with_argmax")
            assert torch.equal(exact[0].nan_to_num(7.0), rounded[0].nan_to_num(7.0))
            assert torch.equal(exact[1], rounded[1])
    finally:
        torch.set_float32_matmul_precision(before)
