"""Shared fixtures and helpers for the maxsim test suite.

The session builds the kernel with tools/build.py (cpu, plus cuda when a GPU and nvcc are
present and build.toml lists the cuda backend) and loads it the way users do, through
`kernels.get_local_kernel`. Every test that takes the `device` fixture runs once per built
backend.

Expected values come from the package's pure-PyTorch references (torch-ext/maxsim/
_reference.py, imported straight from the source tree so that reference-only tests run
without a build) evaluated in float64 on the CPU, on the very values the kernel saw
(fp16/bf16 inputs are upcast, not regenerated), plus a few naive per-pair loops that
check the references themselves.

Environment knobs (all optional):
  MAXSIM_TEST_REPO=<path>   load the kernel from another repo root (a build/ in it)
  MAXSIM_TEST_NO_BUILD=1    do not run tools/build.py; use what build/ holds
  MAXSIM_TEST_SEED=<int>    mixed into every test's seed, to draw other inputs
  MAXSIM_TEST_BACKENDS=cuda[,cpu,...]  run the `device` tests on these backends only (the GPU
                            machine's suite leaves the CPU ones to CI: `cli.py suite --gpu-only`)
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNEL_REPO = Path(os.environ.get("MAXSIM_TEST_REPO", REPO_ROOT)).resolve()
NO_BUILD = os.environ.get("MAXSIM_TEST_NO_BUILD") == "1" or "MAXSIM_TEST_REPO" in os.environ

# Every public name the loaded module must expose (written out, not read from __all__).
PUBLIC_NAMES = [
    f"{fn}{form}"
    for fn in ("score_candidates_padded", "score_contrastive", "score_contrastive_padded",
               "score_pairs_packed")
    for form in ("", "_with_argmax", "_train", "_reference", "_with_argmax_reference",
                 "_backward_reference")
] + ["maxsim_reference"]

SURFACES = ("padded", "contrastive", "contrastive_padded", "packed")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


def _load_source_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# The references, straight from the source tree (they import nothing but torch).
REF = _load_source_module("maxsim_reference_src", REPO_ROOT / "torch-ext" / "maxsim" / "_reference.py")
BUILD_TOOL = _load_source_module("maxsim_build_tool", REPO_ROOT / "tools" / "build.py")


def _cuda_wanted() -> bool:
    if not torch.cuda.is_available():
        return False
    if NO_BUILD:
        return any((KERNEL_REPO / "build").glob("torch*-cxx11-cu*-linux"))
    backends = BUILD_TOOL.load_config()["general"]["backends"]
    return "cuda" in backends and BUILD_TOOL.find_nvcc() is not None


def _mps_wanted() -> bool:
    """On a Mac with an Apple GPU the Metal variant is built and every device test runs on
    `mps` too (no Mac here: on Linux the Metal kernels run through tests/metal_emulator.py)."""
    if sys.platform != "darwin" or not torch.backends.mps.is_available():
        return False
    if NO_BUILD:
        return any((KERNEL_REPO / "build").glob("torch*-metal-*-darwin"))
    return "metal" in BUILD_TOOL.load_config()["general"]["backends"]


# Device types the suite runs on; the kernel variant of each is KERNEL_BACKEND's.
BACKENDS = ["cpu"] + (["cuda"] if _cuda_wanted() else []) + (["mps"] if _mps_wanted() else [])
if os.environ.get("MAXSIM_TEST_BACKENDS"):
    _only = os.environ["MAXSIM_TEST_BACKENDS"].split(",")
    if not set(_only) <= set(BACKENDS):
        raise pytest.UsageError(f"MAXSIM_TEST_BACKENDS={','.join(_only)}: only {', '.join(BACKENDS)} "
                                "are built and available here")
    BACKENDS = [b for b in BACKENDS if b in _only]
KERNEL_BACKEND = {"cpu": "cpu", "cuda": "cuda", "mps": "metal"}


# ---- build + load ---------------------------------------------------------------------------

@functools.cache
def load_kernel(device_type: str):
    """Build (unless told not to) and load the kernel for `device_type`, once per session."""
    import kernels

    backend = KERNEL_BACKEND[device_type]
    if not NO_BUILD:
        result = subprocess.run(
            [sys.executable, str(REPO_ROOT / "tools" / "build.py"), "--backend", backend],
            cwd=REPO_ROOT, capture_output=True, text=True,
        )
        if result.returncode != 0:
            pytest.fail(f"tools/build.py --backend {backend} failed:\n{result.stdout}{result.stderr}",
                        pytrace=False)
    return kernels.get_local_kernel(KERNEL_REPO, backend=backend)


class Target(NamedTuple):
    ms: object  # the loaded kernel module
    device: torch.device


@pytest.fixture(scope="session", params=BACKENDS)
def device(request) -> Target:
    """(loaded module, torch.device) for every built backend."""
    return Target(load_kernel(request.param), torch.device(request.param))


def skip_float64_unsupported(device: torch.device, dtype: torch.dtype) -> None:
    if dtype == torch.float64 and device.type not in ("cpu", "cuda"):
        pytest.skip("float64 runs on the CPU and CUDA backends only")


@pytest.fixture(scope="session")
def cpu_kernel():
    return load_kernel("cpu")


# ---- randomness -----------------------------------------------------------------------------

def seed_for(text: str) -> int:
    return zlib.crc32(f"{text}|{os.environ.get('MAXSIM_TEST_SEED', '')}".encode())


@pytest.fixture
def rng(request) -> torch.Generator:
    """A CPU generator seeded from the test's id: fresh inputs per test, reproducible runs."""
    return torch.Generator().manual_seed(seed_for(request.node.nodeid))


def unit(gen, *shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """Random L2-normalised rows (never zero), drawn on the CPU in float64, then cast."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    if shape[-1] > 0:
        x = x / x.norm(dim=-1, keepdim=True)
    return x.to(dtype).to(device)


def lattice(gen, *shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """Rows of multiples of 1/4 in [-3/4, 3/4], none all-zero: every dot product and every
    score is exact in any precision and any summation order, so results must be bitwise equal
    to the reference, and ties (plentiful) must resolve exactly."""
    x = torch.randint(-3, 4, shape, generator=gen).to(torch.float64) / 4
    if shape[-1] > 0 and x.numel() > 0:
        zero_rows = (x == 0).all(dim=-1)
        x[..., 0] = torch.where(zero_rows, torch.full_like(x[..., 0], 0.5), x[..., 0])
    return x.to(dtype).to(device)


def ids(values, dtype=torch.int64, device="cpu") -> torch.Tensor:
    """An index tensor (lengths, offsets, pair ids)."""
    return torch.as_tensor(values, dtype=dtype, device=device)


def kernel_names(fn):
    """fn()'s result and the names of the CUDA kernels it launched (the profiler elides the
    template arguments of long names)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, {e.key for e in prof.key_averages()}


def rand_lengths(gen, shape, upper: int, *, full_first=True) -> torch.Tensor:
    """Lengths in [0, upper]; the first is `upper` so the padded extent is always exercised."""
    n = torch.randint(0, upper + 1, shape, generator=gen)
    if full_first and n.numel() > 0:
        n.view(-1)[0] = upper
    return n


POISON = 100.0  # scale of the garbage written into padding: it would win any max it entered


# ---- cases: one object per call of a public surface ----------------------------------------

def _replace_tensors(obj, fn):
    changes = {f.name: fn(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)
               if isinstance(getattr(obj, f.name), torch.Tensor)}
    return dataclasses.replace(obj, **changes)


def off_sixteen_bytes(t: torch.Tensor, elements: int) -> torch.Tensor:
    """t's values, contiguous, in fresh storage that starts `elements` elements past an
    allocation (which torch aligns to at least 16 bytes)."""
    flat = torch.empty(t.numel() + elements, dtype=t.dtype, device=t.device)
    out = flat[elements:].view(t.shape)
    out.copy_(t)
    return out


def flat_rows(t: torch.Tensor) -> torch.Tensor:
    """[..., D] -> [rows, D] (also when D == 0)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


class Case:
    """Inputs of one call to a surface plus everything needed to check its outputs.

    `segments()` lists, per output pair in output order, (query row start, query length,
    document row start, document length) in the flattened queries / documents: the design's
    policy table, written independently of the reference implementation.
    """

    fn: str

    # -- calling
    def call(self, ms, form: str = ""):
        return getattr(ms, self.fn + form)(*self.args(), **self.kwargs())

    def kwargs(self) -> dict:
        return {}

    def with_qd(self, queries, documents):
        return dataclasses.replace(self, queries=queries, documents=documents)

    def to(self, device):
        return _replace_tensors(self, lambda _n, t: t.to(device))

    def as_float64_cpu(self):
        return _replace_tensors(
            self, lambda n, t: t.cpu().double() if n in ("queries", "documents") else t.cpu())

    # -- expectations (float64, CPU)
    def reference(self):
        c = self.as_float64_cpu()
        return getattr(REF, self.fn + "_with_argmax_reference")(*c.args(), **c.ref_kwargs())

    def ref_kwargs(self) -> dict:
        return self.kwargs()

    @property
    def dim(self) -> int:
        return self.queries.shape[-1]

    def flat(self):
        return flat_rows(self.queries), flat_rows(self.documents)

    def valid_query_counts(self) -> torch.Tensor:
        """Number of query tokens that count, per score (scales the score tolerance)."""
        qlen = torch.tensor([s[1] for s in self.segments()], dtype=torch.float64)
        return qlen.reshape(self.score_shape)

    def used_rows(self):
        """Bool masks over flattened query / document rows that some pair reads."""
        nq, nd = flat_rows(self.queries).shape[0], flat_rows(self.documents).shape[0]
        q_used, d_used = torch.zeros(nq, dtype=torch.bool), torch.zeros(nd, dtype=torch.bool)
        for qs, ql, ds, dl in self.segments():
            if dl > 0:
                q_used[qs:qs + ql] = True
            if ql > 0:
                d_used[ds:ds + dl] = True
        return q_used, d_used

    def naive_scores(self, queries, documents) -> torch.Tensor:
        """Per-pair loop with torch.max: differentiable, independent of the reference."""
        qf, df = flat_rows(queries), flat_rows(documents)
        out = []
        for qs, ql, ds, dl in self.segments():
            if ql <= 0:
                out.append(qf.new_zeros(()))
            elif dl <= 0:
                out.append(qf.new_full((), float("-inf")))
            else:
                out.append((qf[qs:qs + ql] @ df[ds:ds + dl].T).max(dim=1).values.sum())
        return torch.stack(out).reshape(self.score_shape) if out else qf.new_zeros(self.score_shape)

    def pair_sims(self):
        """Per pair: the float64 similarity matrix [qlen, dlen] of the values the kernel saw."""
        c = self.as_float64_cpu()
        qf, df = c.flat()
        for qs, ql, ds, dl in self.segments():
            yield exact_order_sims(qf[qs:qs + ql], df[ds:ds + dl])


@dataclasses.dataclass
class Padded(Case):
    queries: torch.Tensor
    documents: torch.Tensor
    query_lengths: torch.Tensor
    doc_lengths: torch.Tensor
    fn = "score_candidates_padded"

    def args(self):
        return self.queries, self.documents, self.query_lengths, self.doc_lengths

    @property
    def score_shape(self):
        return tuple(self.doc_lengths.shape)

    @property
    def argmax_width(self):
        return self.queries.shape[1]

    def segments(self):
        b, lq = self.queries.shape[:2]
        c, ld = self.documents.shape[1:3]
        ql = self.query_lengths.clamp(0, lq).tolist()
        dl = self.doc_lengths.clamp(0, ld).tolist()
        return [(i * lq, ql[i], (i * c + j) * ld, dl[i][j]) for i in range(b) for j in range(c)]

    def backward_reference(self, grad, argmax, queries=None, documents=None):
        c = self.as_float64_cpu()
        q = c.queries if queries is None else queries
        d = c.documents if documents is None else documents
        return REF.score_candidates_padded_backward_reference(
            grad, q, d, c.query_lengths, c.doc_lengths, argmax.cpu())


class _EveryQueryEveryDocument(Case):
    """Contrastive cases: query q against document n is score [q, n]; query_lengths optional."""

    query_lengths: torch.Tensor | None

    def kwargs(self):
        return {} if self.query_lengths is None else {"query_lengths": self.query_lengths}

    def ref_kwargs(self):
        return {"query_lengths": self.query_lengths}

    @property
    def argmax_width(self):
        return self.queries.shape[1]

    def segments(self):
        nq, lq = self.queries.shape[:2]
        ql = [lq] * nq if self.query_lengths is None else self.query_lengths.clamp(0, lq).tolist()
        return [(i * lq, ql[i], start, length)
                for i in range(nq) for start, length in self.document_rows()]


@dataclasses.dataclass
class Contrastive(_EveryQueryEveryDocument):
    queries: torch.Tensor
    documents: torch.Tensor
    document_offsets: torch.Tensor
    query_lengths: torch.Tensor | None = None
    fn = "score_contrastive"

    def args(self):
        return self.queries, self.documents, self.document_offsets

    @property
    def score_shape(self):
        return (self.queries.shape[0], self.document_offsets.shape[0] - 1)

    def document_rows(self):
        off = self.document_offsets.tolist()
        return [(off[n], off[n + 1] - off[n]) for n in range(len(off) - 1)]

    def backward_reference(self, grad, argmax, queries=None, documents=None):
        c = self.as_float64_cpu()
        q = c.queries if queries is None else queries
        d = c.documents if documents is None else documents
        return REF.score_contrastive_backward_reference(
            grad, q, d, c.document_offsets, argmax.cpu(), c.query_lengths)


@dataclasses.dataclass
class ContrastivePadded(_EveryQueryEveryDocument):
    queries: torch.Tensor
    documents: torch.Tensor  # [Nb, Ld, D]
    document_lengths: torch.Tensor
    query_lengths: torch.Tensor | None = None
    fn = "score_contrastive_padded"

    def args(self):
        return self.queries, self.documents, self.document_lengths

    @property
    def score_shape(self):
        return (self.queries.shape[0], self.documents.shape[0])

    def document_rows(self):
        ld = self.documents.shape[1]
        lengths = self.document_lengths.clamp(0, ld).tolist()
        return [(n * ld, length) for n, length in enumerate(lengths)]

    def backward_reference(self, grad, argmax, queries=None, documents=None):
        c = self.as_float64_cpu()
        q = c.queries if queries is None else queries
        d = c.documents if documents is None else documents
        return REF.score_contrastive_padded_backward_reference(
            grad, q, d, c.document_lengths, argmax.cpu(), c.query_lengths)


@dataclasses.dataclass
class Packed(Case):
    queries: torch.Tensor
    query_offsets: torch.Tensor
    documents: torch.Tensor
    document_offsets: torch.Tensor
    pair_query_ids: torch.Tensor
    pair_document_ids: torch.Tensor
    max_q_len: int | None = None
    fn = "score_pairs_packed"

    def args(self):
        return (self.queries, self.query_offsets, self.documents, self.document_offsets,
                self.pair_query_ids, self.pair_document_ids)

    def kwargs(self):
        return {} if self.max_q_len is None else {"max_q_len": self.max_q_len}

    @property
    def score_shape(self):
        return (self.pair_query_ids.shape[0],)

    @property
    def argmax_width(self):
        if self.max_q_len is not None:
            return self.max_q_len
        lens = self.query_offsets[1:] - self.query_offsets[:-1]
        return int(lens.max()) if lens.numel() else 0

    def segments(self):
        qo, do = self.query_offsets.tolist(), self.document_offsets.tolist()
        return [(qo[q], qo[q + 1] - qo[q], do[d], do[d + 1] - do[d])
                for q, d in zip(self.pair_query_ids.tolist(), self.pair_document_ids.tolist())]

    def backward_reference(self, grad, argmax, queries=None, documents=None):
        c = self.as_float64_cpu()
        q = c.queries if queries is None else queries
        d = c.documents if documents is None else documents
        return REF.score_pairs_packed_backward_reference(
            grad, q, c.query_offsets, d, c.document_offsets, c.pair_query_ids,
            c.pair_document_ids, argmax.cpu())


# ---- builders ---------------------------------------------------------------------------------

def _offsets(lengths) -> torch.Tensor:
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])


def make_padded(gen, B, C, Lq, Ld, D, *, dtype=torch.float32, device="cpu",
                index_dtype=torch.int64, q_lens=None, d_lens=None, values=unit) -> Padded:
    """Random padded case; padding rows hold large garbage that would change any result."""
    q_lens = rand_lengths(gen, (B,), Lq) if q_lens is None else torch.as_tensor(q_lens)
    d_lens = rand_lengths(gen, (B, C), Ld) if d_lens is None else torch.as_tensor(d_lens)
    q = values(gen, B, Lq, D, dtype=torch.float64)
    d = values(gen, B, C, Ld, D, dtype=torch.float64)
    q_pad = torch.arange(Lq) >= q_lens.clamp(0, Lq)[:, None]
    d_pad = torch.arange(Ld) >= d_lens.clamp(0, Ld)[..., None]
    q[q_pad] = POISON * unit(gen, int(q_pad.sum()), D, dtype=torch.float64)
    d[d_pad] = POISON * unit(gen, int(d_pad.sum()), D, dtype=torch.float64)
    return Padded(q.to(dtype).to(device), d.to(dtype).to(device),
                  ids(q_lens, index_dtype, device), ids(d_lens, index_dtype, device))


def make_contrastive(gen, Nq, Lq, d_lens, D, *, dtype=torch.float32, device="cpu",
                     index_dtype=torch.int64, q_lens="random", values=unit) -> Contrastive:
    """Nq padded queries against packed documents of the given lengths. q_lens: None (no
    query_lengths argument), "random", or explicit lengths."""
    d_lens = torch.as_tensor(d_lens, dtype=torch.int64)
    q = values(gen, Nq, Lq, D, dtype=torch.float64)
    if isinstance(q_lens, str):
        q_lens = rand_lengths(gen, (Nq,), Lq)
    if q_lens is not None:
        q_lens = torch.as_tensor(q_lens)
        q_pad = torch.arange(Lq) >= q_lens.clamp(0, Lq)[:, None]
        q[q_pad] = POISON * unit(gen, int(q_pad.sum()), D, dtype=torch.float64)
        q_lens = ids(q_lens, index_dtype, device)
    d = values(gen, int(d_lens.sum()), D, dtype=dtype, device=device)
    return Contrastive(q.to(dtype).to(device), d, ids(_offsets(d_lens), index_dtype, device), q_lens)


def make_packed(gen, q_lens, d_lens, D, *, pairs=None, n_pairs=None, dtype=torch.float32,
                device="cpu", index_dtype=torch.int64, max_q_len=None, values=unit) -> Packed:
    """Packed queries / documents of the given lengths and a pair list: explicit (qid, did)
    tuples, or n_pairs random ones (repeats included), or by default every (q, d) pair."""
    nq, nd = len(q_lens), len(d_lens)
    if pairs is None and n_pairs is not None:
        pairs = list(zip(torch.randint(0, max(nq, 1), (n_pairs,), generator=gen).tolist(),
                         torch.randint(0, max(nd, 1), (n_pairs,), generator=gen).tolist()))
    elif pairs is None:
        pairs = [(i, j) for i in range(nq) for j in range(nd)]
    pq = [p[0] for p in pairs]
    pd = [p[1] for p in pairs]
    return Packed(
        values(gen, int(sum(q_lens)), D, dtype=dtype, device=device),
        ids(_offsets(q_lens), index_dtype, device),
        values(gen, int(sum(d_lens)), D, dtype=dtype, device=device),
        ids(_offsets(d_lens), index_dtype, device),
        ids(pq, index_dtype, device), ids(pd, index_dtype, device), max_q_len)


def document_views(case: Case) -> list[tuple[torch.Tensor, int]]:
    """(a view of each document's rows, its length), every document of a case in order: the
    tensor itself, so a test can write ties or NaN into chosen rows."""
    if isinstance(case, Padded):
        return [(case.documents[b, c], int(case.doc_lengths[b, c]))
                for b in range(case.documents.shape[0]) for c in range(case.documents.shape[1])]
    off = case.document_offsets.tolist()
    return [(case.documents[off[k]:off[k + 1]], off[k + 1] - off[k]) for k in range(len(off) - 1)]


def as_padded_documents(case: Case) -> Case:
    """A contrastive case handed over with padded documents [Nb, max length, D]: the same
    tokens, the padding full of garbage that would change any result it entered. Other cases
    are returned as they are, so tests can write `as_padded_documents(make_contrastive(...))`
    for the contrastive_padded surface."""
    if not isinstance(case, Contrastive):
        return case
    offsets = case.document_offsets.cpu().tolist()
    lengths = [e - s for s, e in zip(offsets[:-1], offsets[1:])]
    width = max(lengths, default=0)
    gen = torch.Generator().manual_seed(len(offsets) * 131 + width)
    docs = POISON * unit(gen, len(lengths), width, case.dim)
    docs = docs.to(case.documents.dtype).to(case.documents.device)
    for n, (s, length) in enumerate(zip(offsets[:-1], lengths)):
        docs[n, :length] = case.documents[s:s + length]
    return ContrastivePadded(case.queries, docs,
                             ids(lengths, case.document_offsets.dtype, case.queries.device),
                             case.query_lengths)


def make_case(surface, gen, *, n=3, Lq=9, Ld=13, D=16, **kw) -> Case:
    """A small ragged case of any surface with about n queries and n documents each."""
    if surface == "padded":
        return make_padded(gen, n, n, Lq, Ld, D, **kw)
    if surface in ("contrastive", "contrastive_padded"):
        case = make_contrastive(gen, n, Lq, rand_lengths(gen, (n,), Ld), D, **kw)
        return as_padded_documents(case) if surface == "contrastive_padded" else case
    if surface == "packed":
        return make_packed(gen, rand_lengths(gen, (n,), Lq).tolist(),
                           rand_lengths(gen, (n + 1,), Ld).tolist(), D, n_pairs=2 * n + 1, **kw)
    raise ValueError(surface)


def padded_as_packed(case: Padded) -> Packed:
    """The same tokens handed over packed: query b, document b*C+c, pair b*C+c."""
    b, c = case.doc_lengths.shape
    dev, idx = case.queries.device, case.query_lengths.dtype
    q_rows = [case.queries[i, :int(case.query_lengths[i])] for i in range(b)]
    d_rows = [case.documents[i, j, :int(case.doc_lengths[i, j])] for i in range(b) for j in range(c)]
    dim = case.dim
    cat = lambda rows: torch.cat(rows) if rows else case.queries.new_zeros(0, dim)  # noqa: E731
    return Packed(cat(q_rows), ids(_offsets([len(r) for r in q_rows]), idx, dev),
                  cat(d_rows), ids(_offsets([len(r) for r in d_rows]), idx, dev),
                  ids([i for i in range(b) for _ in range(c)], idx, dev),
                  ids(list(range(b * c)), idx, dev), max_q_len=case.queries.shape[1])


# ---- tolerances and checks ------------------------------------------------------------------

def score_dtype(dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# Relative error allowed per unit of |score| and per valid query token (tokens are unit
# vectors, so |max_j <q_i, d_j>| <= ~1). fp16/bf16 products are exact in fp32, so their
# scores are as good as fp32 ones; the looser bound leaves room for tensor-core accumulation.
SCORE_RTOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-4}


def _eq_special(actual: torch.Tensor, expected: torch.Tensor, what: str) -> torch.Tensor:
    """Asserts NaN / +-inf agree exactly; returns the mask of finite expected entries."""
    nan_a, nan_e = torch.isnan(actual), torch.isnan(expected)
    assert torch.equal(nan_a, nan_e), (
        f"{what}: NaN at {nan_a.nonzero().tolist()[:8]} but expected at {nan_e.nonzero().tolist()[:8]}")
    inf_e = torch.isinf(expected)
    assert torch.equal(torch.isinf(actual), inf_e) and torch.equal(actual[inf_e], expected[inf_e]), (
        f"{what}: infinities differ:\nactual {actual[inf_e | torch.isinf(actual)]}\n"
        f"expected {expected[inf_e | torch.isinf(actual)]}")
    return ~(nan_e | inf_e)


def assert_scores(scores: torch.Tensor, case: Case, expected=None, *, input_dtype=None, exact=False):
    """Checks dtype, shape, device and values of `scores` against the float64 reference."""
    input_dtype = input_dtype or case.queries.dtype
    expected = case.reference()[0] if expected is None else expected
    assert scores.dtype == score_dtype(input_dtype), scores.dtype
    assert tuple(scores.shape) == tuple(case.score_shape), (tuple(scores.shape), case.score_shape)
    assert scores.device == case.queries.device
    actual = scores.detach().cpu().double()
    expected = expected.cpu().double()
    finite = _eq_special(actual, expected, "scores")
    if exact:
        assert torch.equal(actual[finite], expected[finite]), (actual - expected).abs().max()
        return
    rtol = SCORE_RTOL[input_dtype]
    tol = rtol * (expected.abs() + case.valid_query_counts() + 1)
    err = (actual - expected).abs()
    bad = finite & (err > tol)
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.numel()} scores off; worst at {bad.nonzero()[0].tolist()}: "
        f"got {actual[bad][0].item()!r}, expected {expected[bad][0].item()!r} (tol {tol[bad][0].item():.3g})")


def argmax_margin(dtype, dim: int) -> float:
    """How far float32 (or float64) similarities of unit vectors may sit from exact."""
    eps = torch.finfo(score_dtype(dtype)).eps
    return 4 * eps * max(dim, 1) + (1e-12 if dtype == torch.float64 else 1e-7)


def assert_argmax(argmax: torch.Tensor, case: Case, *, exact=False):
    """Checks an argmax tensor [..., W] against the float64 similarities of every pair.

    Positions past the query length or against an empty document are -1. Elsewhere:
    a row containing NaN points at its first NaN; a row whose best similarity beats the
    runner-up by more than the rounding margin (or any row when `exact`) points at the lowest
    index reaching the max; any other row points at some j whose similarity equals the max
    within that margin.
    """
    width = case.argmax_width
    assert argmax.dtype == torch.int32, argmax.dtype
    assert tuple(argmax.shape) == tuple(case.score_shape) + (width,), (tuple(argmax.shape), width)
    assert argmax.device == case.queries.device
    a = argmax.cpu().reshape(math.prod(case.score_shape), width).to(torch.int64)
    margin = argmax_margin(case.queries.dtype, case.dim)
    for p, ((_qs, ql, _ds, dl), sims) in enumerate(zip(case.segments(), case.pair_sims())):
        row = a[p]
        n = ql if dl > 0 else 0
        assert (row[n:] == -1).all(), f"pair {p}: expected -1 past {n}, got {row[n:].tolist()}"
        if n == 0:
            continue
        got = row[:n]
        assert ((got >= 0) & (got < dl)).all(), f"pair {p}: argmax {got.tolist()} outside [0, {dl})"
        expected = lowest_argmax(sims)
        best = sims.gather(1, expected[:, None]).squeeze(1)
        nan_rows = torch.isnan(sims).any(dim=1)
        if exact:
            strict = torch.ones_like(nan_rows)
        else:
            runner_up = sims.masked_fill(torch.arange(dl) == expected[:, None], float("-inf"))
            gap = best - runner_up.max(dim=1).values if dl > 1 else torch.full_like(best, float("inf"))
            strict = nan_rows | ~(gap <= margin)  # NaN gaps (inf - inf) count as strict
        mismatch = strict & (got != expected)
        assert not mismatch.any(), (
            f"pair {p}: argmax {got[mismatch].tolist()} != expected {expected[mismatch].tolist()} "
            f"at query rows {mismatch.nonzero().flatten().tolist()}")
        got_vals = sims.gather(1, got[:, None]).squeeze(1)
        loose = ~strict
        assert (got_vals[loose] >= best[loose] - margin).all(), f"pair {p}: argmax not a max"


def exact_order_sims(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """q [M, D] x d [N, D] -> [M, N], every entry reduced the same way, so that identical
    document tokens give bit-identical similarities (a BLAS matmul does not promise that)."""
    out = q.new_empty(q.shape[0], d.shape[0])
    step = max(1, (1 << 22) // max(d.numel(), 1))
    for i in range(0, q.shape[0], step):
        out[i:i + step] = (q[i:i + step, None, :] * d[None, :, :]).sum(dim=-1)
    return out


def lowest_argmax(sims: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax by the design's rule: the first NaN if any, else the lowest j with the
    max (computed without relying on torch.max's tie-breaking)."""
    j = torch.arange(sims.shape[1]).expand_as(sims)
    big = torch.full_like(j, sims.shape[1])
    nan = torch.isnan(sims)
    first_nan = torch.where(nan, j, big).min(dim=1).values
    best = torch.where(nan, float("-inf"), sims).max(dim=1, keepdim=True).values
    first_best = torch.where(sims == best, j, big).min(dim=1).values
    return torch.where(nan.any(dim=1), first_nan, first_best)


def assert_grads(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, dtype):
    """Gradient check with a per-element bound: `bound` is the same gradient computed on
    absolute values (the sum of |terms|), which is what accumulation error scales with; the
    output's own rounding adds one ulp of its dtype."""
    assert actual.dtype == dtype, actual.dtype
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    actual, expected, bound = (t.detach().cpu().double() for t in (actual, expected, bound))
    acc_rtol = 1e-12 if dtype == torch.float64 else 2e-5
    info = torch.finfo(dtype)
    out_rtol = info.eps if dtype != torch.float64 else 0.0
    # + the spacing of subnormals (fp16 gradients of 1e-5 are subnormal)
    tol = acc_rtol * bound + out_rtol * expected.abs() + info.tiny * info.eps
    err = (actual - expected).abs()
    bad = err > tol
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.numel()} gradient entries off; worst {err.max().item():.3g} "
        f"at {bad.nonzero()[0].tolist()}: got {actual[bad][0].item()!r}, "
        f"expected {expected[bad][0].item()!r}")


def expected_grads(case: Case, grad_scores: torch.Tensor, argmax: torch.Tensor):
    """(grad_q, grad_d, bound_q, bound_d) in float64 from the backward reference, given the
    argmax the kernel chose (so that near-ties cannot make the comparison ambiguous)."""
    g = grad_scores.detach().cpu().double()
    c = case.as_float64_cpu()
    gq, gd = case.backward_reference(g, argmax)
    bq, bd = case.backward_reference(g.abs(), argmax, c.queries.abs(), c.documents.abs())
    return gq, gd, bq, bd


def run_train(ms, case: Case, grad_scores: torch.Tensor, *, need_q=True, need_d=True):
    """Forward + backward of sum(grad_scores * scores) through the `_train` form."""
    q = case.queries.detach().clone().requires_grad_(need_q)
    d = case.documents.detach().clone().requires_grad_(need_d)
    scores = case.with_qd(q, d).call(ms, "_train")
    scores.backward(grad_scores.to(scores.dtype))
    return scores, q.grad, d.grad


def poison_allocator(device, nbytes=1 << 22):
    """Leaves freed, NaN-filled memory behind so that outputs a kernel forgets to write show
    up as NaN / garbage (the CUDA caching allocator reuses blocks; glibc often does too)."""
    for size in (nbytes, nbytes // 16, 4096, 256):
        t = torch.full((max(size // 4, 1),), float("nan"), device=device)
        del t


def rounded_as_the_kernels_see_it(x, precision):
    """(copy, k): what "medium" / "high" score instead of float32 x. "medium": the bfloat16
    rounding, k = 0. "high": the float16 rounding of x * 2^k, k = 14 when x's largest finite
    magnitude lies in [2^-9, 2), else the k that brings it into [2^14, 2^15) (round_inputs.cu),
    written here from the rule, not from the kernel."""
    if precision == "medium":
        return x.bfloat16(), 0
    finite = x[x.isfinite()].abs()
    amax = float(finite.max()) if finite.numel() else 0.0
    e = math.frexp(amax)[1] - 1 if amax > 0 else 0
    k = 14 if amax == 0 or -9 <= e <= 0 else 14 - e
    return (x.double() * 2.0 ** k).half(), k
