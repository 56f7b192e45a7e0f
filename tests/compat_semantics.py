"""What PyLate 1.6 and colpali-engine 0.3 compute, re-implemented in plain PyTorch (per-pair
loops, float64), so that the adapters in maxsim.compat are checked without the libraries;
plus the inputs the compat tests draw and the switch that imports a library for them.

The libraries' semantics, written from their source: PyLate multiplies each similarity by
the query and document masks (any values, any pattern) and takes `max` over every document
position, so a masked token is a candidate with similarity 0; colpali-engine has no masks,
its padding is zero vectors taking part in the max; `score_multi_vector` zero-pads pages per
chunk of `batch_size`.
"""
from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

REQUIRE_LIBRARIES = os.environ.get("MAXSIM_REQUIRE_INTEGRATIONS") == "1"

LENGTHS = (1, 2, 17, 300)
DIMS = (1, 8, 32, 128)
MASK_KINDS = ("none", "prefix", "holes", "all_masked_document")
MASK_DTYPES = (torch.bool, torch.int64, torch.float32)
EMBEDDING_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ---- the libraries' semantics ----------------------------------------------------------------

def pair_score(q, d, q_mask=None, d_mask=None):
    """sum_i max_j (q_i . d_j) * q_mask_i * d_mask_j, every j counting (differentiable)."""
    sims = q @ d.T
    if q_mask is not None:
        sims = sims * q_mask[:, None]
    if d_mask is not None:
        sims = sims * d_mask[None, :]
    return sims.max(dim=1).values.sum()


def colbert_scores(q, d, q_mask=None, d_mask=None):
    """[Nq, Lq, H] x [B, Ld, H] -> [Nq, B]."""
    rows = [torch.stack([pair_score(q[a], d[b], _row(q_mask, a), _row(d_mask, b))
                         for b in range(d.shape[0])]) for a in range(q.shape[0])]
    return torch.stack(rows) if rows else q.new_zeros((0, d.shape[0]))


def colbert_kd_scores(q, d, q_mask=None, d_mask=None):
    """[Nq, Lq, H] x [Nq, C, Ld, H] -> [Nq, C]."""
    return torch.stack([
        torch.stack([pair_score(q[a], d[a, c], _row(q_mask, a), _row(d_mask, a, c))
                     for c in range(d.shape[1])]) for a in range(q.shape[0])])


def colbert_grouped_scores(q, d, q_mask=None, d_mask=None):
    """ColBERTScores: [Q, Lq, H] x [G, N, Ld, H] -> [Q, G * N], column g * N + n."""
    g, n = d.shape[:2]
    flat_mask = None if d_mask is None else d_mask.reshape(g * n, -1)
    return colbert_scores(q, d.reshape(g * n, *d.shape[2:]), q_mask, flat_mask)


def pairwise_scores(queries, documents):
    return torch.stack([pair_score(q, d) for q, d in zip(queries, documents)])


def multi_vector_scores(qs, ps, batch_size):
    """score_multi_vector: pages zero-padded to the longest of their chunk of `batch_size`."""
    columns = []
    for start in range(0, len(ps), batch_size):
        chunk = ps[start:start + batch_size]
        width = max(p.shape[0] for p in chunk)
        padded = [torch.cat([p, p.new_zeros(width - p.shape[0], p.shape[1])]) for p in chunk]
        columns.append(torch.stack([torch.stack([pair_score(q, p) for p in padded]) for q in qs]))
    return torch.cat(columns, dim=1)


def _row(mask, *index):
    return None if mask is None else mask[index]


# ---- inputs ----------------------------------------------------------------------------------

def gaussian(gen, *shape, scale=1.0):
    """Unnormalised embeddings (never unit vectors: short documents then often lose to 0)."""
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def lattice(gen, *shape):
    """Multiples of 1/4 in [-1, 1]: dot products are exact in every dtype and summation order,
    so argmax ties (plentiful, including with the zero candidates) must resolve identically."""
    return torch.randint(-4, 5, shape, generator=gen).to(torch.float64) / 4


def mask(gen, shape, kind: str, dtype: torch.dtype):
    """A [..., L] mask: `prefix` (padding at the end), `holes` (skiplist-like gaps anywhere),
    `all_masked_document` (holes, plus the first row masked entirely)."""
    if kind == "none":
        return None
    length = shape[-1]
    if kind == "prefix":
        keep = torch.randint(1, length + 1, shape[:-1], generator=gen)
        m = torch.arange(length) < keep.unsqueeze(-1)
    else:
        m = torch.rand(shape, generator=gen) < 0.6
        if kind == "all_masked_document":
            m.view(-1, length)[0] = False
    return m.to(dtype)


def cast(t, dtype, device):
    return None if t is None else t.to(device=device, dtype=dtype)


def tolerance(reference, magnitude, out_dtype, dim):
    """Kernel accumulation (float32, dim terms per similarity) + rounding to the output dtype."""
    eps_out = torch.finfo(out_dtype).eps
    return 4 * eps_out * reference.abs() + 8 * dim * torch.finfo(torch.float32).eps * magnitude \
        + 1e-6


def magnitude(q, d):
    """A bound on sum_i max_j |q_i . d_j| per pair: [Nq, B] from norms."""
    qn = q.norm(dim=-1)            # [Nq, Lq]
    dn = d.norm(dim=-1).amax(-1)   # [B] or [Nq, C]
    if dn.dim() == 1:
        return qn.sum(-1)[:, None] * dn[None, :]
    return qn.sum(-1)[:, None] * dn


# ---- the real libraries (integration runs) ---------------------------------------------------

def hide_kernels_from_transformers() -> None:
    """transformers 5.3.0 (the one version PyLate 1.6 and colpali-engine 0.3.18 both accept)
    requires kernels < 0.11 and raises at import next to a newer kernels package. maxsim is
    loaded by then, so transformers' optional hub-kernel layer is simply turned off."""
    if "transformers.integrations.hub_kernels" in sys.modules:
        return
    saved = sys.modules.get("kernels")
    sys.modules["kernels"] = None  # `from kernels import ...` now raises ImportError
    try:
        importlib.import_module("transformers.integrations.hub_kernels")
    except ImportError:
        pass  # no transformers: the libraries will not import either
    finally:
        if saved is None:
            del sys.modules["kernels"]
        else:
            sys.modules["kernels"] = saved


def import_library(module: str):
    """Import a library module for a comparison; skip without it, or fail when the run
    requires the libraries (MAXSIM_REQUIRE_INTEGRATIONS=1, set by .ci/integrations.sh)."""
    hide_kernels_from_transformers()
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if REQUIRE_LIBRARIES:
            pytest.fail(f"MAXSIM_REQUIRE_INTEGRATIONS=1 but {module} does not import: {error}",
                        pytrace=False)
        pytest.skip(f"{module} is not installed ({error})")
