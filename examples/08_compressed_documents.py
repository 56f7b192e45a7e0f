"""Compressed documents: rerank candidates stored as int8 or float8 (one scale per token).

A candidate set stored in fp16 takes 2 bytes per value; int8 and float8 e4m3fn take 1, plus
one float32 scale per token (132 bytes a token at dim 128 instead of 256). Here both
formats rerank the same candidates as fp16 and we compare scores and rankings.

Run: `python3 tools/dev.py example 8` (or LOCAL_KERNELS="maxsim/maxsim=$PWD" HF_HUB_OFFLINE=1 python3 examples/08_compressed_documents.py)
"""
import torch
import torch.nn.functional as F
from kernels import get_kernel

# Resolves to the hub build, or to a local build when LOCAL_KERNELS names this repository.
maxsim = get_kernel("maxsim/maxsim", version=1)
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

B, C, Lq, Ld, D = 2, 200, 32, 120, 128   # queries, candidates per query, max tokens, embedding dim


def unit(*shape):
    return F.normalize(torch.randn(*shape, device=device), dim=-1)


# ---- 1. A candidate set ---------------------------------------------------------------------
# Candidate c holds noisy copies of a random number of its query's tokens, so the candidates
# range from unrelated to close, as a first stage's list does.
queries = unit(B, Lq, D).half()
documents = unit(B, C, Ld, D)
query_lengths = torch.tensor([32, 20], device=device)
doc_lengths = torch.randint(Ld // 2, Ld + 1, (B, C), device=device)
for b in range(B):
    for c in range(C):
        for i in range(int(torch.randint(0, int(query_lengths[b]) + 1, ()))):
            documents[b, c, 2 * i] = F.normalize(queries[b, i].float() + 0.5 * unit(D), dim=-1)
documents = documents.half()   # what an uncompressed index stores

fp16_scores = maxsim.score_candidates_padded(queries, documents, query_lengths, doc_lengths)

# ---- 2. Quantise once, rerank with document_scales -------------------------------------------
for fmt in ("int8", "float8_e4m3fn"):
    values, scales = maxsim.quantize_documents(documents, fmt)   # values [B, C, Ld, D], scales [B, C, Ld]
    stored = values.numel() * values.element_size() + scales.numel() * scales.element_size()
    scores = maxsim.score_candidates_padded(queries, values, query_lengths, doc_lengths,
                                            document_scales=scales)

    # The kernel's promise: the float64 score of the dequantised documents, up to float32
    # accumulation error. Quantisation itself is the only difference from fp16 scoring.
    dequantised = maxsim.dequantize_documents(values, scales, torch.float64)
    reference = maxsim.score_candidates_padded_reference(queries.double(), dequantised,
                                                         query_lengths, doc_lengths)
    torch.testing.assert_close(scores.double(), reference, rtol=1e-5, atol=1e-4)

    change = (scores - fp16_scores).abs()
    print(f"{fmt}: {stored / 2**20:.1f} MiB stored (fp16: "
          f"{documents.numel() * documents.element_size() / 2**20:.1f} MiB); largest score change "
          f"vs fp16 {change.max():.4f} (fp16 scores {fp16_scores.min():.1f} .. {fp16_scores.max():.1f})")
    for b in range(B):
        top_fp16 = fp16_scores[b].topk(10).indices.tolist()
        top = scores[b].topk(10).indices.tolist()
        moved = sum(a != f for a, f in zip(top, top_fp16))
        shared = len(set(top) & set(top_fp16))
        gaps = (fp16_scores[b].sort(descending=True).values[:10].diff().abs().min())
        print(f"  query {b}: top-10 {top}: {shared}/10 in fp16's top-10, {moved} at another "
              f"rank (smallest fp16 gap between neighbours there: {gaps:.4f})")
print("compressed scores match the float64 reference on the dequantised documents")
