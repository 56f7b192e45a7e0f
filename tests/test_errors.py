"""Bad arguments raise errors that name the argument.

Shape / dtype / device / type problems are metadata and raise on every device. Problems in
index *values* raise where reading them is free (CPU tensors, or MAXSIM_CHECK_VALUES=1); on a
GPU without that flag the kernels must survive them: lengths are clamped, and a pair whose ids
or offsets are out of range scores NaN with argmax -1.
"""
import dataclasses

import pytest
import torch

from conftest import (
    Contrastive, as_padded_documents, assert_argmax, assert_scores, ids, make_contrastive,
    make_packed, make_padded,
)

FORMS = ("", "_with_argmax", "_train")


def base(surface, gen, dev):
    if surface == "padded":
        return make_padded(gen, 2, 3, 4, 5, 8, device=dev, q_lens=[4, 2], d_lens=[[5, 0, 3], [1, 5, 2]])
    if surface == "contrastive":
        return make_contrastive(gen, 2, 4, [3, 0, 5], 8, q_lens=[4, 1], device=dev)
    if surface == "contrastive_padded":
        return as_padded_documents(make_contrastive(gen, 2, 4, [3, 0, 5], 8, q_lens=[4, 1],
                                                    device=dev))
    return make_packed(gen, [2, 3], [4, 0, 1], 8, pairs=[(0, 0), (1, 2), (1, 1), (0, 2)], device=dev)


def edit(**changes):
    """A mutation: each value is a constant or a function of the case."""
    def apply(case, other):
        return dataclasses.replace(case, **{k: (v(case, other) if callable(v) else v)
                                            for k, v in changes.items()})
    return apply


def moved(name):
    return edit(**{name: lambda c, other: getattr(c, name).to(other)})


def as_dtype(name, dtype):
    return edit(**{name: lambda c, _o: getattr(c, name).to(dtype)})


def other_device(dev):
    return torch.device("cpu") if dev.type != "cpu" else torch.device("meta")


# (id, mutation, exception, match): metadata problems, raised on every device.
METADATA = {
    "padded": [
        ("queries-rank", edit(queries=lambda c, _: c.queries[0]), ValueError, "queries"),
        ("queries-type", edit(queries=lambda c, _: c.queries.tolist()), TypeError, "queries"),
        ("queries-int", as_dtype("queries", torch.int32), TypeError, "queries"),
        ("documents-rank", edit(documents=lambda c, _: c.documents[0]), ValueError, "documents"),
        ("documents-batch", edit(documents=lambda c, _: c.documents[:1]), ValueError, "documents"),
        ("documents-dtype", as_dtype("documents", torch.float16), TypeError, "documents"),
        ("dim-mismatch", edit(documents=lambda c, _: c.documents[..., :7]), ValueError, "embedding dim"),
        ("query_lengths-shape", edit(query_lengths=lambda c, _: c.query_lengths[:1]), ValueError, "query_lengths"),
        ("query_lengths-2d", edit(query_lengths=lambda c, _: c.query_lengths[:, None]), ValueError, "query_lengths"),
        ("query_lengths-float", as_dtype("query_lengths", torch.float32), TypeError, "query_lengths"),
        ("query_lengths-type", edit(query_lengths=[4, 2]), TypeError, "query_lengths"),
        ("doc_lengths-shape", edit(doc_lengths=lambda c, _: c.doc_lengths[:, :2]), ValueError, "doc_lengths"),
        ("doc_lengths-int16", as_dtype("doc_lengths", torch.int16), TypeError, "doc_lengths"),
        ("queries-device", moved("queries"), ValueError, "queries"),
        ("documents-device", moved("documents"), ValueError, "documents"),
        ("query_lengths-device", moved("query_lengths"), ValueError, "query_lengths"),
        ("doc_lengths-device", moved("doc_lengths"), ValueError, "doc_lengths"),
    ],
    "contrastive": [
        ("queries-rank", edit(queries=lambda c, _: c.queries[0]), ValueError, "queries"),
        ("queries-bool", as_dtype("queries", torch.bool), TypeError, "queries"),
        ("documents-rank", edit(documents=lambda c, _: c.documents[None]), ValueError, "documents"),
        ("documents-type", edit(documents=lambda c, _: c.documents.numpy(force=True)), TypeError, "documents"),
        ("documents-dtype", as_dtype("documents", torch.bfloat16), TypeError, "documents"),
        ("dim-mismatch", edit(documents=lambda c, _: c.documents[:, :5]), ValueError, "embedding dim"),
        ("document_offsets-2d", edit(document_offsets=lambda c, _: c.document_offsets[None]), ValueError, "document_offsets"),
        ("document_offsets-empty", edit(document_offsets=lambda c, _: c.document_offsets[:0]), ValueError, "document_offsets"),
        ("document_offsets-float", as_dtype("document_offsets", torch.float64), TypeError, "document_offsets"),
        ("query_lengths-shape", edit(query_lengths=lambda c, _: c.query_lengths[:1]), ValueError, "query_lengths"),
        ("query_lengths-uint8", as_dtype("query_lengths", torch.uint8), TypeError, "query_lengths"),
        ("queries-device", moved("queries"), ValueError, "queries"),
        ("documents-device", moved("documents"), ValueError, "documents"),
        ("document_offsets-device", moved("document_offsets"), ValueError, "document_offsets"),
        ("query_lengths-device", moved("query_lengths"), ValueError, "query_lengths"),
    ],
    "contrastive_padded": [
        ("queries-rank", edit(queries=lambda c, _: c.queries[0]), ValueError, "queries"),
        ("queries-int", as_dtype("queries", torch.int64), TypeError, "queries"),
        ("documents-rank", edit(documents=lambda c, _: c.documents[0]), ValueError, "documents"),
        ("documents-packed", edit(documents=lambda c, _: c.documents.flatten(0, 1)), ValueError, "documents"),
        ("documents-dtype", as_dtype("documents", torch.float16), TypeError, "documents"),
        ("dim-mismatch", edit(documents=lambda c, _: c.documents[..., :5]), ValueError, "embedding dim"),
        ("document_lengths-shape", edit(document_lengths=lambda c, _: c.document_lengths[:2]), ValueError, "document_lengths"),
        ("document_lengths-2d", edit(document_lengths=lambda c, _: c.document_lengths[None]), ValueError, "document_lengths"),
        ("document_lengths-float", as_dtype("document_lengths", torch.float32), TypeError, "document_lengths"),
        ("document_lengths-type", edit(document_lengths=[3, 0, 5]), TypeError, "document_lengths"),
        ("query_lengths-shape", edit(query_lengths=lambda c, _: c.query_lengths[:1]), ValueError, "query_lengths"),
        ("query_lengths-int16", as_dtype("query_lengths", torch.int16), TypeError, "query_lengths"),
        ("queries-device", moved("queries"), ValueError, "queries"),
        ("documents-device", moved("documents"), ValueError, "documents"),
        ("document_lengths-device", moved("document_lengths"), ValueError, "document_lengths"),
        ("query_lengths-device", moved("query_lengths"), ValueError, "query_lengths"),
    ],
    "packed": [
        ("queries-rank", edit(queries=lambda c, _: c.queries[None]), ValueError, "queries"),
        ("queries-complex", as_dtype("queries", torch.complex64), TypeError, "queries"),
        ("documents-rank", edit(documents=lambda c, _: c.documents[0]), ValueError, "documents"),
        ("documents-dtype", as_dtype("documents", torch.float16), TypeError, "documents"),
        ("dim-mismatch", edit(documents=lambda c, _: c.documents[:, 1:]), ValueError, "embedding dim"),
        ("query_offsets-2d", edit(query_offsets=lambda c, _: c.query_offsets[:, None]), ValueError, "query_offsets"),
        ("query_offsets-float", as_dtype("query_offsets", torch.float32), TypeError, "query_offsets"),
        ("query_offsets-empty", edit(query_offsets=lambda c, _: c.query_offsets[:0]), ValueError, "query_offsets"),
        ("document_offsets-2d", edit(document_offsets=lambda c, _: c.document_offsets[None]), ValueError, "document_offsets"),
        ("document_offsets-int8", as_dtype("document_offsets", torch.int8), TypeError, "document_offsets"),
        ("pair_query_ids-2d", edit(pair_query_ids=lambda c, _: c.pair_query_ids[None]), ValueError, "pair_query_ids"),
        ("pair_query_ids-float", as_dtype("pair_query_ids", torch.float32), TypeError, "pair_query_ids"),
        ("pair_document_ids-length", edit(pair_document_ids=lambda c, _: c.pair_document_ids[:3]), ValueError, "pair_document_ids"),
        ("pair_document_ids-type", edit(pair_document_ids=[0, 2, 1, 2]), TypeError, "pair_document_ids"),
        ("max_q_len-float", edit(max_q_len=3.0), TypeError, "max_q_len"),
        ("max_q_len-str", edit(max_q_len="3"), TypeError, "max_q_len"),
        ("max_q_len-bool", edit(max_q_len=True), TypeError, "max_q_len"),
        ("max_q_len-tensor", edit(max_q_len=lambda c, _: torch.tensor(3)), TypeError, "max_q_len"),
        ("max_q_len-negative", edit(max_q_len=-1), ValueError, "max_q_len"),
        ("queries-device", moved("queries"), ValueError, "queries"),
        ("query_offsets-device", moved("query_offsets"), ValueError, "query_offsets"),
        ("documents-device", moved("documents"), ValueError, "documents"),
        ("document_offsets-device", moved("document_offsets"), ValueError, "document_offsets"),
        ("pair_query_ids-device", moved("pair_query_ids"), ValueError, "pair_query_ids"),
        ("pair_document_ids-device", moved("pair_document_ids"), ValueError, "pair_document_ids"),
    ],
}


def set_index(name, values):
    return edit(**{name: lambda c, _: ids(values, getattr(c, name).dtype, getattr(c, name).device)})


# Problems in index values (base cases: padded Lq=4, Ld=5; contrastive T=8, Lq=4; contrastive
# padded Nb=3, Ld=5, Lq=4;
# packed Tq=5 with 2 queries (longest 3), Td=5 with 3 documents).
VALUES = {
    "padded": [
        ("query_lengths-negative", set_index("query_lengths", [4, -1]), "query_lengths"),
        ("query_lengths-above-Lq", set_index("query_lengths", [5, 2]), "query_lengths"),
        ("doc_lengths-negative", set_index("doc_lengths", [[5, 0, 3], [1, -3, 2]]), "doc_lengths"),
        ("doc_lengths-above-Ld", set_index("doc_lengths", [[5, 0, 6], [1, 5, 2]]), "doc_lengths"),
    ],
    "contrastive": [
        ("document_offsets-start", set_index("document_offsets", [1, 3, 3, 8]), "document_offsets"),
        ("document_offsets-decreasing", set_index("document_offsets", [0, 5, 3, 8]), "document_offsets"),
        ("document_offsets-end-short", set_index("document_offsets", [0, 3, 3, 7]), "document_offsets"),
        ("document_offsets-end-long", set_index("document_offsets", [0, 3, 3, 9]), "document_offsets"),
        ("query_lengths-negative", set_index("query_lengths", [-2, 1]), "query_lengths"),
        ("query_lengths-above-Lq", set_index("query_lengths", [4, 9]), "query_lengths"),
    ],
    "contrastive_padded": [
        ("document_lengths-negative", set_index("document_lengths", [3, -1, 5]), "document_lengths"),
        ("document_lengths-above-Ld", set_index("document_lengths", [3, 0, 6]), "document_lengths"),
        ("query_lengths-negative", set_index("query_lengths", [-2, 1]), "query_lengths"),
        ("query_lengths-above-Lq", set_index("query_lengths", [4, 9]), "query_lengths"),
    ],
    "packed": [
        ("query_offsets-start", set_index("query_offsets", [1, 2, 5]), "query_offsets"),
        ("query_offsets-decreasing", set_index("query_offsets", [0, 3, 2]), "query_offsets"),
        ("query_offsets-end", set_index("query_offsets", [0, 2, 4]), "query_offsets"),
        ("document_offsets-start", set_index("document_offsets", [2, 4, 4, 5]), "document_offsets"),
        ("document_offsets-decreasing", set_index("document_offsets", [0, 4, 3, 5]), "document_offsets"),
        ("document_offsets-end", set_index("document_offsets", [0, 4, 4, 6]), "document_offsets"),
        ("pair_query_ids-negative", set_index("pair_query_ids", [0, -1, 1, 0]), "pair_query_ids"),
        ("pair_query_ids-too-big", set_index("pair_query_ids", [0, 1, 2, 0]), "pair_query_ids"),
        ("pair_document_ids-negative", set_index("pair_document_ids", [0, 2, -5, 2]), "pair_document_ids"),
        ("pair_document_ids-too-big", set_index("pair_document_ids", [0, 2, 1, 3]), "pair_document_ids"),
        ("max_q_len-below-longest", edit(max_q_len=2), "max_q_len"),
    ],
}


def _params(table):
    return [pytest.param(surface, *row, id=f"{surface}-{row[0]}")
            for surface, rows in table.items() for row in rows]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("surface,name,mutate,exc,match", _params(METADATA))
def test_metadata_errors(device, surface, name, mutate, exc, match, form, rng):
    ms, dev = device
    case = mutate(base(surface, rng, dev), other_device(dev))
    with pytest.raises(exc, match=match) as raised:
        case.call(ms, form)
    # A non-tensor argument is named after the op's schema refused it: the user sees that
    # error alone, not chained to the schema's RuntimeError.
    assert raised.value.__context__ is None and raised.value.__cause__ is None


def test_float64_gives_float64_scores(device, rng):
    ms, dev = device
    case = base("padded", rng, dev)
    case = dataclasses.replace(case, queries=case.queries.double(), documents=case.documents.double())
    if dev.type in ("cpu", "cuda"):
        assert case.call(ms).dtype == torch.float64
    else:
        with pytest.raises(TypeError, match="queries"):
            case.call(ms)


@pytest.mark.parametrize("check_values", [False, True], ids=["default", "MAXSIM_CHECK_VALUES"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("surface,name,mutate,match", _params(VALUES))
def test_value_errors(device, surface, name, mutate, match, form, check_values, monkeypatch, rng):
    ms, dev = device
    if check_values:
        monkeypatch.setenv("MAXSIM_CHECK_VALUES", "1")
    else:
        monkeypatch.delenv("MAXSIM_CHECK_VALUES", raising=False)
        if dev.type != "cpu":
            pytest.skip("values are not read on a GPU: see test_bad_values_on_gpu")
    case = mutate(base(surface, rng, dev), None)
    with pytest.raises(ValueError, match=match):
        case.call(ms, form)


def test_valid_base_cases_pass(device, rng):
    """The unmutated cases above are valid: the errors come from the mutations alone."""
    ms, dev = device
    for surface in METADATA:
        case = base(surface, rng, dev)
        for form in FORMS:
            out = case.call(ms, form)
            assert_scores(out[0] if form == "_with_argmax" else out, case)


# ---- GPU: bad values must not crash -------------------------------------------------------------

def uses(kind, k):
    """Bad-score mask: the pairs that use query / document k."""
    def mask(case):
        if isinstance(case, Contrastive):
            bad = torch.zeros(case.score_shape, dtype=torch.bool)
            bad[:, k] = True
            return bad
        return ((case.pair_query_ids if kind == "query" else case.pair_document_ids) == k).cpu()
    return mask


def pairs_at(*indices):
    def mask(case):
        bad = torch.zeros(case.score_shape, dtype=torch.bool)
        bad[list(indices)] = True
        return bad
    return mask


# Which pairs must score NaN (argmax -1) on a GPU for each bad-value mutation: those whose
# segment is out of range (decreasing, or past the end of the tensor) or whose id is. Other
# mutations (a first offset above 0, a last one short of the end, max_q_len below the longest
# query) come with no promise beyond not crashing.
NAN_PAIRS = {
    "document_offsets-decreasing": uses("document", 1),
    "document_offsets-end-long": uses("document", 2),
    "document_offsets-end": uses("document", 2),
    "query_offsets-decreasing": uses("query", 1),
    "pair_query_ids-negative": pairs_at(1),
    "pair_query_ids-too-big": pairs_at(2),
    "pair_document_ids-negative": pairs_at(2),
    "pair_document_ids-too-big": pairs_at(3),
}


@pytest.mark.parametrize("surface,name,mutate,match", _params(VALUES))
def test_bad_values_on_gpu(device, surface, name, mutate, match, monkeypatch, rng):
    ms, dev = device
    if dev.type == "cpu":
        pytest.skip("CPU tensors are value-checked (see test_value_errors)")
    monkeypatch.delenv("MAXSIM_CHECK_VALUES", raising=False)
    good = base(surface, rng, dev)
    case = mutate(good, None)
    outputs = {form: case.call(ms, form) for form in FORMS}
    torch.cuda.synchronize()  # an out-of-bounds access would surface here
    scores, argmax = outputs["_with_argmax"]
    for form in ("", "_train"):
        assert torch.equal(outputs[form].isnan(), scores.isnan())

    if name.startswith(("query_lengths", "doc_lengths", "document_lengths")):
        # clamped to [0, padded size]: the same as the reference on clamped lengths
        field = name.split("-")[0]
        upper = case.queries.shape[1] if field == "query_lengths" else case.documents.shape[-2]
        clamped = dataclasses.replace(case, **{field: getattr(case, field).clamp(0, upper)})
        assert_scores(scores, clamped)
        assert_argmax(argmax, clamped)
        return
    if name not in NAN_PAIRS:
        return
    bad = NAN_PAIRS[name](case)
    assert bad.any() and not bad.all()
    assert torch.isnan(scores.cpu()[bad]).all(), scores
    assert (argmax.cpu()[bad] == -1).all()
    # The other pairs score normally: ids mutations leave their segments as in `good`.
    c64 = (good if name.startswith("pair_") else case).as_float64_cpu()
    expected = c64.naive_scores(c64.queries, c64.documents) if not name.startswith("pair_") \
        else good.reference()[0]
    torch.testing.assert_close(scores.cpu()[~bad].double(), expected[~bad], rtol=1e-5, atol=1e-5)


OP_MESSAGE_CHECKS = r"""
import importlib, sys, torch
from pathlib import Path
import kernels
ms = kernels.get_local_kernel(Path(sys.argv[1]), backend=sys.argv[2])
ops = importlib.import_module(ms.__name__ + "._ops").ops
q = torch.randn(2, 8, 16)
d = torch.randn(2, 3, 5, 16)
ql = torch.tensor([8, 5])
dl = torch.full((2, 3), 5)
checks = {
    "rank": lambda: ops.padded_forward(q[0], d, ql, dl, False, None),
    "index_length": lambda: ops.padded_forward(q, d, torch.tensor([8, 5, 1]), dl, False, None),
}
for name, call in checks.items():
    try:
        call()
        print(name, "no error")
    except (RuntimeError, ValueError, TypeError) as e:  # the ops' checks raise ValueError / TypeError
        print(name, str(e).splitlines()[0])
"""


def test_op_messages_with_integers():
    """The ops' argument checks (torch-ext/checks.h, run by direct op calls too) put integers
    in their messages. In a subprocess, so that a crash fails this test alone:
    streaming an integer into a check's message crashed a CUDA build's module (the CPU ops
    are compiled into it too), so the messages take them as strings."""
    import subprocess
    import sys

    from conftest import BACKENDS, KERNEL_REPO, load_kernel

    backend = "cuda" if "cuda" in BACKENDS else "cpu"  # a CUDA build's module holds the CPU ops
    load_kernel(backend)
    result = subprocess.run([sys.executable, "-c", OP_MESSAGE_CHECKS, str(KERNEL_REPO), backend],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    out = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert "queries must have 3 dimensions" in out.get("rank", ""), out
    assert "query_lengths must have shape (2,), got (3,)" in out.get("index_length", ""), out
