"""maxsim's residual documents against the libraries that write them.

colbert-ai 0.2.22 (`colbert.indexing.codecs.residual.ResidualCodec`, ColBERTv2 / PLAID
indexes) runs here on its pure-torch CPU path: its indexer's own bucket statistics, its
`compress` and its `decompress` are the ground truth, and maxsim must read the very bytes it
writes (`decompress_residuals`, `unpack_buckets`), write the same bytes itself
(`compress_residuals`), load its index files as they lie on disk, and score its documents
(`score_pairs_packed` / `score_candidates_padded` with `document_codes=` and
`residual_codec=`) as plain float64 MaxSim over colbert-ai's decompressed tokens.

fast-plaid 1.7 (PyLate's PLAID backend) ships one compiled extension per torch release and
crashes when imported next to another torch, so it runs in a subprocess: the interpreter
named by MAXSIM_FAST_PLAID_PYTHON (a virtual environment holding fast-plaid and the torch its
wheel names), or this one when the installed fast-plaid was built for this torch. It builds a
small index on the CPU; the test reads the index files with numpy and checks them against
fast-plaid's own reconstruction (`get_embeddings`) and the embeddings it was given.

colbert-ai is required under MAXSIM_REQUIRE_INTEGRATIONS=1 (a missing import fails, as in
the other integration tests). fast-plaid needs its own interpreter, since no fast-plaid 1.7
wheel exists for the torch this suite is pinned to: CI makes one (.ci/integrations.sh, a venv
with .ci/integrations-fast-plaid.txt) and names it in MAXSIM_FAST_PLAID_PYTHON; elsewhere,
without a usable interpreter, the test skips, saying why.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import compat_semantics as sem

NBITS = (1, 2, 4)
KINDS = ("random", "clustered")
N_CENTROIDS = 32
N_TOKENS = 640
# Score tolerance per unit of sum_i |q_i| (document tokens are unit vectors): maxsim rounds
# the un-normalised token (centroid + bucket weights) once to the queries' dtype; colbert-ai's
# CPU path keeps it in float32.
SCORE_RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


# ---- the libraries ---------------------------------------------------------------------------

@pytest.fixture
def colbert(monkeypatch):
    """colbert-ai's codec, indexer and config, pinned to the CPU path: with a visible GPU the
    codec would move everything to float16 on CUDA and compile its C++ extensions."""
    residual = sem.import_library("colbert.indexing.codecs.residual")
    indexer = sem.import_library("colbert.indexing.collection_indexer")
    config = sem.import_library("colbert.infra.config")
    monkeypatch.setattr(config.ColBERTConfig, "total_visible_gpus", 0)
    return types.SimpleNamespace(ResidualCodec=residual.ResidualCodec,
                                 CollectionIndexer=indexer.CollectionIndexer,
                                 ColBERTConfig=config.ColBERTConfig)


@pytest.fixture(scope="module")
def residual_module(cpu_kernel):
    """maxsim's residual helpers, from the built package (what users import)."""
    return importlib.import_module(cpu_kernel.__name__ + "._residual")


# ---- data ------------------------------------------------------------------------------------

def make_tokens(gen, kind: str, n: int, dim: int):
    """(centroids [N_CENTROIDS, dim] float16, tokens [n, dim] float16), both unit rows.

    colbert-ai normalises its k-means centroids and stores them as float16; its indexer hands
    the codec float16 embeddings. "clustered" tokens sit near a centroid, as real ones do."""
    unit = lambda t: torch.nn.functional.normalize(t, dim=-1)  # noqa: E731
    centroids = unit(torch.randn(N_CENTROIDS, dim, generator=gen)).half()
    if kind == "random":
        tokens = unit(torch.randn(n, dim, generator=gen))
    else:
        which = torch.randint(0, N_CENTROIDS, (n,), generator=gen)
        tokens = unit(centroids[which].float() + 0.15 * torch.randn(n, dim, generator=gen))
    return centroids, tokens.half()


def colbert_codec(colbert, centroids, tokens, nbits):
    """colbert-ai's codec with bucket cutoffs / weights / avg_residual from its own indexer
    code (quantiles of a held-out sample's residuals)."""
    dim = centroids.shape[1]
    config = colbert.ColBERTConfig(dim=dim, nbits=nbits)
    trainer = types.SimpleNamespace(config=config, use_gpu=False, verbose=0)
    heldout = tokens[: tokens.shape[0] // 5]
    cutoffs, weights, avg_residual = colbert.CollectionIndexer._compute_avg_residual(
        trainer, centroids.float(), heldout)
    return colbert.ResidualCodec(config=config, centroids=centroids.float(), avg_residual=avg_residual,
                                 bucket_cutoffs=cutoffs, bucket_weights=weights)


class Compressed(types.SimpleNamespace):
    """codes [N] int32, residuals [N, D*nbits/8] uint8, tokens (colbert-ai's decompression,
    [N, D] float32), the maxsim codec and the colbert-ai codec they came from."""


def compress_with_colbert(colbert, ms_residual, gen, kind, dim, nbits, n=N_TOKENS):
    centroids, x = make_tokens(gen, kind, n, dim)
    codec = colbert_codec(colbert, centroids, x, nbits)
    packed = codec.compress(x)
    tokens = codec.decompress(packed)
    ms_codec = ms_residual.ResidualCodec(centroids, codec.bucket_weights, nbits)
    return Compressed(codes=packed.codes, residuals=packed.residuals, tokens=tokens, embeddings=x,
                      centroids=centroids, codec=ms_codec, colbert_codec=codec)


def near_tie_rows(x, centroids, margin=1e-4):
    """Rows whose two best centroid scores are within `margin`: either code is right there."""
    scores = x.double() @ centroids.double().T
    top = scores.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]) <= margin


# ---- colbert-ai: the bytes -------------------------------------------------------------------

@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("dim", [128, 64])
@pytest.mark.parametrize("kind", KINDS)
def test_decompression_matches_colbert(colbert, residual_module, rng, kind, dim, nbits):
    R = residual_module
    c = compress_with_colbert(colbert, R, rng, kind, dim, nbits)
    assert c.codes.dtype == torch.int32 and c.residuals.dtype == torch.uint8
    assert c.residuals.shape == (N_TOKENS, dim * nbits // 8)

    # the bucket ids maxsim reads are the ones colbert-ai bucketised
    residual = c.embeddings.float() - c.centroids.float()[c.codes.long()]
    expected_buckets = torch.bucketize(residual, c.colbert_codec.bucket_cutoffs)
    assert torch.equal(R.unpack_buckets(c.residuals, nbits), expected_buckets)
    assert torch.equal(R.pack_buckets(expected_buckets, nbits), c.residuals)

    ours = R.decompress_residuals(c.codes, c.residuals, c.codec)
    assert ours.dtype == torch.float32 and ours.shape == c.tokens.shape
    torch.testing.assert_close(ours, c.tokens, rtol=0, atol=4 * torch.finfo(torch.float32).eps)
    # int64 codes (fast-plaid's) decode the same
    torch.testing.assert_close(R.decompress_residuals(c.codes.long(), c.residuals, c.codec), ours,
                               rtol=0, atol=0)


@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("dim", [128, 64])
@pytest.mark.parametrize("kind", KINDS)
def test_compression_matches_colbert(colbert, residual_module, rng, kind, dim, nbits):
    R = residual_module
    c = compress_with_colbert(colbert, R, rng, kind, dim, nbits)
    codes, residuals = R.compress_residuals(c.embeddings, c.codec, c.colbert_codec.bucket_cutoffs)
    assert codes.dtype == torch.int32 and residuals.dtype == torch.uint8
    assert residuals.shape == c.residuals.shape
    same = codes == c.codes
    assert (same | near_tie_rows(c.embeddings, c.centroids)).all(), (
        f"codes differ at rows {(~same).nonzero().flatten().tolist()[:8]}")
    assert same.float().mean() > 0.99
    assert torch.equal(residuals[same], c.residuals[same])


@pytest.mark.parametrize("nbits", NBITS)
def test_colbert_index_files_load_into_maxsim(colbert, residual_module, rng, tmp_path, nbits):
    """The files colbert-ai writes (codec.save, ResidualEmbeddings.save), read back with plain
    torch.load, give maxsim the codec and tokens colbert-ai's own loader gives."""
    R, dim = residual_module, 128
    c = compress_with_colbert(colbert, R, rng, "clustered", dim, nbits)
    index = tmp_path / "index"
    index.mkdir()
    c.colbert_codec.save(index_path=str(index))
    colbert.ResidualCodec.Embeddings(c.codes, c.residuals).save(str(index / "0"))
    (index / "metadata.json").write_text(json.dumps({"config": {"dim": dim, "nbits": nbits}}))

    centroids = torch.load(index / "centroids.pt", map_location="cpu")
    cutoffs, weights = torch.load(index / "buckets.pt", map_location="cpu")
    avg_residual = torch.load(index / "avg_residual.pt", map_location="cpu")
    codes = torch.load(index / "0.codes.pt", map_location="cpu")
    residuals = torch.load(index / "0.residuals.pt", map_location="cpu")
    assert centroids.dtype == torch.float16 and centroids.shape == (N_CENTROIDS, dim)
    assert cutoffs.shape == (2 ** nbits - 1,) and weights.shape == (2 ** nbits,)
    assert weights.dtype == torch.float32 and cutoffs.dtype == torch.float32  # CPU-built index
    assert avg_residual.numel() == 1
    assert codes.dtype == torch.int32 and residuals.dtype == torch.uint8

    theirs_codec = colbert.ResidualCodec.load(str(index))
    theirs = theirs_codec.decompress(colbert.ResidualCodec.Embeddings.load(str(index), 0))
    ours = R.decompress_residuals(codes, residuals, R.ResidualCodec(centroids, weights, nbits))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=4 * torch.finfo(torch.float32).eps)
    torch.testing.assert_close(ours, c.tokens, rtol=0, atol=4 * torch.finfo(torch.float32).eps)


# ---- colbert-ai: scoring ---------------------------------------------------------------------

def maxsim64(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Plain MaxSim in float64: sum over query rows of the best dot product."""
    if q.shape[0] == 0:
        return torch.zeros((), dtype=torch.float64)
    if d.shape[0] == 0:
        return torch.full((), float("-inf"), dtype=torch.float64)
    return torch.einsum("id,jd->ij", q.double(), d.double()).max(dim=1).values.sum()


def assert_close_scores(scores, expected, query_norm_sums, qdtype, what):
    assert scores.dtype == torch.float32, scores.dtype
    actual = scores.detach().cpu().double()
    tol = SCORE_RTOL[qdtype] * query_norm_sums + 1e-6
    err = (actual - expected).abs()
    bad = ~(err <= tol)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.numel()} scores off; worst error {err.max().item():.3g} "
        f"(tolerance there {tol.flatten()[err.flatten().argmax()].item():.3g})")


def unit_queries(gen, n, dim, dtype):
    q = torch.nn.functional.normalize(torch.randn(n, dim, generator=gen, dtype=torch.float64), dim=-1)
    return q.to(dtype)


@pytest.mark.parametrize("qdtype", list(SCORE_RTOL), ids=str)
@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("kind", KINDS)
def test_score_pairs_packed_on_colbert_documents(device, colbert, residual_module, rng, kind, nbits,
                                                 qdtype):
    ms, dev = device
    dim = 128
    c = compress_with_colbert(colbert, residual_module, rng, kind, dim, nbits)
    # documents: consecutive runs of the compressed tokens
    doc_lens = torch.randint(1, 41, (40,), generator=rng)
    doc_lens = doc_lens[doc_lens.cumsum(0) <= N_TOKENS]
    d_off = torch.cat([torch.zeros(1, dtype=torch.int64), doc_lens.cumsum(0)])
    total_d = int(d_off[-1])
    q_lens = torch.randint(1, 33, (6,), generator=rng)
    q_lens[0] = 32
    q_off = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)])
    queries = unit_queries(rng, int(q_off[-1]), dim, qdtype)
    n_pairs = 60
    pq = torch.randint(0, len(q_lens), (n_pairs,), generator=rng)
    pd = torch.randint(0, len(doc_lens), (n_pairs,), generator=rng)

    scores = ms.score_pairs_packed(
        queries.to(dev), q_off.to(dev), c.residuals[:total_d].to(dev), d_off.to(dev), pq.to(dev),
        pd.to(dev), document_codes=c.codes[:total_d].to(dev), residual_codec=c.codec.to(dev))

    expected, norms = [], []
    for qi, di in zip(pq.tolist(), pd.tolist()):
        q = queries[q_off[qi]:q_off[qi + 1]].double()
        expected.append(maxsim64(q, c.tokens[d_off[di]:d_off[di + 1]]))
        norms.append(q.norm(dim=-1).sum())
    assert scores.shape == (n_pairs,) and scores.device.type == dev.type
    assert_close_scores(scores, torch.stack(expected), torch.stack(norms), qdtype, "score_pairs_packed")


@pytest.mark.parametrize("qdtype", list(SCORE_RTOL), ids=str)
@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("kind", KINDS)
def test_score_candidates_padded_on_colbert_documents(device, colbert, residual_module, rng, kind,
                                                      nbits, qdtype):
    ms, dev = device
    dim, b, cands, lq, ld = 128, 3, 5, 16, 24
    c = compress_with_colbert(colbert, residual_module, rng, kind, dim, nbits)
    # each candidate: random compressed tokens; the padding holds other valid tokens, which
    # would win the max if it were read
    pick = torch.randint(0, N_TOKENS, (b, cands, ld), generator=rng)
    codes, residuals, tokens = c.codes[pick], c.residuals[pick], c.tokens[pick]
    doc_lens = torch.randint(1, ld + 1, (b, cands), generator=rng)
    doc_lens[0, 0] = ld
    q_lens = torch.randint(1, lq + 1, (b,), generator=rng)
    q_lens[0] = lq
    queries = unit_queries(rng, b * lq, dim, qdtype).reshape(b, lq, dim)

    scores = ms.score_candidates_padded(
        queries.to(dev), residuals.to(dev), q_lens.to(dev), doc_lens.to(dev),
        document_codes=codes.to(dev), residual_codec=c.codec.to(dev))

    expected = torch.empty(b, cands, dtype=torch.float64)
    norms = torch.empty(b, cands, dtype=torch.float64)
    for i in range(b):
        q = queries[i, :q_lens[i]].double()
        for j in range(cands):
            expected[i, j] = maxsim64(q, tokens[i, j, :doc_lens[i, j]])
            norms[i, j] = q.norm(dim=-1).sum()
    assert scores.shape == (b, cands) and scores.device.type == dev.type
    assert_close_scores(scores, expected, norms, qdtype, "score_candidates_padded")


# ---- fast-plaid ------------------------------------------------------------------------------

# Run by the fast-plaid interpreter: argv = index folder, nbits, dim, seed. Writes the index,
# the embeddings it was given (input.npy, float32) and fast-plaid's own reconstruction of
# every document (reconstructed.npy, float32), concatenated in document order.
_FAST_PLAID_SCRIPT = r"""
import os, sys
import numpy as np
import torch
from fast_plaid import search

path, nbits, dim, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
gen = torch.Generator().manual_seed(seed)
lengths = torch.randint(4, 40, (48,), generator=gen).tolist()
docs = [torch.nn.functional.normalize(torch.randn(n, dim, generator=gen), dim=-1) for n in lengths]
index = search.FastPlaid(index=os.path.join(path, "index"), device="cpu")
index.create(documents_embeddings=docs, nbits=nbits, kmeans_niters=2)
rebuilt = index.get_embeddings(list(range(len(docs))))
np.save(os.path.join(path, "input.npy"), torch.cat(docs).float().numpy())
np.save(os.path.join(path, "reconstructed.npy"), torch.cat([t.float().cpu() for t in rebuilt]).numpy())
"""


def _fast_plaid_python() -> str:
    """An interpreter that can run fast-plaid, or a skip saying why there is none."""
    named = os.environ.get("MAXSIM_FAST_PLAID_PYTHON")
    if named:
        return named
    if importlib.util.find_spec("fast_plaid") is None:
        pytest.skip("fast-plaid is not installed (it is not required: set MAXSIM_FAST_PLAID_PYTHON "
                    "to an interpreter that has it and the torch its wheel was built for)")
    pins = [r for r in importlib.metadata.requires("fast-plaid") or []
            if re.match(r"torch\s*==", r) and "extra" not in r]
    here = torch.__version__.split("+")[0]
    wanted = pins[0].split("==")[1].strip() if pins else here
    if wanted != here:
        pytest.skip(f"the installed fast-plaid's extension is built for torch {wanted}, this is torch "
                    f"{here} (it crashes there); set MAXSIM_FAST_PLAID_PYTHON to an interpreter "
                    f"with fast-plaid and torch {wanted}")
    return sys.executable


def _load_npy_rows(index, name, rows):
    """The first `rows` rows of fast-plaid's codes / residuals: the merged file (1.7's single
    copy, padded past the last document) or else the per-chunk shards in order."""
    merged = index / f"merged_{name}.npy"
    if merged.exists():
        arr = np.load(merged)
    else:
        chunks = json.loads((index / "metadata.json").read_text())["num_chunks"]
        arr = np.concatenate([np.load(index / f"{i}.{name}.npy") for i in range(chunks)])
    assert arr.shape[0] >= rows
    return torch.from_numpy(np.ascontiguousarray(arr[:rows]))


@pytest.mark.parametrize("nbits", NBITS)
def test_fast_plaid_index_decodes(cpu_kernel, residual_module, tmp_path, nbits):
    python = _fast_plaid_python()
    R, dim = residual_module, 128
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOCAL_KERNELS")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    run = subprocess.run([python, "-c", _FAST_PLAID_SCRIPT, str(tmp_path), str(nbits), str(dim), "7"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, f"fast-plaid failed ({run.returncode}):\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
    index = tmp_path / "index"

    meta = json.loads((index / "metadata.json").read_text())
    assert meta["nbits"] == nbits
    n = meta["num_embeddings"]
    centroids = torch.from_numpy(np.load(index / "centroids.npy"))
    weights = torch.from_numpy(np.load(index / "bucket_weights.npy"))
    cutoffs = torch.from_numpy(np.load(index / "bucket_cutoffs.npy"))
    avg_residual = np.load(index / "avg_residual.npy")
    codes = _load_npy_rows(index, "codes", n)
    residuals = _load_npy_rows(index, "residuals", n)
    assert centroids.dtype == torch.float16 and centroids.shape[1] == dim
    assert weights.dtype == torch.float32 and weights.shape == (2 ** nbits,)
    assert cutoffs.dtype == torch.float32 and cutoffs.shape == (2 ** nbits - 1,)
    assert avg_residual.shape == (dim,)  # per dimension (colbert-ai stores one scalar)
    assert codes.dtype == torch.int64 and residuals.dtype == torch.uint8
    assert residuals.shape == (n, dim * nbits // 8)

    given = torch.from_numpy(np.load(tmp_path / "input.npy"))
    rebuilt = torch.from_numpy(np.load(tmp_path / "reconstructed.npy"))
    assert given.shape == rebuilt.shape == (n, dim)

    # Bucket ids: fast-plaid takes the residual in float16 (float16 embeddings minus float16
    # centroids) and bucketises it against the float32 cutoffs, colbert-ai's bit packing.
    residual16 = given.half() - centroids[codes]
    assert torch.equal(R.unpack_buckets(residuals, nbits), torch.bucketize(residual16.float(), cutoffs))

    # Tokens: fast-plaid decodes in float16; maxsim in float32 from the same bytes.
    codec = R.ResidualCodec(centroids, weights, nbits)
    ours = R.decompress_residuals(codes, residuals, codec)
    torch.testing.assert_close(ours, rebuilt, rtol=0, atol=2e-3)

    # Scoring straight from fast-plaid's arrays (int64 codes, float16 centroids).
    ms = cpu_kernel
    d_off = torch.tensor([0, n // 3, n // 2, n], dtype=torch.int64)
    gen = torch.Generator().manual_seed(nbits)
    queries = unit_queries(gen, 24, dim, torch.float32)
    q_off = torch.tensor([0, 10, 24], dtype=torch.int64)
    pq, pd = torch.tensor([0, 0, 1, 1, 1]), torch.tensor([0, 2, 0, 1, 2])
    scores = ms.score_pairs_packed(queries, q_off, residuals, d_off, pq, pd,
                                   document_codes=codes, residual_codec=codec)
    expected = torch.stack([maxsim64(queries[q_off[q]:q_off[q + 1]], ours[d_off[d]:d_off[d + 1]])
                            for q, d in zip(pq.tolist(), pd.tolist())])
    norms = torch.stack([queries[q_off[q]:q_off[q + 1]].double().norm(dim=-1).sum() for q in pq.tolist()])
    assert_close_scores(scores, expected, norms, torch.float32, "score_pairs_packed (fast-plaid)")
