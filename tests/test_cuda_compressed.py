"""CUDA: compressed documents (int8 / float8 e4m3fn values, one float32 scale per row).

Calls the ops directly (the document_scales argument every forward and backward op takes),
on every surface, for the score, the argmax and the query gradient, with float16, bfloat16
and float32 queries. Expected values: a float64 reference on the dequantised documents
(values.double() * scales.double()[..., None]), computed pair by pair on the CPU.

Error bound. The kernels multiply exact values (int8 and e4m3 values are exact in fp16 and
bf16) and accumulate in float32, then scale each similarity once, so a similarity is off by
at most the accumulation's rounding: we allow |err_ij| <= 2^-18 * S_ij with
S_ij = |scale_j| * sum_k |q_ik * v_jk| (2^-24 per add, times a generous 64 for the tensor
cores' accumulation order). A score adds one such error per query row plus its own float32
sum of at most Lq terms; argmax must point at a similarity within the bound of the best.
Integer-valued inputs with power-of-two scales are exact throughout: there the scores, ties
(lowest index) and argmax must match exactly.
"""
import functools
import importlib

import pytest
import torch

from conftest import BACKENDS, kernel_names, load_kernel

pytestmark = pytest.mark.skipif("cuda" not in BACKENDS, reason="no CUDA backend built")
CUDA = torch.device("cuda")
FORMATS = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn}
QUERY_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SURFACES = ("padded", "contrastive", "contrastive_padded", "packed")
DIMS = (8, 40, 96, 128, 136, 256, 264, 520)
REL = 2.0 ** -18


@pytest.fixture(scope="module")
def ops():
    ms = load_kernel("cuda")
    return importlib.import_module(ms.__name__ + "._ops").ops


@pytest.fixture(autouse=True)
def no_value_checks(monkeypatch):
    monkeypatch.delenv("MAXSIM_CHECK_VALUES", raising=False)


# ---- inputs ---------------------------------------------------------------------------------

def make_values(shape, fmt, gen, integer=False):
    """Document values of `fmt` (no NaN) on the CPU."""
    if fmt == "int8":
        hi = 8 if integer else 128
        return torch.randint(-hi + 1, hi, shape, generator=gen, dtype=torch.int8)
    if integer:
        x = torch.randint(-8, 9, shape, generator=gen).float()
    else:
        # magnitudes over the whole e4m3 range, subnormals (< 2^-6) included
        x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-9, 8, shape, generator=gen).float())
        x = x.clamp(-448, 448)
    return x.to(torch.float8_e4m3fn)


def make_scales(shape, gen, integer=False):
    if integer:
        return torch.exp2(torch.randint(-3, 3, shape, generator=gen).float())
    s = (torch.rand(shape, generator=gen) * 0.05 + 0.001)
    return torch.where(torch.rand(shape, generator=gen) < 0.1, -s, s)


def make_queries(shape, dtype, gen, integer=False):
    if integer:
        return torch.randint(-4, 5, shape, generator=gen).to(dtype)
    return torch.randn(shape, generator=gen).to(dtype)


def dequantised(values, scales):
    return values.double() * scales.double()[..., None]


def lengths(n, hi, gen, zero_every=5):
    out = torch.randint(0, hi + 1, (n,), generator=gen)
    out[::zero_every] = torch.where(torch.arange(len(out[::zero_every])) % 2 == 0, 0, hi)
    return out


class Case:
    """One call's inputs (CPU originals and CUDA copies) and its pairs for the reference:
    (pair index, query rows [qlen, D], document value rows, their scales, ok)."""

    def __init__(self, surface, fmt, qdtype, dim, lq, gen, integer=False, index_dtype=torch.int64, ld=None,
                 nq=3, nb=5):
        self.surface, self.fmt, self.qdtype, self.dim = surface, fmt, qdtype, dim
        D = dim
        if surface == "padded":
            B, C, Ld = 3, 4, ld or 37
            self.q = make_queries((B, lq, D), qdtype, gen, integer)
            self.v = make_values((B, C, Ld, D), fmt, gen, integer)
            self.s = make_scales((B, C, Ld), gen, integer)
            self.ql = lengths(B, lq, gen, 3)
            self.dl = lengths(B * C, Ld, gen).view(B, C)
            self.width = lq
            self.set_padded_lengths(self.ql, self.dl)
        elif surface in ("contrastive", "contrastive_padded"):
            Nq, Nb = nq, nb
            self.q = make_queries((Nq, lq, D), qdtype, gen, integer)
            self.ql = lengths(Nq, lq, gen, 3)
            if surface == "contrastive":
                dlen = lengths(Nb, ld or 45, gen)
                self.offsets = torch.cat([torch.zeros(1, dtype=torch.int64), dlen.cumsum(0)])
                T = int(self.offsets[-1])
                self.v = make_values((T, D), fmt, gen, integer)
                self.s = make_scales((T,), gen, integer)
                docs = [(int(self.offsets[n]), int(dlen[n])) for n in range(Nb)]
                self.index = (self.offsets,)
            else:
                Ld = ld or 45
                self.dl = lengths(Nb, Ld, gen)
                self.v = make_values((Nb, Ld, D), fmt, gen, integer)
                self.s = make_scales((Nb, Ld), gen, integer)
                docs = [(n * Ld, int(self.dl[n])) for n in range(Nb)]
                self.index = (self.dl,)
            self.width = lq
            vflat, sflat = self.v.reshape(-1, D), self.s.reshape(-1)
            self.pairs = []
            for qi in range(Nq):
                for n, (r0, dn) in enumerate(docs):
                    self.pairs.append((qi * Nb + n, self.q[qi, :int(self.ql[qi])], vflat[r0:r0 + dn],
                                       sflat[r0:r0 + dn], True))
        else:
            Nq, Nd, P = 4, 5, 9
            qlen = lengths(Nq, lq, gen, 3)
            dlen = lengths(Nd, ld or 41, gen)
            self.qoffs = torch.cat([torch.zeros(1, dtype=torch.int64), qlen.cumsum(0)])
            self.doffs = torch.cat([torch.zeros(1, dtype=torch.int64), dlen.cumsum(0)])
            self.q = make_queries((int(self.qoffs[-1]), D), qdtype, gen, integer)
            self.v = make_values((int(self.doffs[-1]), D), fmt, gen, integer)
            self.s = make_scales((int(self.doffs[-1]),), gen, integer)
            self.pq = torch.randint(0, Nq, (P,), generator=gen)
            self.pd = torch.randint(0, Nd, (P,), generator=gen)
            self.width = lq
            self.nq = Nq
            self.pairs = []
            for p in range(P):
                a, b = int(self.qoffs[self.pq[p]]), int(self.qoffs[self.pq[p] + 1])
                c, d = int(self.doffs[self.pd[p]]), int(self.doffs[self.pd[p] + 1])
                self.pairs.append((p, self.q[a:b], self.v[c:d], self.s[c:d], True))
        self.index_dtype = index_dtype

    def idx(self, t):
        return t.to(self.index_dtype).to(CUDA)

    def set_padded_lengths(self, ql, dl):
        """A padded case's query and document lengths, and the pairs the reference scores."""
        self.ql, self.dl, self.index = ql, dl, (ql, dl)
        B, C = dl.shape
        self.pairs = [(b * C + c, self.q[b, :int(ql[b])], self.v[b, c, :int(dl[b, c])], self.s[b, c, :int(dl[b, c])],
                       True) for b in range(B) for c in range(C)]

    def cuda_inputs(self):
        self.qc, self.vc, self.sc = self.q.to(CUDA), self.v.to(CUDA), self.s.contiguous().to(CUDA)
        if self.surface == "packed":
            self.qoc, self.doc_, self.pqc, self.pdc = (self.idx(self.qoffs), self.idx(self.doffs),
                                                       self.idx(self.pq), self.idx(self.pd))
        else:
            self.ic = [self.idx(t) for t in self.index]
            self.qlc = self.idx(self.ql)
        return self

    def on_cpu(self):
        """A copy of this case whose call inputs are the CPU copies of the CUDA ones."""
        cpu = self.__class__.__new__(self.__class__)
        cpu.__dict__.update(self.__dict__)
        for name in ("qc", "vc", "sc", "qlc", "qoc", "doc_", "pqc", "pdc"):
            if hasattr(self, name):
                setattr(cpu, name, getattr(self, name).cpu())
        if hasattr(self, "ic"):
            cpu.ic = [t.cpu() for t in self.ic]
        return cpu

    def forward(self, ops, with_argmax, scales="default"):
        sc = self.sc if scales == "default" else scales
        if self.surface == "padded":
            return ops.padded_forward(self.qc, self.vc, self.qlc, self.ic[1], with_argmax, sc)
        if self.surface == "contrastive":
            return ops.contrastive_forward(self.qc, self.vc, self.ic[0], self.qlc, with_argmax, sc)
        if self.surface == "contrastive_padded":
            return ops.contrastive_padded_forward(self.qc, self.vc, self.ic[0], self.qlc, with_argmax, sc)
        return ops.packed_forward(self.qc, self.qoc, self.vc, self.doc_, self.pqc, self.pdc, self.width,
                                  with_argmax, sc)

    def backward(self, ops, g, argmax, need_d=False):
        if self.surface == "padded":
            return ops.padded_backward(g, self.qc, self.vc, self.qlc, self.ic[1], argmax, True, need_d, self.sc)
        if self.surface == "contrastive":
            return ops.contrastive_backward(g, self.qc, self.vc, self.ic[0], self.qlc, argmax, True, need_d, self.sc)
        if self.surface == "contrastive_padded":
            return ops.contrastive_padded_backward(g, self.qc, self.vc, self.ic[0], self.qlc, argmax, True, need_d,
                                                   self.sc)
        pbq = torch.argsort(self.pqc.long(), stable=True)
        qpo = torch.searchsorted(self.pqc.long()[pbq], torch.arange(self.nq + 1, device=CUDA))
        pbd = torch.argsort(self.pdc.long(), stable=True)
        dpo = torch.searchsorted(self.pdc.long()[pbd], torch.arange(len(self.doffs), device=CUDA))
        return ops.packed_backward(g, self.qc, self.qoc, self.vc, self.doc_, self.pqc, self.pdc, argmax, pbq, qpo,
                                   pbd, dpo, True, need_d, self.sc)

    def query_row_of(self, p, i):
        """Row of the flattened queries tensor that pair p's query position i is."""
        if self.surface == "packed":
            return int(self.qoffs[self.pq[p]]) + i
        per = len(self.pairs) // self.q.shape[0]
        return (p // per) * self.q.shape[1] + i


def pair_reference(q, v, s):
    """float64 similarities [qlen, dlen] and their error bounds."""
    qd, vd, sd = q.double(), v.double(), s.double()
    sims = (qd @ vd.T) * sd[None, :]
    bound = REL * (qd.abs() @ vd.abs().T) * sd.abs()[None, :] + 1e-300
    return sims, bound


def check_forward(case, scores, argmax):
    scores, argmax = scores.cpu(), (argmax.cpu() if argmax is not None else None)
    for p, q, v, s, ok in case.pairs:
        qn, dn = q.shape[0], v.shape[0]
        got = float(scores.reshape(-1)[p])
        arow = argmax.reshape(-1, case.width)[p] if argmax is not None else None
        if qn == 0 or dn == 0:
            assert got == (0.0 if qn == 0 else float("-inf")), (p, qn, dn, got)
            if arow is not None:
                assert (arow == -1).all(), (p, arow)
            continue
        sims, bound = pair_reference(q, v, s)
        nan_rows = sims.isnan().any(dim=1)
        best = torch.where(nan_rows, torch.nan, sims.nan_to_num(nan=-torch.inf).max(dim=1).values)
        want = float(best.sum())
        if nan_rows.any():
            assert got != got, (p, got)
        else:
            tol = float(bound.max(dim=1).values.sum()) + 2.0 ** -22 * qn * float(best.abs().sum())
            assert abs(got - want) <= tol, (p, got, want, tol)
        if arow is None:
            continue
        assert (arow[qn:] == -1).all(), (p, arow)
        for i in range(qn):
            a = int(arow[i])
            assert 0 <= a < dn, (p, i, a)
            if nan_rows[i]:
                assert a == int(sims[i].isnan().nonzero()[0]), (p, i, a)
            else:
                assert float(best[i] - sims[i, a]) <= float(bound[i].max() * 2), (p, i, a)


def check_grad_queries(case, g, argmax, grad_q):
    """grad_q[row] = sum over pairs of g_p * scale[a] * v[a] (float64), from the kernel's argmax."""
    D = case.dim
    want = torch.zeros(case.q.reshape(-1, D).shape, dtype=torch.float64)
    mag = torch.zeros_like(want)
    gcpu, acpu = g.cpu().double().reshape(-1), argmax.cpu().reshape(-1, case.width)
    for p, q, v, s, ok in case.pairs:
        if v.shape[0] == 0:
            continue
        for i in range(q.shape[0]):
            a = int(acpu[p, i])
            if a < 0:
                continue
            term = gcpu[p] * s[a].double() * v[a].double()
            row = case.query_row_of(p, i)
            want[row] += term
            mag[row] += term.abs()
    got = grad_q.cpu().double().reshape(-1, D)
    eps = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}[case.qdtype]
    # the gradient is stored in the queries' dtype: float16 rounds values below 2^-14 to a
    # multiple of 2^-24 (its subnormals), which small e4m3 values times small scales reach
    tiny = {torch.float16: 2.0 ** -25}.get(case.qdtype, 0.0)
    tol = mag * 2.0 ** -20 + want.abs() * eps + tiny + 1e-30
    bad = (got - want).abs() > tol
    assert not bad.any(), (bad.nonzero()[:5], got[bad][:5], want[bad][:5])


def poison(*likes):
    """Fill and free blocks of the outputs' sizes, so that the op's at::empty outputs start
    as garbage (the caching allocator hands the freed blocks back)."""
    blocks = [torch.full_like(t, 12345.0) if t.is_floating_point() else torch.full_like(t, 0x5A5A5A5A)
              for t in likes]
    del blocks


def run_case(ops, case, check_backward=True):
    case.cuda_inputs()
    scores_only, empty = case.forward(ops, False)
    assert empty.numel() == 0
    check_forward(case, scores_only, None)
    scores, argmax = case.forward(ops, True)
    poison(scores, argmax)
    scores, argmax = case.forward(ops, True)
    check_forward(case, scores, argmax)
    # the score without argmax is the same computation (bitwise, NaN where NaN)
    assert torch.equal(scores_only.nan_to_num(nan=7.0), scores.nan_to_num(nan=7.0))
    if check_backward:
        g = torch.randn(scores.shape, generator=torch.Generator().manual_seed(5)).to(CUDA)
        poison(case.qc)
        gq, gd = case.backward(ops, g, argmax)
        assert gd.numel() == 0
        assert gq.dtype == case.qdtype and gq.shape == case.qc.shape
        check_grad_queries(case, g, argmax, gq)
    return scores, argmax


# ---- every surface x format x query dtype x dim ----------------------------------------------

@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("qdtype", QUERY_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("surface", SURFACES)
def test_matches_float64_reference(ops, surface, fmt, qdtype, dim):
    gen = torch.Generator().manual_seed(hash((surface, fmt, str(qdtype), dim)) & 0xFFFF)
    # query lengths that pick the 32-, 64- and 128-row blocks across the dims
    lq = (7, 40, 90)[DIMS.index(dim) % 3]
    run_case(ops, Case(surface, fmt, qdtype, dim, lq, gen))


@pytest.mark.parametrize("lq", (5, 33, 70))
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("surface", SURFACES)
def test_block_shapes_fp16(ops, surface, fmt, lq):
    """Every block height with the fast path's dims (64 / 128 / 256-byte rows)."""
    for dim in (64, 128, 256):
        gen = torch.Generator().manual_seed(lq * 1000 + dim)
        run_case(ops, Case(surface, fmt, torch.float16, dim, lq, gen))


@pytest.mark.parametrize("dim", (64, 96, 128, 256))
@pytest.mark.parametrize("qdtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("surface", ("padded", "packed"))
def test_long_documents(ops, surface, fmt, qdtype, dim):
    """Documents of up to three 128-row tiles with ragged tails, empty and full ones among
    them: a tile stream that crosses documents mid-tile and tails of every length."""
    gen = torch.Generator().manual_seed(dim * 100 + SURFACES.index(surface) * 10 + list(FORMATS).index(fmt) * 2
                                        + (qdtype == torch.bfloat16))
    run_case(ops, Case(surface, fmt, qdtype, dim, 70 if dim == 96 else 32, gen, ld=300))


@pytest.mark.parametrize("qdtype", QUERY_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("surface", SURFACES)
def test_integer_inputs_are_exact(ops, surface, fmt, qdtype):
    """Small integers and power-of-two scales: every product and sum is exact, so scores
    match exactly and ties go to the lowest index."""
    for dim in (16, 128, 300):
        gen = torch.Generator().manual_seed(dim + 77)
        case = Case(surface, fmt, qdtype, dim, 9, gen, integer=True, index_dtype=torch.int32).cuda_inputs()
        scores, argmax = case.forward(ops, True)
        scores, argmax = scores.cpu(), argmax.cpu()
        for p, q, v, s, ok in case.pairs:
            qn, dn = q.shape[0], v.shape[0]
            if qn == 0 or dn == 0:
                continue
            sims, _ = pair_reference(q, v, s)
            best = sims.max(dim=1).values
            assert float(scores.reshape(-1)[p]) == float(best.sum()), p
            first = (sims == best[:, None]).double().argmax(dim=1)  # lowest index reaching the max
            assert torch.equal(argmax.reshape(-1, case.width)[p, :qn].long(), first), p


def test_float8_nan_bytes(ops):
    """0x7F and 0xFF are NaN: a pair whose valid rows hold one scores NaN, argmax the first
    NaN column; the same bytes past a document's length change nothing."""
    gen = torch.Generator().manual_seed(3)
    for qdtype in QUERY_DTYPES:
        for dim in (40, 128, 264):
            case = Case("padded", "e4m3", qdtype, dim, 6, gen)
            raw = case.v.view(torch.uint8)
            B, C, Ld, D = raw.shape
            for b in range(B):
                for c in range(C):
                    dn = int(case.dl[b, c])
                    if (b + c) % 2 == 0 and dn > 2:
                        raw[b, c, dn // 2, (b * 7 + c) % D] = 0x7F if c % 2 else 0xFF
                    if dn < Ld:
                        raw[b, c, dn, 0] = 0x7F  # padding: ignored
            run_case(ops, case)


@pytest.mark.parametrize("surface", ("contrastive", "packed"))
def test_bad_offsets_and_ids(ops, surface):
    gen = torch.Generator().manual_seed(11)
    case = Case(surface, "int8", torch.float16, 128, 8, gen).cuda_inputs()
    if surface == "contrastive":
        offs = case.ic[0].clone()
        offs[2] = 10 ** 6  # documents 1 and 2 are out of range
        scores, argmax = ops.contrastive_forward(case.qc, case.vc, offs, case.qlc, True, case.sc)
        bad = torch.zeros(scores.shape, dtype=torch.bool)
        bad[:, 1:3] = True
    else:
        pd = case.pdc.clone()
        pd[1] = 99
        pq = case.pqc.clone()
        pq[4] = -1
        scores, argmax = ops.packed_forward(case.qc, case.qoc, case.vc, case.doc_, pq, pd, case.width, True,
                                            case.sc)
        bad = torch.zeros(scores.shape, dtype=torch.bool)
        bad[[1, 4]] = True
    scores, argmax = scores.cpu(), argmax.cpu()
    assert scores[bad].isnan().all()
    assert (argmax[bad] == -1).all()
    assert not scores[~bad].isnan().any()


def test_deterministic(ops):
    gen = torch.Generator().manual_seed(21)
    for surface in SURFACES:
        for fmt in FORMATS:
            case = Case(surface, fmt, torch.bfloat16, 136, 20, gen).cuda_inputs()
            g = torch.randn(case.forward(ops, False)[0].shape, generator=gen).to(CUDA)
            runs = []
            for _ in range(2):
                s, a = case.forward(ops, True)
                gq, _ = case.backward(ops, g, a)
                runs.append((s, a, gq))
            for x, y in zip(*runs):
                assert torch.equal(x.view(torch.uint8) if x.is_floating_point() else x,
                                   y.view(torch.uint8) if y.is_floating_point() else y)


@pytest.mark.parametrize("surface", SURFACES)
def test_cuda_graph(ops, surface):
    gen = torch.Generator().manual_seed(31)
    case = Case(surface, "e4m3", torch.float16, 128, 16, gen).cuda_inputs()
    g = torch.randn(case.forward(ops, False)[0].shape, generator=gen).to(CUDA)
    eager_s, eager_a = case.forward(ops, True)
    eager_gq, _ = case.backward(ops, g, eager_a)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        case.forward(ops, True)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        s, a = case.forward(ops, True)
        gq, _ = case.backward(ops, g, a)
    for t in (s, gq):
        t.fill_(1234.0)
    a.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(s.nan_to_num(nan=3.0), eager_s.nan_to_num(nan=3.0))
    assert torch.equal(a, eager_a)
    assert torch.equal(gq, eager_gq)


def clear_rows(case):
    """Per pair of the case, (pair index, rows, their top two float64 similarities, their bounds):
    the query rows whose best similarity is clear of the runner-up by more than four bounds,
    where two backends' argmax must agree; rows None where the whole argmax row must (an empty
    query, or fewer than two document rows: no runner-up)."""
    out = []
    for p, q, v, s, ok in case.pairs:
        if q.shape[0] == 0 or v.shape[0] < 2:
            out.append((p, None, None, None))
            continue
        sims, bound = pair_reference(q, v, s)
        top, bound = sims.topk(2, dim=1).values, bound.max(dim=1).values
        rows = ((top[:, 0] - top[:, 1]) > 4 * bound).nonzero().flatten()
        out.append((p, rows, top[rows], bound[rows]))
    return out


def argmax_disagreements(checks, a_gpu, a_cpu):
    """(rows compared, a message per pair where a_gpu and a_cpu [pairs, width] differ on the
    rows clear_rows chose)."""
    compared, messages = 0, []
    for p, rows, top, bound in checks:
        if rows is None:
            if not torch.equal(a_gpu[p], a_cpu[p]):
                messages.append(f"pair {p} (whole row): GPU {a_gpu[p].tolist()}, CPU {a_cpu[p].tolist()}")
            continue
        differ = a_gpu[p, rows] != a_cpu[p, rows]
        if differ.any():
            r = rows[differ]
            messages.append(f"pair {p}: rows {r.tolist()}, GPU {a_gpu[p, r].tolist()}, CPU {a_cpu[p, r].tolist()}, "
                            f"top two {top[differ].tolist()}, bound {bound[differ].tolist()}")
        compared += len(rows)
    return compared, messages


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("surface", SURFACES)
def test_argmax_matches_cpu_backend(ops, surface, fmt):
    """Same argmax as the CPU backend wherever the best similarity is clear of the runner-up
    by more than both backends' rounding."""
    cpu_ops = importlib.import_module(load_kernel("cpu").__name__ + "._ops").ops
    gen = torch.Generator().manual_seed(41)
    case = Case(surface, fmt, torch.float32, 96, 12, gen).cuda_inputs()
    _, a_gpu = case.forward(ops, True)
    # a second call over poisoned memory: the GPU's answer is its own
    poison(a_gpu)
    _, a_again = case.forward(ops, True)
    assert torch.equal(a_gpu, a_again)
    _, a_cpu = case.on_cpu().forward(cpu_ops, True)
    a_gpu = a_gpu.cpu().reshape(-1, case.width)
    a_cpu = a_cpu.reshape(-1, case.width)
    compared, disagreements = argmax_disagreements(clear_rows(case), a_gpu, a_cpu)
    assert not disagreements, disagreements[:3]
    assert compared > 0


ERROR_CHECKS = r"""
import importlib, sys, torch
from pathlib import Path
import kernels
ms = kernels.get_local_kernel(Path(sys.argv[1]), backend="cuda")
ops = importlib.import_module(ms.__name__ + "._ops").ops
dev = torch.device("cuda")
q = torch.randn(2, 8, 64, device=dev, dtype=torch.float16)
v = torch.randint(-127, 128, (2, 3, 16, 64), device=dev, dtype=torch.int8)
s = torch.rand(2, 3, 16, device=dev)
ql = torch.tensor([8, 5], device=dev)
dl = torch.full((2, 3), 16, device=dev)
_, a = ops.padded_forward(q, v, ql, dl, True, s)
g = torch.ones(2, 3, device=dev)
checks = {
    "missing": lambda: ops.padded_forward(q, v, ql, dl, False, None),
    "float_documents": lambda: ops.padded_forward(q, v.half(), ql, dl, False, s),
    "float64_scales": lambda: ops.padded_forward(q, v, ql, dl, False, s.double()),
    "short_scales": lambda: ops.padded_forward(q, v, ql, dl, False, s[:-1]),
    "cpu_scales": lambda: ops.padded_forward(q, v, ql, dl, False, s.cpu()),
    "float64_queries": lambda: ops.padded_forward(q.double(), v, ql, dl, False, s),
    "grad_documents": lambda: ops.padded_backward(g, q, v, ql, dl, a, True, True, s),
}
for name, call in checks.items():
    try:
        call()
        print(name, "NO ERROR", flush=True)
    except (RuntimeError, ValueError, TypeError) as e:  # the ops' checks raise ValueError / TypeError
        print(name, "|", str(e).splitlines()[0], flush=True)
"""


def test_errors(tmp_path):
    """Each bad call raises a message naming the argument. In a subprocess, so that a crash
    fails this test alone: the short-scales message once streamed integers, which crashed
    the process on the H100 (SIGSEGV in the module's std::ostream::_M_insert<long>)."""
    import subprocess
    import sys

    from conftest import KERNEL_REPO

    load_kernel("cuda")
    result = subprocess.run([sys.executable, "-c", ERROR_CHECKS, str(KERNEL_REPO)], capture_output=True,
                            text=True, timeout=300)
    out = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert result.returncode == 0, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    want = {"missing": "document_scales", "float_documents": "document_scales",
            "float64_scales": "document_scales", "short_scales": "document_scales",
            "cpu_scales": "document_scales", "float64_queries": "queries", "grad_documents": "no gradient"}
    for name, word in want.items():
        assert name in out and word in out[name], (name, out.get(name))


def test_zero_dim_and_empty(ops):
    q = torch.randn(2, 3, 0, device=CUDA, dtype=torch.float16)
    v = torch.zeros(2, 2, 4, 0, device=CUDA, dtype=torch.int8)
    ql = torch.tensor([3, 0], device=CUDA)
    dl = torch.tensor([[4, 0], [2, 1]], device=CUDA)
    # one scale per document row (documents.shape[:-1]), as at any other dim
    s, a = ops.padded_forward(q, v, ql, dl, True, torch.rand(2, 2, 4, device=CUDA) + 0.5)
    assert s.cpu().tolist() == [[0.0, float("-inf")], [0.0, 0.0]]
    assert (a[0, 0] == 0).all() and (a[0, 1] == -1).all() and (a[1] == -1).all()


# ---- the sm_90a kernel (documents as the register operand) against mma.sync ------------------

@pytest.mark.parametrize("tile", ("64", "128"))
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("surface", ("padded", "packed"))
def test_sm90a_kernel_runs_and_matches_mma_sync(ops, monkeypatch, surface, fmt, tile):
    """On an H100 / H200 padded and packed calls with 64 < dim <= 128 take the wgmma kernel
    (MAXSIM_CUDA_HOPPER_BYTES=0 keeps mma.sync), Lq <= 32 in either tile height
    (MAXSIM_CUDA_HOPPER_BYTES_TILE): both paths meet the float64 bound, and on integer inputs
    (exact everywhere) they agree bit for bit, argmax included."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90a")
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_BYTES_TILE", tile)
    shapes = ((torch.float16, 128, 32, 300), (torch.bfloat16, 96, 70, 200), (torch.float16, 112, 64, 129),
              (torch.bfloat16, 128, 1, 64), (torch.float16, 128, 17, 700), (torch.bfloat16, 112, 32, 65))
    for qdtype, dim, lq, ld in shapes:
        got = {}
        for knob in ("1", "0"):
            monkeypatch.setenv("MAXSIM_CUDA_HOPPER_BYTES", knob)
            for integer in (False, True):
                gen = torch.Generator().manual_seed(dim * 7 + lq + integer)
                case = Case(surface, fmt, qdtype, dim, lq, gen, integer=integer, ld=ld)
                (scores, argmax), names = kernel_names(lambda: run_case(ops, case, check_backward=False))
                assert any("hopper_bytes" in n for n in names) == (knob == "1"), (knob, sorted(names))
                if integer:
                    check_forward(case, scores, argmax)
                    got[knob] = (scores.cpu(), argmax.cpu())
        assert torch.equal(got["1"][0], got["0"][0]) and torch.equal(got["1"][1], got["0"][1]), (qdtype, dim, lq)


@pytest.mark.parametrize("tile", ("64", "128"))
@pytest.mark.parametrize("lq", (32, 64))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_sm90a_kernel_never_reads_padding_rows(ops, monkeypatch, fmt, lq, tile):
    """Padded calls of one step a CTA, whose producer loads a CTA's first document tile before
    it has read the document's length (the padded Ld's rows): the rows past each document hold
    the format's largest values under huge positive scales, so one such row reaching a max
    would win it. Documents of every length class lead a CTA: empty, a few rows, one row short
    of a 64 / 128-row tile, exactly a tile, longer; Ld below and above a tile."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90a")
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_BYTES", "1")
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_BYTES_TILE", tile)
    big = {"int8": 127.0, "e4m3": 448.0}[fmt]
    for ld, lens in ((40, (0, 3, 39, 40, 17, 1)), (200, (0, 5, 63, 64, 127, 128, 129, 200, 1))):
        gen = torch.Generator().manual_seed(ld + lq)
        case = Case("padded", fmt, torch.float16, 128, lq, gen, ld=ld)
        B, C = case.v.shape[:2]
        dl = torch.tensor([lens[i % len(lens)] for i in range(B * C)]).view(B, C)
        case.q = case.q.abs()  # all positive: the largest positive values make the largest products
        for b in range(B):
            for c in range(C):
                case.v[b, c, dl[b, c]:] = torch.tensor(big).to(FORMATS[fmt])
                case.s[b, c, dl[b, c]:] = 1.0e6
        # no empty query: every document is scored
        case.set_padded_lengths(torch.tensor([lq, lq // 2 + 1, lq - 3]), dl)
        (scores, argmax), names = kernel_names(lambda: run_case(ops, case, check_backward=False))
        assert any("hopper_bytes" in n for n in names), sorted(names)
        assert torch.isfinite(scores).logical_or(scores == float("-inf")).all(), scores


@pytest.mark.parametrize("surface", ("padded", "packed"))
def test_sm90a_kernel_takes_every_query_length_by_default(ops, monkeypatch, surface):
    """Without knobs the wgmma kernel takes short and long queries at any document length
    (here 40 rows at most, or up to 1,000: ~500 on average), padded and packed."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90a")
    for knob in ("MAXSIM_CUDA_HOPPER_BYTES", "MAXSIM_CUDA_HOPPER_BYTES_TILE", "MAXSIM_CUDA_FORCE_MMA_SYNC"):
        monkeypatch.delenv(knob, raising=False)
    for lq, ld, wanted in ((32, 40, True), (48, 40, True), (48, 1000, True)):
        gen = torch.Generator().manual_seed(lq + ld)
        case = Case(surface, "int8", torch.float16, 128, lq, gen, ld=ld)
        (scores, argmax), names = kernel_names(lambda: run_case(ops, case, check_backward=False))
        assert any("hopper_bytes" in n for n in names) == wanted, (lq, ld, sorted(names))
        check_forward(case, scores, argmax)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_sm90a_kernel_one_short_packed_query(ops, monkeypatch, fmt):
    """One packed query of 20 rows with max_q_len 32 (the one-query rerank's packed form): the
    wgmma kernel takes it by default, its 32-row query box reaching past the query tensor (TMA
    fills zeros there); integer inputs, so its scores and argmax equal the mma.sync kernels' and
    the float64 MaxSim of the dequantised documents exactly."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90a")
    for knob in ("MAXSIM_CUDA_HOPPER_BYTES", "MAXSIM_CUDA_HOPPER_BYTES_TILE", "MAXSIM_CUDA_FORCE_MMA_SYNC"):
        monkeypatch.delenv(knob, raising=False)
    gen = torch.Generator().manual_seed(20)
    dim, lq, max_q_len = 128, 20, 32
    dlen = torch.tensor([300, 0, 65, 1, 129, 64, 250])
    q = make_queries((lq, dim), torch.float16, gen, integer=True)
    v = make_values((int(dlen.sum()), dim), fmt, gen, integer=True)
    sc = make_scales((int(dlen.sum()),), gen, integer=True)
    doffs = torch.cat([torch.zeros(1, dtype=torch.int64), dlen.cumsum(0)])
    n = len(dlen)
    args = (q.to(CUDA), torch.tensor([0, lq]).to(CUDA), v.to(CUDA), doffs.to(CUDA),
            torch.zeros(n, dtype=torch.int64, device=CUDA), torch.arange(n, device=CUDA), max_q_len)
    got = {}
    for knob in ("default", "0"):
        if knob == "0":
            monkeypatch.setenv("MAXSIM_CUDA_HOPPER_BYTES", "0")
        (scores, argmax), names = kernel_names(lambda: ops.packed_forward(*args, True, sc.to(CUDA)))
        assert any("hopper_bytes" in name for name in names) == (knob == "default"), (knob, sorted(names))
        got[knob] = (scores.cpu(), argmax.cpu())
    assert torch.equal(got["default"][0], got["0"][0]) and torch.equal(got["default"][1], got["0"][1])
    deq = dequantised(v, sc)
    for p in range(n):
        a, b = int(doffs[p]), int(doffs[p + 1])
        if b == a:  # a query against an empty document scores -inf, argmax -1
            assert got["default"][0][p] == float("-inf") and (got["default"][1][p] == -1).all()
            continue
        sim = q.double() @ deq[a:b].T
        assert float(got["default"][0][p]) == float(sim.max(dim=1).values.sum())


def query_runs(n, nq, gen, longest=12):
    """n pair query ids in runs of one query (1 to `longest` pairs each), as a rerank's pair
    list holds them; a query may come back after others."""
    ids = []
    while len(ids) < n:
        ids += [int(torch.randint(0, nq, (1,), generator=gen))] * int(torch.randint(1, longest + 1, (1,), generator=gen))
    return torch.tensor(ids[:n])


def packed_pairs(q, qoffs, v, doffs, sc, pq, pd):
    """(pair, query rows, document values, their scales) of every pair of a packed call."""
    return [(p, q[int(qoffs[pq[p]]):int(qoffs[pq[p] + 1])], v[int(doffs[pd[p]]):int(doffs[pd[p] + 1])],
             sc[int(doffs[pd[p]]):int(doffs[pd[p] + 1])]) for p in range(len(pq))]


def byte_kernel_variants(monkeypatch, fwd, args, scales, npairs, knob, values, tag):
    """The call on the mma.sync kernels (MAXSIM_CUDA_HOPPER_BYTES=0) and on the sm_90a byte
    kernel at each of `values` of the environment knob `knob`: the profiler sees the byte
    kernel exactly when it is asked for, each variant's score-only form gives its argmax form's
    scores (outputs poisoned first), and every variant's scores and argmax equal mma.sync's bit
    for bit. Returns mma.sync's scores, flat, on the CPU."""
    got = {}
    for value in ("mma.sync", *values):
        byte = value != "mma.sync"
        monkeypatch.setenv("MAXSIM_CUDA_HOPPER_BYTES", "1" if byte else "0")
        if byte:
            monkeypatch.setenv(knob, value)
        (scores, argmax), names = kernel_names(functools.partial(fwd, *args, True, scales))
        assert any("hopper_bytes" in n for n in names) == byte, (tag, value, sorted(names))
        poison(scores)
        only, _ = fwd(*args, False, scales)
        differ = only.cpu() != scores.cpu()
        assert torch.equal(only.cpu(), scores.cpu()), (tag, value, differ.nonzero()[:8].tolist())
        got[value] = (scores.cpu().reshape(-1), argmax.cpu().reshape(npairs, -1))
    for value in values:
        assert torch.equal(got[value][0], got["mma.sync"][0]), (tag, value)
        assert torch.equal(got[value][1], got["mma.sync"][1]), (tag, value)
    return got["mma.sync"][0]


# document lengths at the byte kernel's tile edges (64- and 128-row tiles), and none
TILE_EDGES = torch.tensor([0, 1, 127, 128, 129, 256, 640, 700])


def exact_maxsim(pairs):
    """Each pair's float64 MaxSim on the dequantised documents (0 for an empty query, -inf for
    an empty document), indexed by pair."""
    want = torch.empty(len(pairs), dtype=torch.float64)
    for p, qp, vp, sp in pairs:
        if qp.shape[0] == 0 or vp.shape[0] == 0:
            want[p] = 0.0 if qp.shape[0] == 0 else float("-inf")
        else:
            want[p] = (qp.double() @ dequantised(vp, sp).T).max(dim=1).values.sum()
    return want


def assert_exact_maxsim(scores, pairs, tag):
    """Integer inputs (exact in fp32): each pair's score is its float64 MaxSim."""
    differ = (scores.double() != exact_maxsim(pairs)).nonzero().flatten()
    assert len(differ) == 0, (tag, differ[:8].tolist())


def split_steps_packed(lq, count, fmt, gen, dim=128):
    """test_sm90a_kernel_split_steps's packed call (tools/device/repeat_bytes.py repeats it):
    `count` pairs in runs of one query over 5 queries (one empty) and 40 documents of 0 to 700
    rows, half of them at tile edges; integer values. Returns (q, qoffs, v, doffs, sc, pq, pd)
    on the CPU."""
    nq, nd = 5, 40
    qlen = lengths(nq, lq, gen, 4)
    at_edges = TILE_EDGES[torch.randint(0, len(TILE_EDGES), (nd,), generator=gen)]
    dlen = torch.where(torch.rand(nd, generator=gen) < 0.5, at_edges, torch.randint(0, 701, (nd,), generator=gen))
    qoffs = torch.cat([torch.zeros(1, dtype=torch.int64), qlen.cumsum(0)])
    doffs = torch.cat([torch.zeros(1, dtype=torch.int64), dlen.cumsum(0)])
    q = make_queries((int(qoffs[-1]), dim), torch.float16, gen, integer=True)
    v = make_values((int(doffs[-1]), dim), fmt, gen, integer=True)
    sc = make_scales((int(doffs[-1]),), gen, integer=True)
    pq, pd = query_runs(count, nq, gen, 4), torch.randint(0, nd, (count,), generator=gen)
    return q, qoffs, v, doffs, sc, pq, pd


@pytest.mark.parametrize("surface", ("padded", "packed"))
def test_sm90a_kernel_runs_of_steps(ops, monkeypatch, surface):
    """The byte kernel's CTAs take runs of consecutive steps (MAXSIM_CUDA_HOPPER_BYTES_RUN), and
    on a pair grid consecutive pairs of one query load and permute it once. 1,200 steps, more
    than a grid holds, so runs of several steps happen; padded: 150 candidates a query; packed:
    pairs in runs of one query of random length, a query recurring after others, an empty query
    among them, chunked queries (Lq 100) included. Integer inputs: every run length gives the
    mma.sync kernels' scores and argmax bit for bit, and those equal the float64 MaxSim."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90a")
    monkeypatch.delenv("MAXSIM_CUDA_FORCE_MMA_SYNC", raising=False)
    dim = 128
    for lq in (24, 48, 100):
        gen = torch.Generator().manual_seed(lq)
        if surface == "padded":
            B, C, Ld = 8, 150, 24
            q = make_queries((B, lq, dim), torch.float16, gen, integer=True)
            v = make_values((B, C, Ld, dim), "int8", gen, integer=True)
            sc = make_scales((B, C, Ld), gen, integer=True)
            ql, dl = lengths(B, lq, gen, 3), lengths(B * C, Ld, gen).view(B, C)
            args = (q.to(CUDA), v.to(CUDA), ql.to(CUDA), dl.to(CUDA))
            pairs = [(b * C + c, q[b, :int(ql[b])], v[b, c, :int(dl[b, c])], sc[b, c, :int(dl[b, c])])
                     for b in range(B) for c in range(C)]
            fwd = ops.padded_forward
        else:
            nq, nd, P = 6, 300, 1200
            qlen, dlen = lengths(nq, lq, gen, 4), lengths(nd, 40, gen)
            qoffs = torch.cat([torch.zeros(1, dtype=torch.int64), qlen.cumsum(0)])
            doffs = torch.cat([torch.zeros(1, dtype=torch.int64), dlen.cumsum(0)])
            q = make_queries((int(qoffs[-1]), dim), torch.float16, gen, integer=True)
            v = make_values((int(doffs[-1]), dim), "int8", gen, integer=True)
            sc = make_scales((int(doffs[-1]),), gen, integer=True)
            pq, pd = query_runs(P, nq, gen), torch.randint(0, nd, (P,), generator=gen)
            args = (q.to(CUDA), qoffs.to(CUDA), v.to(CUDA), doffs.to(CUDA), pq.to(CUDA), pd.to(CUDA), lq)
            pairs = packed_pairs(q, qoffs, v, doffs, sc, pq, pd)
            fwd = ops.packed_forward
        scores = byte_kernel_variants(monkeypatch, fwd, args, sc.to(CUDA), len(pairs), "MAXSIM_CUDA_HOPPER_BYTES_RUN",
                                      ("1", "2", "5"), lq)
        assert_exact_maxsim(scores, pairs, lq)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("surface", ("padded", "packed"))
def test_sm90a_kernel_split_steps(ops, monkeypatch, surface, fmt):
    """Lq > 32 with fewer steps than SMs: two consumer warpgroups of a CTA split each step's
    tiles by parity (MAXSIM_CUDA_HOPPER_BYTES_SPLIT=1; =0 the one-warpgroup shape). Documents
    of 0 to 6 tiles (one tile: the second warpgroup has none; lengths at tile edges), empty
    queries, 64-row chunks (Lq 100), a query recurring after others on the pair list, and more
    steps than SMs once (the CTAs then walk several steps, and meet a new query between two
    steps of one run). Integer inputs: split, unsplit and the mma.sync kernels agree bit for
    bit, argmax included, and equal the float64 MaxSim; the max-only form equals the scores."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90a")
    monkeypatch.delenv("MAXSIM_CUDA_FORCE_MMA_SYNC", raising=False)
    dim = 128
    for lq, count in ((48, 40), (100, 30), (64, 400)):
        gen = torch.Generator().manual_seed(lq + count)
        if surface == "padded":
            B, Ld = 4, 700
            C = count // B
            q = make_queries((B, lq, dim), torch.float16, gen, integer=True)
            v = make_values((B, C, Ld, dim), fmt, gen, integer=True)
            sc = make_scales((B, C, Ld), gen, integer=True)
            ql = lengths(B, lq, gen, 3)
            at_edges = TILE_EDGES[torch.randint(0, len(TILE_EDGES), (B * C,), generator=gen)]
            dl = torch.where(torch.rand(B * C, generator=gen) < 0.5, at_edges,
                             torch.randint(0, Ld + 1, (B * C,), generator=gen)).view(B, C)
            args = (q.to(CUDA), v.to(CUDA), ql.to(CUDA), dl.to(CUDA))
            pairs = [(b * C + c, q[b, :int(ql[b])], v[b, c, :int(dl[b, c])], sc[b, c, :int(dl[b, c])])
                     for b in range(B) for c in range(C)]
            fwd = ops.padded_forward
        else:
            q, qoffs, v, doffs, sc, pq, pd = split_steps_packed(lq, count, fmt, gen, dim)
            args = (q.to(CUDA), qoffs.to(CUDA), v.to(CUDA), doffs.to(CUDA), pq.to(CUDA), pd.to(CUDA), lq)
            pairs = packed_pairs(q, qoffs, v, doffs, sc, pq, pd)
            fwd = ops.packed_forward
        scores = byte_kernel_variants(monkeypatch, fwd, args, sc.to(CUDA), len(pairs), "MAXSIM_CUDA_HOPPER_BYTES_SPLIT",
                                      ("0", "1"), lq)
        assert_exact_maxsim(scores, pairs, lq)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("surface", ("contrastive", "contrastive_padded"))
def test_sm90a_widening_kernel_runs_and_matches_mma_sync(ops, monkeypatch, surface, fmt):
    """On an H100 / H200 contrastive calls with 64 < dim <= 128 take the wgmma kernel with a
    widening stage (MAXSIM_CUDA_HOPPER_WIDEN=0 keeps mma.sync): both paths meet the float64
    bound, and on integer inputs they agree bit for bit, argmax included. The shapes pick two,
    three and four consumer warpgroups, long queries (64-row chunks), and documents of several
    tiles with a short last one."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90a")
    # (query dtype, dim, Lq, Ld, Nq, Nb)
    shapes = ((torch.float16, 128, 32, 300, 9, 7), (torch.bfloat16, 96, 70, 200, 3, 5),
              (torch.float16, 112, 64, 129, 8, 6), (torch.bfloat16, 128, 5, 64, 2, 4))
    for qdtype, dim, lq, ld, nq, nb in shapes:
        got = {}
        for knob in ("1", "0"):
            monkeypatch.setenv("MAXSIM_CUDA_HOPPER_WIDEN", knob)
            for integer in (False, True):
                gen = torch.Generator().manual_seed(dim * 5 + lq + integer)
                case = Case(surface, fmt, qdtype, dim, lq, gen, integer=integer, ld=ld, nq=nq, nb=nb)
                (scores, argmax), names = kernel_names(lambda: run_case(ops, case, check_backward=False))
                assert any("hopper_widen" in n for n in names) == (knob == "1"), (knob, sorted(names))
                if integer:
                    check_forward(case, scores, argmax)
                    got[knob] = (scores.cpu(), argmax.cpu())
        assert torch.equal(got["1"][0], got["0"][0]) and torch.equal(got["1"][1], got["0"][1]), (qdtype, dim, lq)
