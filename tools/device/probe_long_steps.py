"""Fixed cost against per-row cost of few long steps (LongDocStress's grid: B 8, C 16, Lq 64,
dim 128, one step an SM): GPU time per call (CUDA graphs, us) over document lengths, for
float16 documents and each compressed format, then a least-squares line time = fixed + per_row
x Ld per format. Issue 19 asks int8 / e4m3 at 0.6x of float16's time at Ld 1,024; the fit says
how much of each call no format can shrink (launch, the first tile's latency, the epilogue).
Run on the GPU machine after a build:

  python3 tools/device/probe_long_steps.py [--lengths 64,128,...] [--grid B,C] [--lq N]
      [--surface padded|packed] [--json OUT]

The kernel rules' switches (MAXSIM_CUDA_HOPPER_BYTES=0|1, ...) are read per call, so a run under
one of them times the other kernel on the same grid.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "device"))
from bench_compressed import graph_time_ms  # noqa: E402

FORMATS = ("float16", "int8", "float8_e4m3fn")


def fit(xs, ys):
    """(intercept, slope) of the least-squares line through (xs, ys)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def packed_call(ms, q, docs, scales=None):
    """A no-argument call scoring the padded grid (queries [B, Lq, D], documents [B, C, Ld, D],
    every row real) as B x C packed pairs: query b against document b * C + c, max_q_len given."""
    B, C, Ld, D = docs.shape
    Lq = q.shape[1]
    qoffs = torch.arange(0, (B + 1) * Lq, Lq, device=q.device)
    doffs = torch.arange(0, (B * C + 1) * Ld, Ld, device=q.device)
    pq = torch.arange(B, device=q.device).repeat_interleave(C)
    pd = torch.arange(B * C, device=q.device)
    flat_q, flat_d = q.reshape(B * Lq, D), docs.reshape(B * C * Ld, D)
    extra = {} if scales is None else {"document_scales": scales.reshape(B * C * Ld)}
    return lambda: ms.score_pairs_packed(flat_q, qoffs, flat_d, doffs, pq, pd, max_q_len=Lq, **extra)


def scorer(ms, surface, q, ql, d, dl, fmt):
    """A no-argument call scoring every (query b, candidate c) pair of the grid, padded or
    packed, with the documents in `fmt`."""
    docs, scales = (d.half(), None) if fmt == "float16" else ms.quantize_documents(d, fmt)
    if surface == "packed":
        return packed_call(ms, q, docs, scales)
    extra = {} if scales is None else {"document_scales": scales}
    return lambda: ms.score_candidates_padded(q, docs, ql, dl, **extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="64,128,256,384,512,768,1024")
    ap.add_argument("--grid", default="8,16", help="B,C (queries, candidates each); 8,16 is LongDocStress's")
    ap.add_argument("--lq", type=int, default=64)
    ap.add_argument("--surface", choices=("padded", "packed"), default="padded",
                    help="packed: the same tokens as B queries, B x C documents and B x C pairs (max_q_len given)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import kernels

    ms = kernels.get_local_kernel(ROOT, backend="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    (B, C), Lq, D = map(int, args.grid.split(",")), args.lq, 128
    lengths = [int(v) for v in args.lengths.split(",")]
    x = torch.zeros(16, device="cuda")
    rows = [{"torch add_ (floor)": round(graph_time_ms(lambda: x.add_(1.0)) * 1e3, 2)}]
    print(json.dumps(rows[0]), flush=True)
    q = torch.nn.functional.normalize(torch.randn(B, Lq, D, device="cuda", generator=gen), dim=-1).half()
    ql = torch.full((B,), Lq, device="cuda", dtype=torch.int32)
    times = {f: [] for f in FORMATS}
    for ld in lengths:
        d = torch.nn.functional.normalize(torch.randn(B, C, ld, D, device="cuda", generator=gen), dim=-1)
        dl = torch.full((B, C), ld, device="cuda", dtype=torch.int32)
        row = {"Ld": ld}
        for f in FORMATS:
            call = scorer(ms, args.surface, q, ql, d, dl, f)
            row[f] = round(graph_time_ms(call) * 1e3, 2)
            times[f].append(row[f])
        rows.append(row)
        print(json.dumps(row), flush=True)
    for f in FORMATS:
        fixed, per_row = fit(lengths, times[f])
        line = {"format": f, "fixed_us": round(fixed, 2), "us_per_1024_rows": round(per_row * 1024, 2)}
        rows.append(line)
        print(json.dumps(line), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
