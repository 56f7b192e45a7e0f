"""The full-length rerank rows by dim (RerankD256 ... D1024 of compare.py and their dim-128 twin):
GPU time per call (CUDA graphs, us) of maxsim by its default rule and with each knob of the
sm_90a strided launcher, against late-interaction-kernels and flash-maxsim, in alternating
rounds in one process. Which shape wins where says whether these rows are limited by the
launcher's choice or by the kernel. Run on the GPU machine after a build:

  python3 tools/device/probe_wide.py [--dims 128,256,512,768,1024] [--lengths 180,256] [--rounds 3]

Prints one JSON line per (dim, Ld) and writes $OUT/probe_wide.json. With --once, each call of
each shape runs once after a warm-up, no graphs and no timing: the form to run under Nsight
Compute, whose kernel filter picks maxsim's kernel (or a peer's, named by an unfiltered run), e.g.

  ncu --kernel-name regex:maxsim_forward_hopper --launch-skip 1 --launch-count 1 \
      python3 tools/device/probe_wide.py --dims 256 --lengths 180 --once default
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "device"))
from bench_compressed import graph_time_ms, knobs, padded_rerank_peers

# name -> environment of the call (read by the launchers at capture time)
VARIANTS = {
    "default": {},
    "one_cta": {"MAXSIM_CUDA_HOPPER_PADDED_CTAS": "1"},
    # three CTAs an SM at 64-row tiles where the tree has them (hopper_three_ctas.patch); a tree
    # without them runs its two-CTA shape under this knob
    "three_ctas": {"MAXSIM_CUDA_HOPPER_PADDED_CTAS": "3"},
    "streamed": {"MAXSIM_CUDA_HOPPER_RESIDENT": "0"},  # the two-CTA streamed shape at any dim
    "mma_sync": {"MAXSIM_CUDA_FORCE_MMA_SYNC": "1"},
    # 128 < dim <= 256: the resident 256-column shapes (two CTAs of one query buffer, one CTA
    # of two; the default rule takes the latter for calls of many steps)
    "resident2": {"MAXSIM_CUDA_HOPPER_RESIDENT": "1", "MAXSIM_CUDA_HOPPER_PADDED_CTAS": "2"},
    "resident1": {"MAXSIM_CUDA_HOPPER_RESIDENT": "1", "MAXSIM_CUDA_HOPPER_PADDED_CTAS": "1"},
}
# the same MMAs in the same order as the default's: bit for bit its scores
SAME_BITS = ("one_cta", "three_ctas", "resident2", "resident1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="128,256,512,768,1024")
    ap.add_argument("--lengths", default="180,256")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--cands", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--once", metavar="NAMES", help="comma-separated variants / peers: each called "
                    "twice (a warm-up, then the call to profile), nothing timed")
    args = ap.parse_args()
    import kernels
    ms = kernels.get_local_kernel(ROOT, backend="cuda")
    peers = padded_rerank_peers()
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, C, Lq = args.batch, args.cands, 32
    rows = []
    for D in (int(x) for x in args.dims.split(",")):
        for Ld in (int(x) for x in args.lengths.split(",")):
            q = torch.nn.functional.normalize(torch.randn(B, Lq, D, device="cuda", generator=gen), dim=-1).half()
            d = torch.nn.functional.normalize(torch.randn(B, C, Ld, D, device="cuda", generator=gen), dim=-1).half()
            ql = torch.full((B,), Lq, device="cuda", dtype=torch.int32)
            dl = torch.full((B, C), Ld, device="cuda", dtype=torch.int32)
            calls = {name: (lambda: ms.score_candidates_padded(q, d, ql, dl), env)  # noqa: B023
                     for name, env in VARIANTS.items()
                     if not (name == "streamed" and D > 128)}
            for name, fn in peers.items():
                calls[name] = ((lambda fn=fn: fn(q, d)), {})  # noqa: B023
            if args.once:
                for name in args.once.split(","):
                    fn, env = calls[name]
                    with knobs(env):
                        fn()
                        fn()
                    torch.cuda.synchronize()
                    print(name, "called", flush=True)
                continue
            ref = ms.score_candidates_padded(q, d, ql, dl)
            for name, (fn, env) in calls.items():  # every variant scores the same (within fp32 order)
                with knobs(env):
                    graph_time_ms(fn)  # the graph path, once
                    out = fn()
                if name in SAME_BITS and D > 128:
                    assert torch.equal(out, ref), (D, Ld, name)
                err = (out.float() - ref.float()).abs().max().item()
                assert err < 1e-2, (D, Ld, name, err)
            samples = {name: [] for name in calls}
            for _ in range(args.rounds):
                for name, (fn, env) in calls.items():
                    with knobs(env):
                        samples[name].append(graph_time_ms(fn) * 1e3)
            copy_us = graph_time_ms(lambda: d.clone()) * 1e3  # noqa: B023  (reads and writes the documents)
            row = {"dim": D, "Ld": Ld, "B": B, "C": C, "doc_MB": round(d.numel() * 2 / 1e6, 2),
                   "clone_us": round(copy_us, 2)}
            row.update({name: round(statistics.median(v), 2) for name, v in samples.items()})
            row["best_peer_over_default"] = round(min(row.get(p, float("inf")) for p in peers) / row["default"], 3) \
                if peers else None
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.once:
        return
    out = Path(os.environ.get("OUT", "/tmp/out")) / "probe_wide.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
