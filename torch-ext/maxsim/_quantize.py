"""Compressed document storage: int8 or float8 e4m3fn values with one float32 scale per token.

A token d is stored as values v (the documents' shape, int8 or torch.float8_e4m3fn) and a
scale s (documents.shape[:-1], float32), d ~= v * s. The scoring entry points take v as
`documents` and s as `document_scales=`; the kernels widen v on chip (both formats are exact
in float16 and bfloat16), accumulate q . v in float32 and multiply each similarity by s
before the max, so a compressed score equals the float64 score of the dequantised documents
up to float32 accumulation error. The quantisation error itself is the format's: see
docs/compressed.md for its size on clustered embeddings.
"""
from __future__ import annotations

import torch

from ._validate import COMPRESSED_DTYPES

# Largest magnitude each format stores: symmetric int8 keeps -128 unused so that v and -v
# are both representable; 448 is e4m3fn's largest finite value.
_FORMATS = {"int8": (torch.int8, 127.0), "float8_e4m3fn": (torch.float8_e4m3fn, 448.0)}


def _format(fmt):
    if isinstance(fmt, torch.dtype):
        fmt = str(fmt).removeprefix("torch.")
    if fmt not in _FORMATS:
        raise ValueError(f"format must be 'int8' or 'float8_e4m3fn', got {fmt!r}")
    return _FORMATS[fmt]


@torch.no_grad()
def quantize_documents(documents: torch.Tensor, format="int8"):
    """documents [..., D] float -> (values [..., D] int8 or float8_e4m3fn, scales [...] float32).

    Each token is scaled by its own largest magnitude (scale = amax / 127 for int8, / 448 for
    float8_e4m3fn), int8 rounds to nearest, float8 by torch's cast. An all-zero token gets scale
    0 and zero values. A token with a NaN or infinite entry gets scale NaN (and zero values),
    so its similarities are NaN, as a NaN token's are when scored in float.
    """
    if not isinstance(documents, torch.Tensor):
        raise TypeError(f"documents must be a torch.Tensor, got {type(documents).__name__}")
    if not documents.is_floating_point() or documents.dtype in COMPRESSED_DTYPES:
        raise TypeError(f"documents to quantise must be float16, bfloat16, float32 or float64, "
                        f"got {documents.dtype}")
    if documents.dim() < 1:
        raise ValueError("documents must have at least one dimension (the embedding dim)")
    dtype, top = _format(format)
    x = documents.float()
    amax = x.abs().amax(dim=-1) if x.shape[-1] > 0 else x.new_zeros(x.shape[:-1])
    finite = torch.isfinite(amax)
    scales = torch.where(finite, amax / top, torch.full_like(amax, float("nan")))
    # Divide by a safe scale: zero tokens stay zero, non-finite tokens become zeros.
    safe = torch.where(finite & (amax > 0), scales, torch.ones_like(scales))
    y = torch.where(finite.unsqueeze(-1), x / safe.unsqueeze(-1), torch.zeros_like(x))
    y = y.clamp(-top, top)
    values = y.round().to(dtype) if dtype == torch.int8 else y.to(dtype)
    return values, scales


def dequantize_documents(values: torch.Tensor, scales: torch.Tensor, dtype=torch.float32):
    """The inverse of quantize_documents: values * scales[..., None] in `dtype`."""
    if not isinstance(values, torch.Tensor) or values.dtype not in COMPRESSED_DTYPES:
        raise TypeError(f"values must be an int8 or float8_e4m3fn tensor, got "
                        f"{getattr(values, 'dtype', type(values).__name__)}")
    if not isinstance(scales, torch.Tensor) or scales.dtype != torch.float32:
        raise TypeError(f"scales must be a float32 tensor, got {getattr(scales, 'dtype', type(scales).__name__)}")
    if tuple(scales.shape) != tuple(values.shape[:-1]):
        raise ValueError(f"scales must have shape {tuple(values.shape[:-1])}, got {tuple(scales.shape)}")
    return (values.float() * scales.unsqueeze(-1)).to(dtype)
