"""PLAID's centroid-only score: maxsim.score_centroids against late-interaction-kernels'
`plaid_approx_score`, GPU-only (CUDA graphs) and eager, with each call's two stages apart.

late-interaction-kernels takes the query-centroid table ([n_centroids, Lq] float32) as its
input; maxsim.score_centroids takes the queries and the centroids and builds the table itself.
So each row times both calls from the same inputs (for late-interaction-kernels, the table made
by the cheapest exact torch route: a float16 matmul with float32 output where torch has it,
else float32 copies and a float32 matmul) and both gathers given the same table.

Run on the device from the repository root after a CUDA build:
  python3 tools/device/bench_centroids.py [--json PATH]
and for Nsight Compute, one gather of each library per row (the table given):
  ncu -k regex:'centroid_score|plaid' --metrics ... python3 tools/device/bench_centroids.py --once
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compressed import graph_time_ms  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def eager_ms(fn, reps=50, warmup=3):
    """CUDA-event-timed median of single calls, host cost included: benchmarks/compare.py's
    eager timing, so "eager" means here what it means in its tables."""
    from compare import time_ms

    return time_ms(fn, "cuda", warmup, reps)


def exact_table(centroids, query):
    """[n_centroids, Lq] float32 with float32 accumulation, the cheapest way torch offers."""
    try:
        return torch.mm(centroids, query.T, out_dtype=torch.float32)
    except (TypeError, RuntimeError):
        return centroids.float() @ query.float().T


def rows():
    # name, queries, candidates, Lq, Ld, n_centroids
    yield "PLAID 1 x 1000 x 300, 4k centroids", 1, 1000, 32, 300, 4096
    yield "PLAID 1 x 1000 x 300, 64k centroids", 1, 1000, 32, 300, 65536
    yield "PLAID 1 x 100 x 300, 64k centroids", 1, 100, 32, 300, 65536
    yield "PLAID 1 x 4000 x 120, 256k centroids", 1, 4000, 32, 120, 262144


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--repo", type=Path, default=ROOT, help="the tree whose CUDA build is timed")
    parser.add_argument("--once", action="store_true", help="one gather call of each library per row "
                        "(the table given), untimed: for ncu")
    parser.add_argument("--no-parts", action="store_true", help="the whole call only (trees without "
                        "ops.centroid_table)")
    args = parser.parse_args()
    import kernels

    ms = kernels.get_local_kernel(args.repo, backend="cuda")
    ops = ms._api.ops
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        import late_interaction_kernels.plaid as lik
    except Exception as e:  # noqa: BLE001
        lik = None
        print("late-interaction-kernels not importable:", e)
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for name, nq, C, Lq, Ld, nc in rows():
        D = 128
        centroids = torch.nn.functional.normalize(torch.randn(nc, D, device="cuda", generator=gen), dim=-1).half()
        q = torch.nn.functional.normalize(torch.randn(nq, Lq, D, device="cuda", generator=gen), dim=-1).half()
        codes = torch.randint(0, nc, (C * Ld,), device="cuda", generator=gen, dtype=torch.int32)
        offs = torch.arange(0, C + 1, device="cuda", dtype=torch.int64) * Ld
        row = {"workload": name, "Nq": nq, "C": C, "Lq": Lq, "Ld": Ld, "D": D, "n_centroids": nc,
               "table_MB_read": C * Ld * Lq * 4 / 1e6}
        full = lambda: ms.score_centroids(q, codes, offs, centroids)  # noqa: E731
        if args.once:
            table = exact_table(centroids, q[0])
            ops.centroid_forward(table.unsqueeze(0), codes, offs, None, None, None)
            if lik is not None:
                lik.plaid_approx_score(table, codes.reshape(C, Ld), torch.full((C,), Ld, device="cuda"))
            torch.cuda.synchronize()
            print(name, "called once", flush=True)
            continue
        row["maxsim_ms"] = graph_time_ms(full)
        row["maxsim_eager_ms"] = eager_ms(full)
        table = exact_table(centroids, q[0]).unsqueeze(0).contiguous()
        row["maxsim_gather_ms"] = graph_time_ms(lambda: ops.centroid_forward(table, codes, offs, None, None, None))
        row["table_TBps_in_gather"] = row["table_MB_read"] / 1e6 / row["maxsim_gather_ms"] * 1e3
        if not args.no_parts:
            row["maxsim_table_ms"] = graph_time_ms(lambda: ops.centroid_table(q, centroids))
        ours = full()[0]
        if lik is not None and not args.no_parts:
            t2 = exact_table(centroids, q[0])
            c2 = codes.reshape(C, Ld)
            lens = torch.full((C,), Ld, device="cuda", dtype=torch.int64)
            try:
                given = lambda: lik.plaid_approx_score(t2, c2, lens)  # noqa: E731
                with_table = lambda: lik.plaid_approx_score(exact_table(centroids, q[0]), c2, lens)  # noqa: E731
                row["lik_given_table_ms"] = graph_time_ms(given)
                row["lik_ms"] = graph_time_ms(with_table)
                row["lik_eager_ms"] = eager_ms(with_table)
                row["max_abs_diff_vs_lik"] = float((ours - given()).abs().max())
                row["speedup_vs_lik"] = row["lik_ms"] / row["maxsim_ms"]
                row["speedup_vs_lik_eager"] = row["lik_eager_ms"] / row["maxsim_eager_ms"]
                row["gather_speedup_vs_lik_given_table"] = row["lik_given_table_ms"] / row["maxsim_gather_ms"]
            except Exception as e:  # noqa: BLE001
                row["lik_error"] = repr(e)[:300]
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": results}, indent=1))


if __name__ == "__main__":
    main()
