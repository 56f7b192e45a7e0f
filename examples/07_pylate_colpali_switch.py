"""One line to run PyLate's and colpali-engine's MaxSim on maxsim, with their results.

Needs PyLate 1.6 and colpali-engine 0.3.18 (no model is downloaded). In this repository:
    bash .ci/integrations.sh            # once: makes build/integrations-venv with both
    LOCAL_KERNELS="maxsim/maxsim=$PWD" HF_HUB_OFFLINE=1 \
        build/integrations-venv/bin/python examples/07_pylate_colpali_switch.py
"""
import os

import torch
from kernels import get_kernel

maxsim = get_kernel("maxsim/maxsim", version=1)
# Before importing the libraries (and before building losses): every scoring call site,
# the losses' defaults included, now runs on maxsim.
maxsim.patch_pylate()
maxsim.patch_colpali_engine()

from colpali_engine.utils.processing_utils import BaseVisualRetrieverProcessor  # noqa: E402
from pylate import losses, scores  # noqa: E402

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

# ---- PyLate: scores with masks (a masked token still counts, with similarity 0) ------------
queries = torch.randn(4, 32, 128, device=device)
documents = torch.randn(6, 180, 128, device=device)
documents_mask = torch.rand(6, 180, device=device) > 0.2   # skiplist-like holes
ours = scores.colbert_scores(queries, documents, documents_mask=documents_mask)
theirs = scores.colbert_scores(queries, documents, documents_mask=documents_mask, backend="torch")
print(f"PyLate colbert_scores: max |maxsim - torch| = {(ours - theirs).abs().max():.2e}")


# ---- PyLate: a Contrastive training step through a stub encoder ---------------------------
class StubEncoder(torch.nn.Module):
    """Stands in for a ColBERT model: token ids -> embeddings, no weights to download."""
    skiplist, do_query_expansion = [3, 5], True

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(100, 128)

    def forward(self, features):
        return {"token_embeddings": self.table(features["input_ids"])}


def batch(n, length):
    ids = torch.randint(1, 100, (n, length), device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


model = StubEncoder().to(device)
loss = losses.Contrastive(model=model)(
    [batch(16, 32), batch(16, 180), batch(16, 180)])  # anchors, positives, negatives
loss.backward()
print(f"PyLate Contrastive loss {loss.item():.4f}, "
      f"grad norm {model.table.weight.grad.norm():.4f}")

# ---- colpali-engine: score_multi_vector over ragged pages --------------------------------
qs = [torch.randn(n, 128, device=device) for n in (20, 25, 31)]
ps = [torch.randn(n, 128, device=device) for n in (1030, 700, 1030, 512, 900)]
ours = BaseVisualRetrieverProcessor.score_multi_vector(qs, ps, batch_size=2)
os.environ["COLPALI_SCORES_BACKEND"] = "torch"            # colpali-engine's own einsum path
theirs = BaseVisualRetrieverProcessor.score_multi_vector(qs, ps, batch_size=2)
del os.environ["COLPALI_SCORES_BACKEND"]
print(f"colpali score_multi_vector: max |maxsim - torch| = {(ours - theirs).abs().max():.2e}")

maxsim.unpatch_pylate()        # back to the libraries' own code
maxsim.unpatch_colpali_engine()
