"""Where compare.py's decompress-then-score row spends its time: HeavyRerank's residual2
documents (CUDA) decoded by workloads.torch_decompress and by other PyTorch forms of the same
decode, each timed alone (CUDA events) and checked equal to it; then torch.profiler over the
decode that compare.py uses."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import workloads as W  # noqa: E402


def timed(fn, reps=5):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    import kernels
    ms = kernels.get_local_kernel(ROOT, backend="cuda")
    x = W.build_inputs(W.WORKLOADS["HeavyRerank"], "cuda", layout="full")
    r = W.compress(x, ms, "residual2")
    codes, res, codec = r.document_codes, r.document_residuals, r.codec
    dim, per_byte = codec.dim, 8 // codec.nbits
    print("codes", codes.dtype, tuple(codes.shape), "residuals", tuple(res.shape), "centroids",
          codec.centroids.dtype, tuple(codec.centroids.shape), "query", x.dtype)
    cents = codec.centroids.float()
    flat_table = W.residual_byte_table(codec)
    table = flat_table.view(256, per_byte)   # the row-gather forms' view of the same table
    flat_codes, flat_res = codes.reshape(-1), res.reshape(-1, res.shape[-1])

    def finish(t):
        return F.normalize(t.reshape(*res.shape[:-1], dim), p=2, dim=-1, eps=1e-12).to(x.dtype)

    forms = {
        "torch_decompress (take)": lambda: W.torch_decompress(codes, res, codec, x.dtype, flat_table),
        "embedding both (ca5bbe3's form)": lambda: finish(F.embedding(flat_codes.int(), cents) + F.embedding(
            flat_res.int(), table).reshape(-1, dim)),
        "centroids only: embedding int32": lambda: F.embedding(flat_codes.int(), cents),
        "centroids only: index_select int64": lambda: cents.index_select(0, flat_codes.long()),
        "centroids only: [] int64": lambda: cents[flat_codes.long()],
        "weights only: embedding int32": lambda: F.embedding(flat_res.int(), table),
        "weights only: index_select int64": lambda: table.index_select(0, flat_res.reshape(-1).long()),
        "weights only: [] int64": lambda: table[flat_res.long()],
        "weights only: take on flat table": lambda: flat_table.take(
            (flat_res.long().unsqueeze(-1) * per_byte + torch.arange(per_byte, device="cuda"))),
        "index_select both": lambda: finish(cents.index_select(0, flat_codes.long()) + table.index_select(
            0, flat_res.reshape(-1).long()).reshape(-1, dim)),
        "[] both": lambda: finish(cents[flat_codes.long()] + table[flat_res.long()].reshape(-1, dim)),
    }
    want = W.torch_decompress(codes, res, codec, x.dtype, flat_table)
    for name, fn in forms.items():
        ms_ = timed(fn)
        out = fn()
        same = torch.equal(out, want) if out.shape == want.shape else "-"
        print(f"{name:45s} {ms_:8.3f} ms  equal: {same}")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        W.torch_decompress(codes, res, codec, x.dtype, flat_table)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))


if __name__ == "__main__":
    main()
