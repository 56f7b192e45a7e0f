"""Argument checks shared by every public entry point.

Shape, dtype and device checks are free (metadata only) and always run. Checks that
must read tensor values run only where reading is free: on CPU tensors, or on any
device when MAXSIM_CHECK_VALUES=1 (that costs a host sync on a GPU). Without them
the kernels still never touch memory out of bounds: they clamp lengths and give a
pair whose offsets or ids are out of range a NaN score.
"""
from __future__ import annotations

import os

import torch

_EMBEDDING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INDEX_DTYPES = (torch.int32, torch.int64)


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def reads_values(t: torch.Tensor) -> bool:
    """Whether value checks may look at tensors on `t`'s device without stalling a stream.

    Asked once per call (every argument shares the device): the environment lookup costs
    about a microsecond, which small GPU calls feel.
    """
    if _compiling():
        return False
    return t.is_cpu or os.environ.get("MAXSIM_CHECK_VALUES") == "1"


def embeddings(name: str, t, ndim: int, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {what}, got shape {tuple(t.shape)}")
    if t.dtype not in _EMBEDDING_DTYPES:
        raise TypeError(
            f"{name} must be float16, bfloat16 or float32 (float64 on CPU/CUDA), got {t.dtype}"
        )
    if t.dtype == torch.float64 and t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{name} is float64, which is supported on CPU and CUDA only, not {t.device}")


def same_dtype_and_dim(queries: torch.Tensor, documents: torch.Tensor) -> None:
    if queries.dtype != documents.dtype:
        raise TypeError(
            f"queries and documents must share a dtype, got {queries.dtype} and {documents.dtype}"
        )
    if queries.shape[-1] != documents.shape[-1]:
        raise ValueError(
            "queries and documents must have the same embedding dim, got "
            f"{queries.shape[-1]} and {documents.shape[-1]}"
        )


def index(name: str, t, shape: tuple[int, ...] | None, ndim: int = 1) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 or int64, got {type(t).__name__}")
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if shape is None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")


def same_device(names: tuple[str, ...], *tensors) -> None:
    """All of `tensors` (None entries skipped) on one device; `names` label them in order."""
    device = tensors[0].device
    for name, t in zip(names[1:], tensors[1:]):
        if t is not None and t.device != device:
            raise ValueError(
                f"{name} is on {t.device} but {names[0]} is on {device}; "
                "all arguments must be on one device"
            )


def lengths_in_range(name: str, lengths: torch.Tensor, upper: int, upper_name: str,
                     read: bool) -> None:
    if not read or lengths.numel() == 0:
        return
    low, high = int(lengths.min()), int(lengths.max())
    if low < 0:
        raise ValueError(f"{name} must be >= 0, found {low}")
    if high > upper:
        raise ValueError(f"{name} must be <= {upper_name} ({upper}), found {high}")


def offsets(name: str, offsets: torch.Tensor, total: int, total_name: str, read: bool) -> None:
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"{name} must be 1-D with at least one entry (0), got shape {tuple(offsets.shape)}")
    if not read:
        return
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0:
        raise ValueError(f"{name} must start at 0, starts at {first}")
    if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"{name} must be non-decreasing")
    if last != total:
        raise ValueError(f"{name} must end at {total_name} ({total}), ends at {last}")


def ids_in_range(name: str, ids: torch.Tensor, count: int, count_name: str, read: bool) -> None:
    if not read or ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= count:
        bad = low if low < 0 else high
        raise ValueError(f"{name} must be in [0, {count_name}) = [0, {count}), found {bad}")


def max_q_len(value, query_offsets: torch.Tensor, read: bool) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"max_q_len must be an int or None, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"max_q_len must be >= 0, got {value}")
    if read and query_offsets.numel() > 1:
        longest = int((query_offsets[1:] - query_offsets[:-1]).max())
        if value < longest:
            raise ValueError(
                f"max_q_len ({value}) is below the longest query segment ({longest})"
            )
