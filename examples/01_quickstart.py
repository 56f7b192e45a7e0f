"""Quickstart: rerank candidates with MaxSim, then take one training step.

    score(q, d) = sum_i max_j <q_i, d_j>

Run: `just example 1` (or LOCAL_KERNELS="maxsim/maxsim=$PWD" HF_HUB_OFFLINE=1 python3 examples/01_quickstart.py)
"""
import torch
import torch.nn.functional as F
from kernels import get_kernel

# Resolves to the hub build, or to a local build when LOCAL_KERNELS names this repository.
maxsim = get_kernel("maxsim/maxsim", version=1)
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

B, C, Lq, Ld, D = 2, 5, 8, 40, 128   # queries, candidates per query, max tokens, embedding dim


def unit(*shape):
    return F.normalize(torch.randn(*shape, device=device), dim=-1)


# ---- 1. Rerank ----------------------------------------------------------------------------
# Padded batch: each query has C candidate documents; the *_lengths say how many tokens are
# real (the rest is padding and never counts). Candidate c contains noisy copies of c of the
# query's tokens, so the more of them it holds, the better it should rank.
queries = unit(B, Lq, D)
documents = unit(B, C, Ld, D)
query_lengths = torch.tensor([8, 5], device=device)
doc_lengths = torch.randint(20, Ld + 1, (B, C), device=device)
for b in range(B):
    for c in range(C):
        for i in range(min(c, int(query_lengths[b]))):
            documents[b, c, 3 * i] = F.normalize(queries[b, i] + 0.3 * unit(D), dim=-1)

scores = maxsim.score_candidates_padded(queries, documents, query_lengths, doc_lengths)  # [B, C]

for b in range(B):
    order = scores[b].argsort(descending=True).tolist()
    ranked = "  ".join(f"doc{c} ({scores[b, c]:.2f})" for c in order)
    print(f"query {b} ({int(query_lengths[b])} tokens) reranked: {ranked}")

# Check every score against the one-pair pure-PyTorch reference on the unpadded slices.
expected = torch.tensor([[float(maxsim.maxsim_reference(queries[b, :query_lengths[b]],
                                                        documents[b, c, :doc_lengths[b, c]]))
                          for c in range(C)] for b in range(B)], device=device)
torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-4)
print("scores match maxsim_reference\n")

# ---- 2. One training step -------------------------------------------------------------------
# The *_train form is differentiable: the backward sends each query token's gradient only to
# the document token it matched. Here a small projection plays the encoder, the last candidate
# (the one sharing most tokens with its query) is the positive, and we take one cross-entropy step.
encoder = torch.nn.Linear(D, D).to(device)
optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3)

q_emb = F.normalize(encoder(queries), dim=-1)
d_emb = F.normalize(encoder(documents), dim=-1)
scores = maxsim.score_candidates_padded_train(q_emb, d_emb, query_lengths, doc_lengths)
loss = F.cross_entropy(scores, torch.full((B,), C - 1, device=device))
loss.backward()

print(f"training step: scores {tuple(scores.shape)}, loss {loss.item():.4f}")
for name, p in encoder.named_parameters():
    print(f"  encoder.{name}.grad: shape {tuple(p.grad.shape)}, norm {p.grad.norm():.4f}")
assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())
optimizer.step()
