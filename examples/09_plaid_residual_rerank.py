"""Rerank a PLAID candidate list straight from its residual codes (ColBERTv2 compression).

A ColBERTv2 / PLAID index keeps each document token as a centroid id plus nbits per dimension
(2 bits: 32 bytes + a code at dim 128, instead of 256 bytes of fp16). maxsim scores those codes
in place: no dense copy of the candidates is made. Here we build a small index the way
colbert-ai's codec does (maxsim.compress_residuals writes its byte layout, checked against
colbert-ai itself in tests/integrations/test_residual_codecs.py), rerank one query's candidates
from the codes, compare with scoring the decompressed tokens, and score float32 queries (what
a PyLate model emits) against the same float16 index.

Run: `python3 tools/dev.py example 9` (or LOCAL_KERNELS="maxsim/maxsim=$PWD" HF_HUB_OFFLINE=1 python3 examples/09_plaid_residual_rerank.py)
"""
import torch
import torch.nn.functional as F
from kernels import get_kernel

maxsim = get_kernel("maxsim/maxsim", version=1)
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

D, n_centroids, nbits = 128, 256, 2
n_docs, Ld, Lq = 300, 80, 32

# ---- 1. An index: clustered token embeddings, centroids, bucket statistics ------------------
centroids = F.normalize(torch.randn(n_centroids, D), dim=-1)
lengths = torch.randint(Ld // 2, Ld + 1, (n_docs,))
tokens = F.normalize(centroids[torch.randint(0, n_centroids, (int(lengths.sum()),))]
                     + 0.08 * torch.randn(int(lengths.sum()), D), dim=-1)
residual = tokens - centroids[(tokens @ centroids.T).argmax(-1)]
quantiles = torch.arange(1, 1 << nbits) / (1 << nbits)
bucket_cutoffs = torch.quantile(residual.flatten(), quantiles)
bucket_weights = torch.quantile(residual.flatten(), (torch.arange(1 << nbits) + 0.5) / (1 << nbits))

# The codec as the index stores it (colbert-ai keeps centroids in float16).
codec = maxsim.ResidualCodec(centroids.half(), bucket_weights, nbits)
codes, residuals = maxsim.compress_residuals(tokens, codec, bucket_cutoffs)  # [T] int32, [T, 32] uint8
offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
print(f"index: {tokens.shape[0]} tokens, {residuals.shape[1]} residual bytes + a code each "
      f"({residuals.shape[1] + 4} bytes a token against {2 * D} in fp16)")

# ---- 2. One query, a candidate list from the first stage, reranked from the codes ------------
query = F.normalize(tokens[offsets[7]:offsets[7] + Lq] + 0.05 * torch.randn(Lq, D), dim=-1)
candidates = torch.randperm(n_docs)[:100]
candidates[0] = 7  # the document the query came from is among them
query_offsets = torch.tensor([0, Lq])
pair_query_ids = torch.zeros(len(candidates), dtype=torch.int64)

dev = lambda t: t.to(device)  # noqa: E731
q = dev(query.half())
scores = maxsim.score_pairs_packed(q, dev(query_offsets), dev(residuals), dev(offsets), dev(pair_query_ids),
                                   dev(candidates), document_codes=dev(codes), residual_codec=codec.to(device))

# ---- 3. The same scores from decompressed tokens (what a decompress-then-score pipeline does) --
dense = maxsim.decompress_residuals(codes, residuals, codec, torch.float16)
dense_scores = maxsim.score_pairs_packed(q, dev(query_offsets), dev(dense), dev(offsets), dev(pair_query_ids),
                                         dev(candidates))
print(f"largest score difference, fused vs decompressed-then-scored: "
      f"{(scores - dense_scores).abs().max().item():.2e} (fp16 rounding of the normalised tokens)")
order = scores.argsort(descending=True)
print("top 5 candidates:", candidates[order[:5].cpu()].tolist(), "(the query came from document 7)")
assert candidates[order[0].cpu()] == 7
assert torch.equal(order[:10].cpu(), dense_scores.argsort(descending=True)[:10].cpu()) or \
    (scores - dense_scores).abs().max() < 1e-2

# ---- 4. float32 queries, as a PyLate model emits them, against the same float16 index ---------
# No cast needed: the tokens are then decoded in float32 (on a GPU by the FFMA decode, under
# torch's default "highest" float32 matmul precision; "high" scores a float16 copy instead).
scores32 = maxsim.score_pairs_packed(dev(query), dev(query_offsets), dev(residuals), dev(offsets),
                                     dev(pair_query_ids), dev(candidates), document_codes=dev(codes),
                                     residual_codec=codec.to(device))
print(f"float32 queries: largest difference from the float16 queries' scores "
      f"{(scores32 - scores).abs().max().item():.2e}; same top 1: {bool(scores32.argmax() == scores.argmax())}")
assert scores32.argmax() == scores.argmax()
