"""Repeats test_argmax_matches_cpu_backend's calls (float32 queries: the FFMA kernels with
int8 / e4m3 documents) many times, with the host's cores busy, and reports any call whose
argmax or scores differ from the first call's, or whose argmax differs from the CPU backend's
where the best similarity is clear of the runner-up.

That test failed once (2026-11-28, padded-int8, inside `cli.py ab`, whose base build was
compiling on every core at the time) and passed on every rerun; this is the probe for it.

Run on the device from the repository root after a CUDA and a CPU build, with the test
environment (as `cli.py suite` sets it):
  REPS=200 BUSY=16 python3 tools/device/repeat_ffma_argmax.py
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_cuda_compressed import Case, argmax_disagreements, clear_rows, load_kernel, poison  # noqa: E402


def spin(stop):
    x = 0
    while not stop.is_set():
        x = (x * 1103515245 + 12345) % 2147483648


def main() -> None:
    ops = importlib.import_module(load_kernel("cuda").__name__ + "._ops").ops
    cpu_ops = importlib.import_module(load_kernel("cpu").__name__ + "._ops").ops
    reps, busy = int(os.environ.get("REPS", "200")), int(os.environ.get("BUSY", "0"))
    stop = multiprocessing.Event()
    workers = [multiprocessing.Process(target=spin, args=(stop,)) for _ in range(busy)]
    for w in workers:
        w.start()
    failures = 0
    try:
        for surface in ("padded", "packed", "contrastive", "contrastive_padded"):
            for fmt in ("int8", "e4m3"):
                case = Case(surface, fmt, torch.float32, 96, 12, torch.Generator().manual_seed(41)).cuda_inputs()
                s0, a0 = case.forward(ops, True)
                _, a_cpu = case.on_cpu().forward(cpu_ops, True)
                a_cpu = a_cpu.reshape(-1, case.width)
                checks = clear_rows(case)
                moved = cpu_diff = 0
                for _ in range(reps):
                    poison(s0, a0)
                    s, a = case.forward(ops, True)
                    if not (torch.equal(s.nan_to_num(nan=3.0), s0.nan_to_num(nan=3.0)) and torch.equal(a, a0)):
                        moved += 1
                    _, messages = argmax_disagreements(checks, a.cpu().reshape(-1, case.width), a_cpu)
                    for m in messages[:max(0, 3 - cpu_diff)]:
                        print(f"  {surface} {fmt}: {m}")
                    cpu_diff += len(messages)
                print(f"{surface} {fmt}: {reps} calls, {moved} differ from the first, "
                      f"{cpu_diff} pair(s) differ from the CPU backend")
                failures += moved + cpu_diff
    finally:
        stop.set()
        for w in workers:
            w.join()
    print("repeat_ffma_argmax:", "ok" if failures == 0 else f"{failures} differences")


if __name__ == "__main__":
    main()
