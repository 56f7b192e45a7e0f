"""Fixed cost of small padded calls: GPU time per call (CUDA graphs, us) of maxsim by its default
rule, with the mma.sync or the sm_90a kernel forced and without PDL, against late-interaction-
kernels (`lik`), over candidates per query (C) and document lengths (Ld) at B 32 (or B given as
C:Ld:B), Lq 32, dim 128, and a one-element torch op as the graph's floor. Run on the GPU machine
after a build (`source tools/device/setup.sh` first: the carried wheels):

  python3 tools/device/probe_small.py [--shapes C:Ld,C:Ld:B,...] [--variants default,nopdl,lik,...]

Each call is replayed on the same documents, as compare.py does, so documents of a few tens of
MB partly stay in L2 between replays. --sets N also times every variant rotating over N
document sets (the `<variant>_rotN` columns), whose documents come from DRAM once the sets
outgrow the L2 (H200: 50 MB).

With --once, each variant of each shape is called twice, a warm-up and the call to profile,
with nothing timed: the form to run under Nsight Compute, e.g. the three-CTA kernel on 64-row
documents against the peer's

  ncu --set full -k regex:"maxsim_forward_hopper|_maxsim_fwd" --launch-skip 1 --launch-count 1 \
      python3 tools/device/probe_small.py --shapes 10:64 --variants default,lik --once
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

SHAPES = ((1, 180), (2, 180), (5, 180), (9, 180), (10, 180), (12, 180), (16, 180), (20, 180), (24, 180),
          (10, 64), (10, 32), (10, 300), (10, 512))  # (C, Ld)
# hopper3: the sm_90a kernel's three-CTA shape where a tree has it (MAXSIM_CUDA_HOPPER_PADDED_CTAS=3;
# a tree without it runs its two-CTA shape under that knob); hopper3q2: its two-query-buffer form
# where a tree has that (MAXSIM_CUDA_HOPPER_QUERY_BUFS=2, hopper_three_ctas_rule.patch; else
# the one-buffer shape again)
VARIANTS = (("default", {}), ("mma", {"MAXSIM_CUDA_FORCE_MMA_SYNC": "1"}),
            ("hopper", {"MAXSIM_CUDA_HOPPER_PADDED": "1"}),
            ("hopper3", {"MAXSIM_CUDA_HOPPER_PADDED": "1", "MAXSIM_CUDA_HOPPER_PADDED_CTAS": "3"}),
            ("hopper3q2", {"MAXSIM_CUDA_HOPPER_PADDED": "1", "MAXSIM_CUDA_HOPPER_PADDED_CTAS": "3",
                           "MAXSIM_CUDA_HOPPER_QUERY_BUFS": "2"}),
            ("nopdl", {"MAXSIM_CUDA_PDL": "0"}))


def us(fn) -> float:
    return round(graph_time_ms(fn) * 1e3, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", help="C:Ld pairs, or C:Ld:B for another batch than 32, comma-separated "
                    "(default: SHAPES)")
    ap.add_argument("--variants", help="names from VARIANTS and lik, comma-separated (default: all)")
    ap.add_argument("--sets", type=int, default=0, help="also time rotating over this many document sets")
    ap.add_argument("--once", action="store_true", help="call each twice, time nothing (for ncu)")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    wanted = args.variants.split(",") if args.variants else [n for n, _ in VARIANTS] + ["lik"]
    import kernels
    import late_interaction_kernels as lik

    ms = kernels.get_local_kernel(ROOT, backend="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.zeros(16, device="cuda")
    if not args.once:
        print(json.dumps({"torch add_ (floor)": us(lambda: x.add_(1.0))}))
    Lq, D = 32, 128
    unit = lambda *shape: torch.nn.functional.normalize(  # noqa: E731
        torch.randn(*shape, D, device="cuda", generator=gen), dim=-1).half()
    for C, Ld, *rest in shapes:
        B = rest[0] if rest else 32
        q = unit(B, Lq)
        docs = [unit(B, C, Ld) for _ in range(max(args.sets, 1))]
        ql = torch.full((B,), Lq, device="cuda", dtype=torch.int32)
        dl = torch.full((B, C), Ld, device="cuda", dtype=torch.int32)
        row = {"C": C, "Ld": Ld} if B == 32 else {"C": C, "Ld": Ld, "B": B}
        for name in wanted:
            if name == "lik":
                call, env = (lambda d: lik.maxsim(q, d, None, None)), {}  # noqa: B023
            else:
                call, env = (lambda d: ms.score_candidates_padded(q, d, ql, dl)), dict(VARIANTS)[name]  # noqa: B023
            with knobs(env):
                if args.once:
                    call(docs[0])
                    call(docs[0])
                    continue
                row[name] = us(lambda: call(docs[0]))  # noqa: B023
                if args.sets:
                    row[f"{name}_rot{args.sets}"] = round(
                        graph_time_ms(lambda: [call(d) for d in docs]) * 1e3 / args.sets, 2)  # noqa: B023
        if args.once:
            torch.cuda.synchronize()
            continue
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
