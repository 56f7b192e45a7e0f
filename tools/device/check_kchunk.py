#!/usr/bin/env python3
"""Checks the K-streaming tensor-core forward (fp16/bf16, dim > 256) on a GPU.

    MAXSIM_CUDA_ARCHS=9.0a python3 tools/build.py --backend cuda
    python3 tools/device/check_kchunk.py            # correctness + timing
    MAXSIM_CUDA_HALF_SIMT=1 python3 tools/device/check_kchunk.py --time-only   # old SIMT path

Loads the local build with kernels.get_local_kernel, compares scores / argmax / backward of
the padded, contrastive and packed surfaces against the *_reference functions run in
float64 on the (rounded) half inputs, for dims 257..1030, ragged lengths, Lq 1..300,
Ld 1..2000; then times fp16 D=512 padded rerank (B=32, C=50, Lq=32, Ld=180).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
FAIL: list[str] = []
NPASS = [0]
DEV = "cuda"


def check(ok: bool, what: str) -> None:
    if ok:
        NPASS[0] += 1
    else:
        FAIL.append(what)
        print("FAIL", what, flush=True)


def load():
    import kernels

    return kernels.get_local_kernel(ROOT)


def rel(a, b):
    a, b = a.double(), b.double()
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def cmp_scores(tag, s, ref):
    s, ref = s.double().flatten(), ref.double().flatten()
    check(torch.equal(s.isnan(), ref.isnan()), f"{tag}: NaN pattern")
    check(torch.equal(s == float("-inf"), ref == float("-inf")), f"{tag}: -inf pattern")
    fin = torch.isfinite(ref)
    if fin.any():
        e = rel(s[fin], ref[fin])
        check(e <= 1e-5, f"{tag}: score rel err {e:.2e}")
        return e
    return 0.0


def cmp_argmax(tag, a, r, Q, D, qrow, dstart):
    """a, r: [P, W] kernel / reference argmax; qrow [P, W] global query rows; dstart [P]."""
    a, r = a.long(), r.long()
    neg = r < 0
    check(torch.equal(a[neg], r[neg]), f"{tag}: argmax -1 positions ({int((a[neg] != -1).sum())} wrong)")
    pos = ~neg
    if not pos.any():
        return
    check(bool((a[pos] >= 0).all()), f"{tag}: argmax missing where matched")
    qi = qrow[pos]
    dk = (dstart[:, None].expand_as(a))[pos] + a[pos].clamp(min=0)
    dr = (dstart[:, None].expand_as(r))[pos] + r[pos]
    vk = (Q[qi] * D[dk]).sum(-1)
    vr = (Q[qi] * D[dr]).sum(-1)
    scale = Q[qi].norm(dim=-1) * D.norm(dim=-1).max() + 1e-30
    bad = (vk < vr - 2e-6 * scale).sum().item()
    check(bad == 0, f"{tag}: argmax not a max in {bad} rows")


def cmp_grads(tag, got, ref, dtype):
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[dtype]
    e = rel(got, ref)
    check(e <= tol, f"{tag}: grad rel err {e:.2e}")


def rand(shape, dtype, gen):
    return torch.randn(*shape, generator=gen, device=DEV, dtype=torch.float32).to(dtype)


def shifted(t, elems):
    """The same values in storage that starts `elems` elements past an aligned allocation."""
    if elems == 0:
        return t
    buf = torch.zeros(t.numel() + elems, dtype=t.dtype, device=t.device)
    out = buf[elems:].view(t.shape)
    out.copy_(t)
    return out


def run_padded(ms, dtype, dim, B, C, Lq, Ld, gen, nan=False, shift=0):
    tag = f"padded {str(dtype)[6:]} D={dim} B={B} C={C} Lq={Lq} Ld={Ld}{' nan' if nan else ''} shift={shift}"
    q = shifted(rand((B, Lq, dim), dtype, gen), shift)
    d = shifted(rand((B, C, Ld, dim), dtype, gen), shift)
    ql = torch.randint(0, Lq + 1, (B,), generator=gen, device=DEV)
    ql[0] = Lq
    dl = torch.randint(0, Ld + 1, (B, C), generator=gen, device=DEV)
    dl[0, 0] = Ld
    if nan:
        q[0, 0, dim - 1] = float("nan")
    s, a = ms.score_candidates_padded_with_argmax(q, d, ql, dl)
    s2 = ms.score_candidates_padded(q, d, ql, dl)
    rs, ra = ms.score_candidates_padded_with_argmax_reference(q.double(), d.double(), ql, dl)
    e = cmp_scores(tag, s, rs)
    check(torch.equal(s.nan_to_num(), s2.nan_to_num()), f"{tag}: with/without argmax differ")
    if not nan:
        qrow = (torch.arange(B, device=DEV)[:, None, None] * Lq + torch.arange(Lq, device=DEV)).expand(B, C, Lq)
        dstart = (torch.arange(B * C, device=DEV) * Ld)
        cmp_argmax(tag, a.reshape(B * C, Lq), ra.reshape(B * C, Lq), q.double().reshape(-1, dim),
                   d.double().reshape(-1, dim), qrow.reshape(B * C, Lq), dstart)
        qq, dd = q.clone().requires_grad_(), d.clone().requires_grad_()
        out = ms.score_candidates_padded_train(qq, dd, ql, dl)
        out = out[0] if isinstance(out, tuple) else out
        g = torch.randn(out.shape, generator=gen, device=DEV, dtype=out.dtype)
        out.backward(g)
        gq, gd = ms.score_candidates_padded_backward_reference(g.double(), q.double(), d.double(), ql, dl, a)
        cmp_grads(tag + " dq", qq.grad, gq, dtype)
        cmp_grads(tag + " dd", dd.grad, gd, dtype)
    return e


def run_contrastive(ms, dtype, dim, Nq, Lq, dlens, gen, ragged_q):
    tag = f"contrastive {str(dtype)[6:]} D={dim} Nq={Nq} Lq={Lq} Nb={len(dlens)} ragged_q={ragged_q}"
    q = rand((Nq, Lq, dim), dtype, gen)
    offs = torch.tensor([0] + list(torch.tensor(dlens).cumsum(0).tolist()), device=DEV, dtype=torch.int64)
    T = int(offs[-1])
    d = rand((T, dim), dtype, gen)
    ql = torch.randint(0, Lq + 1, (Nq,), generator=gen, device=DEV) if ragged_q else None
    kw = {"query_lengths": ql} if ragged_q else {}
    s, a = ms.score_contrastive_with_argmax(q, d, offs, **kw)
    rs, ra = ms.score_contrastive_with_argmax_reference(q.double(), d.double(), offs, ql)
    e = cmp_scores(tag, s, rs)
    Nb = len(dlens)
    qrow = (torch.arange(Nq, device=DEV)[:, None, None] * Lq + torch.arange(Lq, device=DEV)).expand(Nq, Nb, Lq)
    dstart = offs[:-1][None, :].expand(Nq, Nb).reshape(-1)
    cmp_argmax(tag, a.reshape(Nq * Nb, Lq), ra.reshape(Nq * Nb, Lq), q.double().reshape(-1, dim), d.double(),
               qrow.reshape(Nq * Nb, Lq), dstart)
    qq, dd = q.clone().requires_grad_(), d.clone().requires_grad_()
    out = ms.score_contrastive_train(qq, dd, offs, **kw)
    out = out[0] if isinstance(out, tuple) else out
    g = torch.randn(out.shape, generator=gen, device=DEV, dtype=out.dtype)
    out.backward(g)
    gq, gd = ms.score_contrastive_backward_reference(g.double(), q.double(), d.double(), offs, a, ql)
    cmp_grads(tag + " dq", qq.grad, gq, dtype)
    cmp_grads(tag + " dd", dd.grad, gd, dtype)
    return e


def run_packed(ms, dtype, dim, qlens, dlens, P, gen):
    tag = f"packed {str(dtype)[6:]} D={dim} Nq={len(qlens)} Nd={len(dlens)} P={P} maxq={max(qlens)}"
    qoffs = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), device=DEV, dtype=torch.int64)
    doffs = torch.tensor([0] + torch.tensor(dlens).cumsum(0).tolist(), device=DEV, dtype=torch.int32)
    q = rand((int(qoffs[-1]), dim), dtype, gen)
    d = rand((int(doffs[-1]), dim), dtype, gen)
    pq = torch.randint(0, len(qlens), (P,), generator=gen, device=DEV).sort().values  # runs share a query
    pd = torch.randint(0, len(dlens), (P,), generator=gen, device=DEV)
    s, a = ms.score_pairs_packed_with_argmax(q, qoffs, d, doffs, pq, pd)
    rs, ra = ms.score_pairs_packed_with_argmax_reference(q.double(), qoffs, d.double(), doffs, pq, pd,
                                                         max_q_len=a.shape[1])
    e = cmp_scores(tag, s, rs)
    W = a.shape[1]
    qrow = (qoffs[pq][:, None] + torch.arange(W, device=DEV)).clamp(max=max(int(qoffs[-1]) - 1, 0))
    cmp_argmax(tag, a, ra, q.double(), d.double(), qrow, doffs.long()[pd])
    qq, dd = q.clone().requires_grad_(), d.clone().requires_grad_()
    out = ms.score_pairs_packed_train(qq, qoffs, dd, doffs, pq, pd)
    out = out[0] if isinstance(out, tuple) else out
    g = torch.randn(out.shape, generator=gen, device=DEV, dtype=out.dtype)
    out.backward(g)
    gq, gd = ms.score_pairs_packed_backward_reference(g.double(), q.double(), qoffs, d.double(), doffs, pq, pd, a)
    cmp_grads(tag + " dq", qq.grad, gq, dtype)
    cmp_grads(tag + " dd", dd.grad, gd, dtype)
    return e


def correctness(ms, quick=False):
    gen = torch.Generator(device=DEV)
    gen.manual_seed(1234)
    worst = 0.0
    for dtype in ((torch.float16,) if quick else (torch.float16, torch.bfloat16)):
        for dim in ((300, 512, 1030, 1031) if quick else (257, 300, 384, 512, 1024, 1030, 1031)):
            # padded: Lq picks the 32 / 64 / 128-row block shapes and M-chunks (Lq > 128)
            for (B, C, Lq, Ld) in ((2, 3, 1, 1), (3, 5, 32, 180), (2, 4, 64, 777), (2, 3, 100, 2000),
                                   (1, 2, 300, 1500), (4, 3, 17, 65)):
                worst = max(worst, run_padded(ms, dtype, dim, B, C, Lq, Ld, gen))
            run_padded(ms, dtype, dim, 2, 2, 8, 40, gen, nan=True)
            for shift in (1, 2, 4):  # base addresses 2 / 4 / 8 bytes past 16-byte alignment
                run_padded(ms, dtype, dim, 2, 3, 20, 150, gen, shift=shift)
            # contrastive: stacked queries (several per block), 128-row blocks, empty docs
            worst = max(worst, run_contrastive(ms, dtype, dim, 5, 7, [1, 0, 33, 200, 64, 1999], gen, True))
            worst = max(worst, run_contrastive(ms, dtype, dim, 8, 32, [180, 17, 300, 1], gen, False))
            worst = max(worst, run_contrastive(ms, dtype, dim, 2, 300, [100, 1000, 3], gen, True))
            # packed: ragged queries 1..300, documents 0..2000
            qlens = [1, 32, 5, 300, 64, 0, 129]
            dlens = [1, 2000, 0, 64, 500, 33]
            worst = max(worst, run_packed(ms, dtype, dim, qlens, dlens, 23, gen))
            worst = max(worst, run_packed(ms, dtype, dim, [32] * 6, [180, 1, 99, 256], 12, gen))
    print(f"correctness: {NPASS[0]} checks passed, {len(FAIL)} failed; worst score rel err {worst:.2e}", flush=True)


def time_ms(fn, iters=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts)


def timing(ms, what):
    knobs = [f"{k}={os.environ[k]}" for k in ("MAXSIM_CUDA_HALF_SIMT", "MAXSIM_CUDA_RERANK_CFG",
                                               "MAXSIM_CUDA_CONTRASTIVE_CFG") if k in os.environ]
    label = " ".join(knobs) if knobs else "default"
    gen = torch.Generator(device=DEV)
    gen.manual_seed(7)
    for dim in ((512, 300, 768, 1024) if what in ("all", "rerank") else ()):
        B, C, Lq, Ld = 32, 50, 32, 180
        q = rand((B, Lq, dim), torch.float16, gen)
        d = rand((B, C, Ld, dim), torch.float16, gen)
        ql = torch.full((B,), Lq, device=DEV, dtype=torch.int64)
        dl = torch.full((B, C), Ld, device=DEV, dtype=torch.int64)
        t = time_ms(lambda: ms.score_candidates_padded(q, d, ql, dl))
        tn = time_ms(lambda: torch.einsum("bqd,bcld->bcql", q, d).amax(-1).sum(-1))
        gb = d.numel() * 2 / 1e9
        print(f"timing fp16 D={dim} padded B=32 C=50 Lq=32 Ld=180 [{label}]: {t:.3f} ms "
              f"({gb / t:.2f} TB/s of documents); naive einsum+amax {tn:.3f} ms", flush=True)
    # contrastive (tensor-core bound)
    for dim in ((512, 1024) if what in ("all", "contrastive") else ()):
        Nq, Lq, Nb, L = 64, 32, 512, 128
        q = rand((Nq, Lq, dim), torch.bfloat16, gen)
        d = rand((Nb * L, dim), torch.bfloat16, gen)
        offs = torch.arange(0, Nb * L + 1, L, device=DEV)
        t = time_ms(lambda: ms.score_contrastive(q, d, offs))
        tn = time_ms(lambda: torch.einsum("qid,njd->qnij", q, d.view(Nb, L, dim)).amax(-1).sum(-1))
        tf = 2 * Nq * Lq * Nb * L * dim / 1e12
        print(f"timing bf16 D={dim} contrastive Nq={Nq} Lq={Lq} Nb={Nb} Ld={L} [{label}]: {t:.3f} ms "
              f"({tf / t * 1e3:.0f} TFLOP/s); naive {tn:.3f} ms", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-only", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fp16, 4 dims")
    ap.add_argument("--time", default="all", choices=["all", "rerank", "contrastive", "none"])
    args = ap.parse_args()
    ms = load()
    print("loaded", ms.__name__ if hasattr(ms, "__name__") else ms, torch.cuda.get_device_name(), flush=True)
    if not args.time_only:
        correctness(ms, args.quick)
    timing(ms, args.time)
    if FAIL:
        print(f"{len(FAIL)} FAILURES", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
