#!/usr/bin/env python3
"""Side-by-side benchmark: maxsim vs naive PyTorch vs the peer packages, in one process.

    python3 benchmarks/compare.py --device cpu                      # CPU rerank table, fp32 + bf16
    python3 benchmarks/compare.py --device cuda --workloads all --json out.json
    python3 benchmarks/compare.py --device cpu --workloads Rerank,Contrastive --dtype float32 --iters 20

Implementations (each wrapped so a failure is reported as n/a with its reason):
- maxsim: this repository's build, loaded with kernels.get_local_kernel(<repo root>).
- naive:  torch.einsum materialising the similarity tensor in the input dtype, masked_fill
          for padding, amax, sum; for training steps autograd of that. Packed inputs are
          first scattered into padded tensors (part of the timed call).
- LIK:    late-interaction-kernels (late_interaction_kernels.maxsim with 4-D documents for
          padded rerank, score_pairs.score_pairs_packed, maxsim_varlen for corpus scoring).
- FM:     flash-maxsim (flash_maxsim_rerank_padded, flash_maxsim_varlen with every pair's query
          copied next to its document (the copy is made before timing), flash_maxsim_batched
          [_train] with padded documents).
  Both peers are Triton packages: they run on CUDA only.

Every implementation gets the same inputs (benchmarks/workloads.py). Training rows time
forward + backward of (scores * g).sum(). Scores are checked against maxsim's ("max err").

Time: median (and min) over --iters calls after --warmup calls; CUDA events on a GPU,
time.perf_counter on the CPU. The load average is printed and saved: CPU times taken
while other processes run are not clean.

Memory ("peak extra"): the memory a call needs beyond its inputs.
- CUDA: torch.cuda.max_memory_allocated() during one call minus memory_allocated() before it.
- CPU:  each (workload, dtype, layout, implementation) runs once in a fresh subprocess, which
  builds the inputs, resets the kernel's peak-RSS counter (writes 5 to /proc/self/clear_refs),
  then reports VmHWM after the call minus VmRSS before it. The child runs with
  MALLOC_MMAP_THRESHOLD_=65536 so large buffers are mmapped and returned on free and freed
  input-building memory cannot hide the call's allocations. Where clear_refs is not writable
  it falls back to ru_maxrss growth (then input building can mask small peaks).

Floors, measured at start: copy bandwidth (a large device-to-device copy, read + write
bytes / time) and the matmul rate of each dtype (a large square matmul). The floor of a row
is max(input bytes / bandwidth, useful forward FLOPs / matmul rate), where useful FLOPs =
2 * D * sum over pairs of valid query tokens x valid document tokens (training rows use the
forward FLOPs too). "of floor" = floor / maxsim time.

On the CPU every workload runs its scaled-down shape (see workloads.py; `scale` column =
fraction of the (query, document) pairs kept), and the default workload set is the rerank
workloads (padded, full and ragged, and packed) in float32 and bfloat16.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
IMPLS = ("maxsim", "naive", "LIK", "FM")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
RERANK = ("SmallRerank", "Rerank", "HeavyRerank", "LongDocStress", "ColPaliRerank")


# ---- implementations -------------------------------------------------------------------

def load_kernel(device, path=REPO):
    try:
        from kernels import get_local_kernel
    except ImportError:   # a bare GPU box without the `kernels` package: import the build directly
        return _import_variant(Path(path), device)
    return get_local_kernel(Path(path), backend="cpu" if device == "cpu" else None)


def _import_variant(path, device):
    import importlib.util
    import platform
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    tag = "cpu" if device == "cpu" else "cu" + torch.version.cuda.replace(".", "")
    variant = path / "build" / f"torch{major}{minor}-cxx11-{tag}-{platform.machine()}-linux"
    name = json.loads((variant / "metadata.json").read_text())["id"]
    spec = importlib.util.spec_from_file_location(
        name, variant / "__init__.py", submodule_search_locations=[str(variant)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    print(f"(kernels package not installed: imported {variant} directly)", flush=True)
    return module


def _train_step(score_fn, q, d, g):
    scores = score_fn(q, d)
    torch.autograd.grad((scores * g).sum(), (q, d))
    return scores.detach()


def _cuda_only(x):
    if x.device.type != "cuda":
        raise RuntimeError("Triton kernels, CUDA only")


def lik_fn(x: W.Inputs):
    import late_interaction_kernels as lik
    _cuda_only(x)
    w, s, ragged = x.workload, x.shape, x.layout == "ragged"
    Lq, Ld = s["Lq"], s["Ld"]
    if w.surface == "padded":
        qm = W.valid_mask(x.query_lengths, Lq) if ragged else None
        dm = W.valid_mask(x.doc_lengths, Ld) if ragged else None
        return lambda: lik.maxsim(x.queries, x.documents, qm, dm)
    if w.surface == "packed":
        from late_interaction_kernels.score_pairs import score_pairs_packed
        return lambda: score_pairs_packed(
            x.queries_packed, x.documents_packed, x.query_offsets, x.document_offsets,
            x.pair_query_ids, x.pair_document_ids, max_seqlen_q=Lq, max_seqlen_d=Ld)
    if w.train:
        q, d = W.train_leaves(x, padded_docs=True)
        qm = None if x.query_lengths is None else W.valid_mask(x.query_lengths, Lq)
        dm = W.valid_mask(x.doc_lengths, Ld) if ragged else None
        return lambda: _train_step(lambda a, b: lik.maxsim(a, b, qm, dm), q, d, x.grad_weights)
    q_packed, q_off = W.packed_queries(x)
    return lambda: lik.maxsim_varlen(q_packed, x.documents_packed, q_off, x.document_offsets,
                                     max_seqlen_q=Lq, max_seqlen_d=Ld)


def fm_fn(x: W.Inputs):
    import flash_maxsim as fm
    _cuda_only(x)
    w, s, ragged = x.workload, x.shape, x.layout == "ragged"
    Lq, Ld = s["Lq"], s["Ld"]
    if w.surface == "padded":
        ql, dl = (x.query_lengths, x.doc_lengths) if ragged else (None, None)
        return lambda: fm.flash_maxsim_rerank_padded(x.queries, x.documents, ql, dl)
    if w.surface == "packed":
        # flash_maxsim_varlen scores pair n = (query segment n, document segment n): give every
        # pair its own copy of its query (built here, outside the timed call).
        pq = x.pair_query_ids.long()
        q_len = x.query_lengths[pq]
        q_pairs = W.unpack(x.queries_packed, x.query_offsets, Lq)[pq][W.valid_mask(q_len, Lq)]
        q_off = W.offsets(q_len)
        return lambda: fm.flash_maxsim_varlen(q_pairs, x.documents_packed, q_off,
                                              x.document_offsets, Lq, Ld)
    dl = x.doc_lengths if ragged else None
    if w.train:
        q, d = W.train_leaves(x, padded_docs=True)
        return lambda: _train_step(
            lambda a, b: fm.flash_maxsim_batched_train(a, b, shared_docs=True, doc_lengths=dl,
                                                       query_lengths=x.query_lengths),
            q, d, x.grad_weights)
    d_pad = W.padded_documents(x)
    return lambda: fm.flash_maxsim_batched(x.queries, d_pad, doc_lengths=dl, shared_docs=True,
                                           query_lengths=x.query_lengths)


def make_impl(name, x: W.Inputs, kernel):
    """A zero-argument callable returning the scores, or raises with the reason it can't run."""
    if name == "maxsim":
        leaves = W.train_leaves(x) if x.workload.train else None
        return lambda: W.maxsim_call(kernel, x, leaves)
    if name == "naive":
        leaves = W.train_leaves(x, padded_docs=True) if x.workload.train else None
        return lambda: W.naive_call(x, leaves)
    return lik_fn(x) if name == "LIK" else fm_fn(x)


def _reason(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:100]


# ---- measurement -----------------------------------------------------------------------------

def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device, warmup, iters, stat=statistics.median, all_times=None):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    if device == "cuda":
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    if all_times is not None:
        all_times.extend(times)
    return stat(times)


def cuda_peak_bytes(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def cpu_child(spec: dict) -> dict:
    """Runs in a fresh process: one call of one implementation, peak RSS growth over it."""
    torch.set_num_threads(spec["threads"])
    w = W.WORKLOADS[spec["workload"]]
    x = W.build_inputs(w, "cpu", DTYPES[spec["dtype"]], spec["layout"])
    kernel = load_kernel("cpu", spec["kernel"]) if spec["impl"] == "maxsim" else None
    fn = make_impl(spec["impl"], x, kernel)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        method, before = "VmHWM", _status_kib("VmRSS")
    except OSError:
        method, before = "ru_maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn()
    after = _status_kib("VmHWM") if method == "VmHWM" else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_bytes": (after - before) * 1024, "method": method}


def cpu_peak_bytes(workload, dtype, layout, impl, kernel_path):
    spec = dict(workload=workload, dtype=dtype, layout=layout, impl=impl, kernel=str(kernel_path),
                threads=torch.get_num_threads())
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, __file__, "--_child", json.dumps(spec)], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError((out.stderr.strip().splitlines() or ["child failed"])[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]


def measure_floors(device, dtypes):
    """Copy bandwidth (bytes/s) and matmul rate per dtype (FLOP/s) of this device."""
    # CPU: short calls, best of many, so a busy machine's preemptions do not lower the floor.
    n = (1 << 30 if device == "cuda" else 1 << 26) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t = time_ms(lambda: dst.copy_(src), device, 3, 20, stat=min)   # best: the hardware's limit
    floors = {"copy_bytes_per_s": 2 * src.numel() * 4 / (t * 1e-3), "matmul_flops_per_s": {}}
    del src, dst
    m = 8192 if device == "cuda" else 1024
    for name in dtypes:
        a = torch.randn(m, m, device=device).to(DTYPES[name])
        b = torch.randn(m, m, device=device).to(DTYPES[name])
        t = time_ms(lambda: a @ b, device, 2, 20, stat=min)
        floors["matmul_flops_per_s"][name] = 2 * m ** 3 / (t * 1e-3)
    return floors


# ---- driver --------------------------------------------------------------------------------

def rows_to_run(args):
    device = args.device
    if args.workloads == "default":
        names = ",".join(RERANK + tuple(n + "Packed" for n in RERANK)) if device == "cpu" else "all"
    else:
        names = args.workloads
    rows = []
    for w in W.resolve(names):
        if args.dtype == "auto":
            dtypes = ["float32", "bfloat16"] if device == "cpu" else \
                [{torch.float16: "float16", torch.bfloat16: "bfloat16"}[w.gpu_dtype]]
        else:
            dtypes = args.dtype.split(",")
        if args.layout == "table":
            layouts = ["full", "ragged"] if w.surface == "padded" else [w.layout]
        elif args.layout == "default":
            layouts = [w.layout]
        else:
            layouts = ["full", "ragged"] if args.layout == "both" else [args.layout]
        if w.surface == "packed":
            layouts = ["ragged"]
        rows += [(w, dt, lay) for dt in dtypes for lay in layouts]
    return rows


def run(args):
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False")
    plan = rows_to_run(args)
    kernel = load_kernel(device, args.kernel)
    floors = measure_floors(device, sorted({dt for _, dt, _ in plan}))
    bw = floors["copy_bytes_per_s"]
    print(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU, %d threads' % torch.get_num_threads()}), "
          f"torch {torch.__version__}; copy {bw / 1e9:.1f} GB/s, matmul "
          + ", ".join(f"{k} {v / 1e12:.3f} TFLOP/s" for k, v in floors["matmul_flops_per_s"].items()),
          flush=True)
    if device == "cpu" and os.getloadavg()[0] > 0.5:
        print(f"warning: load average {os.getloadavg()[0]:.1f}: other processes share the CPU, "
              "so the CPU times are not clean", flush=True)
    results = []
    for w, dt, layout in plan:
        x = W.build_inputs(w, device, DTYPES[dt], layout)
        row = dict(workload=w.name, surface=w.surface, train=w.train, layout=layout, dtype=dt,
                   shape=x.shape, scale=w.cpu_scale if device == "cpu" else 1.0,
                   bytes=x.bytes_in(), flops=x.useful_flops(), impls={})
        row["floor_ms"] = 1e3 * max(row["bytes"] / bw,
                                    row["flops"] / floors["matmul_flops_per_s"][dt])
        expected = None
        for name in IMPLS:
            if name not in args.impls:
                continue
            r = {}
            try:
                fn = make_impl(name, x, kernel)
                scores = fn()
                sync(device)
                if expected is None:
                    expected = scores.float()
                r["max_err"] = float((scores.float() - expected).abs().max())
                times = []
                r["ms"] = time_ms(fn, device, args.warmup, args.iters, all_times=times)
                r["min_ms"] = min(times)
                if not args.no_memory:
                    r["peak_bytes"] = cuda_peak_bytes(fn) if device == "cuda" else \
                        cpu_peak_bytes(w.name, dt, layout, name, args.kernel)
                del fn
            except Exception as e:  # noqa: BLE001 - a peer failing is a result, not a crash
                r = {"na": _reason(e)}
            row["impls"][name] = r
        m = row["impls"].get("maxsim", {})
        if "ms" in m:
            row["maxsim_GBps"] = row["bytes"] / (m["ms"] * 1e-3) / 1e9
            row["maxsim_TFLOPs"] = row["flops"] / (m["ms"] * 1e-3) / 1e12
            row["of_floor"] = row["floor_ms"] / m["ms"]
        results.append(row)
        print(progress_line(row), flush=True)
        del x
        if device == "cuda":
            torch.cuda.empty_cache()
    return floors, results


def _ms(r):
    return f"{r['ms']:.3f} ({r['min_ms']:.3f})" if "ms" in r else "n/a"


def progress_line(row):
    parts = [f"{n} {_ms(r)}" for n, r in row["impls"].items()]
    return f"  {row['workload']:<20} {row['layout']:<6} {row['dtype']:<8} " + "  ".join(parts)


def markdown(device, floors, results, impls):
    ran = [n for n in impls if any("ms" in r["impls"].get(n, {}) for r in results)]
    lines = []
    head = ["workload", "layout", "dtype"] + (["scale"] if device == "cpu" else []) + \
        [f"{n} ms (min)" for n in ran] + ["naive / maxsim"] + [f"{n} peak" for n in ran] + \
        ["floor ms", "maxsim of floor", "maxsim GB/s", "maxsim TFLOP/s", "max err vs maxsim"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    for row in results:
        im = row["impls"]
        speed = (f"{im['naive']['ms'] / im['maxsim']['ms']:.2f}x"
                 if "ms" in im.get("naive", {}) and "ms" in im.get("maxsim", {}) else "n/a")
        errs = [r["max_err"] for r in im.values() if "max_err" in r]
        cells = [row["workload"], row["layout"], row["dtype"]]
        if device == "cpu":
            cells.append(f"{row['scale']:.3g}")
        cells += [_ms(im.get(n, {})) for n in ran] + [speed]
        cells += [W.fmt_bytes(im[n]["peak_bytes"]) if "peak_bytes" in im.get(n, {}) else "n/a"
                  for n in ran]
        cells += [f"{row['floor_ms']:.3f}",
                  f"{100 * row['of_floor']:.0f}%" if "of_floor" in row else "n/a",
                  f"{row['maxsim_GBps']:.1f}" if "maxsim_GBps" in row else "n/a",
                  f"{row['maxsim_TFLOPs']:.3f}" if "maxsim_TFLOPs" in row else "n/a",
                  f"{max(errs):.1e}" if errs else "n/a"]
        lines.append("| " + " | ".join(cells) + " |")
    reasons = {}
    for row in results:
        for n, r in row["impls"].items():
            if "na" in r:
                reasons.setdefault(n, set()).add(r["na"])
    for n, rs in reasons.items():
        lines.append(f"\n{n}: n/a ({'; '.join(sorted(rs))})")
    lines.append(f"\nfloors: copy {floors['copy_bytes_per_s'] / 1e9:.1f} GB/s; matmul "
                 + ", ".join(f"{k} {v / 1e12:.3f} TFLOP/s"
                             for k, v in floors["matmul_flops_per_s"].items()))
    shapes = {r["workload"]: W.WORKLOADS[r["workload"]].describe(r["shape"]) for r in results}
    lines.append("shapes: " + "; ".join(f"{k} {v}" for k, v in shapes.items()))
    lines.append("peak = memory a call needs beyond its inputs "
                 + ("(torch.cuda.max_memory_allocated)" if device == "cuda"
                    else "(peak RSS growth over one call in a fresh subprocess)"))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workloads", default="default",
                   help="'all', 'default' (CPU: the rerank workloads; CUDA: all) or name,name")
    p.add_argument("--dtype", default="auto",
                   help="'auto' (CPU: float32,bfloat16; CUDA: the table's fp16/bf16) or a list")
    p.add_argument("--layout", default="table", choices=("table", "default", "full", "ragged", "both"),
                   help="table: padded rerank in both layouts, the rest as in the table")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--kernel", default=str(REPO), help="kernel repository (default: this one)")
    p.add_argument("--iters", type=int, default=None, help="timed calls (default: CUDA 50, CPU 10)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (CUDA 10, CPU 2)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        print(json.dumps(cpu_child(json.loads(args._child))))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    args.impls = args.impls.split(",")
    args.iters = args.iters or (50 if args.device == "cuda" else 10)
    args.warmup = args.warmup if args.warmup is not None else (10 if args.device == "cuda" else 2)
    floors, results = run(args)
    table = markdown(args.device, floors, results, args.impls)
    print("\n" + table)
    if args.json:
        info = dict(device=args.device, torch=torch.__version__, iters=args.iters,
                    warmup=args.warmup, threads=torch.get_num_threads(),
                    loadavg_at_end=os.getloadavg(),
                    gpu=torch.cuda.get_device_name() if args.device == "cuda" else None)
        Path(args.json).write_text(json.dumps(
            dict(info=info, floors=floors, results=results, table=table), indent=2, default=str))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
