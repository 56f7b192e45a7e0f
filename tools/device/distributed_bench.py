"""Scaling of maxsim.distributed over GPUs: run under torchrun, one process per GPU
(`python3 tools/device/cli.py bench distributed` runs it on 1 and 2 GPUs and prints the table).

    torchrun --nproc-per-node N tools/device/distributed_bench.py --units U [U ...] --json F
    python3 tools/device/distributed_bench.py --report F1 F2 ...   # the table
    (--smoke: tiny shapes on the CPU with gloo, to check the script itself without a GPU)

A "unit" is one rank's worth of the issue's shapes (bf16, D 128, document lengths uniform
in [100, 260], mean 180):
  train:  512 queries (Lq 32) and 512 documents; one step = score_contrastive_train_global,
          cross-entropy, backward (gather, forward, both gradients, gradient return);
  corpus: 32 queries (Lq 32) against 10,000 documents; one call = search_sharded, k = 100.
With U units on N processes each process holds U / N of them: U = N is weak scaling (the
issue's "per rank" sizes), U = 2 on one process is the 2-GPU global batch on one GPU
(the same step: every query against every document of the global batch).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
DIM, LQ, LD_LOW, LD_HIGH = 128, 32, 100, 260
SIZES = dict(train_queries=512, train_docs=512, corpus_queries=32, corpus_docs=10_000, k=100)
SMOKE_SIZES = dict(train_queries=8, train_docs=8, corpus_queries=4, corpus_docs=300, k=10)


def _documents(gen, n, device):
    lengths = torch.randint(LD_LOW, LD_HIGH + 1, (n,), generator=gen, device=device)
    offsets = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    tokens = F.normalize(torch.randn(int(offsets[-1]), DIM, generator=gen, device=device), dim=-1)
    return tokens.to(torch.bfloat16), offsets


def _queries(gen, n, device):
    return F.normalize(torch.randn(n, LQ, DIM, generator=gen, device=device), dim=-1).to(torch.bfloat16)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, steps, warmup, device):
    """Seconds per call: wall time of `steps` calls between barriers, slowest rank."""
    for _ in range(warmup):
        fn()
    _sync(device)
    if dist.is_initialized():
        dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    elapsed = torch.tensor([time.perf_counter() - start], device=device)
    if dist.is_initialized():
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item() / steps


def run(ms, units: int, world: int, rank: int, device, steps: int, sizes: dict) -> list[dict]:
    share = units // world
    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    rows = []

    q = _queries(gen, share * sizes["train_queries"], device).requires_grad_()
    d, offsets = _documents(gen, share * sizes["train_docs"], device)
    d.requires_grad_()

    def train_step():
        q.grad = d.grad = None
        out = ms.score_contrastive_train_global(q, d, offsets)
        targets = torch.arange(q.shape[0], device=device) + out.document_start
        loss = F.cross_entropy(out.scores.float(), targets, reduction="sum") / out.total_queries
        loss.backward()

    seconds = _time(train_step, steps, 3, device)
    rows.append(dict(workload="train", gpus=world, units=units, ms=seconds * 1e3,
                     queries=units * sizes["train_queries"], documents=units * sizes["train_docs"]))
    del q, d, offsets

    queries = _queries(torch.Generator(device=device).manual_seed(99), sizes["corpus_queries"], device)
    corpus, corpus_offsets = _documents(gen, share * sizes["corpus_docs"], device)

    def search():
        ms.search_sharded(queries, corpus, corpus_offsets, sizes["k"], dst=0)

    seconds = _time(search, steps, 3, device)
    rows.append(dict(workload="corpus", gpus=world, units=units, ms=seconds * 1e3,
                     queries=sizes["corpus_queries"], documents=units * sizes["corpus_docs"]))
    return rows


def _pairs(r: dict) -> int:
    """(query, document) pairs scored per step: every query against every global document."""
    return r["queries"] * r["documents"]


def report(paths: list[str]) -> None:
    """Scaling = 1-GPU time / N-GPU time for the same global batch (the same step, split
    over N GPUs), and N-GPU pairs/s / 1-GPU pairs/s for the same batch per GPU (weak
    scaling; in training the work per GPU then grows with N, since each query meets every
    rank's documents, so pairs/s, not steps/s, is the measure that can scale)."""
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line]
    one_gpu = {(r["workload"], r["units"]): r for r in rows if r["gpus"] == 1}
    print("| workload | GPUs | global batch | ms per step | steps/s | pairs/s | "
          "scaling, same global batch | scaling, same batch per GPU |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["workload"], r["gpus"], r["units"])):
        same_global = one_gpu.get((r["workload"], r["units"]))
        same_per_gpu = one_gpu.get((r["workload"], r["units"] // r["gpus"]))
        strong = f"{same_global['ms'] / r['ms']:.2f}x" if same_global and r["gpus"] > 1 else "-"
        weak = (f"{(_pairs(r) / r['ms']) / (_pairs(same_per_gpu) / same_per_gpu['ms']):.2f}x"
                if same_per_gpu and r["gpus"] > 1 else "-")
        print(f"| {r['workload']} | {r['gpus']} | {r['queries']} q x {r['documents']} docs | "
              f"{r['ms']:.3f} | {1e3 / r['ms']:.1f} | {_pairs(r) / r['ms'] * 1e3:.3g} | {strong} | {weak} |")
    print(report.__doc__.replace("\n    ", "\n"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--units", type=int, nargs="+", default=[1])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json")
    parser.add_argument("--report", nargs="+")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.report:
        return report(args.report)

    import kernels

    if args.smoke:
        device = torch.device("cpu")
        if "RANK" in os.environ:
            dist.init_process_group("gloo")
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        if "RANK" in os.environ:
            dist.init_process_group("nccl", device_id=device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    ms = kernels.get_local_kernel(ROOT, backend=device.type)
    rows = []
    for units in args.units:
        if units % world:
            raise SystemExit(f"--units {units} does not split over {world} processes")
        rows += run(ms, units, world, rank, device, args.steps, SMOKE_SIZES if args.smoke else SIZES)
    if rank == 0:
        for r in rows:
            print(json.dumps(r), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
