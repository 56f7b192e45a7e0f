"""The two benchmarked maxsim.compat calls against the libraries' torch paths, on a GPU machine
without PyLate / colpali-engine installed (tools/device/compat_gpu.py times the libraries
themselves where they can be installed; their dependencies do not fit one device carry).

The libraries' paths are written here from their code's formulas (PyLate 1.6.0 and
colpali-engine 0.3.18):
- PyLate `colbert_scores`, torch backend: einsum("ash,bth->abst"), times the query and document
  masks, max over the document tokens, sum over the query tokens. The row times one Contrastive
  training step's scoring: 64 queries (Lq 32, expanded: every token counts) against the 128
  positives and negatives (Ld <= 180, masked), cross-entropy, backward to both embeddings.
- colpali-engine `score_multi_vector`: per chunk of 128 queries, the queries zero-padded; per
  chunk of 128 pages, the pages zero-padded and moved; einsum("bnd,csd->bcns").amax(3).sum(2);
  the chunks concatenated on the CPU, float32. 128 queries (16-32 tokens) x 1,024 pages
  (900-1,030 tokens), dim 128.
Each in float32 under "highest", "high" and "medium", and in bfloat16; ms, CUDA-event median of
--reps calls (eager: both calls end on the host). Run after a CUDA build:

    python3 tools/device/compat_speed.py [--reps 20] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))


def pylate_colbert_scores(q, d, q_mask, d_mask):
    s = torch.einsum("ash,bth->abst", q, d)
    s = s * q_mask[:, None, :, None]
    s = s * d_mask[None, :, None, :]
    return s.max(dim=-1).values.sum(dim=-1)


def colpali_score_multi_vector(qs, ps, batch_size=128, device="cuda"):
    pad = torch.nn.utils.rnn.pad_sequence
    rows = []
    for i in range(0, len(qs), batch_size):
        qb = pad(qs[i:i + batch_size], batch_first=True, padding_value=0).to(device)
        cols = [torch.einsum("bnd,csd->bcns", qb,
                             pad(ps[j:j + batch_size], batch_first=True, padding_value=0).to(device))
                .amax(dim=3).sum(dim=2) for j in range(0, len(ps), batch_size)]
        rows.append(torch.cat(cols, dim=1).cpu())
    return torch.cat(rows, dim=0).to(torch.float32)


def contrastive_step(score, dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(64, 32, 128, device="cuda", generator=gen).to(dtype).requires_grad_()
    d = torch.randn(128, 180, 128, device="cuda", generator=gen).to(dtype).requires_grad_()
    q_mask = torch.ones(64, 32, device="cuda", dtype=torch.long)
    lengths = torch.randint(1, 181, (128,), device="cuda", generator=gen)
    d_mask = (torch.arange(180, device="cuda") < lengths[:, None]).long()
    labels = torch.arange(64, device="cuda")

    def step():
        q.grad = d.grad = None
        F.cross_entropy(score(q, d, q_mask, d_mask).float(), labels).backward()

    return step


def multi_vector_call(score, dtype):
    gen = torch.Generator().manual_seed(0)
    qs = [torch.randn(int(n), 128, generator=gen).to("cuda", dtype)
          for n in torch.randint(16, 33, (128,), generator=gen)]
    ps = [torch.randn(int(n), 128, generator=gen).to("cuda", dtype)
          for n in torch.randint(900, 1031, (1024,), generator=gen)]
    return lambda: score(qs, ps, device="cuda")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import compare as C

    ms = C.load_kernel("cuda")
    settings = [(torch.float32, "highest"), (torch.float32, "high"), (torch.float32, "medium"),
                (torch.bfloat16, "highest")]
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; ms, median of {args.reps}")
    print("| call | dtype | matmul precision | library's torch path | maxsim.compat | ratio |")
    print("|---|---|---|---|---|---|")
    calls = (("PyLate Contrastive scoring step (64 x 128, Lq 32, Ld <= 180, fwd+bwd)", contrastive_step,
              pylate_colbert_scores, ms.compat.colbert_scores),
             ("colpali-engine score_multi_vector (128 x 1,024 pages, Ld <= 1030)", multi_vector_call,
              colpali_score_multi_vector, ms.compat.score_multi_vector))
    for name, make, library, ours in calls:
        for dtype, precision in settings:
            torch.set_float32_matmul_precision(precision)
            t_lib = C.time_ms(make(library, dtype), "cuda", 2, args.reps)
            t_ms = C.time_ms(make(ours, dtype), "cuda", 2, args.reps)
            torch.cuda.empty_cache()
            label = precision if dtype == torch.float32 else "-"
            rows.append(dict(call=name, dtype=str(dtype).split(".")[-1], precision=label,
                             library_ms=t_lib, maxsim_ms=t_ms))
            print(f"| {name} | {rows[-1]['dtype']} | {label} | {t_lib:.3f} | {t_ms:.3f} | "
                  f"{t_ms / t_lib:.2f} |", flush=True)
    torch.set_float32_matmul_precision("highest")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                               "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
