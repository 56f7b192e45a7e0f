"""In-batch contrastive (InfoNCE) training with score_contrastive_train.

N queries and their N positive documents: every query is scored against every document
of the batch (the other N-1 are its negatives) and cross-entropy pushes the diagonal up.
The "encoder" is one learnable nn.Linear over fixed token features. Each query token is a
noisy copy of a token of its document, but the noise is large and sits in other feature
dimensions than the shared signal, so an untrained projection ranks poorly; the projection
has to learn which dimensions to keep.

Run: `just example 3` (or LOCAL_KERNELS="maxsim/maxsim=$PWD" HF_HUB_OFFLINE=1 python3 examples/03_contrastive_training.py)
"""
import torch
import torch.nn.functional as F
from kernels import get_kernel

maxsim = get_kernel("maxsim/maxsim", version=1)
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

N, Lq, F_IN, D = 32, 8, 96, 64        # batch, query tokens, input features, embedding dim
SIGNAL, NOISE = 16, 4.0                # features 0..15 carry the signal, the rest is loud noise

# Documents: ragged lengths, tokens packed one after another; offsets delimit them.
doc_lengths = torch.randint(12, 33, (N,))
document_offsets = torch.cat([torch.zeros(1, dtype=torch.long), doc_lengths.cumsum(0)]).to(device)
doc_signal = torch.randn(int(doc_lengths.sum()), SIGNAL)
doc_features = torch.cat([doc_signal, NOISE * torch.randn(len(doc_signal), F_IN - SIGNAL)], dim=1)

# Query n: Lq tokens copied (signal part, slightly perturbed) from random tokens of document n.
picks = torch.stack([int(document_offsets[n]) + torch.randint(0, int(doc_lengths[n]), (Lq,))
                     for n in range(N)])                                   # [N, Lq] token rows
query_signal = doc_signal[picks] + 0.3 * torch.randn(N, Lq, SIGNAL)
query_features = torch.cat([query_signal, NOISE * torch.randn(N, Lq, F_IN - SIGNAL)], dim=-1)
doc_features, query_features = doc_features.to(device), query_features.to(device)

encoder = torch.nn.Linear(F_IN, D, bias=False).to(device)
optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3)
targets = torch.arange(N, device=device)   # query n's positive is document n
temperature = 0.1                           # scores are sums of Lq cosines, in [-Lq, Lq]

losses = []
for step in range(60):
    q = F.normalize(encoder(query_features), dim=-1)      # [N, Lq, D]
    d = F.normalize(encoder(doc_features), dim=-1)        # [total_doc_tokens, D]
    scores = maxsim.score_contrastive_train(q, d, document_offsets)   # [N, N]
    loss = F.cross_entropy(scores / (temperature * Lq), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    losses.append(loss.item())
    if step % 10 == 0 or step == 59:
        accuracy = (scores.argmax(dim=1) == targets).float().mean().item()
        print(f"step {step:2d}  loss {loss.item():.3f}  in-batch accuracy {accuracy:5.1%}")

assert losses[-1] < 0.5 * losses[0], f"loss did not drop enough: {losses[0]:.3f} -> {losses[-1]:.3f}"
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}: the projection learned to match queries to documents")
