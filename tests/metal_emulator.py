"""The Metal kernels (maxsim_metal/*.metal) run on the Linux emulator (tools/metal_emu/),
called through its C ABI on CPU tensors.

`EmulatedMaxsim` exposes the public entry points' `""`, `_with_argmax` and `_train` forms
with the package's signatures, so the suite's Case objects (conftest.py) can call it like
the loaded kernel; `backward()` runs the two gradient kernels (and `_train`'s autograd
backward goes through it). Compressed documents take what decodes them through the
package's keywords: int8 / float8 e4m3fn values their per-row float32 scales
(`document_scales=`), ColBERTv2 residuals (uint8 packed bucket ids) `document_codes=` and
`residual_codec=` (anything with centroids, bucket_weights, nbits and normalize); they get
grad_queries only. Every call runs the kernel in each of `RunConfig.runs` (thread order, poison pattern, seed) and requires bitwise
identical outputs across them.

The library flavour: "asan" when AddressSanitizer is preloaded (LD_PRELOAD, as
.ci/metal.sh does), else "plain"; MAXSIM_METAL_EMU=plain|asan overrides.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.util
import os
import shutil
import types
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
SURFACE_IDS = {"padded": 0, "contrastive": 1, "packed": 2, "contrastive_padded": 3}
DTYPE_IDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# maxsim_metal::DocFormat: documents of the queries' dtype, compressed with per-row scales, or
# residuals (uint8)
DOC_FORMAT_IDS = {torch.int8: 1, torch.float8_e4m3fn: 2, torch.uint8: 3}
STORAGE_KEYWORDS = ("document_scales", "document_codes", "residual_codec")
FORWARD, REVERSE, RANDOM = 0, 1, 2
POISON_A, POISON_B = 0x7FC0DEAD, 0x12345678  # a NaN pattern and a small positive float


def _build_tool():
    spec = importlib.util.spec_from_file_location(
        "metal_emu_build", REPO_ROOT / "tools" / "metal_emu" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flavour() -> str:
    forced = os.environ.get("MAXSIM_METAL_EMU")
    if forced:
        return forced
    return "asan" if "libasan" in os.environ.get("LD_PRELOAD", "") else "plain"


@functools.cache
def build(kind: str, kernel_dir: str | None = None) -> Path:
    tool = _build_tool()
    src = Path(kernel_dir) if kernel_dir else REPO_ROOT / "maxsim_metal"
    out = REPO_ROOT / "build" / "metal_emu" / (kind if kernel_dir is None else f"{kind}-{src.name}")
    return tool.build(kind, src.resolve(), out)


class EmuIndex(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("numel", ctypes.c_int64), ("is64", ctypes.c_int),
                ("present", ctypes.c_int)]


class EmuResidual(ctypes.Structure):
    _fields_ = [("codes", EmuIndex), ("centroids", ctypes.c_void_p), ("n_centroids", ctypes.c_int64),
                ("centroid_dtype", ctypes.c_int), ("bucket_weights", ctypes.c_void_p),
                ("weight_dtype", ctypes.c_int), ("nbits", ctypes.c_int), ("normalize", ctypes.c_int)]


class EmuOptions(ctypes.Structure):
    _fields_ = [("order", ctypes.c_int), ("seed", ctypes.c_uint64), ("poison", ctypes.c_uint32),
                ("real_threads", ctypes.c_int)]


@functools.cache
def library(path: str):
    lib = ctypes.CDLL(path)
    lib.emu_forward.restype = ctypes.c_int
    lib.emu_backward.restype = ctypes.c_int
    return lib


class EmulatorError(RuntimeError):
    """The emulator reported a barrier / divergence / binding problem."""


@dataclasses.dataclass
class RunConfig:
    # (order, poison, seed) per run; outputs must agree bit for bit across runs
    runs: tuple = ((FORWARD, POISON_A, 0), (REVERSE, POISON_B, 0), (RANDOM, POISON_A, 1))
    real_threads: bool = False


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.float32, torch.int32):
        return t.view(torch.int32)
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16)
    return t


class EmulatedMaxsim:
    def __init__(self, lib_path: Path | None = None, config: RunConfig | None = None):
        self.lib = library(str(lib_path or build(flavour())))
        self.config = config or RunConfig()
        self.runs_done = 0  # kernel executions, for the report

    # ---- plumbing
    def _index(self, t, keep):
        if t is None:
            return EmuIndex(None, 0, 0, 0)
        t = t.contiguous()
        keep.append(t)
        return EmuIndex(t.data_ptr(), t.numel(), int(t.dtype == torch.int64), 1)

    def _repeat(self, call):
        """call(options) -> tuple of output tensors; runs every configured order/poison."""
        first = None
        for order, poison, seed in self.config.runs:
            opts = EmuOptions(order, seed, poison, int(self.config.real_threads))
            out = call(opts)
            self.runs_done += 1
            if first is None:
                first = out
                continue
            for a, b in zip(first, out):
                if not torch.equal(_bits(a), _bits(b)):
                    raise AssertionError(
                        f"result depends on thread order / poison (order {order}, poison {poison:#x})")
        return first

    def _check(self, rc, err):
        if rc != 0:
            raise EmulatorError(err.value.decode())

    def _documents(self, documents, storage, keep):
        """(doc_format, documents, scales pointer, scales numel, residual pointer) as the C
        ABI takes them, from the storage keywords."""
        unknown = set(storage) - set(STORAGE_KEYWORDS)
        if unknown:
            raise TypeError(f"unexpected keywords {sorted(unknown)}")
        document_scales = storage.get("document_scales")
        codes, codec = storage.get("document_codes"), storage.get("residual_codec")
        fmt = DOC_FORMAT_IDS.get(documents.dtype, 0)
        d = documents.contiguous()
        keep.append(d)
        if fmt == 3:
            if codes is None or codec is None or document_scales is not None:
                raise ValueError("residual documents need document_codes and residual_codec, and no scales")
            cents, weights = codec.centroids.contiguous(), codec.bucket_weights.contiguous()
            keep += [cents, weights]
            res = EmuResidual(self._index(codes.reshape(-1), keep), cents.data_ptr(), cents.shape[0],
                              DTYPE_IDS[cents.dtype], weights.data_ptr(), DTYPE_IDS[weights.dtype],
                              codec.nbits, int(codec.normalize))
            keep.append(res)
            return fmt, d, None, 0, ctypes.byref(res)
        if codes is not None or codec is not None:
            raise ValueError("document_codes / residual_codec are for uint8 (residual) documents")
        if (fmt != 0) != (document_scales is not None):
            raise ValueError("int8 / float8 documents need document_scales, float ones take none")
        if document_scales is None:
            return 0, d, None, 0, None
        if document_scales.dtype != torch.float32:
            raise ValueError("document_scales must be float32")
        sc = document_scales.contiguous()
        keep.append(sc)
        return fmt, d, ctypes.c_void_p(sc.data_ptr()), sc.numel(), None

    def forward(self, surface, queries, documents, indices, sizes, width, with_argmax, **storage):
        dtype = DTYPE_IDS[queries.dtype]
        if surface == "padded":
            num_pairs = sizes[0] * sizes[1]
        elif surface == "contrastive":
            num_pairs = sizes[0] * max(indices[0].numel() - 1, 0)
        elif surface == "contrastive_padded":
            num_pairs = sizes[0] * sizes[2]
        else:
            num_pairs = indices[2].numel()
        q = queries.contiguous()
        keep = []
        fmt, d, scales, scales_numel, residual = self._documents(documents, storage, keep)
        idx = (EmuIndex * 4)(*[self._index(t, keep) for t in indices])
        sz = (ctypes.c_int64 * 4)(*(list(sizes) + [0] * (4 - len(sizes))))

        def call(opts):
            scores = torch.empty(num_pairs, dtype=torch.float32)
            argmax = torch.empty(num_pairs * width if with_argmax else 0, dtype=torch.int32)
            err = ctypes.create_string_buffer(2048)
            rc = self.lib.emu_forward(
                SURFACE_IDS[surface], dtype, fmt, sz, ctypes.c_int64(q.shape[-1]),
                ctypes.c_void_p(q.data_ptr()), ctypes.c_int64(q.numel()),
                ctypes.c_void_p(d.data_ptr()), ctypes.c_int64(d.numel()), scales,
                ctypes.c_int64(scales_numel), residual, idx, int(with_argmax),
                ctypes.c_void_p(scores.data_ptr()), ctypes.c_int64(scores.numel()),
                ctypes.c_void_p(argmax.data_ptr()), ctypes.c_int64(argmax.numel()),
                ctypes.byref(opts), err, 2048)
            self._check(rc, err)
            return scores, argmax.reshape(num_pairs, width) if with_argmax else argmax

        return self._repeat(call)

    def gradient(self, surface, to_query, queries, documents, indices, sizes, grad_scores, argmax,
                 owner_pairs=None, owner_pair_offsets=None, **storage):
        dtype = DTYPE_IDS[queries.dtype]
        q = queries.contiguous()
        g = grad_scores.contiguous().float()
        a = argmax.contiguous()
        width = a.shape[-1] if a.dim() > 0 else 0
        keep = []
        fmt, d, scales, scales_numel, residual = self._documents(documents, storage, keep)
        idx = (EmuIndex * 4)(*[self._index(t, keep) for t in indices])
        op = self._index(owner_pairs, keep)
        oo = self._index(owner_pair_offsets, keep)
        sz = (ctypes.c_int64 * 4)(*(list(sizes) + [0] * (4 - len(sizes))))
        like = q if to_query else d

        def call(opts):
            grad = torch.empty_like(like)
            err = ctypes.create_string_buffer(2048)
            rc = self.lib.emu_backward(
                SURFACE_IDS[surface], dtype, fmt, int(to_query), sz, ctypes.c_int64(q.shape[-1]),
                ctypes.c_void_p(q.data_ptr()), ctypes.c_int64(q.numel()),
                ctypes.c_void_p(d.data_ptr()), ctypes.c_int64(d.numel()), scales,
                ctypes.c_int64(scales_numel), residual,
                ctypes.c_void_p(g.data_ptr()), ctypes.c_int64(g.numel()),
                ctypes.c_void_p(a.data_ptr()), ctypes.c_int64(width), idx, op, oo,
                ctypes.c_void_p(grad.data_ptr()), ctypes.c_int64(grad.numel()),
                ctypes.byref(opts), err, 2048)
            self._check(rc, err)
            return (grad,)

        return self._repeat(call)[0]

    # ---- the public forms (signatures of torch-ext/maxsim/_api.py); **storage: the keywords
    # that say how the documents are stored (document_scales, document_codes, residual_codec)
    def _padded(self, queries, documents, query_lengths, doc_lengths, with_argmax, **storage):
        b, lq = queries.shape[:2]
        c, ld = documents.shape[1:3]
        s, a = self.forward("padded", queries, documents, [query_lengths, doc_lengths, None, None],
                            [b, c, lq, ld], lq, with_argmax, **storage)
        return s.reshape(b, c), (a.reshape(b, c, lq) if with_argmax else None)

    def _contrastive(self, queries, documents, document_offsets, query_lengths, with_argmax, **storage):
        nq, lq = queries.shape[:2]
        nb = document_offsets.numel() - 1
        s, a = self.forward("contrastive", queries, documents,
                            [document_offsets, query_lengths, None, None],
                            [nq, lq, documents.shape[0]], lq, with_argmax, **storage)
        return s.reshape(nq, nb), (a.reshape(nq, nb, lq) if with_argmax else None)

    def _contrastive_padded(self, queries, documents, document_lengths, query_lengths, with_argmax,
                            **storage):
        nq, lq = queries.shape[:2]
        nb, ld = documents.shape[:2]
        s, a = self.forward("contrastive_padded", queries, documents,
                            [document_lengths, query_lengths, None, None], [nq, lq, nb, ld], lq,
                            with_argmax, **storage)
        return s.reshape(nq, nb), (a.reshape(nq, nb, lq) if with_argmax else None)

    def _packed(self, queries, query_offsets, documents, document_offsets, pair_query_ids,
                pair_document_ids, max_q_len, with_argmax, **storage):
        if max_q_len is None:
            lens = query_offsets[1:] - query_offsets[:-1]
            max_q_len = int(lens.max()) if lens.numel() else 0
        s, a = self.forward("packed", queries, documents,
                            [query_offsets, document_offsets, pair_query_ids, pair_document_ids],
                            [queries.shape[0], documents.shape[0], max_q_len], max_q_len, with_argmax,
                            **storage)
        return s, a

    def score_candidates_padded(self, *args, **storage):
        return self._padded(*args, False, **storage)[0]

    def score_candidates_padded_with_argmax(self, *args, **storage):
        return self._padded(*args, True, **storage)

    def score_contrastive(self, queries, documents, document_offsets, query_lengths=None, **storage):
        return self._contrastive(queries, documents, document_offsets, query_lengths, False, **storage)[0]

    def score_contrastive_with_argmax(self, queries, documents, document_offsets, query_lengths=None,
                                      **storage):
        return self._contrastive(queries, documents, document_offsets, query_lengths, True, **storage)

    def score_contrastive_padded(self, queries, documents, document_lengths, query_lengths=None,
                                 **storage):
        return self._contrastive_padded(queries, documents, document_lengths, query_lengths, False,
                                        **storage)[0]

    def score_contrastive_padded_with_argmax(self, queries, documents, document_lengths,
                                             query_lengths=None, **storage):
        return self._contrastive_padded(queries, documents, document_lengths, query_lengths, True,
                                        **storage)

    def score_pairs_packed(self, *args, max_q_len=None, **storage):
        return self._packed(*args, max_q_len, False, **storage)[0]

    def score_pairs_packed_with_argmax(self, *args, max_q_len=None, **storage):
        return self._packed(*args, max_q_len, True, **storage)

    def score_centroids(self, queries, document_codes, document_offsets, centroids, *, query_lengths=None,
                        pair_query_ids=None, pair_document_ids=None):
        """PLAID's centroid-only score: the table as the package builds it (one float32
        matmul), then the kernel (centroid.metal)."""
        table = torch.matmul(centroids.float(), queries.float().transpose(1, 2)).contiguous()
        nq, nc, lq = table.shape
        keep = []
        listed = pair_query_ids is not None
        n = pair_query_ids.numel() if listed else nq * max(document_offsets.numel() - 1, 0)
        args = [self._index(t, keep) for t in (document_codes, document_offsets, query_lengths,
                                               pair_query_ids, pair_document_ids)]

        def call(opts):
            scores = torch.empty(n, dtype=torch.float32)
            err = ctypes.create_string_buffer(2048)
            rc = self.lib.emu_centroid_scores(
                ctypes.c_int64(nq), ctypes.c_int64(nc), ctypes.c_int64(lq), ctypes.c_void_p(table.data_ptr()),
                *args, ctypes.c_void_p(scores.data_ptr()), ctypes.c_int64(n), ctypes.byref(opts), err, 2048)
            self._check(rc, err)
            return (scores,)

        scores = self._repeat(call)[0]
        return scores if listed else scores.reshape(nq, -1)

    # ---- the _train forms: the forward with argmax, the gradient kernels as its backward
    def _train(self, fn, names, args, kwargs):
        """`fn`'s _train form: names are its positional parameters, kwargs its keywords."""
        def forward(queries, documents):
            swapped = {"queries": queries, "documents": documents}
            return getattr(self, fn + "_with_argmax")(
                *[swapped.get(n, a) for n, a in zip(names, args)], **kwargs)

        case = types.SimpleNamespace(fn=fn, **{"query_lengths": None, **dict(zip(names, args)), **kwargs})
        return _Train.apply(self, forward, case, case.queries, case.documents)

    @staticmethod
    def _keywords(**given):
        return {k: v for k, v in given.items() if v is not None}

    def score_candidates_padded_train(self, *args, **storage):
        return self._train("score_candidates_padded",
                           ("queries", "documents", "query_lengths", "doc_lengths"), args,
                           self._keywords(**storage))

    def score_contrastive_train(self, *args, query_lengths=None, **storage):
        return self._train("score_contrastive", ("queries", "documents", "document_offsets"), args,
                           self._keywords(query_lengths=query_lengths, **storage))

    def score_contrastive_padded_train(self, *args, query_lengths=None, **storage):
        return self._train("score_contrastive_padded", ("queries", "documents", "document_lengths"),
                           args, self._keywords(query_lengths=query_lengths, **storage))

    def score_pairs_packed_train(self, *args, max_q_len=None, **storage):
        return self._train("score_pairs_packed",
                           ("queries", "query_offsets", "documents", "document_offsets",
                            "pair_query_ids", "pair_document_ids"), args,
                           self._keywords(max_q_len=max_q_len, **storage))

    # ---- backward of a Case (conftest.py) given the forward's argmax
    def backward(self, case, grad_scores, argmax, **storage):
        """(grad_queries, grad_documents); compressed documents (storage keywords given, or
        taken from the case's attributes of those names) get no gradient: grad_documents is
        None."""
        storage = {k: v for k, v in storage.items() if v is not None}
        for k in STORAGE_KEYWORDS:
            if k not in storage and getattr(case, k, None) is not None:
                storage[k] = getattr(case, k)
        fn = case.fn
        g = grad_scores.reshape(-1)
        a = argmax.reshape(g.numel(), -1) if g.numel() else argmax.reshape(0, max(case.argmax_width, 0))
        sc = storage
        both = not storage

        def pair(grad):
            return grad(True), (grad(False) if both else None)

        if fn == "score_candidates_padded":
            b, lq = case.queries.shape[:2]
            c, ld = case.documents.shape[1:3]
            args = (case.queries, case.documents, [case.query_lengths, case.doc_lengths, None, None],
                    [b, c, lq, ld], g, a)
            return pair(lambda to_query: self.gradient("padded", to_query, *args, **sc))
        if fn == "score_contrastive":
            nq, lq = case.queries.shape[:2]
            args = (case.queries, case.documents, [case.document_offsets, case.query_lengths, None, None],
                    [nq, lq, case.documents.shape[0]], g, a)
            return pair(lambda to_query: self.gradient("contrastive", to_query, *args, **sc))
        if fn == "score_contrastive_padded":
            nq, lq = case.queries.shape[:2]
            nb, ld = case.documents.shape[:2]
            args = (case.queries, case.documents, [case.document_lengths, case.query_lengths, None, None],
                    [nq, lq, nb, ld], g, a)
            return pair(lambda to_query: self.gradient("contrastive_padded", to_query, *args, **sc))
        indices = [case.query_offsets, case.document_offsets, case.pair_query_ids, case.pair_document_ids]
        sizes = [case.queries.shape[0], case.documents.shape[0], a.shape[-1]]

        def packed(to_query):
            ids_, offsets = ((case.pair_query_ids, case.query_offsets) if to_query
                             else (case.pair_document_ids, case.document_offsets))
            pairs_by, pair_offsets = owner_lists(ids_, offsets.numel() - 1)
            return self.gradient("packed", to_query, case.queries, case.documents, indices, sizes,
                                 g, a, pairs_by, pair_offsets, **sc)

        return pair(packed)


class _Train(torch.autograd.Function):
    """scores = forward(queries, documents); the backward runs the gradient kernels on the
    forward's argmax, as the package's _train forms do."""

    @staticmethod
    def forward(ctx, ms, forward, case, queries, documents):
        q, d = queries.detach(), documents.detach()
        scores, argmax = forward(q, d)
        ctx.ms = ms
        ctx.case = types.SimpleNamespace(**{**vars(case), "queries": q, "documents": d,
                                            "argmax_width": argmax.shape[-1]})
        ctx.save_for_backward(argmax)
        return scores

    @staticmethod
    def backward(ctx, grad_scores):
        (argmax,) = ctx.saved_tensors
        grad_queries, grad_documents = ctx.ms.backward(ctx.case, grad_scores.contiguous(), argmax)
        return None, None, None, grad_queries, grad_documents


def mutant(tmp_path, name: str, edits) -> EmulatedMaxsim:
    """The emulator built from a copy of maxsim_metal/ with `edits` applied: (file, old, new)
    triples, each `old` found exactly once."""
    src = tmp_path / name
    shutil.copytree(REPO_ROOT / "maxsim_metal", src)
    for file, old, new in edits:
        text = (src / file).read_text()
        assert text.count(old) == 1, old
        (src / file).write_text(text.replace(old, new))
    return EmulatedMaxsim(build("plain", str(src)))


def owner_lists(ids: torch.Tensor, n: int):
    """(pairs_by, pair_offsets) as the Python layer builds them: a stable argsort of the ids
    and, per owner, where its run starts (int64)."""
    ids64 = ids.to(torch.int64)
    order = torch.argsort(ids64, stable=True)
    starts = torch.searchsorted(ids64[order], torch.arange(max(n, 0) + 1, dtype=torch.int64))
    return order.to(torch.int64), starts.to(torch.int64)
