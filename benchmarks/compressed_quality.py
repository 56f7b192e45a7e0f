#!/usr/bin/env python3
"""How far int8 / float8 e4m3fn documents move MaxSim scores and rankings from fp16 ones.

    python3 benchmarks/compressed_quality.py                      # the table in docs/compressed.md
    python3 benchmarks/compressed_quality.py --queries 2 --candidates 200 --json out.json

Synthetic clustered embeddings, built to look like a late-interaction index rather than
uniform noise (on which every document scores alike and rankings mean little):
- `--centroids` unit vectors in dim `--dim`;
- a token is normalize(centroid + noise), noise ~ N(0, sigma^2 / dim) per coordinate, so
  its cosine with its centroid is about 1 / sqrt(1 + sigma^2);
- every sequence draws its tokens from a topic of `--topic` centroids; a query's candidates
  share a uniformly random number (0..topic) of the query's centroids and draw the rest at
  random, and each candidate has its own noise level (sigma times a factor uniform in
  [0.75, 1.5]), so relevance varies continuously rather than in topic-sized steps of tied
  scores: the candidates spread from unrelated to close, as a first stage's list does;
- queries have `--lq` tokens, candidates lengths uniform in [--ld-min, --ld].

For each query the fp16 documents (the format an uncompressed index stores) are quantised
with maxsim.quantize_documents and scored with document_scales=; the queries are fp16 in
every run. Reported per format, over all queries:
- largest absolute and relative score change against fp16 scoring (relative: |change| /
  |fp16 score|);
- overlap@10: |top-10(format) & top-10(fp16)| / 10 (mean, and the worst query);
- exact top-10: queries whose ten best candidates come out in the same order;
- mean absolute score change, and the largest fp16 score gap between two of fp16's top 10
  whose order the format inverts (how close a pair must be to swap);
- contract: largest |score - float64 reference on the dequantised documents| (what the
  kernels promise: fp32-accumulation error only, the quantisation itself excluded);
- fp16 row: the same contract against float64 on the fp16 documents, for scale.
Runs on the CPU backend (any built backend with --device).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import load_kernel  # noqa: E402

FORMATS = ("int8", "float8_e4m3fn")


def clustered(gen, centroids, topic, n, sigma):
    """n tokens: each a random centroid of `topic` (index tensor) plus noise, normalised."""
    dim = centroids.shape[1]
    pick = topic[torch.randint(0, topic.numel(), (n,), generator=gen)]
    noise = torch.randn(n, dim, generator=gen) * (sigma / dim ** 0.5)
    return F.normalize(centroids[pick] + noise, dim=-1)


def build_query(gen, args, centroids, sigma):
    """One query [1, Lq, D] fp16 and its candidates [1, C, Ld, D] fp16 with their lengths."""
    n_cent = centroids.shape[0]
    q_topic = torch.randperm(n_cent, generator=gen)[:args.topic]
    query = clustered(gen, centroids, q_topic, args.lq, sigma)
    docs = torch.zeros(args.candidates, args.ld, args.dim)
    lengths = torch.randint(args.ld_min, args.ld + 1, (args.candidates,), generator=gen)
    shared = torch.randint(0, args.topic + 1, (args.candidates,), generator=gen)
    for c in range(args.candidates):
        k = int(shared[c])
        own = q_topic[torch.randperm(args.topic, generator=gen)[:k]]
        rest = torch.randperm(n_cent, generator=gen)[:args.topic - k]
        topic = torch.cat([own, rest])
        own_sigma = sigma * (0.75 + 0.75 * float(torch.rand((), generator=gen)))
        docs[c, :int(lengths[c])] = clustered(gen, centroids, topic, int(lengths[c]), own_sigma)
    return (query.unsqueeze(0).half(), docs.unsqueeze(0).half(),
            torch.tensor([args.lq]), lengths.unsqueeze(0))


def top(scores, k):
    return scores.topk(k).indices.tolist()


def evaluate(maxsim, args, sigma, device):
    gen = torch.Generator().manual_seed(args.seed)
    centroids = F.normalize(torch.randn(args.centroids, args.dim, generator=gen), dim=-1)
    stats = {f: dict(abs=0.0, rel=0.0, overlap=[], exact=0, contract=0.0, sum=0.0, n=0, flip=0.0)
             for f in FORMATS}
    fp16 = dict(contract=0.0, gap=[])
    k = args.k
    for _ in range(args.queries):
        q, d, ql, dl = (t.to(device) for t in build_query(gen, args, centroids, sigma))
        base = maxsim.score_candidates_padded(q, d, ql, dl)[0].cpu()
        ref = maxsim.score_candidates_padded_reference(q.double(), d.double(), ql, dl)[0].cpu()
        fp16["contract"] = max(fp16["contract"], float((base.double() - ref).abs().max()))
        ranked = base.sort(descending=True).values
        fp16["gap"] += (ranked[:k] - ranked[1:k + 1]).tolist()   # neighbours in the top k + 1
        base_top = top(base, k)
        for fmt in FORMATS:
            values, scales = maxsim.quantize_documents(d, fmt)
            got = maxsim.score_candidates_padded(q, values, ql, dl, document_scales=scales)[0].cpu()
            deq = maxsim.dequantize_documents(values, scales, torch.float64)
            ref = maxsim.score_candidates_padded_reference(q.double(), deq, ql, dl)[0].cpu()
            s = stats[fmt]
            change = (got - base).abs()
            s["abs"] = max(s["abs"], float(change.max()))
            s["sum"], s["n"] = s["sum"] + float(change.double().sum()), s["n"] + change.numel()
            b10, g10 = base[base_top], got[base_top]
            inverted = (b10[:, None] > b10[None, :]) & (g10[:, None] < g10[None, :])
            gaps = (b10[:, None] - b10[None, :])[inverted]
            s["flip"] = max(s["flip"], float(gaps.max()) if gaps.numel() else 0.0)
            s["rel"] = max(s["rel"], float((change / base.abs()).max()))
            s["contract"] = max(s["contract"], float((got.double() - ref).abs().max()))
            got_top = top(got, k)
            s["overlap"].append(len(set(got_top) & set(base_top)) / k)
            s["exact"] += got_top == base_top
        del q, d
    rows = []
    for fmt in FORMATS:
        s = stats[fmt]
        rows.append(dict(sigma=sigma, format=fmt, max_abs_change=s["abs"], max_rel_change=s["rel"],
                         mean_abs_change=s["sum"] / s["n"], max_inverted_gap=s["flip"],
                         mean_overlap_at_k=sum(s["overlap"]) / len(s["overlap"]),
                         min_overlap_at_k=min(s["overlap"]), exact_top_k=s["exact"],
                         queries=args.queries, max_contract_err=s["contract"]))
    rows.append(dict(sigma=sigma, format="float16", max_contract_err=fp16["contract"],
                     median_gap_k=sorted(fp16["gap"])[len(fp16["gap"]) // 2],
                     min_gap_k=min(fp16["gap"]),
                     queries=args.queries))
    return rows


def markdown(rows, k):
    head = ["noise sigma", "documents", "max abs score change", "mean abs score change",
            "max rel score change", f"overlap@{k} mean (worst)", f"exact top-{k}",
            f"largest fp16 gap of a swapped top-{k} pair", "max err vs float64 (contract)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        if r["format"] == "float16":
            cells = [f"{r['sigma']:g}", "float16 (baseline)", "-", "-", "-", "-", "-", "-",
                     f"{r['max_contract_err']:.1e}"]
        else:
            cells = [f"{r['sigma']:g}", r["format"], f"{r['max_abs_change']:.3g}",
                     f"{r['mean_abs_change']:.2g}", f"{r['max_rel_change']:.2e}",
                     f"{r['mean_overlap_at_k']:.3f} ({r['min_overlap_at_k']:.1f})",
                     f"{r['exact_top_k']} / {r['queries']}", f"{r['max_inverted_gap']:.2g}",
                     f"{r['max_contract_err']:.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    gaps = "; ".join(f"sigma {r['sigma']:g}: median {r['median_gap_k']:.3g}, smallest "
                     f"{r['min_gap_k']:.2g}" for r in rows if r["format"] == "float16")
    lines.append(f"\nfp16 score gaps between neighbours in each query's top {k + 1}: {gaps}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--centroids", type=int, default=256)
    p.add_argument("--topic", type=int, default=8, help="centroids per sequence")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--candidates", type=int, default=1000)
    p.add_argument("--lq", type=int, default=32)
    p.add_argument("--ld", type=int, default=300)
    p.add_argument("--ld-min", type=int, default=240)
    p.add_argument("--noise", default="0.5,1.0", help="sigma values, comma-separated")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the rows and settings here")
    args = p.parse_args()
    maxsim = load_kernel(args.device)
    started = time.time()
    rows = []
    for sigma in (float(s) for s in args.noise.split(",")):
        rows += evaluate(maxsim, args, sigma, args.device)
    table = markdown(rows, args.k)
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    print(f"settings: {settings}; {time.time() - started:.0f} s, torch {torch.__version__}\n")
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(settings=settings, torch=torch.__version__,
                                                   rows=rows, table=table), indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
