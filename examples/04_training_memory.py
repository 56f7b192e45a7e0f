"""Memory held by one contrastive training step: maxsim vs naive PyTorch.

Naive MaxSim builds the [Nq, Nb, Lq, Ld] similarity tensor and autograd keeps it alive until
the backward (amax needs it to route gradients). maxsim keeps only its inputs and the
winning document index per query token ([Nq, Nb, Lq] int32).

Measured two ways:
- every device: the bytes of the tensors autograd saves for backward
  (torch.autograd.graph.saved_tensors_hooks, each storage counted once);
- CUDA only: torch.cuda.memory_allocated after the forward (what stays alive for the
  backward) and torch.cuda.max_memory_allocated over forward + backward, both above the inputs.

Run: `just example 4` (or LOCAL_KERNELS="maxsim/maxsim=$PWD" HF_HUB_OFFLINE=1 python3 examples/04_training_memory.py)
"""
import torch
import torch.nn.functional as F
from kernels import get_kernel

maxsim = get_kernel("maxsim/maxsim", version=1)
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.float16 if device == "cuda" else torch.float32
torch.manual_seed(0)

Nq = Nb = 32
Lq, Ld, D = 32, 512, 128
queries = F.normalize(torch.randn(Nq, Lq, D, device=device), dim=-1).to(dtype)
documents = F.normalize(torch.randn(Nb * Ld, D, device=device), dim=-1).to(dtype)  # packed
document_offsets = torch.arange(0, Nb * Ld + 1, Ld, device=device)
g = torch.randn(Nq, Nb, device=device)


def maxsim_scores(q, d):
    return maxsim.score_contrastive_train(q, d, document_offsets)


def naive_scores(q, d):
    sims = torch.einsum("qid,njd->qnij", q, d.view(Nb, Ld, D))   # [Nq, Nb, Lq, Ld]
    return sims.amax(dim=-1).float().sum(dim=-1)


def measure(score_fn):
    q = queries.clone().requires_grad_()
    d = documents.clone().requires_grad_()
    saved = {}

    def pack(t):
        saved[(t.untyped_storage().data_ptr(), t.device)] = t.untyped_storage().nbytes()
        return t

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        scores = score_fn(q, d)
    row = {"saved for backward": sum(saved.values())}
    if device == "cuda":
        row["held after forward"] = torch.cuda.memory_allocated() - base
    (scores * g).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
        row["peak fwd+bwd"] = torch.cuda.max_memory_allocated() - base
    return scores.detach(), row


def mib(n):
    return f"{n / 2**20:10.1f} MiB"


ours, row_maxsim = measure(maxsim_scores)
naive, row_naive = measure(naive_scores)
# The naive path materialises similarities in the input dtype (fp16 on GPU): compare loosely.
torch.testing.assert_close(ours, naive, rtol=1e-2, atol=2e-2)

inputs = queries.numel() * queries.element_size() + documents.numel() * documents.element_size()
print(f"one training step: Nq=Nb={Nq}, Lq={Lq}, Ld={Ld}, D={D}, {dtype} on {device}")
print(f"inputs (queries + documents): {mib(inputs).strip()}; "
      f"similarity tensor [Nq,Nb,Lq,Ld]: {mib(Nq * Nb * Lq * Ld * queries.element_size()).strip()}\n")
print(f"| {'measure':<20} | {'maxsim':>14} | {'naive PyTorch':>14} | {'ratio':>6} |")
print(f"|{'-' * 22}|{'-' * 16}|{'-' * 16}|{'-' * 8}|")
for key in row_maxsim:
    a, b = row_maxsim[key], row_naive[key]
    print(f"| {key:<20} | {mib(a):>14} | {mib(b):>14} | {b / max(a, 1):5.1f}x |")
print("\n'saved for backward' includes the inputs themselves (both implementations keep them).")
