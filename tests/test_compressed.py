"""Compressed documents (int8 / float8_e4m3fn values, one float32 scale per token) on every
surface and form of every built backend, against the float64 reference on the dequantised
documents.

The contract: a similarity is scale_j * (q_i . v_j), the products exact (both formats are exact
in float16 and bfloat16) and summed in float32, the scale applied before the max. So a score
differs from the float64 score of the dequantised documents by at most
    (D + Lq + 2) * 2^-23 * sum_i max_j |s_j| (|q_i| . |v_j|)
(D products and a scale multiply per similarity, Lq additions per score, each rounding at most
2^-24 relative; a max moves by at most its inputs' error); test_error_within_stated_bound checks
that bound, the rest use the suite's usual tolerances.
"""
import dataclasses

import pytest
import torch

from conftest import (
    SURFACES, assert_argmax, assert_grads, assert_scores, expected_grads, make_case, make_padded,
    off_sixteen_bytes, unit,
)

FORMATS = ("int8", "float8_e4m3fn")
QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FORMS = ("", "_with_argmax", "_train")


def compress(ms, case, fmt, query_dtype):
    """(call_case, scales, expect_case): the case with compressed documents and queries of
    query_dtype, and the same case with the dequantised documents in float64 for expectations."""
    values, scales = ms.quantize_documents(case.documents.float(), fmt)
    queries = case.queries.to(query_dtype)
    deq = values.cpu().double() * scales.cpu().double().unsqueeze(-1)
    expect = dataclasses.replace(case, queries=queries, documents=deq.to(case.queries.device))
    return dataclasses.replace(case, queries=queries, documents=values), scales, expect


def call(ms, case, scales, form=""):
    return getattr(ms, case.fn + form)(*case.args(), **case.kwargs(), document_scales=scales)


# ---- quantize_documents / dequantize_documents --------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_round_trip(cpu_kernel, fmt, rng):
    ms = cpu_kernel
    d = unit(rng, 4, 6, 40) * (1 + 9 * torch.rand(4, 6, 1, generator=rng))
    values, scales = ms.quantize_documents(d, fmt)
    assert values.dtype == getattr(torch, fmt) and values.shape == d.shape
    assert scales.dtype == torch.float32 and scales.shape == d.shape[:-1]
    back = ms.dequantize_documents(values, scales, torch.float64)
    assert back.dtype == torch.float64
    err = (back - d.double()).abs()
    if fmt == "int8":  # round to nearest: half a step, one step being the scale
        assert (values.abs() <= 127).all() and values.abs().amax(-1).eq(127).all()
        assert (err <= scales.double().unsqueeze(-1) * 0.5 * (1 + 1e-6)).all()
    else:  # 3 mantissa bits: relative 2^-4 for normals, the subnormal step 2^-9 * scale below
        bound = d.double().abs() * 2 ** -4 + scales.double().unsqueeze(-1) * 2 ** -10
        assert (err <= bound * (1 + 1e-6)).all()


def test_quantize_special_tokens(cpu_kernel):
    ms = cpu_kernel
    d = torch.tensor([[0.0, 0.0, 0.0], [1.0, float("nan"), 0.0], [float("inf"), 1.0, 0.0],
                      [1.0, -2.0, 0.5]])
    for fmt in FORMATS:
        values, scales = ms.quantize_documents(d, fmt)
        assert scales[0] == 0 and (values[0].float() == 0).all()
        assert torch.isnan(scales[1]) and torch.isnan(scales[2])
        assert (values[1:3].float() == 0).all()
        assert torch.isfinite(values[3].float()).all()


def test_quantize_errors(cpu_kernel):
    ms = cpu_kernel
    d = torch.randn(3, 8)
    with pytest.raises(ValueError, match="format must be 'int8' or 'float8_e4m3fn'"):
        ms.quantize_documents(d, "int4")
    with pytest.raises(ValueError, match="format"):
        ms.quantize_documents(d, torch.float8_e5m2)
    with pytest.raises(TypeError, match="documents to quantise must be float"):
        ms.quantize_documents(d.to(torch.int8), "int8")
    v, s = ms.quantize_documents(d, torch.int8)
    with pytest.raises(ValueError, match="scales must have shape"):
        ms.dequantize_documents(v, s[:2])
    with pytest.raises(TypeError, match="scales must be a float32"):
        ms.dequantize_documents(v, s.double())


# ---- every surface, form, format and query dtype -------------------------------------------

@pytest.mark.parametrize("query_dtype", QUERY_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("surface", SURFACES)
def test_scores_and_argmax(device, surface, fmt, query_dtype, rng):
    ms, dev = device
    case = make_case(surface, rng, n=4, Lq=11, Ld=70, D=40, device=dev)
    run, scales, expect = compress(ms, case, fmt, query_dtype)
    scores = call(ms, run, scales)
    both, argmax = call(ms, run, scales, "_with_argmax")
    assert torch.equal(scores, both)
    assert_scores(scores, expect, input_dtype=query_dtype)
    assert_argmax(argmax, expect)
    # the references take the compressed form too, with the same result
    on_cpu = dataclasses.replace(run, queries=run.queries.double()).to("cpu")
    ref = getattr(ms, case.fn + "_reference")(*on_cpu.args(), **on_cpu.kwargs(),
                                               document_scales=scales.cpu())
    assert_scores(ref, expect.to("cpu"), input_dtype=torch.float64)


@pytest.mark.parametrize("query_dtype", QUERY_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("surface", SURFACES)
def test_query_gradient(device, surface, fmt, query_dtype, rng):
    ms, dev = device
    case = make_case(surface, rng, n=4, Lq=9, Ld=50, D=24, device=dev)
    run, scales, expect = compress(ms, case, fmt, query_dtype)
    q = run.queries.detach().clone().requires_grad_()
    scores = call(ms, dataclasses.replace(run, queries=q), scales, "_train")
    g = unit(rng, *case.score_shape).to(dev)
    scores.backward(g.to(scores.dtype))
    inference, argmax = call(ms, run, scales, "_with_argmax")
    assert torch.equal(scores.detach(), inference)
    eq, _, bq, _ = expected_grads(expect, g, argmax)
    assert_grads(q.grad, eq, bq, query_dtype)
    assert q.grad.abs().sum() > 0
    # the backward references take the compressed form and give no document gradient
    r = dataclasses.replace(run, queries=run.queries.double()).to("cpu")
    gq_ref, gd_ref = getattr(ms, case.fn + "_backward_reference")(
        g.double().cpu(), *r.args(), argmax.cpu(), document_scales=scales.cpu())
    assert gd_ref is None
    assert_grads(gq_ref, eq, bq, torch.float64)


@pytest.mark.parametrize("dim", (1, 8, 33, 96, 128, 136, 264))
@pytest.mark.parametrize("fmt", FORMATS)
def test_dims_and_stated_bound(device, fmt, dim, rng):
    """Odd and large dims, and the error bound of the module docstring."""
    ms, dev = device
    case = make_case("padded", rng, n=3, Lq=33, Ld=75, D=dim, device=dev)
    for query_dtype in QUERY_DTYPES:
        run, scales, expect = compress(ms, case, fmt, query_dtype)
        scores, argmax = call(ms, run, scales, "_with_argmax")
        assert_argmax(argmax, expect)
        ref = expect.reference()[0]
        absolute = dataclasses.replace(expect, queries=expect.queries.double().abs(),
                                       documents=expect.documents.abs()).reference()[0]
        finite = torch.isfinite(ref)
        bound = (dim + run.queries.shape[1] + 2) * 2.0 ** -23 * absolute
        err = (scores.cpu().double() - ref).abs()
        assert (err[finite] <= bound[finite]).all(), (err[finite] - bound[finite]).max()
        assert torch.equal(torch.isinf(scores.cpu()), torch.isinf(ref))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("surface", SURFACES)
def test_ties_resolve_exactly(device, surface, fmt, rng):
    """Values on a lattice whose every similarity is exact: scores and argmax bitwise equal
    to the reference, ties (plentiful) to the lowest token."""
    ms, dev = device
    case = make_case(surface, rng, n=4, Lq=10, Ld=40, D=12, device=dev)
    lattice = torch.randint(-3, 4, case.documents.shape, generator=rng).to(dev)
    if fmt == "int8":
        values, scales = lattice.to(torch.int8), torch.full(case.documents.shape[:-1], 0.25, device=dev)
    else:
        values, scales = (lattice / 4).to(torch.float8_e4m3fn), torch.ones(case.documents.shape[:-1], device=dev)
    q = (torch.randint(-3, 4, case.queries.shape, generator=rng) / 4).to(dev)
    run = dataclasses.replace(case, queries=q, documents=values)
    expect = dataclasses.replace(case, queries=q, documents=(values.double() * scales.double().unsqueeze(-1)))
    for query_dtype in QUERY_DTYPES:
        r = dataclasses.replace(run, queries=q.to(query_dtype))
        scores, argmax = call(ms, r, scales, "_with_argmax")
        assert_scores(scores, expect, input_dtype=query_dtype, exact=True)
        assert_argmax(argmax, expect, exact=True)


@pytest.mark.parametrize("query_dtype", (torch.float32, torch.float16), ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("surface", SURFACES)
def test_values_off_sixteen_bytes(device, surface, fmt, query_dtype, rng):
    """Values whose data starts one byte past a 16-byte boundary (a slice of a larger buffer)
    score as aligned ones, dim 96 (every row 16-byte aligned when the base is) and 72 (every
    other row off): on a GPU the kernels that load 16 bytes of a row at a time must notice and
    take narrower loads, never a misaligned wide one. With float32 queries both calls run the
    same FFMA kernel, so the results must be the same bits; with float16 queries an aligned
    call may take a TMA kernel that an unaligned one may not, whose sums can differ in their
    last bits, so those are held to the reference."""
    ms, dev = device
    for dim in (96, 72):
        case = make_case(surface, rng, n=4, Lq=12, Ld=150, D=dim, device=dev)
        run, scales, expect = compress(ms, case, fmt, query_dtype)
        aligned = call(ms, run, scales, "_with_argmax")
        shifted = dataclasses.replace(run, documents=off_sixteen_bytes(run.documents, 1))
        assert shifted.documents.data_ptr() % 16 != 0
        scores, argmax = call(ms, shifted, scales, "_with_argmax")
        if query_dtype == torch.float32:
            assert torch.equal(scores, aligned[0]) and torch.equal(argmax, aligned[1]), (surface, dim)
        assert_scores(scores, expect, input_dtype=query_dtype)
        assert_argmax(argmax, expect)


@pytest.mark.parametrize("surface", SURFACES)
def test_float8_nan_bytes(device, surface, rng):
    """e4m3fn's NaN encodings (0x7f, 0xff) decode to NaN: the pairs that see them score NaN,
    and the argmax points at the first NaN, as for float documents."""
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=6, Ld=30, D=20, device=dev)
    values, scales = ms.quantize_documents(case.documents.float(), "float8_e4m3fn")
    bits = values.view(torch.uint8).clone()
    rows = bits.view(-1, bits.shape[-1])
    if rows.shape[0] > 0:
        rows[torch.randint(0, rows.shape[0], (3,), generator=rng).to(dev), 5] = 0x7F
        rows[torch.randint(0, rows.shape[0], (2,), generator=rng).to(dev), 7] = 0xFF
    values = bits.view(torch.float8_e4m3fn)
    expect = dataclasses.replace(case, documents=values.double() * scales.double().unsqueeze(-1))
    scores, argmax = call(ms, dataclasses.replace(case, documents=values), scales, "_with_argmax")
    assert_scores(scores, expect)
    assert_argmax(argmax, expect)


@pytest.mark.parametrize("query_dtype", (torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_padding_never_counts(device, fmt, query_dtype, rng):
    """Garbage in every padding row of padded queries and documents (NaN and infinite scales,
    float8 NaN bytes, NaN query rows) changes neither the scores nor the argmax: kernels may
    read those rows (they are inside the tensors) but must leave them out."""
    ms, dev = device
    case = make_padded(rng, 3, 5, 11, 70, 40, device=dev, q_lens=[11, 4, 0],
                       d_lens=[[70, 0, 65, 1, 33], [64, 63, 70, 2, 40], [70, 70, 17, 64, 5]])
    run, scales, expect = compress(ms, case, fmt, query_dtype)
    clean = call(ms, run, scales, "_with_argmax")
    d_pad = (torch.arange(70) >= case.doc_lengths.cpu()[..., None]).to(dev)
    q_pad = (torch.arange(11) >= case.query_lengths.cpu()[:, None]).to(dev)
    bits = run.documents.view(torch.uint8).clone()
    bits[d_pad] = 0x7F  # int8 127; float8 e4m3fn NaN
    scales = scales.clone()
    scales[d_pad] = torch.tensor([float("nan"), float("inf"), -float("inf")], device=dev).repeat(
        int(d_pad.sum()) // 3 + 1)[:int(d_pad.sum())]
    queries = run.queries.clone()
    queries[q_pad] = float("nan")
    dirty = dataclasses.replace(run, queries=queries, documents=bits.view(run.documents.dtype))
    scores, argmax = call(ms, dirty, scales, "_with_argmax")
    assert torch.equal(scores, clean[0]) and torch.equal(argmax, clean[1])
    assert_scores(scores, expect, input_dtype=query_dtype)


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_and_degenerate(device, fmt, rng):
    ms, dev = device
    # empty queries (score 0), empty documents (-inf), zero tokens (scale 0), all at once
    case = make_padded(rng, 3, 4, 5, 6, 16, device=dev, q_lens=[0, 5, 2],
                       d_lens=[[6, 0, 3, 1], [0, 0, 6, 2], [6, 6, 0, 1]])
    case.documents[1, 2, 3] = 0
    run, scales, expect = compress(ms, case, fmt, torch.float32)
    for form in FORMS[:2]:
        out = call(ms, run, scales, form)
        scores = out if form == "" else out[0]
        assert_scores(scores, expect)
    # zero-size tensors
    q = torch.randn(0, 7, 16, device=dev)
    values, scales = ms.quantize_documents(torch.randn(0, 16, device=dev), fmt)
    offsets = torch.zeros(1, dtype=torch.int64, device=dev)
    assert ms.score_contrastive(q, values, offsets, document_scales=scales).shape == (0, 0)
    # dim 0: every similarity is 0 (times a finite scale), so a non-empty query scores 0
    case = make_padded(rng, 2, 3, 4, 5, 0, device=dev, q_lens=[4, 0], d_lens=[[5, 0, 2], [1, 5, 5]])
    run, scales, expect = compress(ms, case, fmt, torch.float16)
    scores, argmax = call(ms, run, scales, "_with_argmax")
    assert_scores(scores, expect, input_dtype=torch.float16)
    assert_argmax(argmax, expect)


def test_deterministic(device, rng):
    ms, dev = device
    case = make_case("contrastive", rng, n=8, Lq=20, Ld=120, D=64, device=dev)
    for fmt in FORMATS:
        run, scales, _ = compress(ms, case, fmt, torch.float16)
        a = call(ms, run, scales, "_with_argmax")
        b = call(ms, run, scales, "_with_argmax")
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("surface", SURFACES)
def test_compiled(device, surface, rng):
    """torch.compile(fullgraph=True) traces the compressed calls through the fake kernels."""
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=7, Ld=19, D=32, device=dev)
    if surface == "packed":
        case.max_q_len = case.argmax_width + 2
    run, scales, _ = compress(ms, case, "int8", torch.float32)
    fn = getattr(ms, case.fn + "_with_argmax")
    compiled = torch.compile(lambda *a, **k: fn(*a, **k), fullgraph=True, backend="aot_eager")
    eager = fn(*run.args(), **run.kwargs(), document_scales=scales)
    traced = compiled(*run.args(), **run.kwargs(), document_scales=scales)
    assert torch.equal(eager[0], traced[0]) and torch.equal(eager[1], traced[1])


# ---- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("surface", SURFACES)
def test_errors(device, surface, rng):
    ms, dev = device
    case = make_case(surface, rng, n=3, Lq=5, Ld=9, D=16, device=dev)
    values, scales = ms.quantize_documents(case.documents.float(), "int8")
    run = dataclasses.replace(case, documents=values)
    fn = getattr(ms, case.fn)

    def raises(exc, match, c=run, **kw):
        with pytest.raises(exc, match=match):
            fn(*c.args(), **c.kwargs(), **kw)

    raises(ValueError, "pass their per-token scales as document_scales")
    raises(ValueError, "document_scales is only for int8 / float8_e4m3fn", c=case, document_scales=scales)
    raises(TypeError, "document_scales must be float32", document_scales=scales.double())
    raises(ValueError, "document_scales must have shape", document_scales=scales.reshape(-1)[1:])
    raises(TypeError, "document_scales must be a torch.Tensor", document_scales=1.0)
    e5m2 = dataclasses.replace(case, documents=case.documents.to(torch.float8_e5m2))
    raises(TypeError, "float8 documents must be torch.float8_e4m3fn", c=e5m2, document_scales=scales)
    q64 = dataclasses.replace(run, queries=run.queries.double())
    raises(TypeError, "compressed documents pair with float16, bfloat16 or float32 queries", c=q64,
           document_scales=scales)
    fp8 = dataclasses.replace(case, documents=values.float().to(torch.float8_e4m3fn).requires_grad_())
    raises(ValueError, "frozen storage", c=fp8, document_scales=scales)
    raises(ValueError, "frozen storage", document_scales=scales.clone().requires_grad_())
    if dev.type != "cpu":
        raises(ValueError, "document_scales is on", document_scales=scales.cpu())


def test_op_refuses_document_gradient(cpu_kernel, rng):
    """Below the Python layer too: a backward op asked for grad_documents of compressed
    documents raises instead of writing anything."""
    ms = cpu_kernel
    case = make_padded(rng, 2, 3, 4, 5, 8)
    values, scales = ms.quantize_documents(case.documents, "int8")
    ops = ms._ops.ops
    _, argmax = ops.padded_forward(case.queries, values, case.query_lengths, case.doc_lengths, True, scales)
    g = torch.ones(2, 3)
    with pytest.raises(RuntimeError, match="compressed documents get no gradient"):
        ops.padded_backward(g, case.queries, values, case.query_lengths, case.doc_lengths, argmax,
                            True, True, scales)
    with pytest.raises(ValueError, match="pass their per-token scales as document_scales="):
        ops.padded_forward(case.queries, values, case.query_lengths, case.doc_lengths, True, None)


def run_on_cpu_build(script, isa):
    """Runs `script` (ending in print('ok')) in a fresh process whose CPU kernels are capped at
    `isa` (MAXSIM_CPU_ISA is read once, at load time), or left to the CPU's best for "default"."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    here = Path(__file__).resolve().parent
    path = os.pathsep.join(p for p in (str(here), os.environ.get("PYTHONPATH")) if p)
    env = {k: v for k, v in os.environ.items() if k != "MAXSIM_CPU_ISA"}
    env["PYTHONPATH"] = path
    if isa != "default":
        env["MAXSIM_CPU_ISA"] = isa
    result = subprocess.run([sys.executable, "-c", script], cwd=here, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


@pytest.mark.parametrize("isa", ("generic", "avx2"))
def test_cpu_instruction_sets(isa):
    """The CPU kernels' narrower builds: the same compressed scores as float64 on the
    dequantised documents."""
    run_on_cpu_build(
        "import torch, dataclasses\n"
        "from conftest import load_kernel, make_case, assert_scores, assert_argmax\n"
        "ms = load_kernel('cpu')\n"
        "g = torch.Generator().manual_seed(7)\n"
        "for surface in ('padded', 'packed'):\n"
        "    case = make_case(surface, g, n=3, Lq=19, Ld=70, D=40)\n"
        "    for fmt in ('int8', 'float8_e4m3fn'):\n"
        "        v, s = ms.quantize_documents(case.documents, fmt)\n"
        "        deq = v.double() * s.double().unsqueeze(-1)\n"
        "        for dt in (torch.float32, torch.float16, torch.bfloat16):\n"
        "            run = dataclasses.replace(case, queries=case.queries.to(dt), documents=v)\n"
        "            expect = dataclasses.replace(run, documents=deq)\n"
        "            out, arg = getattr(ms, case.fn + '_with_argmax')(*run.args(), **run.kwargs(),\n"
        "                                                      document_scales=s)\n"
        "            assert_scores(out, expect, input_dtype=dt)\n"
        "            assert_argmax(arg, expect)\n"
        "print('ok')\n", isa)


@pytest.mark.parametrize("isa", ("generic", "avx2", "default"))
def test_cpu_widening_of_every_byte(isa):
    """Every int8 and every float8 e4m3fn byte (NaNs, subnormals, -0, -128 included) widens
    to exactly torch's value on each CPU build: document row b holds byte b at column b % 11
    (so bytes land in vector lanes and in the tail past them) and zeros elsewhere, each row its
    own document, and one-hot queries read the columns back as scores."""
    run_on_cpu_build(
        "import torch\n"
        "from conftest import load_kernel\n"
        "ms = load_kernel('cpu')\n"
        "D = 11\n"
        "q = torch.eye(D).unsqueeze(1)\n"  # [D, 1, D]: query k reads column k
        "offsets = torch.arange(257)\n"
        "for dtype in (torch.int8, torch.float8_e4m3fn):\n"
        "    bits = torch.zeros(256, D, dtype=torch.uint8)\n"
        "    b = torch.arange(256)\n"
        "    bits[b, b % D] = b.to(torch.uint8)\n"
        "    values = bits.view(dtype)\n"
        "    scales = torch.ones(256)\n"
        "    got = ms.score_contrastive(q, values, offsets, document_scales=scales)\n"
        "    want = (q[:, 0].double() @ values.double().T).float()\n"
        "    assert want.isnan().any() == (dtype == torch.float8_e4m3fn)\n"
        "    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)\n"
        "print('ok')\n", isa)
