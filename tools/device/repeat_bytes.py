"""Repeats one packed call of the sm_90a byte kernel many times and counts wrong scores: a
race that a single test run meets once in a while and compute-sanitizer's racecheck does not
see. The missing proxy fence before a slot's release (fixed in a8e021f) gave 16 wrong scores
in 960 calls (Lq 48 and 64, variants n64 and n64 run1, 120 repetitions) on inputs built as
these are, in a first form of this script that drew them in another order.

The inputs are test_sm90a_kernel_split_steps's packed case: integer values and power-of-two
scales (exact in fp32), 400 pairs over 5 queries (one empty) and 40 documents of 0 to 700
rows, many at tile edges, the pair list in runs of one query. Each variant runs REPS times in
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
    dequantised,
    lengths,
    load_kernel,
    make_queries,
    make_scales,
    make_values,
    packed_pairs,
    query_runs,
)

VARIANTS = {
    "mma.sync": {"MAXSIM_CUDA_HOPPER_BYTES": "0"},
    "n64": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_SPLIT": "0"},
    "n64 run1": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_SPLIT": "0",
                 "MAXSIM_CUDA_HOPPER_BYTES_RUN": "1"},
    "split": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_SPLIT": "1"},
    "t64": {"MAXSIM_CUDA_HOPPER_BYTES": "1", "MAXSIM_CUDA_HOPPER_BYTES_TILE": "64"},
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
    gen = torch.Generator().manual_seed(lq + 400)
    edges = torch.tensor([0, 1, 127, 128, 129, 256, 640, 700])
    nq, nd, P, dim = 5, 40, 400, 128
    qlen = lengths(nq, lq, gen, 4)
    at_edges = edges[torch.randint(0, len(edges), (nd,), generator=gen)]
    dlen = torch.where(torch.rand(nd, generator=gen) < 0.5, at_edges, torch.randint(0, 701, (nd,), generator=gen))
    qoffs = torch.cat([torch.zeros(1, dtype=torch.int64), qlen.cumsum(0)])
    doffs = torch.cat([torch.zeros(1, dtype=torch.int64), dlen.cumsum(0)])
    q = make_queries((int(qoffs[-1]), dim), torch.float16, gen, integer=True)
    v = make_values((int(doffs[-1]), dim), fmt, gen, integer=True)
    sc = make_scales((int(doffs[-1]),), gen, integer=True)
    pq, pd = query_runs(P, nq, gen, 4), torch.randint(0, nd, (P,), generator=gen)
    want = []
    for _, qp, vp, sp in packed_pairs(q, qoffs, v, doffs, sc, pq, pd):
        if qp.shape[0] == 0 or vp.shape[0] == 0:
            want.append(0.0 if qp.shape[0] == 0 else float("-inf"))
        else:
            want.append(float((qp.double() @ dequantised(vp, sp).T).max(dim=1).values.sum()))
    want = torch.tensor(want, dtype=torch.float64)
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
                    print(f"  {name}: pair {i} scored {float(scores[i])}, float64 {float(want[i])}"
                          f" (query rows {int(qlen[pq[i]])}, document rows {int(dlen[pd[i]])})")
        print(f"{name}: {wrong} wrong scores in {calls} calls")
        for key in VARIANTS[name]:
            os.environ.pop(key)


if __name__ == "__main__":
    main()
