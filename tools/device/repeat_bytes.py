"""Repeats one packed call of the sm_90a byte kernel many times and counts wrong scores: a
race that a single test run meets once in a while and compute-sanitizer's racecheck does not
see. The missing proxy fence before a slot's release (fixed in a8e021f) gave 16 wrong scores
in 960 calls (Lq 48 and 64, variants n64 and n64 run1, 120 repetitions) on inputs built as
these are, in a first form of this script that drew them in another order.

The inputs are test_sm90a_kernel_split_steps's packed case (`split_steps_packed` there, 400
pairs): integer values and power-of-two scales, exact in fp32. Each variant runs REPS times in
both forms (argmax and score-only), its outputs' memory poisoned before each call, and every
score is compared with the float64 MaxSim.

Run on the device from the repository root after a CUDA build (tools/device/setup.sh, then
build_cuda), with the test environment (MAXSIM_TEST_NO_BUILD=1, LOCAL_KERNELS, HF_HUB_OFFLINE=1):
  LQ=64 REPS=120 VARIANTS="n64,n64 run1" python3 tools/device/repeat_bytes.py
LQ: max_q_len (<= 32 takes the 32-row shapes, above the 64-row ones); FMT: int8 or e4m3.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_cuda_compressed import (
    exact_maxsim,
    load_kernel,
    packed_pairs,
    split_steps_packed,
)

VARIANTS = {
    "mma.sync": {"MAXSIM_CUDA_HOPPER_BYTES": "0"},
    "n64": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_SPLIT": "0"},
    "n64 run1": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_SPLIT": "0",
                 "MAXSIM_CUDA_HOPPER_BYTES_RUN": "1"},
    "split": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_SPLIT": "1"},
    "t64": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_TILE": "64"},
    "t64 run1": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_TILE": "64",
                 "MAXSIM_CUDA_HOPPER_BYTES_RUN": "1"},
    "t128": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_TILE": "128"},
    "t128 run1": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_TILE": "128",
                  "MAXSIM_CUDA_HOPPER_BYTES_RUN": "1"},
}


def main() -> None:
    ops = importlib.import_module(load_kernel("cuda").__name__ + "._ops").ops
    cuda = torch.device("cuda")
    lq, reps = int(os.environ.get("LQ", "64")), int(os.environ.get("REPS", "120"))
    fmt = os.environ.get("FMT", "int8")
    names = os.environ.get("VARIANTS", "n64,n64 run1").split(",")
    P = 400
    q, qoffs, v, doffs, sc, pq, pd = split_steps_packed(lq, P, fmt, torch.Generator().manual_seed(lq + P))
    want = exact_maxsim(packed_pairs(q, qoffs, v, doffs, sc, pq, pd))
    args = (q.to(cuda), qoffs.to(cuda), v.to(cuda), doffs.to(cuda), pq.to(cuda), pd.to(cuda), lq)
    scales = sc.to(cuda)
    print(f"Lq {lq}, {fmt}, {P} pairs, {reps} repetitions of each form")
    for name in names:
        os.environ.update(VARIANTS[name])
        wrong = calls = 0
        for _ in range(reps):
            for with_argmax in (True, False):
                torch.full((P,), 12345.0, device=cuda)  # freed at once: the output's block, poisoned
                scores, _ = ops.packed_forward(*args, with_argmax, scales)
                bad = (scores.double().cpu() != want).nonzero().flatten()
                calls += 1
                wrong += len(bad)
                if len(bad) and wrong <= 3:
                    i = int(bad[0])
                    qrows, drows = int(qoffs[pq[i] + 1] - qoffs[pq[i]]), int(doffs[pd[i] + 1] - doffs[pd[i]])
                    print(f"  {name}: pair {i} scored {float(scores[i])}, float64 {float(want[i])}"
                          f" (query rows {qrows}, document rows {drows})")
        print(f"{name}: {wrong} wrong scores in {calls} calls")
        for key in VARIANTS[name]:
            os.environ.pop(key)


if __name__ == "__main__":
    main()
