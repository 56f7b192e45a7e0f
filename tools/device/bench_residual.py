"""GPU time of ColBERTv2 residual documents (nbits 1, 2, 4) against maxsim's float16 rerank
of the same documents decompressed, decompress-then-score, and late-interaction-kernels'
`maxsim_residual` / `maxsim_residual_varlen` where they apply (their scoring is every query
against every document, so only the one-query row is their call).

Timing as tools/device/bench_compressed.py: 20 calls captured in a CUDA graph, median of 7
replays. Bytes: codes (int32) + packed residuals + queries; the centroids (a few hundred KB
here) come from L2. The bucket weights are float32 (the kernels' float32 adds) and, in the
`_f16w` columns, float16 (16-bit adds: colbert-ai's GPU codec keeps them so). Note:
late-interaction-kernels reads the bucket ids in another bit order than colbert-ai writes them (its docstring: little-endian within the byte), so its scores of
these bytes differ; only its time is comparable.

Run on the device from the repository root after a CUDA build:
  python3 tools/device/bench_residual.py
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_compressed import graph_time_ms  # noqa: E402
from workloads import residual_byte_table, torch_decompress  # noqa: E402  (compare.py's decompress-then-score)

ROOT = Path(__file__).resolve().parents[2]
N_CENTROIDS = 4096
D = 128


def rows(quick=False):
    # name, B, C, Lq, Ld
    yield "SingleQueryRerank", 1, 1000, 32, 300
    yield "HeavyRerank", 32, 100, 32, 256
    yield "ColPaliRerank", 16, 64, 32, 1030


def main():
    import kernels

    ms = kernels.get_local_kernel(ROOT, backend="cuda")
    try:
        import late_interaction_kernels.plaid as lik
    except Exception as e:  # noqa: BLE001
        lik = None
        print("late-interaction-kernels not importable:", e)
    gen = torch.Generator(device="cuda").manual_seed(0)
    centroids = torch.nn.functional.normalize(torch.randn(N_CENTROIDS, D, device="cuda", generator=gen), dim=-1)
    results = []
    for name, B, C, Lq, Ld in rows():
        q = torch.nn.functional.normalize(torch.randn(B, Lq, D, device="cuda", generator=gen), dim=-1).half()
        ql = torch.full((B,), Lq, device="cuda", dtype=torch.int32)
        dl = torch.full((B, C), Ld, device="cuda", dtype=torch.int32)
        codes = torch.randint(0, N_CENTROIDS, (B, C, Ld), device="cuda", generator=gen, dtype=torch.int32)
        row = {"workload": name, "B": B, "C": C, "Lq": Lq, "Ld": Ld, "D": D}
        for nbits in (1, 2, 4):
            weights = torch.linspace(-0.05, 0.05, 1 << nbits, device="cuda")
            codec = ms.ResidualCodec(centroids.half(), weights, nbits)
            res = torch.randint(0, 256, (B, C, Ld, D * nbits // 8), device="cuda", generator=gen,
                                dtype=torch.int32).to(torch.uint8)
            t = graph_time_ms(lambda: ms.score_candidates_padded(q, res, ql, dl, document_codes=codes,
                                                                  residual_codec=codec))
            nbytes = codes.numel() * 4 + res.numel() + q.numel() * 2
            row[f"residual{nbits}_ms"] = t
            row[f"residual{nbits}_TBps"] = nbytes / t / 1e9
            # float16 weights (colbert-ai's GPU codec keeps them so): the kernels' 16-bit adds
            codec16 = ms.ResidualCodec(centroids.half(), weights.half(), nbits)
            row[f"residual{nbits}_f16w_ms"] = graph_time_ms(
                lambda: ms.score_candidates_padded(q, res, ql, dl, document_codes=codes, residual_codec=codec16))
            # packed: the same tokens, flat
            offs = torch.arange(0, B * C + 1, device="cuda", dtype=torch.int64) * Ld
            qo = torch.arange(0, B + 1, device="cuda", dtype=torch.int64) * Lq
            pq = torch.arange(B, device="cuda").repeat_interleave(C)
            pd = torch.arange(B * C, device="cuda")
            qf, rf, cf = q.reshape(-1, D), res.reshape(-1, res.shape[-1]), codes.reshape(-1)
            row[f"residual{nbits}_packed_ms"] = graph_time_ms(
                lambda: ms.score_pairs_packed(qf, qo, rf, offs, pq, pd, max_q_len=Lq, document_codes=cf,
                                              residual_codec=codec))
            if nbits == 2:
                dense = ms.decompress_residuals(codes, res, codec, torch.float16)
                row["fp16_ms"] = graph_time_ms(lambda: ms.score_candidates_padded(q, dense, ql, dl))
                table = residual_byte_table(codec)
                row["decompress_then_score_ms"] = graph_time_ms(lambda: ms.score_candidates_padded(
                    q, torch_decompress(codes, res, codec, torch.float16, table), ql, dl))
                row["fp16_GBytes"] = dense.numel() * 2 / 1e9
                # the FFMA route (SimtMainloop's decode): float32 queries against float16 centroids
                # (PyLate embeddings against a colbert-ai GPU index), float16 queries against
                # float32 centroids; beside them float32 decompress-then-score
                qf32 = q.float()
                row["residual2_f32_queries_ms"] = graph_time_ms(lambda: ms.score_candidates_padded(
                    qf32, res, ql, dl, document_codes=codes, residual_codec=codec))
                codec32 = ms.ResidualCodec(centroids.float(), weights, nbits)
                row["residual2_f32_centroids_ms"] = graph_time_ms(lambda: ms.score_candidates_padded(
                    q, res, ql, dl, document_codes=codes, residual_codec=codec32))
                row["decompress_then_score_f32_ms"] = graph_time_ms(lambda: ms.score_candidates_padded(
                    qf32, torch_decompress(codes, res, codec, torch.float32, table), ql, dl))
                a32 = ms.score_candidates_padded(qf32, res, ql, dl, document_codes=codes, residual_codec=codec)
                b32 = ms.score_candidates_padded(qf32, ms.decompress_residuals(codes, res, codec, torch.float32), ql, dl)
                row["f32_queries_max_abs_diff_vs_f32_dense"] = float((a32 - b32).abs().max())
                # correctness spot check against the float16 documents (rounding of t only)
                a = ms.score_candidates_padded(q, res, ql, dl, document_codes=codes, residual_codec=codec)
                b = ms.score_candidates_padded(q, dense, ql, dl)
                row["max_abs_diff_vs_fp16_dense"] = float((a - b).abs().max())
            if lik is not None and B == 1 and nbits in (2, 4):
                c2, r2 = codes.reshape(C, Ld), res.reshape(C, Ld, -1)
                lens = torch.full((C,), Ld, device="cuda", dtype=torch.int64)
                w = weights.float()
                try:
                    row[f"lik_residual{nbits}_ms"] = graph_time_ms(
                        lambda: lik.maxsim_residual(q[0], c2, r2, lens, codec.centroids, w, nbits))
                except Exception as e:  # noqa: BLE001
                    row[f"lik_residual{nbits}_error"] = repr(e)[:200]
                cu = torch.arange(0, C + 1, device="cuda", dtype=torch.int32) * Ld
                try:
                    row[f"lik_varlen{nbits}_ms"] = graph_time_ms(
                        lambda: lik.maxsim_residual_varlen(q[0], c2.reshape(-1), r2.reshape(C * Ld, -1), cu,
                                                           codec.centroids, w, nbits, max_seqlen_d=Ld))
                except Exception as e:  # noqa: BLE001
                    row[f"lik_varlen{nbits}_error"] = repr(e)[:200]
        # PLAID's centroid-only stage: every query against its candidates' codes
        flat_codes = codes.reshape(-1)
        offs = torch.arange(0, B * C + 1, device="cuda", dtype=torch.int64) * Ld
        if B == 1:
            row["centroid_score_ms"] = graph_time_ms(lambda: ms.score_centroids(q, flat_codes, offs, centroids.half()))
            if lik is not None:
                lens = torch.full((C,), Ld, device="cuda", dtype=torch.int64)
                table = (centroids.half().float() @ q[0].float().T).contiguous()  # [n_centroids, Lq]
                c2 = codes.reshape(C, Ld)
                try:
                    row["lik_plaid_approx_ms"] = graph_time_ms(lambda: lik.plaid_approx_score(table, c2, lens))
                    row["lik_plaid_approx_with_table_ms"] = graph_time_ms(
                        lambda: lik.plaid_approx_score((centroids.half().float() @ q[0].float().T), c2, lens))
                    ours = ms.score_centroids(q, flat_codes, offs, centroids.half())[0]
                    row["centroid_max_abs_diff_vs_lik"] = float((ours - lik.plaid_approx_score(table, c2, lens)).abs().max())
                except Exception as e:  # noqa: BLE001
                    row["lik_plaid_approx_error"] = repr(e)[:200]
        print(json.dumps(row), flush=True)
        results.append(row)
    out = Path(os.environ.get("OUT", "/tmp/out")) / "bench_residual.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": results}, indent=1))


if __name__ == "__main__":
    main()
