"""Whether a padded call's GPU time depends on its documents staying in L2 between CUDA-graph
replays: each variant timed calling the same inputs every time (`same`, what the probes and
compare.py measure) and rotating over three document sets (`rot3`, each call's documents come
from DRAM once the set is larger than half the L2). B 32, Lq 32, dim 128, fp16. On the GPU
machine after a build:

  python3 tools/device/probe_l2.py [--shapes C:Ld,...] [--variants default,nopdl,lik]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "device"))
from bench_compressed import graph_time_ms, knobs

VARIANTS = {"default": {}, "nopdl": {"MAXSIM_CUDA_PDL": "0"}, "mma": {"MAXSIM_CUDA_FORCE_MMA_SYNC": "1"},
            "hopper": {"MAXSIM_CUDA_HOPPER_PADDED": "1"},
            "hopper3": {"MAXSIM_CUDA_HOPPER_PADDED": "1", "MAXSIM_CUDA_HOPPER_PADDED_CTAS": "3"}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="10:512,5:1024,10:448,10:320,10:768")
    ap.add_argument("--variants", default="default,nopdl,lik")
    ap.add_argument("--sets", type=int, default=3, help="document sets rotated over (rotN)")
    args = ap.parse_args()
    import kernels

    ms = kernels.get_local_kernel(ROOT, backend="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, Lq, D = 32, 32, 128
    for C, Ld in (tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")):
        q = torch.nn.functional.normalize(torch.randn(B, Lq, D, device="cuda", generator=gen), dim=-1).half()
        docs = [torch.nn.functional.normalize(torch.randn(B, C, Ld, D, device="cuda", generator=gen), dim=-1).half()
                for _ in range(args.sets)]
        ql = torch.full((B,), Lq, device="cuda", dtype=torch.int32)
        dl = torch.full((B, C), Ld, device="cuda", dtype=torch.int32)
        row = {"C": C, "Ld": Ld, "doc_MB": round(docs[0].numel() * 2 / 1e6, 1)}
        for name in args.variants.split(","):
            if name == "lik":
                import late_interaction_kernels as lik

                call, env = (lambda d: lik.maxsim(q, d, None, None)), {}  # noqa: B023
            else:
                call, env = (lambda d: ms.score_candidates_padded(q, d, ql, dl)), VARIANTS[name]  # noqa: B023
            with knobs(env):
                row[name + "_same"] = round(graph_time_ms(lambda: call(docs[0])) * 1e3, 2)  # noqa: B023
                row[name + f"_rot{args.sets}"] = round(graph_time_ms(lambda: [call(d) for d in docs]) * 1e3 / args.sets, 2)  # noqa: B023
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
