"""Which document token did each query token match? (the `_with_argmax` forms)

MaxSim picks, for every query token, its most similar document token. The `_with_argmax`
functions return that choice next to the score, which is useful for explaining a ranking
or highlighting matched words. Here the embeddings are toy "word vectors": words that
share a concept (sun / solar, eclipse / eclipses) get similar vectors.

Run: `just example 2` (or LOCAL_KERNELS="maxsim/maxsim=$PWD" HF_HUB_OFFLINE=1 python3 examples/02_argmax_alignment.py)
"""
import torch
import torch.nn.functional as F
from kernels import get_kernel

maxsim = get_kernel("maxsim/maxsim", version=1)
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
D = 128

CONCEPTS = {"sun": ["sun", "solar"], "eclipse": ["eclipse", "eclipses"], "moon": ["moon", "lunar"],
            "cause": ["causes", "blocks"], "time": ["when", "during"]}
concept_vec = {c: torch.randn(D) for c in CONCEPTS}


def embed(words):
    """Toy word vectors: a word's own random part plus the vector of its concept."""
    rows = []
    for w in words:
        v = 0.6 * torch.randn(D, generator=torch.Generator().manual_seed(sum(map(ord, w))))
        v += sum((concept_vec[c] for c, ws in CONCEPTS.items() if w in ws), torch.zeros(D))
        rows.append(F.normalize(v, dim=0))
    return torch.stack(rows)


query = "what causes solar eclipses".split()
docs = ["the moon blocks the sun during a solar eclipse".split(),
        "lunar tides rise when the moon is full".split()]

# Packed layout: all tokens concatenated, segments delimited by offsets, and a list of
# (query, document) pairs to score: here query 0 against documents 0 and 1.
queries = embed(query).to(device)
documents = torch.cat([embed(d) for d in docs]).to(device)
query_offsets = torch.tensor([0, len(query)], device=device)
document_offsets = torch.tensor([0, len(docs[0]), len(docs[0]) + len(docs[1])], device=device)
pair_query_ids = torch.tensor([0, 0], device=device)
pair_document_ids = torch.tensor([0, 1], device=device)

scores, argmax = maxsim.score_pairs_packed_with_argmax(
    queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids)
# scores [P] float32; argmax [P, longest query] int32: index into the document, -1 if unmatched

for p, words in enumerate(docs):
    doc = documents[document_offsets[p]:document_offsets[p + 1]]
    sims = (queries @ doc.T).cpu()          # only to print the grid; the kernel never builds it
    print(f"\ndocument {p}: score {scores[p]:.3f}")
    print(" " * 10 + "".join(f"{w:>8} " for w in words))
    for i, q_word in enumerate(query):
        j = int(argmax[p, i])
        cells = "".join(f"{sims[i, k]:8.2f}{'*' if k == j else ' '}" for k in range(len(words)))
        print(f"{q_word:>10}{cells}   -> {words[j]}")
    # The score is exactly the sum of the matched similarities.
    matched = sum(float(sims[i, int(argmax[p, i])]) for i in range(len(query)))
    assert abs(matched - float(scores[p])) < 1e-4, (matched, float(scores[p]))

print("\n* marks the document token each query token matched (its argmax; ties go to the first)")
ref_scores, ref_argmax = maxsim.score_pairs_packed_with_argmax_reference(
    queries, query_offsets, documents, document_offsets, pair_query_ids, pair_document_ids)
assert torch.equal(argmax.cpu(), ref_argmax.cpu()) and torch.allclose(scores, ref_scores, atol=1e-5)
print(f"document {int(scores.argmax())} ranks first; scores and argmax match the reference")
