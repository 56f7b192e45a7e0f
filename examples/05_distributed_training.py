"""Contrastive training on several processes, with every process's documents as negatives.

Each process (rank) encodes its own batch: N queries and their N positive documents, with
ragged document lengths that differ from rank to rank. `maxsim.gather_documents` collects
the packed documents of all ranks, differentiably, so each query is scored against
world_size * N documents; in backward, every document's gradient goes back to the rank
that encoded it (summed over ranks in rank order: the same result on every run).

The loss below is written the way PyLate's `losses.Contrastive` is when
`gather_across_devices=True` (sentence-transformers' `gather_across_devices` habit):
same constructor arguments, same `forward(sentence_features, labels)`, labels shifted to
where this rank's positives sit among the gathered documents, and the local mean loss
multiplied by the world size (DDP averages the gradients over the ranks). Where PyLate pads the gathered
documents and scores them with a [.., Lq, Ld] similarity tensor, this one packs the
tokens and lets maxsim score them without it. With pylate installed and a PyLate ColBERT
model, its skiplist masks (punctuation tokens) are applied to the documents as PyLate
does; without pylate, the attention masks alone say which tokens count.

Run on CPUs (gloo) or GPUs (NCCL, one GPU per process), unchanged:
    LOCAL_KERNELS="maxsim/maxsim=$PWD" HF_HUB_OFFLINE=1 torchrun --nproc-per-node 2 examples/05_distributed_training.py
Without torchrun it runs as a single process (`just example 5`).
"""
import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from kernels import get_kernel

try:  # only to reuse PyLate's skiplist masks when a PyLate model is trained
    from pylate.losses.contrastive import extract_skiplist_mask
except ImportError:
    extract_skiplist_mask = None

maxsim = get_kernel("maxsim/maxsim", version=1)


class MaxSimContrastive(torch.nn.Module):
    """In-batch contrastive loss for a ColBERT-style model; arguments as PyLate's Contrastive.

    sentence_features: [anchor, positive, *negatives], each a dict with "attention_mask"
    [B, L] and whatever the model reads; model(features)["token_embeddings"] is [B, L, D].
    """

    def __init__(self, model, size_average=True, gather_across_devices=False, temperature=1.0):
        super().__init__()
        self.model = model
        self.size_average = size_average
        self.gather_across_devices = gather_across_devices
        self.temperature = temperature

    def forward(self, sentence_features, labels=None):  # labels: unused, as in PyLate
        embeddings = [F.normalize(self.model(f)["token_embeddings"], p=2, dim=-1)
                      for f in sentence_features]
        masks = [f["attention_mask"].bool() for f in sentence_features]
        model = getattr(self.model, "module", self.model)  # under DDP, the wrapped model
        skiplist = getattr(model, "skiplist", None)
        if extract_skiplist_mask is not None and skiplist is not None:
            masks = extract_skiplist_mask(sentence_features, skiplist=skiplist)
        queries = embeddings[0]  # every query position counts (PyLate's query expansion)
        # Pack this rank's documents (positives first, then each group of negatives).
        documents = torch.cat([e[m] for e, m in zip(embeddings[1:], masks[1:])])
        lengths = torch.cat([m.sum(dim=1) for m in masks[1:]])
        offsets = F.pad(lengths.cumsum(0), (1, 0))

        if self.gather_across_devices:
            out = maxsim.score_contrastive_train_global(queries, documents, offsets)
            scores, first_positive = out.scores, out.document_start
        else:
            scores, first_positive = maxsim.score_contrastive_train(queries, documents, offsets), 0
        targets = torch.arange(len(queries), device=queries.device) + first_positive
        loss = F.cross_entropy(scores / self.temperature, targets,
                               reduction="mean" if self.size_average else "sum")
        self.accuracy = (scores.argmax(dim=1) == targets).float().mean().detach()  # for logging
        world = dist.get_world_size() if dist.is_initialized() else 1
        return loss * world


class TokenEncoder(torch.nn.Module):
    """Stands in for a ColBERT model: one projection of fixed token features."""

    def __init__(self, features_in, dim):
        super().__init__()
        self.projection = torch.nn.Linear(features_in, dim, bias=False)

    def forward(self, features):
        return {"token_embeddings": self.projection(features["features"])}


def main():
    distributed = "RANK" in os.environ  # set by torchrun
    if distributed:
        if torch.cuda.is_available():
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        rank, world = 0, 1

    N, Lq, Ld, F_IN, D = 16, 8, 32, 96, 64  # per rank: queries, tokens, features, dim
    SIGNAL, NOISE = 16, 4.0                  # the signal sits in 16 features, loud noise elsewhere
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data

    # Documents padded to Ld with an attention mask; real lengths differ per rank.
    doc_lengths = torch.randint(12, Ld + 1, (N,), generator=gen)
    doc_mask = torch.arange(Ld) < doc_lengths[:, None]
    doc_signal = torch.randn(N, Ld, SIGNAL, generator=gen)
    doc_features = torch.cat([doc_signal, NOISE * torch.randn(N, Ld, F_IN - SIGNAL, generator=gen)], -1)
    # Query n: noisy copies of random real tokens of document n.
    picks = (torch.rand(N, Lq, generator=gen) * doc_lengths[:, None]).long()
    query_signal = doc_signal.gather(1, picks[..., None].expand(-1, -1, SIGNAL))
    query_signal = query_signal + 0.3 * torch.randn(N, Lq, SIGNAL, generator=gen)
    query_features = torch.cat([query_signal, NOISE * torch.randn(N, Lq, F_IN - SIGNAL, generator=gen)], -1)
    anchor = {"features": query_features.to(device), "attention_mask": torch.ones(N, Lq, device=device)}
    positive = {"features": doc_features.to(device), "attention_mask": doc_mask.to(device)}

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = TokenEncoder(F_IN, D).to(device)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    loss_fn = MaxSimContrastive(model, gather_across_devices=distributed, temperature=0.1 * Lq)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    losses = []
    for step in range(60):
        loss = loss_fn([anchor, positive])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        stats = torch.stack([loss.detach() / world, loss_fn.accuracy])
        if distributed:
            dist.all_reduce(stats)
            stats /= world
        losses.append(stats[0].item())
        if rank == 0 and (step % 10 == 0 or step == 59):
            print(f"step {step:2d}  loss {stats[0]:.3f}  accuracy among {world * N} documents "
                  f"{stats[1]:5.1%}")

    if rank == 0:
        assert losses[-1] < 0.5 * losses[0], f"loss did not drop: {losses[0]:.3f} -> {losses[-1]:.3f}"
        print(f"{world} rank(s), {N} queries each, {world * N} in-batch documents per query: "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    if distributed:
        # DDP's reducer keeps its own reference to the process group. Were it the last one,
        # the group would die inside the reducer's destructor, which joins gloo's worker
        # threads while holding the GIL that those threads may need: a hang at exit. Drop
        # the model first, so that destroy_process_group (which releases the GIL) ends it.
        del loss_fn, model
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
