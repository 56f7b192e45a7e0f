#!/usr/bin/env python3
"""Forward timings of the contrastive shapes only (for comparing block-shape variants).

    MAXSIM_CUDA_CONTRASTIVE_CFG=0 python3 tools/device/bench_contrastive.py --lib <so> [--profile]
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import check_cuda as cc  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", required=True)
ap.add_argument("--profile", action="store_true", help="a few BigColBERT forwards only (for ncu)")
ap.add_argument("--profile-rerank", action="store_true", help="a few HeavyRerank padded forwards (for ncu)")
args = ap.parse_args()
ops = cc.load_ops(args.lib)
DEV = "cuda"


def shape(Nq, Lq, Nb, Ld, D, dtype, ragged):
    torch.manual_seed(3)
    q = torch.nn.functional.normalize(torch.randn(Nq, Lq, D, device=DEV), dim=-1).to(dtype)
    dl = torch.randint(Ld // 4, Ld + 1, (Nb,), device=DEV) if ragged else torch.full((Nb,), Ld, device=DEV)
    d = torch.nn.functional.normalize(torch.randn(int(dl.sum()), D, device=DEV), dim=-1).to(dtype)
    offs = torch.zeros(Nb + 1, dtype=torch.int64, device=DEV)
    offs[1:] = dl.cumsum(0)
    return q, d, offs, 2.0 * Nq * Lq * int(dl.sum()) * D


if args.profile_rerank:
    q = torch.randn(32, 32, 128, device=DEV, dtype=torch.float16)
    d = torch.randn(32, 100, 256, 128, device=DEV, dtype=torch.float16)
    ql = torch.full((32,), 32, device=DEV)
    dl = torch.full((32, 100), 256, device=DEV)
    for _ in range(3):
        ops.padded_forward(q, d, ql, dl, False)
    torch.cuda.synchronize()
    sys.exit(0)

if args.profile:
    q, d, offs, _ = shape(512, 32, 512, 180, 128, torch.bfloat16, False)
    for _ in range(3):
        ops.contrastive_forward(q, d, offs, None, False)
    torch.cuda.synchronize()
    sys.exit(0)

v = os.environ.get("MAXSIM_CUDA_CONTRASTIVE_CFG", "default")
ref = None
for name, args_ in [("BigColBERT", (512, 32, 512, 180, 128, torch.bfloat16, False)),
                    ("DocDoc", (64, 1024, 64, 1024, 128, torch.bfloat16, False)),
                    ("ColBERTCorpus", (32, 32, 10000, 256, 128, torch.float16, True)),
                    ("ColPaliCorpus", (8, 32, 4096, 1030, 128, torch.float16, True)),
                    ("BigBatch", (64, 32, 64, 128, 128, torch.float16, False))]:
    q, d, offs, flops = shape(*args_)
    t = cc.bench(lambda: ops.contrastive_forward(q, d, offs, None, False), reps=10)
    ta = cc.bench(lambda: ops.contrastive_forward(q, d, offs, None, True), reps=10)
    print(f"variant {v} {name}: fwd {t:.3f} ms ({flops / t / 1e9:.0f} TFLOP/s), with argmax {ta:.3f} ms", flush=True)
