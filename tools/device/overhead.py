"""Where small calls spend their time: CUDA-event median of eager calls, host time per call,
and GPU-only time (CUDA-graph replay), for maxsim and for the raw ops under it. Run through
`python3 tools/device/cli.py profile MODE ...` (which builds first); Nsight Compute runs the
`once` and `call` modes directly (`cli.py profile --ncu`).

    python3 tools/device/overhead.py train    # Contrastive training step (Nq=Nb=32, Lq=32, Ld=80)
    python3 tools/device/overhead.py rerank   # the five rerank workloads, padded vs packed
    python3 tools/device/overhead.py split    # training workloads: forward / grad_q / grad_d GPU time
    python3 tools/device/overhead.py split_kernels  # the kernels under grad_d (BigColBERT, DocDoc), each's GPU time
    python3 tools/device/overhead.py once NAME  # one forward + backward of a training workload (for ncu)
    python3 tools/device/overhead.py kernels    # GPU time (graph replay) of the forward on the issue-9 shapes
    python3 tools/device/overhead.py call NAME LAYOUT [FORMAT]  # one forward call (for ncu);
                                                 # FORMAT: int8 / float8_e4m3fn documents
    python3 tools/device/overhead.py floor      # eager - GPU time of the cheapest calls (host floor)
    python3 tools/device/overhead.py ab ENV=V[+ENV=V][,ENV=V..] NAME:LAYOUT[:DIM] ...  # GPU time with / without knobs

An eager time close to the host time means the call is host-bound; the graph time is what
the kernels cost. Add `profile` for a torch.profiler table of the training step.
"""
import dataclasses
import sys
import time
from pathlib import Path

import kernels
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tools" / "device"))
import workloads as W  # noqa: E402
from bench_compressed import knobs  # noqa: E402

maxsim = kernels.get_local_kernel(ROOT)
ops = maxsim._ops.ops


def events(fn, n=200):
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[n // 2] * 1e3


def host(fn, n=500):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        fn()
    host_us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host_us


def capture(fn, calls=1):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(calls):
            fn()
    return gr


def graph(fn, calls=1):
    """GPU time per call: `calls` calls in one graph (more than one keeps the host's launch
    of the graph out of small calls' times), replays timed with events."""
    return events(capture(fn, calls).replay) / calls


def report(name, fn):
    print(f"{name:28s} events {events(fn):7.1f} us   host/call {host(fn):7.1f} us   "
          f"graph {graph(fn):7.1f} us", flush=True)


def train_probe(profile):
    x = W.build_inputs(W.WORKLOADS["Contrastive"], "cuda")
    q, d = W.train_leaves(x)
    off, g = x.document_offsets, x.grad_weights

    def step():
        s = maxsim.score_contrastive_train(q, d, off)
        (s * g).sum().backward()

    def raw_fwd_bwd():
        _, a = ops.contrastive_forward(q.detach(), d.detach(), off, None, True)
        ops.contrastive_backward(g, q.detach(), d.detach(), off, None, a, True, True)

    report("train step (API)", step)
    report("raw fwd+bwd ops", raw_fwd_bwd)
    report("raw fwd op", lambda: ops.contrastive_forward(q.detach(), d.detach(), off, None, False))
    if profile:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22,
                                        max_name_column_width=60))


def rerank_probe():
    for base in ("SmallRerank", "Rerank", "HeavyRerank", "LongDocStress", "ColPaliRerank"):
        for name in (base, base + "Packed"):
            x = W.build_inputs(W.WORKLOADS[name], "cuda", layout="ragged")
            report(f"{name} ragged", lambda: W.maxsim_call(maxsim, x))


def split_probe():
    """GPU time (graph replay) of each piece of a training step, raw ops only."""
    for name in ("Contrastive", "LongDocs", "BigBatch", "ColPali", "BigColBERT", "DocDoc"):
        fwd, bwd = W.raw_training_ops(maxsim, name)
        parts = {"forward+argmax": fwd, "grad_q": lambda: bwd(True, False),
                 "grad_d": lambda: bwd(False, True), "backward": lambda: bwd(True, True)}
        print(f"{name:12s} " + "  ".join(f"{k} {graph(f):8.1f} us" for k, f in parts.items()), flush=True)


def split_kernels_probe():
    """The kernels grad_documents launches on the two large training workloads and each one's
    GPU time (torch.profiler over ten calls): how binning passes and the apply kernel share it."""
    for name in ("BigColBERT", "DocDoc"):
        _, bwd = W.raw_training_ops(maxsim, name)
        for _ in range(3):
            bwd(False, True)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                bwd(False, True)
            torch.cuda.synchronize()
        print(name, "grad_d", flush=True)
        for e in prof.key_averages():
            if e.device_time_total > 0:
                print(f"  {e.key[:90]:90s} calls {e.count:4d}  {e.device_time_total / e.count:9.2f} us", flush=True)


KERNEL_SHAPES = (("HeavyRerank", "full"), ("HeavyRerank", "ragged"), ("ColPaliRerank", "full"),
                 ("ColPaliRerank", "ragged"), ("Rerank", "full"), ("HeavyRerankPacked", "ragged"),
                 ("ColBERTCorpus", "ragged"), ("ColPaliCorpus", "ragged"),
                 ("ContrastiveD256", "full"), ("ContrastiveD1024", "full"))


def kernels_probe():
    """GPU time (graph replay) of one inference call per workload, with its bytes and FLOP rate."""
    for name, layout in KERNEL_SHAPES:
        x = W.build_inputs(W.WORKLOADS[name], "cuda", layout=layout)
        us = graph(lambda: W.maxsim_call(maxsim, x))
        print(f"{name:18s} {layout:6s} graph {us:8.1f} us", flush=True)


def floor_probe():
    """What an eager call costs beyond its kernel when the kernel is negligible: one torch
    elementwise launch, a torch.empty + launch, and maxsim's padded and packed calls on one
    1-row pair. Eager here is timed like benchmarks/compare.py (events around one call, then
    a sync), so eager - graph is the host time from the call to its kernel's start."""
    t = torch.zeros(1, device="cuda")
    q = torch.randn(1, 1, 8, device="cuda", dtype=torch.float16)
    d = torch.randn(1, 1, 1, 8, device="cuda", dtype=torch.float16)
    ql = torch.ones(1, dtype=torch.int32, device="cuda")
    dl = torch.ones(1, 1, dtype=torch.int32, device="cuda")
    off = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    pid = torch.zeros(1, dtype=torch.int32, device="cuda")
    calls = {
        "torch add_ (1 launch)": lambda: t.add_(1),
        "torch empty + fill_": lambda: torch.empty(1, device="cuda").fill_(1),
        "maxsim padded 1x1x1x1": lambda: maxsim.score_candidates_padded(q, d, ql, dl),
        "maxsim packed 1 pair": lambda: maxsim.score_pairs_packed(q[0], off, d[0, 0], off, pid, pid),
        "raw padded op": lambda: ops.padded_forward(q, d, ql, dl, False),
    }
    for name, fn in calls.items():
        e, g1, g = events(fn), graph(fn), graph(fn, 20)
        print(f"{name:26s} eager {e:6.1f} us  graph of 1 call {g1:6.1f} us  per call of 20 {g:6.1f} us  "
              f"eager - GPU {e - g:6.1f} us", flush=True)


def ab_probe(settings, shapes):
    """GPU time per call by default and with each environment setting (ENV=VALUE, comma-
    separated, several joined by '+'; read per call by the kernels' launchers), every graph
    captured in this process and replayed in alternating rounds so that clocks and neighbours
    hit all alike. A shape is NAME:LAYOUT, or NAME:LAYOUT:DIM for the workload at another dim."""
    settings = settings.split(",")
    for shape in shapes:
        name, layout, *dim = shape.split(":")
        w = W.WORKLOADS[name]
        if dim:
            w = dataclasses.replace(w, dim=int(dim[0]))
            name = f"{name}:d{dim[0]}"
        x = W.build_inputs(w, "cuda", layout=layout)
        fn = lambda: W.maxsim_call(maxsim, x)  # noqa: E731
        calls, graphs = 20, {}
        for setting in ["default"] + settings:
            with knobs(dict(kv.split("=", 1) for kv in setting.split("+") if "=" in kv)):
                graphs[setting] = capture(fn, calls)
        times = {k: [] for k in graphs}
        for _ in range(5):
            for k, gr in graphs.items():
                times[k].append(events(gr.replay, 20) / calls)
        line = "  ".join(f"{k} {sorted(v)[2]:7.2f}" for k, v in times.items())
        print(f"{name:20s} {layout:6s} us per call: {line}", flush=True)


def call(name, layout, fmt=None):
    """Two forward calls of a workload; fmt: int8 / float8_e4m3fn documents, or float32 /
    float64 inputs (the FFMA mainloop under torch's default precision)."""
    as_dtype = fmt in ("float32", "float64")
    x = W.build_inputs(W.WORKLOADS[name], "cuda", layout=layout, dtype=getattr(torch, fmt) if as_dtype else None)
    if fmt and not as_dtype:
        x = W.compress(x, maxsim, fmt)
    W.maxsim_call(maxsim, x)
    W.maxsim_call(maxsim, x)
    torch.cuda.synchronize()


def once(name):
    fwd, bwd = W.raw_training_ops(maxsim, name)
    fwd()
    bwd(True, True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    args = sys.argv[1:] or ["train"]
    if args[0] == "call":
        call(args[1], args[2], *args[3:4])
        sys.exit(0)
    if "kernels" in args:
        kernels_probe()
    if "floor" in args:
        floor_probe()
    if args[0] == "ab":
        ab_probe(args[1], args[2:])
        sys.exit(0)
    if args[0] == "once":
        once(args[1])
        sys.exit(0)
    if "split" in args:
        split_probe()
    if "split_kernels" in args:
        split_kernels_probe()
    if "rerank" in args:
        rerank_probe()
    if "train" in args:
        train_probe("profile" in args)
