"""GPU time of compressed-document calls (int8 / float8 e4m3fn + float32 row scales) against
the same call with float16 documents, and the bytes per second they read.

Each call is captured 20 times into a CUDA graph; the figure is the median over 7 replays
of (replay time / 20), so host overhead is out. Bytes: documents (values + scales for the
compressed formats) + queries, as the kernel must read them at least once. The copy rate
is a device-to-device copy of the compressed documents' bytes (read + write counted once
each, so "copy rate" = 2 * bytes / time).

Run on the device from the repository root after a CUDA build:
  python3 tools/device/bench_compressed.py
(BENCH_ROWS=ColBERTCorpus,ColPaliCorpus: those rows only; BENCH_VARIANTS: see main.)
"""
from __future__ import annotations

import contextlib
import importlib
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def load_kernel():
    """The built CUDA variant: its raw ops (called directly, so that only the kernel is timed)
    and its quantize_documents."""
    import kernels

    ms = kernels.get_local_kernel(ROOT, backend="cuda")
    return ms, importlib.import_module(ms.__name__ + "._ops").ops


@contextlib.contextmanager
def knobs(env):
    """The environment settings env for the block's calls, the earlier values restored after it
    (the CUDA launchers read their knobs per call, so also at a graph's capture)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def padded_rerank_peers():
    """The installed peers' padded rerank calls, name -> fn(queries, documents), full-length
    documents (no lengths): late-interaction-kernels as "lik", flash-maxsim as "fm"."""
    peers = {}
    try:
        import late_interaction_kernels as lik
        peers["lik"] = lambda q, d: lik.maxsim(q, d, None, None)
    except ImportError:
        pass
    try:
        import flash_maxsim as fm
        peers["fm"] = lambda q, d: fm.flash_maxsim_rerank_padded(q, d, None, None)
    except ImportError:
        pass
    return peers


def graph_time_ms(fn, reps=20, replays=7):
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def with_formats(ms, d, call):
    """{format: (thunk, document bytes)} for float16 documents d and each compressed format
    of them (maxsim.quantize_documents), where call(documents, scales) is the timed op call."""
    calls = {"fp16": ((lambda: call(d, None)), d.numel() * 2)}
    for name, fmt in (("int8", "int8"), ("e4m3", "float8_e4m3fn")):
        v, s = ms.quantize_documents(d, fmt)
        s = s.contiguous()  # the ops want the documents' shape without its last dim
        calls[name] = ((lambda v=v, s=s: call(v, s)), v.numel() + s.numel() * 4)
    return calls


def padded_call(kernel, ops, B, C, Lq, Ld, D, dtype=torch.float16):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Lq, D, device="cuda", dtype=dtype, generator=gen)
    d = torch.randn(B, C, Ld, D, device="cuda", dtype=torch.float16, generator=gen)
    ql = torch.full((B,), Lq, device="cuda", dtype=torch.int32)
    dl = torch.full((B, C), Ld, device="cuda", dtype=torch.int32)
    # float16 documents pair with float16 queries (the ops want one dtype for both)
    return with_formats(kernel, d, lambda v, s: ops.padded_forward(q if s is not None else q.half(), v, ql, dl,
                                                                False, s)), q.numel() * q.element_size()


def packed_call(kernel, ops, B, C, Lq, Ld, D):
    """The padded call's pairs as a packed call (one query row block per query, documents back
    to back, pair b * C + c = (query b, document b * C + c))."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B * Lq, D, device="cuda", dtype=torch.float16, generator=gen)
    d = torch.randn(B * C * Ld, D, device="cuda", dtype=torch.float16, generator=gen)
    qo = torch.arange(0, B * Lq + 1, Lq, device="cuda", dtype=torch.int64)
    do = torch.arange(0, B * C * Ld + 1, Ld, device="cuda", dtype=torch.int64)
    pq = torch.arange(B, device="cuda").repeat_interleave(C)
    pd = torch.arange(B * C, device="cuda")
    return with_formats(kernel, d, lambda v, s: ops.packed_forward(q, qo, v, do, pq, pd, Lq, False, s)), q.numel() * 2


def contrastive_call(kernel, ops, Nq, Nb, Lq, Ld, D):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(Nq, Lq, D, device="cuda", dtype=torch.float16, generator=gen)
    d = torch.randn(Nb, Ld, D, device="cuda", dtype=torch.float16, generator=gen)
    dl = torch.full((Nb,), Ld, device="cuda", dtype=torch.int32)
    return with_formats(kernel, d, lambda v, s: ops.contrastive_padded_forward(q, v, dl, None, False, s)), q.numel() * 2


def copy_rate(nbytes):
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = graph_time_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e12


def main():
    kernel, ops = load_kernel()
    print(torch.cuda.get_device_name(), flush=True)
    rows = [
        ("HeavyRerank", lambda: padded_call(kernel, ops, 32, 100, 32, 256, 128)),
        ("HeavyRerank bf16", lambda: padded_call(kernel, ops, 32, 100, 32, 256, 128, torch.bfloat16)),
        ("HeavyRerankPacked", lambda: packed_call(kernel, ops, 32, 100, 32, 256, 128)),
        ("SingleQueryPacked", lambda: packed_call(kernel, ops, 1, 1000, 32, 300, 128)),
        ("LongDocStressPacked", lambda: packed_call(kernel, ops, 8, 16, 64, 1024, 128)),
        ("SmallRerank", lambda: padded_call(kernel, ops, 32, 10, 32, 180, 128)),
        ("Rerank Ld 64", lambda: padded_call(kernel, ops, 32, 100, 32, 64, 128)),
        ("Rerank Ld 128", lambda: padded_call(kernel, ops, 32, 100, 32, 128, 128)),
        ("Rerank", lambda: padded_call(kernel, ops, 32, 50, 32, 180, 128)),
        ("SingleQueryRerank", lambda: padded_call(kernel, ops, 1, 1000, 32, 300, 128)),
        ("ColPaliRerank", lambda: padded_call(kernel, ops, 16, 64, 32, 1030, 128)),
        ("LongDocStress", lambda: padded_call(kernel, ops, 8, 16, 64, 1024, 128)),
        ("RerankD512", lambda: padded_call(kernel, ops, 32, 50, 32, 180, 512)),
        ("ColBERTCorpus", lambda: contrastive_call(kernel, ops, 32, 10_000, 32, 256, 128)),
        ("ColPaliCorpus", lambda: contrastive_call(kernel, ops, 8, 4096, 32, 1030, 128)),
    ]
    # BENCH_ROWS=name,name,... keeps those rows only
    keep = [w for w in os.environ.get("BENCH_ROWS", "").split(",") if w]
    rows = [r for r in rows if not keep or r[0] in keep]
    # The same call on the other kernels: "bytes ms" the sm_90a kernel with the documents as the
    # register operand where it applies (MAXSIM_CUDA_HOPPER_WIDEN=0, MAXSIM_CUDA_HOPPER_BYTES=1;
    # else mma.sync), "mma.sync ms" with MAXSIM_CUDA_FORCE_MMA_SYNC=1 (the Ampere kernels).
    # BENCH_VARIANTS="name=ENV=V,ENV=V;name2=ENV=V" replaces them (cli.py's --variant syntax,
    # ';' between variants; e.g. block shapes behind a knob).
    variants = (("bytes", {"MAXSIM_CUDA_HOPPER_WIDEN": "0", "MAXSIM_CUDA_HOPPER_BYTES": "1"}),
                ("mma.sync", {"MAXSIM_CUDA_FORCE_MMA_SYNC": "1"}))
    if os.environ.get("BENCH_VARIANTS"):
        from cli import parse_variants  # tools/device, this script's folder

        variants = parse_variants(os.environ["BENCH_VARIANTS"].split(";"))
    print(f"{'workload':<20} {'format':<6} {'ms':>8} {'x fp16':>7} {'TB/s':>6}"
          + "".join(f" {v + ' ms':>12}" for v, _ in variants))
    for name, make in rows:
        calls, qbytes = make()
        base = graph_time_ms(calls["fp16"][0])
        for fmt, (fn, dbytes) in calls.items():
            ms = base if fmt == "fp16" else graph_time_ms(fn)
            others = []
            for _, env in variants:
                with knobs(env):
                    others.append(graph_time_ms(fn))
            tbs = (dbytes + qbytes) / (ms * 1e-3) / 1e12
            print(f"{name:<20} {fmt:<6} {ms:8.4f} {ms / base:7.3f} {tbs:6.2f}"
                  + "".join(f" {o:12.4f}" for o in others), flush=True)
        del calls
        torch.cuda.empty_cache()
    print(f"copy rate (2 x 108 MB / time): {copy_rate(108 << 20):.2f} TB/s")


if __name__ == "__main__":
    sys.exit(main())
