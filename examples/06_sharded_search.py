"""Top-k search over a corpus split across processes.

Every rank holds one shard of the corpus (packed document tokens and offsets) and the same
queries. `maxsim.search_sharded` scores the queries against the local shard, keeps the
shard's top k, and merges the per-rank lists into the global top k, with global document
ids (shards numbered in rank order): on one rank (`dst=0`) or on every rank (the default).
The result equals a top-k over the whole corpus on one process; equal scores go to the
lower document id.

Run on CPUs (gloo) or GPUs (NCCL, one GPU per process), unchanged:
    LOCAL_KERNELS="maxsim/maxsim=$PWD" HF_HUB_OFFLINE=1 torchrun --nproc-per-node 2 examples/06_sharded_search.py
Without torchrun it runs as a single process (`just example 6`).
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from kernels import get_kernel

maxsim = get_kernel("maxsim/maxsim", version=1)


def main():
    distributed = "RANK" in os.environ  # set by torchrun
    if distributed:
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dtype = torch.float16 if device.type == "cuda" else torch.float32

    # The whole corpus, drawn from one seed so every rank can cut out its own shard (in real
    # use each rank would load only its shard from disk).
    n_docs, n_queries, Lq, D, k = 3000, 8, 16, 128, 5
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 120, (n_docs,), generator=gen)
    offsets = F.pad(lengths.cumsum(0), (1, 0))
    tokens = F.normalize(torch.randn(int(offsets[-1]), D, generator=gen), dim=-1)
    # Query i paraphrases document targets[i]: noisy copies of Lq of its tokens.
    targets = torch.randint(0, n_docs, (n_queries,), generator=gen)
    rows = torch.stack([offsets[t] + torch.randint(0, int(lengths[t]), (Lq,), generator=gen) for t in targets])
    queries = F.normalize(tokens[rows] + 0.05 * torch.randn(n_queries, Lq, D, generator=gen), dim=-1)

    # Shard r: documents [first, last), in rank order (uneven when world does not divide n_docs).
    first, last = rank * n_docs // world, (rank + 1) * n_docs // world
    shard_tokens = tokens[offsets[first]:offsets[last]]
    shard_offsets = offsets[first:last + 1] - offsets[first]

    queries_dev = queries.to(device, dtype)
    result = maxsim.search_sharded(queries_dev, shard_tokens.to(device, dtype),
                                   shard_offsets.to(device), k, dst=0)
    if rank == 0:
        print(f"{world} shard(s) of about {n_docs // world} documents; top {k} per query:")
        for i in range(n_queries):
            ids = result.document_ids[i].tolist()
            scores = ", ".join(f"{s:.2f}" for s in result.scores[i].tolist())
            print(f"  query {i}: paraphrases document {int(targets[i]):4d}; found {ids} (scores {scores})")
        assert torch.equal(result.document_ids[:, 0].cpu(), targets), "every paraphrased document ranks first"
        # Check against all scores of the whole corpus on one process: the k found are the
        # best (up to float rounding: GPU kernels may pick other tile shapes for a shard).
        scores = maxsim.score_contrastive(queries_dev, tokens.to(device, dtype), offsets.to(device))
        assert torch.allclose(scores.gather(1, result.document_ids), result.scores, rtol=1e-5, atol=1e-5)
        best_left_out = scores.scatter(1, result.document_ids, float("-inf")).amax(dim=1)
        assert (best_left_out <= result.scores[:, -1] + 1e-5).all()
        print("the same top-k as one process over the whole corpus")

    # Or every rank gets the merged result (default dst=None), e.g. to rerank locally.
    everywhere = maxsim.search_sharded(queries_dev, shard_tokens.to(device, dtype), shard_offsets.to(device), k)
    assert torch.equal(everywhere.document_ids[:, 0].cpu(), targets)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
