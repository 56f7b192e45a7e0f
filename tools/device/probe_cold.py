"""One rerank call as a pipeline meets it: right after a different kernel that evicts the L2
(a 512 MB fill), so the documents come from DRAM and the call starts behind another launch;
GPU time between CUDA events around the call alone (the fill is long enough for the host to
queue the call behind it, so the host's launch cost is not in the interval). Beside it, the
call back to back (eager, ten in a row: host-bound for the peers, whose launches cost more
than their kernels at these sizes). maxsim with programmatic launches on and off, and both
peers. Run on the GPU machine after a build:

  python3 tools/device/probe_cold.py [--shapes D:Ld:C,...] [--repeats 30]

Prints one JSON line per shape (us, medians) and writes $OUT/probe_cold.json. It answers
whether an Nsight Compute launch's duration (one launch, replayed in isolation) says anything
about a user's call that graph replay of the same inputs cannot see.
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
from bench_compressed import knobs, padded_rerank_peers  # noqa: E402


def event_us(fn, before=None, inner=1):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if before is not None:
        before()
    start.record()
    for _ in range(inner):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / inner


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128:256:50,128:180:50,256:256:50,128:180:10",
                    help="dim:Ld:candidates, B 32 and Lq 32 each")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    import kernels
    ms = kernels.get_local_kernel(ROOT, backend="cuda")
    peers = padded_rerank_peers()
    scratch = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, Lq = 32, 32
    rows = []
    for spec in args.shapes.split(","):
        D, Ld, C = (int(x) for x in spec.split(":"))
        q = torch.nn.functional.normalize(torch.randn(B, Lq, D, device="cuda", generator=gen), dim=-1).half()
        d = torch.nn.functional.normalize(torch.randn(B, C, Ld, D, device="cuda", generator=gen), dim=-1).half()
        ql = torch.full((B,), Lq, device="cuda", dtype=torch.int32)
        dl = torch.full((B, C), Ld, device="cuda", dtype=torch.int32)
        calls = {"maxsim": (lambda: ms.score_candidates_padded(q, d, ql, dl), {}),  # noqa: B023
                 "maxsim_pdl_off": (lambda: ms.score_candidates_padded(q, d, ql, dl),  # noqa: B023
                                    {"MAXSIM_CUDA_PDL": "0"})}
        for name, fn in peers.items():
            calls[name] = ((lambda fn=fn: fn(q, d)), {})  # noqa: B023
        row = {"dim": D, "Ld": Ld, "B": B, "C": C, "doc_MB": round(d.numel() * 2 / 1e6, 2)}
        for name, (fn, env) in calls.items():
            with knobs(env):
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                cold = [event_us(fn, before=lambda: scratch.fill_(1)) for _ in range(args.repeats)]
                warm = [event_us(fn, inner=10) for _ in range(args.repeats)]
            row[name + "_cold"] = round(statistics.median(cold), 2)
            row[name + "_back_to_back"] = round(statistics.median(warm), 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path(os.environ.get("OUT", "/tmp/out")) / "probe_cold.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
