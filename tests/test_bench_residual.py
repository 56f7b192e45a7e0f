"""benchmarks/compare.py's residual-document rows: the inputs they build and the calls they
time agree with each other, and the bytes handed to late-interaction-kernels decode to the
same bucket ids. (The peers themselves run on CUDA only, in the device benchmark.)
"""
from __future__ import annotations

import argparse

import pytest
import torch

from conftest import REPO_ROOT, _load_source_module

COMPARE = _load_source_module("maxsim_bench_compare_residual", REPO_ROOT / "benchmarks" / "compare.py")
W = COMPARE.W


def lik_order_buckets(packed, nbits, dim):
    """late-interaction-kernels' documented decoding (its reference.unpack_residuals_reference):
    byte f // (8 / nbits), bits (f % (8 / nbits)) * nbits up."""
    per_byte, mask = 8 // nbits, (1 << nbits) - 1
    rs = packed.to(torch.int64)
    return torch.stack([(rs[..., f // per_byte] >> ((f % per_byte) * nbits)) & mask for f in range(dim)], dim=-1)


@pytest.mark.parametrize("nbits", [1, 2, 4])
def test_little_endian_residuals_decode_to_the_same_buckets(cpu_kernel, nbits):
    pack_buckets = cpu_kernel._residual.pack_buckets   # colbert-ai's order
    gen = torch.Generator().manual_seed(nbits)
    dim = 64
    buckets = torch.randint(0, 1 << nbits, (5, 7, dim), generator=gen)
    colbert = pack_buckets(buckets, nbits)
    lik = W.little_endian_residuals(colbert, nbits, dim)
    assert lik.dtype == torch.uint8 and lik.shape == colbert.shape
    assert torch.equal(lik_order_buckets(lik, nbits, dim), buckets)
    if nbits < 8:   # the orders differ: the conversion is not the identity
        assert not torch.equal(lik, colbert)


def tiny(name, device, layout):
    w = W.WORKLOADS[name]
    return W.build_inputs(w, device, torch.float32 if device.type == "cpu" else torch.float16, layout,
                          shape=dict(B=2, C=3, Lq=8, Ld=20))


@pytest.mark.parametrize("name,layout", [("HeavyRerank", "full"), ("HeavyRerank", "ragged"),
                                         ("HeavyRerankPacked", "ragged")])
def test_residual_rows_agree(device, name, layout):
    ms, dev = device
    x = tiny(name, dev, layout)
    tol = 1e-4 if dev.type == "cpu" else 2e-2
    for fmt in ("residual1", "residual2", "residual4"):
        r = W.compress(x, ms, fmt)
        assert r.document_residuals.shape[-1] == 128 * W.RESIDUAL_FORMATS[fmt] // 8
        assert r.document_bytes_per_token() == 4 + 16 * W.RESIDUAL_FORMATS[fmt]
        fused = W.maxsim_call(ms, r)
        decompressed = COMPARE.make_impl("maxsim-decompress", r, ms)()
        naive = W.naive_call(r)
        # float64 scoring of the decompressed tokens (CPU)
        reference = naive
        if dev.type == "cpu":
            x64 = W.decompressed(r, torch.float64)
            key = "queries_packed" if x64.workload.surface == "packed" else "queries"
            x64.t[key] = x64.t[key].double()
            reference = W.maxsim_call(ms, x64)
        for other in (decompressed, naive, reference):
            assert other.shape == fused.shape
            torch.testing.assert_close(other.float(), fused.float(), atol=tol, rtol=tol)
    c = W.compress(x, ms, "centroids")
    assert c.document_bytes_per_token() == 4
    torch.testing.assert_close(W.maxsim_call(ms, c), W.naive_centroids(c), atol=1e-4, rtol=1e-4)
    # bytes: codes + residuals + queries + centroids + scores
    r = W.compress(x, ms, "residual2")
    q = r.queries_packed if r.workload.surface == "packed" else r.queries
    expect = (r.document_codes.numel() * 4 + r.document_residuals.numel() + q.numel() * q.element_size()
              + r.codec.centroids.numel() * r.codec.centroids.element_size() + 4 * 6)
    assert r.bytes_in() == expect


def test_compare_plans_residual_rows():
    args = argparse.Namespace(device="cuda", workloads="SingleQueryRerank,HeavyRerankPacked", dtype="auto",
                              layout="full", documents="plain,residual2,centroids")
    plan = [(w.name, lay, fmt) for w, _, lay, fmt in COMPARE.rows_to_run(args)]
    assert plan == [("SingleQueryRerank", "full", None), ("SingleQueryRerank", "full", "residual2"),
                    ("SingleQueryRerank", "full", "centroids"), ("HeavyRerankPacked", "ragged", None),
                    ("HeavyRerankPacked", "ragged", "residual2"), ("HeavyRerankPacked", "ragged", "centroids")]
    assert COMPARE.compressed_impls("residual2", COMPARE.IMPLS) == ["maxsim", "naive", "maxsim-decompress",
                                                                   "LIK-residual"]
    assert COMPARE.compressed_impls("centroids", COMPARE.IMPLS) == ["maxsim", "naive", "LIK-centroids"]
    args.documents = "plain,residual3"
    with pytest.raises(SystemExit, match="residual3"):
        COMPARE.rows_to_run(args)


@pytest.mark.parametrize("nbits", [1, 2, 4])
def test_byte_table_decoding_is_the_codec_order(cpu_kernel, nbits):
    gen = torch.Generator().manual_seed(10 + nbits)
    packed = torch.randint(0, 256, (3, 5, 16 * nbits), generator=gen).to(torch.uint8)
    assert torch.equal(W.colbert_buckets(packed, nbits, 128), cpu_kernel._residual.unpack_buckets(packed, nbits))


@pytest.mark.parametrize("nbits", [1, 2, 4])
@pytest.mark.parametrize("normalize", [True, False])
def test_benchmark_decode_is_the_codecs(cpu_kernel, nbits, normalize):
    """decompress-then-score's table decode gives the package's decompress_residuals bit for
    bit, on random codes (int32 and int64) and bytes, padded shapes included."""
    gen = torch.Generator().manual_seed(20 + nbits)
    centroids = torch.randn(37, 128, generator=gen).to(torch.float16)
    weights = torch.randn(1 << nbits, generator=gen).to(torch.float16)
    codec = cpu_kernel.ResidualCodec(centroids, weights, nbits, normalize=normalize)
    for code_dtype in (torch.int32, torch.int64):
        codes = torch.randint(0, 37, (3, 5, 11), generator=gen).to(code_dtype)
        packed = torch.randint(0, 256, (3, 5, 11, 16 * nbits), generator=gen).to(torch.uint8)
        for dtype in (torch.float32, torch.float16):
            got = W.torch_decompress(codes, packed, codec, dtype)
            want = cpu_kernel.decompress_residuals(codes, packed, codec, dtype)
            assert got.dtype == dtype and torch.equal(got, want)
            # the table made once per codec, as compare.py's rows pass it
            assert torch.equal(W.torch_decompress(codes, packed, codec, dtype, W.residual_byte_table(codec)), want)
