"""GPU time of the same calls on two built trees, alternating in one process (CUDA graphs, as
bench_compressed.py times them), for kernel changes that no knob switches. Each tree's CUDA
build is loaded under its own op namespace; every call is made through its public API.

  python3 tools/device/ab_trees.py --base .base [--rounds 3]

The calls are the shapes a change reaches, named in CALLS below; add to them as needed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compressed import graph_time_ms  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def padded(ms, B, C, Lq, Ld, D, qdtype, fmt):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Lq, D, device="cuda", generator=gen).to(qdtype)
    d = torch.randn(B, C, Ld, D, device="cuda", generator=gen)
    ql = torch.full((B,), Lq, device="cuda", dtype=torch.int32)
    dl = torch.full((B, C), Ld, device="cuda", dtype=torch.int32)
    if fmt == "plain":
        d = d.to(qdtype)
        return lambda: ms.score_candidates_padded(q, d, ql, dl)
    v, s = ms.quantize_documents(d, fmt)
    return lambda: ms.score_candidates_padded(q, v, ql, dl, document_scales=s)


# name, env, (B, C, Lq, Ld, D), query dtype, document format
CALLS = [
    # SimtMainloop (FFMA): float32 queries, float32 and int8 documents
    ("HeavyRerank fp32 (FFMA)", {}, (32, 100, 32, 256, 128), torch.float32, "plain"),
    ("HeavyRerank fp32 + int8 (FFMA)", {}, (32, 100, 32, 256, 128), torch.float32, "int8"),
    ("LongDocStress fp32 + int8 (FFMA, BM 64)", {}, (8, 16, 64, 1024, 128), torch.float32, "int8"),
    ("Lq 96, Ld 256, fp32 + int8 (FFMA, BM 128)", {}, (16, 50, 96, 256, 128), torch.float32, "int8"),
    # mma.sync with e4m3 documents at 64-row query blocks (Lq 33-64)
    ("Lq 48, Ld 180, fp16 + e4m3 (mma.sync BM 64)", {}, (32, 50, 48, 180, 128), torch.float16, "float8_e4m3fn"),
    ("Lq 48, Ld 180, D 64, fp16 + e4m3 (mma.sync BM 64)", {}, (32, 50, 48, 180, 64), torch.float16, "float8_e4m3fn"),
    ("Lq 48, Ld 180, fp16 + int8 (control)", {}, (32, 50, 48, 180, 128), torch.float16, "int8"),
    ("HeavyRerank fp16 + e4m3, mma.sync forced (BM 32, control)", {"MAXSIM_CUDA_HOPPER_BYTES": "0"},
     (32, 100, 32, 256, 128), torch.float16, "float8_e4m3fn"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import kernels

    trees = {"base": kernels.get_local_kernel(args.base, backend="cuda"),
             "candidate": kernels.get_local_kernel(ROOT, backend="cuda")}
    torch.set_float32_matmul_precision("highest")
    rows = []
    for name, env, (B, C, Lq, Ld, D), qdtype, fmt in CALLS:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            calls = {t: padded(ms, B, C, Lq, Ld, D, qdtype, fmt) for t, ms in trees.items()}
            same = torch.equal(calls["base"](), calls["candidate"]())
            times = {t: [] for t in trees}
            for _ in range(args.rounds):
                for t, fn in calls.items():
                    times[t].append(graph_time_ms(fn))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        row = {"call": name, "bitwise_equal": same,
               **{f"{t}_ms": [round(x, 5) for x in v] for t, v in times.items()},
               "ratio": statistics.median(times["candidate"]) / statistics.median(times["base"])}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
