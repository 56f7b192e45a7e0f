"""CPU time of this tree's build against another tree's, in one process, calls alternating.

    python3 tools/cpu_ab.py --base /path/to/other/checkout \
        --workloads SingleQueryRerank --documents plain,residual1,residual2,residual4

Both trees must hold a CPU build (`python3 tools/build.py --backend cpu` in each). Every row
of benchmarks/workloads.py's CPU shape is built once (compressed from the same float
documents by this tree's code), then each round times --calls calls of the base build and of
this one (best of them, in ms), for --rounds rounds; a row prints the best round of each, and
whether the two builds' scores are bitwise equal. On a small shared machine run-to-run spread
is tens of percent: the alternation is what makes the two columns comparable.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import workloads as W  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def best_ms(fn, calls):
    fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def for_kernel(x: W.Inputs, kernel) -> W.Inputs:
    """x with its residual codec rebuilt as `kernel`'s own class (each build checks its own)."""
    if "codec" not in x.t:
        return x
    c = x.codec
    codec = kernel.ResidualCodec(c.centroids, c.bucket_weights, c.nbits, c.normalize)
    return W.Inputs(x.workload, x.shape, x.dtype, x.layout, dict(x.t, codec=codec),
                    documents_format=x.documents_format)


def main():
    import kernels

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the other tree (with its CPU build)")
    p.add_argument("--workloads", default="SingleQueryRerank")
    p.add_argument("--documents", default="plain", help="plain and/or workloads.ALL_FORMATS, comma-separated")
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    p.add_argument("--layout", default="full")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    new = kernels.get_local_kernel(ROOT, backend="cpu")
    old = kernels.get_local_kernel(Path(args.base).resolve(), backend="cpu")
    print(f"base {args.base} -> {ROOT}; {torch.get_num_threads()} threads; ms, best of {args.calls} calls, "
          f"best of {args.rounds} alternating rounds", flush=True)
    for name in args.workloads.split(","):
        w = W.WORKLOADS[name]
        for dt in args.dtypes.split(","):
            x = W.build_inputs(w, "cpu", DTYPES[dt], args.layout)
            for fmt in args.documents.split(","):
                r = x if fmt == "plain" else W.compress(x, new, fmt)
                r_old, r_new = for_kernel(r, old), for_kernel(r, new)
                a, b = [], []
                for _ in range(args.rounds):
                    a.append(best_ms(lambda: W.maxsim_call(old, r_old), args.calls))
                    b.append(best_ms(lambda: W.maxsim_call(new, r_new), args.calls))
                same = torch.equal(W.maxsim_call(old, r_old), W.maxsim_call(new, r_new))
                print(f"  {name:<20} {args.layout:<6} {dt:<9} {fmt:<10} {min(a):8.2f} -> {min(b):8.2f}"
                      f"  ({min(b) / min(a):.2f}x){'' if same else '  scores differ'}", flush=True)


if __name__ == "__main__":
    main()
