#!/usr/bin/env python3
"""For a Mac user: maxsim's Metal kernels against its CPU backend and against
late-interaction-kernels' Metal path, on rerank-shaped inputs. Prints one row per
(shape, dtype) with median milliseconds and the largest score difference to maxsim-metal.

    python3 tools/build.py --backend metal
    pip install late-interaction-kernels     # optional; shown as n/a when missing
    python3 benchmarks/metal_compare.py [--iters 20] [--dtype float16]

Needs PyTorch with MPS. Times are wall clock around a call and torch.mps.synchronize().
late-interaction-kernels' Metal path takes float16/bfloat16 with dim % 8 == 0 and dim <= 128.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
# (B queries, C candidates each, Lq, Ld, dim): ColBERT rerank, long documents, ColPali-like
SHAPES = [(16, 32, 32, 180, 128), (4, 16, 32, 1024, 128), (8, 8, 20, 1030, 128)]


def timed(fn, sync, iters: int, warmup: int = 3) -> tuple[float, torch.Tensor]:
    for _ in range(warmup):
        out = fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    args = ap.parse_args()
    if not torch.backends.mps.is_available():
        raise SystemExit("needs PyTorch with MPS (Apple silicon)")
    import kernels

    ms = kernels.get_local_kernel(REPO, backend="metal")
    try:
        import late_interaction_kernels as lik
    except ImportError as e:
        lik, lik_missing = None, str(e)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    print(f"{'shape (B,C,Lq,Ld,D)':>24} {'metal ms':>9} {'cpu ms':>9} {'LIK ms':>9} {'LIK max err':>12}")
    for B, C, Lq, Ld, D in SHAPES:
        q = torch.nn.functional.normalize(torch.randn(B, Lq, D, generator=gen), dim=-1).to(dtype)
        d = torch.nn.functional.normalize(torch.randn(B, C, Ld, D, generator=gen), dim=-1).to(dtype)
        ql = torch.randint(Lq // 2, Lq + 1, (B,), generator=gen)
        dl = torch.randint(Ld // 2, Ld + 1, (B, C), generator=gen)
        mps = [t.to("mps") for t in (q, d, ql, dl)]
        t_metal, s_metal = timed(lambda: ms.score_candidates_padded(*mps), torch.mps.synchronize, args.iters)
        t_cpu, s_cpu = timed(lambda: ms.score_candidates_padded(q, d, ql, dl), lambda: None,
                             max(3, args.iters // 4))
        assert torch.allclose(s_metal.cpu(), s_cpu, rtol=1e-3, atol=1e-3), "metal and cpu disagree"
        lik_cell, err_cell = "n/a", lik_missing if lik is None else ""
        if lik is not None:
            try:
                qm = torch.arange(Lq, device="mps") < mps[2][:, None]
                dm = torch.arange(Ld, device="mps") < mps[3][..., None]
                t_lik, s_lik = timed(lambda: lik.maxsim(mps[0], mps[1], qm, dm), torch.mps.synchronize,
                                     args.iters)
                lik_cell = f"{t_lik:9.3f}"
                err_cell = f"{(s_lik.float().cpu() - s_metal.cpu()).abs().max().item():.2e}"
            except Exception as e:  # a peer's limits (dtype, dim) are its own; report, go on
                err_cell = f"{type(e).__name__}: {e}"[:60]
        print(f"{str((B, C, Lq, Ld, D)):>24} {t_metal:9.3f} {t_cpu:9.3f} {lik_cell:>9} {err_cell:>12}")


if __name__ == "__main__":
    main()
