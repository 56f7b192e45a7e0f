"""Fixed cost of small padded calls: GPU time per call (CUDA graphs, us) of maxsim by its default
rule, with the mma.sync or the sm_90a kernel forced and without PDL, against late-interaction-
kernels, over candidates per query (C) and document lengths (Ld) at B 32, Lq 32, dim 128, and a
one-element torch op as the graph's floor. Run on the GPU machine after a build:

  python3 tools/device/probe_small.py
"""
import os, sys, json
from pathlib import Path
import torch
sys.path.insert(0, "tools/device"); sys.path.insert(0, "benchmarks")
from bench_compressed import graph_time_ms
import kernels
ms = kernels.get_local_kernel(Path("."), backend="cuda")
import late_interaction_kernels as lik
gen = torch.Generator(device="cuda").manual_seed(0)
x = torch.zeros(16, device="cuda")
print(json.dumps({"torch add_ (floor)": round(graph_time_ms(lambda: x.add_(1.0)) * 1e3, 2)}))
for C, Ld in ((1, 180), (2, 180), (5, 180), (10, 180), (20, 180), (10, 64), (10, 32), (10, 512)):
    B, Lq, D = 32, 32, 128
    q = torch.nn.functional.normalize(torch.randn(B, Lq, D, device="cuda", generator=gen), dim=-1).half()
    d = torch.nn.functional.normalize(torch.randn(B, C, Ld, D, device="cuda", generator=gen), dim=-1).half()
    ql = torch.full((B,), Lq, device="cuda", dtype=torch.int32)
    dl = torch.full((B, C), Ld, device="cuda", dtype=torch.int32)
    qm = torch.ones(B, Lq, device="cuda", dtype=torch.bool)
    dm = torch.ones(B, C, Ld, device="cuda", dtype=torch.bool)
    row = {"C": C, "Ld": Ld}
    for name, env in (("default", {}), ("mma", {"MAXSIM_CUDA_FORCE_MMA_SYNC": "1"}), ("hopper", {"MAXSIM_CUDA_HOPPER_PADDED": "1"}),
                      ("nopdl", {"MAXSIM_CUDA_PDL": "0"})):
        os.environ.update(env)
        row[name] = round(graph_time_ms(lambda: ms.score_candidates_padded(q, d, ql, dl)) * 1e3, 2)
        for k in env: os.environ.pop(k)
    row["lik"] = round(graph_time_ms(lambda: lik.maxsim(q, d, None, None)) * 1e3, 2)
    print(json.dumps(row), flush=True)
