"""Host cost of a call: microseconds per call of every entry point and form on a tiny shape,
beside a tiny torch.mm, the naive einsum and both peers, and, on CUDA, eager time against
GPU-only time (CUDA-graph replay) for the small shapes a reranking service sends.

A reranking service scores one query at a time, so its latency is this path, not the
kernel. Host time = N back-to-back calls, then one synchronisation, divided by N; the best
of five runs (the floor the code allows, not the noise of the machine). Single-threaded on
the CPU (torch.set_num_threads(1)) so the op and torch.mm are timed alike.

    python3 benchmarks/call_path.py --device cpu  [--json benchmarks/results/cpu_call_path.json]
    python3 benchmarks/call_path.py --device cuda [--json benchmarks/results/h100_call_path.json]
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare as C  # noqa: E402
import workloads as W  # noqa: E402

D = 128
# (name, surface, shape): tiny = one query, one document of 32 x 32 tokens; the 100-candidate
# rerank is SmallRerank's document length.
SHAPES = {
    "Tiny": W.Workload("Tiny", "padded", False, dict(B=1, C=1, Lq=32, Ld=32), dict(B=1, C=1, Lq=32, Ld=32), "full"),
    "TinyPacked": W.Workload("TinyPacked", "packed", False, dict(B=1, C=1, Lq=32, Ld=32),
                             dict(B=1, C=1, Lq=32, Ld=32), "full"),
    "TinyContrastive": W.Workload("TinyContrastive", "contrastive", False, dict(Nq=1, Nb=1, Lq=32, Ld=32),
                                  dict(Nq=1, Nb=1, Lq=32, Ld=32), "full"),
    "OneBy100": W.Workload("OneBy100", "padded", False, dict(B=1, C=100, Lq=32, Ld=180),
                           dict(B=1, C=100, Lq=32, Ld=180), "full"),
}
FORMS = ("", "_with_argmax", "_train")


def host_us(fn, device, n, runs=5):
    """Best over `runs` of (n back-to-back calls + one sync) / n, in microseconds."""
    for _ in range(max(20, n // 50)):
        fn()
    C.sync(device)
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        C.sync(device)
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def entry_points(kernel, x: W.Inputs):
    """{label: callable} for every form of the surface x belongs to (and of contrastive over
    padded documents, for the contrastive shape)."""
    w = x.workload
    out = {}
    for form in FORMS:
        train = form == "_train"
        if w.surface == "padded":
            args = lambda q, d: (q, d, x.query_lengths, x.doc_lengths)  # noqa: E731
            fn, q0, d0 = "score_candidates_padded", x.queries, x.documents
        elif w.surface == "packed":
            args = lambda q, d: (q, x.query_offsets, d, x.document_offsets,  # noqa: E731
                                 x.pair_query_ids, x.pair_document_ids)
            fn, q0, d0 = "score_pairs_packed", x.queries_packed, x.documents_packed
        else:
            args = lambda q, d: (q, d, x.document_offsets)  # noqa: E731
            fn, q0, d0 = "score_contrastive", x.queries, x.documents_packed
        kw = dict(max_q_len=x.shape["Lq"]) if w.surface == "packed" else {}
        call = getattr(kernel, fn + form)
        if train:
            q, d = q0.detach().requires_grad_(), d0.detach().clone().requires_grad_()

            def step(call=call, q=q, d=d, kw=kw):
                call(*args(q, d), **kw).sum().backward()
            out[fn + form + " (fwd+bwd)"] = step
        else:
            # Bound once, as the baselines are, so the timing holds the call and not the harness.
            out[fn + form] = functools.partial(call, *args(q0, d0), **kw)
    return out


def centroid_calls(kernel, device, dtype):
    """PLAID's centroid-only score on the tiny shape: one 32-token query against one document of
    32 codes over 256 centroids, every pair and the same pair listed."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 32, D, generator=g).to(device, dtype)
    centroids = torch.randn(256, D, generator=g).to(device, dtype)
    codes = torch.randint(0, 256, (32,), generator=g).to(device)
    offsets = torch.tensor([0, 32], device=device)
    pair = torch.zeros(1, dtype=torch.int64, device=device)
    call = kernel.score_centroids
    return {"maxsim score_centroids": functools.partial(call, q, codes, offsets, centroids),
            "maxsim score_centroids (listed pair)": functools.partial(
                call, q, codes, offsets, centroids, pair_query_ids=pair, pair_document_ids=pair)}


def baselines(x: W.Inputs, kernel, peers=True):
    dev = x.device
    a = torch.randn(32, D, device=dev, dtype=x.dtype)
    b = torch.randn(D, 32, device=dev, dtype=x.dtype)
    out = {"torch.mm 32x128 @ 128x32": functools.partial(torch.mm, a, b),
           "naive einsum": C.make_plain_impl("naive", x, kernel)}
    for peer in ("LIK", "FM") if peers else ():
        try:
            out[peer] = C.make_plain_impl(peer, x, kernel)
            out[peer]()
        except Exception as e:  # noqa: BLE001 - a peer that is missing or cannot run the shape
            out.pop(peer, None)
            print(f"  {peer}: n/a ({C._reason(e)})")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=2000, help="back-to-back calls per run")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--repo", default=str(C.REPO), help="checkout whose build to time (e.g. a base tree)")
    ap.add_argument("--no-peers", action="store_true", help="skip the peers (their first calls tune)")
    args = ap.parse_args()
    device = args.device
    torch.set_num_threads(1) if device == "cpu" else None
    kernel = C.load_kernel(device, Path(args.repo))
    dtype = torch.float32 if device == "cpu" else torch.float16
    rows = []
    print(f"device {device}" + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else "")
          + f", torch {torch.__version__}, {dtype}; host us per call (best of 5 x {args.calls} calls)")
    for name, w in SHAPES.items():
        x = W.build_inputs(w, device, dtype=dtype)
        print(f"{name}: {w.describe(w.shape)}")
        fns = {("maxsim " + k): v for k, v in entry_points(kernel, x).items()}
        if name == "Tiny":
            fns.update(centroid_calls(kernel, device, dtype))
        if name in ("Tiny", "OneBy100", "TinyPacked"):
            fns.update(baselines(x, kernel, peers=not args.no_peers))
        for label, fn in fns.items():
            row = dict(shape=name, call=label, host_us=host_us(fn, device, args.calls))
            if device == "cuda" and "fwd+bwd" not in label and name in ("Tiny", "OneBy100"):
                try:
                    eager = C.time_ms(fn, device, 20, 200, stat=statistics.median)
                    ref = fn()
                    ref = ref[0] if isinstance(ref, tuple) else ref
                    g = C.graph_times(fn, 20, 200, ref.float(), calls=8)
                    row.update(eager_us=eager * 1e3, graph_us=g["graph_ms"] * 1e3)
                except Exception as e:  # noqa: BLE001 - e.g. a peer that cannot be captured
                    row.update(graph_error=C._reason(e))
            extra = "".join(f"  {k} {row[k]:7.1f}" for k in ("eager_us", "graph_us") if k in row)
            print(f"  {label:58s} host {row['host_us']:7.1f} us{extra}", flush=True)
            rows.append(row)
    if args.json:
        meta = dict(device=device, torch=torch.__version__, dtype=str(dtype), calls=args.calls, repo=args.repo,
                    gpu=torch.cuda.get_device_name() if device == "cuda" else None)
        Path(args.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
        print("wrote", args.json)


if __name__ == "__main__":
    main()
