"""Drop-in replacements for PyLate's and colpali-engine's MaxSim, computed by maxsim.

Those libraries score differently from maxsim's own surfaces: PyLate multiplies the
similarities by its masks and colpali-engine pads with zero vectors, so a masked or padded
token is still a candidate, with similarity 0, and can win the max. The adapters reproduce
that exactly by scaling each embedding by its mask (<q * mq, d * md> = mq * md * <q, d>, the
library's masked similarity) and letting every position count. Gradients follow the same
chain rule, so they match too.

Signatures follow PyLate 1.6 (`colbert_scores`, `colbert_kd_scores`, `colbert_scores_pairwise`,
`ColBERTScores`) and colpali-engine 0.3 (`maxsim_inbatch`, `maxsim_kd`, `score_multi_vector`);
output dtypes are the libraries' (the kernels compute in float32 and the result is cast).

`patch_pylate()` / `patch_colpali_engine()` route every call site in those libraries through
these adapters (the libraries are imported only then); `unpatch_*()` restores them. Once
patched, the libraries' own backend switches keep their meaning: `backend="torch"` (or
PYLATE_SCORES_BACKEND / COLPALI_SCORES_BACKEND) still selects their own code, and "auto"
selects maxsim. Tensors on devices maxsim does not run on go to the library's own code.
"""
from __future__ import annotations

import functools
import importlib
import sys

import torch

from . import _api

_KERNEL_DEVICES = ("cpu", "cuda")
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ---- shared pieces ---------------------------------------------------------------------------

def _as_tensor(x) -> torch.Tensor:
    """What PyLate's convert_to_tensor does for tensors, arrays and (nested) lists."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, list):
        if not x:
            return torch.tensor([], dtype=torch.float32)
        if isinstance(x[0], torch.Tensor):
            return torch.stack(x)
        return torch.as_tensor(_numpy().array(x, dtype=_numpy().float32))
    return torch.as_tensor(x)


def _numpy():
    import numpy  # only lists of arrays / lists need it

    return numpy


def _check_backend(backend) -> None:
    if backend not in (None, "auto", "maxsim"):
        raise ValueError(
            f"backend must be None, 'auto' or 'maxsim' for maxsim's adapters, got {backend!r}; "
            "call the library's own function for its other backends"
        )


def _check_rank(name: str, t: torch.Tensor, ndim: int, what: str) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {what}, got shape {tuple(t.shape)}")


def _check_tokens(name: str, t: torch.Tensor) -> None:
    """The libraries take the max over the token axis, which torch refuses when it is empty."""
    if t.shape[-2] == 0:
        raise IndexError(f"{name} has no tokens (shape {tuple(t.shape)}): the max over them is "
                         "undefined, as in the library's own code")


def _scaled(embeddings: torch.Tensor, mask) -> torch.Tensor:
    """Embeddings times their mask: the library's masked similarity, as a candidate."""
    if mask is None:
        return embeddings
    return embeddings * _as_tensor(mask).to(device=embeddings.device,
                                            dtype=embeddings.dtype).unsqueeze(-1)


def _library_dtype(embeddings: torch.Tensor, *masks) -> torch.dtype:
    """The dtype the library's `similarities * mask` arithmetic ends in."""
    dtype = embeddings.dtype
    for mask in masks:
        if mask is not None:
            dtype = torch.promote_types(dtype, _as_tensor(mask).dtype)
    return dtype


def _grad_can_flow(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _lengths(shape, value: int, device) -> torch.Tensor:
    return torch.full(shape, value, dtype=torch.int32, device=device)


def _all_vs_all(queries: torch.Tensor, documents: torch.Tensor, dtype: torch.dtype,
                lengths: torch.Tensor | None = None):
    """Every query [Nq, Lq, H] against every document [B, Ld, H] (rows at or past `lengths`
    [B] do not count; default: all Ld), as the library's `dtype` arithmetic gives it."""
    nb, ld = documents.shape[0], documents.shape[1]
    if lengths is None:
        lengths = _lengths((nb,), ld, documents.device)
    args = (queries, documents, lengths)
    if _grad_can_flow(queries, documents):
        return _api.score_contrastive_padded_train(*args).to(dtype)
    if queries.dtype not in _HALF:
        return _api.score_contrastive_padded(*args).to(dtype)
    nq, lq = queries.shape[0], queries.shape[1]
    maxima = _api.score_contrastive_padded(queries.reshape(nq * lq, 1, -1), documents, lengths)
    return _rounded_sum(maxima.reshape(nq, lq, nb).transpose(1, 2), queries.dtype, dtype)


def _rounded_sum(maxima: torch.Tensor, embedding_dtype: torch.dtype, dtype: torch.dtype):
    """The libraries' sum_i m_i over the last axis of `maxima` [..., Lq] (float32 per-token
    maxima): each m_i rounded to the embedding dtype, as their einsum leaves it (rounding is
    monotone, so the rounded max is the max of the rounded similarities), then summed in
    `dtype`. The maxima come from the kernel run with one-token queries, which the contrastive
    surfaces stack 64 to a block: no gather of the winning rows."""
    return maxima.to(embedding_dtype).to(dtype).sum(-1)


def _per_query(queries: torch.Tensor, documents: torch.Tensor, dtype: torch.dtype):
    """Query b [Lq, H] against its candidates documents[b] [C, Ld, H], all positions counting,
    as the library's `dtype` arithmetic gives it."""
    b, lq = queries.shape[0], queries.shape[1]
    c, ld = documents.shape[1], documents.shape[2]
    args = (queries, documents, _lengths((b,), lq, queries.device),
            _lengths((b, c), ld, queries.device))
    if _grad_can_flow(queries, documents):
        return _api.score_candidates_padded_train(*args).to(dtype)
    if queries.dtype not in _HALF:
        return _api.score_candidates_padded(*args).to(dtype)
    argmax = _api.score_candidates_padded_with_argmax(*args)[1]
    first_row = (torch.arange(b * c, device=queries.device) * ld).reshape(b, c, 1)
    return _library_sum(queries, documents.reshape(b * c * ld, -1), argmax.long() + first_row,
                        dtype)


_HALF = (torch.float16, torch.bfloat16)
_GATHER_ELEMENTS = 1 << 25  # bound on the gathered winning document rows held at once


def _library_sum(queries, flat_documents, rows, dtype):
    """sum_i m_i the way the libraries round it with half-precision embeddings: each winning
    similarity m_i in the embedding dtype, then (masks promoted) the sum in `dtype`.

    maxsim sums the m_i in float32, which can land one half-precision step away from the
    libraries' result; the winners (`rows` [Nq, Nb, Lq], from the argmax) are re-scored here,
    as the libraries' einsum does (embedding dtype in and out, float32 accumulation), Nb-chunk
    by chunk. Inference only: training takes maxsim's float32 sum (a gradient does not see
    the rounding).
    """
    nq, nb, lq = rows.shape
    step = max(1, _GATHER_ELEMENTS // max(1, nq * lq * queries.shape[-1]))
    columns = queries.unsqueeze(-1)  # [Nq, Lq, D, 1]
    maxima = [torch.matmul(flat_documents[rows[:, n:n + step].transpose(1, 2)], columns)
              for n in range(0, nb, step)]  # each [Nq, Lq, chunk, 1]
    if not maxima:
        return rows.new_zeros((nq, 0), dtype=dtype)
    return torch.cat(maxima, dim=2).squeeze(-1).to(dtype).sum(1)


# ---- PyLate 1.6 ------------------------------------------------------------------------------

def colbert_scores(queries_embeddings, documents_embeddings, queries_mask=None,
                   documents_mask=None, backend=None) -> torch.Tensor:
    """PyLate's colbert_scores: queries [Nq, Lq, H] x documents [B, Ld, H] -> [Nq, B].

    Masks ([Nq, Lq], [B, Ld]; bool, int or float) multiply the similarities, as in PyLate.
    """
    return _masked_scores(_all_vs_all, "[B, Ld, H]", queries_embeddings, documents_embeddings,
                          queries_mask, documents_mask, backend)


def colbert_kd_scores(queries_embeddings, documents_embeddings, queries_mask=None,
                      documents_mask=None, backend=None) -> torch.Tensor:
    """PyLate's colbert_kd_scores: queries [Nq, Lq, H] x documents [Nq, C, Ld, H] -> [Nq, C]."""
    return _masked_scores(_per_query, "[Nq, C, Ld, H]", queries_embeddings,
                          documents_embeddings, queries_mask, documents_mask, backend)


def _masked_scores(layout, documents_shape, queries_embeddings, documents_embeddings,
                   queries_mask, documents_mask, backend):
    _check_backend(backend)
    queries = _as_tensor(queries_embeddings)
    documents = _as_tensor(documents_embeddings)
    _check_rank("queries_embeddings", queries, 3, "[Nq, Lq, H]")
    _check_rank("documents_embeddings", documents, documents_shape.count(",") + 1,
                documents_shape)
    _check_tokens("documents_embeddings", documents)
    dtype = _library_dtype(queries, queries_mask, documents_mask)
    return layout(_scaled(queries, queries_mask), _scaled(documents, documents_mask), dtype)


def colbert_scores_pairwise(queries_embeddings, documents_embeddings, backend=None):
    """PyLate's colbert_scores_pairwise: query i against document i -> [P].

    Takes [P, L, H] tensors or lists of [L_i, H] tensors / arrays of any lengths (pairs
    beyond the shorter list are dropped, as zip does). One kernel call for all pairs.
    """
    _check_backend(backend)
    if isinstance(queries_embeddings, torch.Tensor) and isinstance(documents_embeddings,
                                                                   torch.Tensor) \
            and queries_embeddings.dim() == 3 and documents_embeddings.dim() == 3:
        p = min(queries_embeddings.shape[0], documents_embeddings.shape[0])
        queries, documents = queries_embeddings[:p], documents_embeddings[:p]
        _check_tokens("documents_embeddings", documents)
        if p == 0:
            return torch.stack([])  # the library's error for no pairs
        return _per_query(queries, documents.unsqueeze(1), queries.dtype).squeeze(1)
    pairs = list(zip(queries_embeddings, documents_embeddings))
    if not pairs:
        return torch.stack([])
    queries = [_as_tensor(q) for q, _ in pairs]
    documents = [_as_tensor(d) for _, d in pairs]
    for i, (q, d) in enumerate(zip(queries, documents)):
        _check_rank(f"queries_embeddings[{i}]", q, 2, "[Lq, H]")
        _check_rank(f"documents_embeddings[{i}]", d, 2, "[Ld, H]")
        _check_tokens(f"documents_embeddings[{i}]", d)
    device = queries[0].device
    q_offsets = torch.tensor([0] + [q.shape[0] for q in queries], device=device).cumsum(0)
    d_offsets = torch.tensor([0] + [d.shape[0] for d in documents], device=device).cumsum(0)
    flat_q, flat_d = torch.cat(queries), torch.cat(documents)
    pair_ids = torch.arange(len(pairs), device=device)
    form = _api.score_pairs_packed_train if _grad_can_flow(flat_q, flat_d) \
        else _api.score_pairs_packed
    scores = form(flat_q, q_offsets, flat_d, d_offsets, pair_ids, pair_ids,
                  max_q_len=max(q.shape[0] for q in queries))
    return scores.to(flat_q.dtype)


class ColBERTScores:
    """PyLate's ColBERTScores: queries [Q, Lq, H] x documents [Q_doc, N, Ld, H] ->
    [Q, Q_doc * N], query-major (column j * N + k is document group j's k-th slot).

    One kernel call over all Q_doc * N documents (PyLate loops over N).
    """

    def __call__(self, queries_embeddings, documents_embeddings, queries_mask=None,
                 documents_mask=None, backend=None) -> torch.Tensor:
        documents = _as_tensor(documents_embeddings)
        _check_rank("documents_embeddings", documents, 4, "[Q_doc, N, Ld, H]")
        groups, slots = documents.shape[0], documents.shape[1]
        flat_documents = documents.reshape(groups * slots, *documents.shape[2:])
        flat_mask = None
        if documents_mask is not None:
            documents_mask = _as_tensor(documents_mask)
            flat_mask = documents_mask.reshape(groups * slots, *documents_mask.shape[2:])
        return colbert_scores(queries_embeddings, flat_documents, queries_mask, flat_mask,
                              backend=backend)


# ---- colpali-engine 0.3 ----------------------------------------------------------------------

def maxsim_inbatch(query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """colpali-engine's maxsim_inbatch: zero-padded query [Bq, Lq, d] x doc [Bd, Ld, d]
    -> [Bq, Bd]."""
    _check_rank("query", query, 3, "[Bq, Lq, d]")
    _check_rank("doc", doc, 3, "[Bd, Ld, d]")
    _check_tokens("doc", doc)
    return _all_vs_all(query, doc, query.dtype)


def maxsim_kd(query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """colpali-engine's maxsim_kd: zero-padded query [B, Lq, d] x doc [B, N, Ld, d] -> [B, N]."""
    _check_rank("query", query, 3, "[B, Lq, d]")
    _check_rank("doc", doc, 4, "[B, N, Ld, d]")
    _check_tokens("doc", doc)
    return _per_query(query, doc, query.dtype)


def score_multi_vector(qs, ps, batch_size: int = 128, device=None) -> torch.Tensor:
    """colpali-engine's BaseVisualRetrieverProcessor.score_multi_vector: [len(qs), len(ps)]
    float32 on the CPU, from lists of [L_i, d] tensors or padded [N, L, d] tensors.

    colpali-engine zero-pads pages per chunk of `batch_size`, so a page shorter than the longest
    page of its chunk also competes with a zero vector (similarity 0). Here the pages are packed
    (one concatenation, no padded copy of every page), the kernel gives each padded query row's
    maximum over each page, a page that would have been padded takes max(m, 0), and the maxima
    are rounded and summed per query as the library's arithmetic does.
    """
    device = device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    if len(qs) == 0:
        raise ValueError("No queries provided")
    if len(ps) == 0:
        raise ValueError("No passages provided")
    # Zero rows of a padded query add max_j <0, d_j> = 0 to every score: they may count.
    queries = _padded(qs).to(device)
    if isinstance(ps, torch.Tensor):
        _check_tokens("ps", ps)
        pages = ps.to(device)
        counts = [pages.shape[1]] * pages.shape[0]
        pages = pages.reshape(-1, pages.shape[-1])
        padded_short = None  # every row of a padded tensor is a token to the library
    else:
        counts = [p.shape[0] for p in ps]
        padded_short = []
        for start in range(0, len(counts), batch_size):
            chunk = counts[start:start + batch_size]
            if max(chunk) == 0:
                raise IndexError(f"ps[{start}:{start + len(chunk)}] has no tokens: the max over "
                                 "them is undefined, as in the library's own code")
            padded_short += [n < max(chunk) for n in chunk]
        pages = torch.cat(list(ps)).to(device)
    offsets = torch.tensor([0] + counts, dtype=torch.int64).cumsum(0).to(device)
    nq, lq = queries.shape[0], queries.shape[1]
    maxima = _api.score_contrastive(queries.reshape(nq * lq, 1, -1), pages, offsets)
    if padded_short is not None and any(padded_short):
        short = torch.tensor(padded_short).to(device)
        maxima = torch.where(short, maxima.clamp_min(0), maxima)
    scores = _rounded_sum(maxima.reshape(nq, lq, -1).transpose(1, 2), queries.dtype, queries.dtype)
    return scores.cpu().to(torch.float32)


def _padded(xs) -> torch.Tensor:
    if isinstance(xs, torch.Tensor):
        return xs
    return torch.nn.utils.rnn.pad_sequence(list(xs), batch_first=True)


# ---- patching --------------------------------------------------------------------------------

# library name -> list of (owner, attribute, previous value in owner.__dict__), in patch order
_PATCHES: dict[str, list] = {}


def _kernel_eligible(*values) -> bool:
    """Whether maxsim runs on these inputs (tensors on CPU/CUDA in a float dtype; lists and
    arrays become CPU tensors)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.device.type not in _KERNEL_DEVICES or value.dtype not in _KERNEL_DTYPES:
                return False
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            if not _kernel_eligible(*value):
                return False
    return True


def _set(record: list, owner, name: str, value) -> None:
    # a class's own entry keeps descriptors (staticmethod) intact; others are plain attributes
    previous = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)
    record.append((owner, name, previous))
    setattr(owner, name, value)


def _import_library(name: str):
    """Import `name`, working around transformers 5.3.0 (the one version PyLate 1.6 and
    colpali-engine 0.3.18 both accept), which expects kernels < 0.11 and raises ValueError at
    import next to the kernels that loads maxsim: if it does, transformers is imported again
    with its optional hub-kernel layer turned off (kernels hidden from that one import)."""
    try:
        importlib.import_module("transformers.integrations.hub_kernels")
    except ImportError:
        pass  # no transformers: the library reports what it misses itself
    except ValueError:
        saved = sys.modules.get("kernels")
        sys.modules["kernels"] = None  # `from kernels import ...` raises ImportError
        try:
            importlib.import_module("transformers.integrations.hub_kernels")
        finally:
            if saved is None:
                del sys.modules["kernels"]
            else:
                sys.modules["kernels"] = saved
    return importlib.import_module(name)


def _import_all(names: list[str]) -> list:
    """The library modules holding call sites; one that cannot import cannot call anything."""
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            pass
    return modules


def _rebind(record: list, package: str, replacements: dict) -> None:
    """Every module global, function default and class attribute in `package` that is one of
    the originals now names its replacement (`from x import f` and `f=default` copies included)."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == package or module_name.startswith(package + ".")):
            continue
        for name, value in list(vars(module).items()):
            if _is_original(value, replacements):
                _set(record, module, name, replacements[id(value)])
            if isinstance(value, type) and value.__module__ == module_name:
                _rebind_defaults(record, value, replacements)


def _is_original(value, replacements) -> bool:
    return callable(value) and id(value) in replacements


def _rebind_defaults(record: list, cls: type, replacements: dict) -> None:
    for attr in vars(cls).values():
        fn = getattr(attr, "__func__", attr)
        defaults = getattr(fn, "__defaults__", None)
        if defaults and any(_is_original(v, replacements) for v in defaults):
            _set(record, fn, "__defaults__",
                 tuple(replacements[id(v)] if _is_original(v, replacements) else v
                       for v in defaults))


def _unpatch(library: str) -> None:
    for owner, name, value in reversed(_PATCHES.pop(library, [])):
        setattr(owner, name, value)


def patch_pylate() -> None:
    """Route PyLate's MaxSim (scores, losses incl. Distillation's default, rank.rerank,
    evaluators, model.similarity) through maxsim. Idempotent; `unpatch_pylate()` undoes it.

    Call it before building losses: a loss built before keeps the score function it was given
    (Distillation's default included). Calling it before `import pylate` also gets PyLate past
    transformers 5.3.0's import error next to a recent `kernels` (see _import_library).
    """
    if "pylate" in _PATCHES:
        return
    colbert = _import_library("pylate.scores.colbert")
    _import_all(["pylate.scores", "pylate.scores.similarity_functions", "pylate.rank.rank",
                 "pylate.losses.contrastive", "pylate.losses.cached_contrastive",
                 "pylate.losses.distillation", "pylate.evaluation.colbert_distillation",
                 "pylate.evaluation.colbert_triplet", "pylate.models.colbert"])

    def use_maxsim(backend, *tensors) -> bool:
        return colbert._resolve_backend(backend) == "auto" and _kernel_eligible(*tensors)

    def routed(original, ours):
        @functools.wraps(original)
        def call(queries_embeddings, documents_embeddings, queries_mask=None,
                 documents_mask=None, backend=None):
            if use_maxsim(backend, queries_embeddings, documents_embeddings):
                return ours(queries_embeddings, documents_embeddings, queries_mask,
                            documents_mask)
            return original(queries_embeddings, documents_embeddings, queries_mask,
                            documents_mask, backend=backend)
        return call

    original_pairwise = colbert.colbert_scores_pairwise

    @functools.wraps(original_pairwise)
    def pairwise(queries_embeddings, documents_embeddings, backend=None):
        if use_maxsim(backend, queries_embeddings, documents_embeddings):
            return colbert_scores_pairwise(queries_embeddings, documents_embeddings)
        return original_pairwise(queries_embeddings, documents_embeddings, backend=backend)

    original_call = colbert.ColBERTScores.__call__
    ours_call = ColBERTScores.__call__

    @functools.wraps(original_call)
    def grouped(self, queries_embeddings, documents_embeddings, queries_mask=None,
                documents_mask=None, backend=None):
        if use_maxsim(backend, queries_embeddings, documents_embeddings):
            return ours_call(self, queries_embeddings, documents_embeddings, queries_mask,
                             documents_mask)
        return original_call(self, queries_embeddings, documents_embeddings, queries_mask,
                             documents_mask, backend=backend)

    originals = {
        colbert.colbert_scores: routed(colbert.colbert_scores, colbert_scores),
        colbert.colbert_kd_scores: routed(colbert.colbert_kd_scores, colbert_kd_scores),
        original_pairwise: pairwise,
    }
    record: list = []
    _set(record, colbert.ColBERTScores, "__call__", grouped)
    _rebind(record, "pylate", {id(k): v for k, v in originals.items()})
    _PATCHES["pylate"] = record


def unpatch_pylate() -> None:
    """Undo patch_pylate() (a no-op when not patched)."""
    _unpatch("pylate")


def patch_colpali_engine() -> None:
    """Route colpali-engine's MaxSim (maxsim_inbatch, maxsim_kd, the late-interaction losses,
    score_multi_vector) through maxsim. Idempotent; `unpatch_colpali_engine()` undoes it."""
    if "colpali_engine" in _PATCHES:
        return
    dispatch = _import_library("colpali_engine.utils.maxsim")
    processing = importlib.import_module("colpali_engine.utils.processing_utils")
    _import_all(["colpali_engine.loss.late_interaction_losses", "colpali_engine.loss"])

    def use_maxsim(*tensors) -> bool:
        return dispatch._resolve_backend() == "auto" and _kernel_eligible(*tensors)

    def routed(original, ours):
        @functools.wraps(original)
        def call(query, doc):
            return ours(query, doc) if use_maxsim(query, doc) else original(query, doc)
        return call

    base = processing.BaseVisualRetrieverProcessor
    original_multi = base.score_multi_vector

    @functools.wraps(original_multi)
    def multi(qs, ps, batch_size=128, device=None):
        if use_maxsim(qs, ps) and _kernel_device(device):
            return score_multi_vector(qs, ps, batch_size=batch_size, device=device)
        return original_multi(qs, ps, batch_size=batch_size, device=device)

    record: list = []
    for cls in _with_subclasses(base):
        if vars(cls).get("score_multi_vector") is vars(base)["score_multi_vector"]:
            _set(record, cls, "score_multi_vector", staticmethod(multi))
    _rebind(record, "colpali_engine", {
        id(dispatch.maxsim_inbatch): routed(dispatch.maxsim_inbatch, maxsim_inbatch),
        id(dispatch.maxsim_kd): routed(dispatch.maxsim_kd, maxsim_kd),
    })
    _PATCHES["colpali_engine"] = record


def _kernel_device(device) -> bool:
    if device is None:
        return torch.cuda.is_available() or not torch.backends.mps.is_available()
    return torch.device(device).type in _KERNEL_DEVICES


def _with_subclasses(cls: type) -> list:
    found, todo = [], [cls]
    while todo:
        c = todo.pop()
        found.append(c)
        todo.extend(c.__subclasses__())
    return found


def unpatch_colpali_engine() -> None:
    """Undo patch_colpali_engine() (a no-op when not patched)."""
    _unpatch("colpali_engine")
