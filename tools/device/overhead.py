"""Where a small training step's time goes: eager vs CUDA-graph replay (GPU-only time) vs
host time per call, plus a profiler table. Contrastive (Nq=Nb=32, Lq=32, Ld=80, fp16)."""
import sys
import time
from pathlib import Path

import kernels
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
maxsim = kernels.get_local_kernel(ROOT)
dev = "cuda"
shape = dict(nq=32, nb=32, lq=32, ld=80)
if len(sys.argv) > 1:
    shape.update(nq=64, nb=64, ld=128)
nq, nb, lq, ld, dim = shape["nq"], shape["nb"], shape["lq"], shape["ld"], 128
q = torch.nn.functional.normalize(torch.randn(nq, lq, dim, device=dev), dim=-1).half().requires_grad_()
d = torch.nn.functional.normalize(torch.randn(nb * ld, dim, device=dev), dim=-1).half().requires_grad_()
off = torch.arange(0, nb * ld + 1, ld, device=dev, dtype=torch.int32)
g = torch.randn(nq, nb, device=dev)
ops = maxsim._ops.ops


def step():
    s = maxsim.score_contrastive_train(q, d, off)
    (s * g).sum().backward()


def raw_fwd_bwd():
    s, a = ops.contrastive_forward(q.detach(), d.detach(), off, None, True)
    ops.contrastive_backward(g, q.detach(), d.detach(), off, None, a, True, True)


def raw_fwd():
    ops.contrastive_forward(q.detach(), d.detach(), off, None, False)


def events(fn, n=200):
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[n // 2] * 1e3


def host(fn, n=500):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        fn()
    host_us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host_us


def graph(fn):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        fn()
    return events(gr.replay)


for name, fn in [("train step (API)", step), ("raw fwd+bwd ops", raw_fwd_bwd), ("raw fwd op", raw_fwd)]:
    print(f"{name:20s} events {events(fn):7.1f} us   host/call {host(fn):7.1f} us   graph {graph(fn):7.1f} us")

with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
