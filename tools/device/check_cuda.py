#!/usr/bin/env python3
"""Correctness + determinism + timing of the CUDA ops, against a float64 torch reference.

    python3 tools/device/check_cuda.py --lib build/<variant>/_maxsim_cuda_<hash>.abi3.so [--quick] [--no-bench]

Every surface x forward/argmax/backward x dtype, ragged lengths, odd dim and Lq, ties,
NaN, empty segments, bad ids, int32/int64 indices, non-default streams, CUDA graph
capture; then the benchmark shapes timed with CUDA events next to naive einsum+amax.
Prints a summary table last.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

FAIL: list[str] = []
SURFACES = {"padded", "contrastive", "packed"}
PASS = [0]
LOG: list[str] = []


def log(msg: str) -> None:
    print(msg, flush=True)
    LOG.append(msg)


def check(cond: bool, what: str) -> None:
    if cond:
        PASS[0] += 1
    else:
        FAIL.append(what)
        log(f"FAIL {what}")


DEV = "cuda"
DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}


def load_ops(lib: str):
    torch.ops.load_library(lib)
    ns = Path(lib).name.split(".")[0]
    return getattr(torch.ops, ns)


# ----------------------------------------------------------------------------- reference
# Every surface is turned into a list of pairs over flattened q [rows, D] / d [rows, D]:
# (qrow0, qlen, drow0, dlen, bad).

def ref_forward(q, d, pairs, width):
    """float64 scores [P], argmax [P, width] (lowest index; first NaN wins), row maxima."""
    q64, d64 = q.double(), d.double()
    P = len(pairs)
    scores = torch.zeros(P, dtype=torch.float64, device=q.device)
    am = torch.full((P, width), -1, dtype=torch.int64, device=q.device)
    sims = []
    for p, (q0, ql, d0, dl, bad) in enumerate(pairs):
        if bad:
            scores[p] = float("nan")
            sims.append(None)
            continue
        if ql == 0:
            scores[p] = 0.0
            sims.append(None)
            continue
        if dl == 0:
            scores[p] = float("-inf")
            sims.append(None)
            continue
        S = q64[q0:q0 + ql] @ d64[d0:d0 + dl].T  # [ql, dl]
        isn = S.isnan()
        j = torch.arange(dl, device=S.device).expand_as(S)
        big = torch.full_like(j, dl)
        first_nan = torch.where(isn, j, big).min(1).values
        m = torch.where(isn, torch.full_like(S, float("-inf")), S).max(1).values
        first_max = torch.where(S == m[:, None], j, big).min(1).values
        has_nan = isn.any(1)
        idx = torch.where(has_nan, first_nan, first_max)
        idx = torch.where(idx >= dl, torch.zeros_like(idx), idx)  # all -inf row -> 0
        mv = torch.where(has_nan, torch.full_like(m, float("nan")), m)
        scores[p] = mv.sum()
        w = min(ql, width)
        am[p, :w] = idx[:w]
        sims.append(S)
    return scores, am, sims


def ref_backward(q, d, pairs, am, g):
    """float64 grads from a given argmax (the kernel's), ignoring invalid entries."""
    gq = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    gd = torch.zeros(d.shape, dtype=torch.float64, device=q.device)
    q64, d64 = q.double(), d.double()
    W = am.shape[1]
    for p, (q0, ql, d0, dl, bad) in enumerate(pairs):
        if bad:
            continue
        n = min(ql, W)
        if n == 0:
            continue
        a = am[p, :n].long()
        ok = (a >= 0) & (a < dl)
        i = torch.arange(n, device=q.device)[ok]
        a = a[ok]
        gq.index_add_(0, q0 + i, g[p].double() * d64[d0 + a])
        gd.index_add_(0, d0 + a, g[p].double() * q64[q0 + i])
    return gq, gd


def rel(a, b):
    a, b = a.double(), b.double()
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else num


def compare_forward(tag, dtype, q, d, pairs, width, scores, argmax, tol):
    ref_s, ref_a, sims = ref_forward(q, d, pairs, width)
    s = scores.double().flatten()
    check(s.shape == ref_s.shape, f"{tag}: score shape {tuple(s.shape)} vs {tuple(ref_s.shape)}")
    nan_ok = torch.equal(s.isnan(), ref_s.isnan())
    check(nan_ok, f"{tag}: NaN pattern of scores")
    inf_ok = torch.equal(torch.isinf(s) & (s < 0), torch.isinf(ref_s) & (ref_s < 0))
    check(inf_ok, f"{tag}: -inf pattern of scores")
    fin = torch.isfinite(ref_s)
    if fin.any():
        r = (s[fin] - ref_s[fin]).abs().max().item()
        scale = max(1.0, ref_s[fin].abs().max().item())
        err = rel(s[fin], ref_s[fin])
        check(err <= tol and r <= tol * scale * 10, f"{tag}: score rel err {err:.2e} (tol {tol:.0e}), max abs {r:.2e}")
    if argmax is None:
        return ref_s, ref_a
    a = argmax.reshape(len(pairs), width).long()
    # padding / empty positions: exactly -1 where the reference says -1
    neg = ref_a < 0
    check(torch.equal(a[neg], ref_a[neg]), f"{tag}: argmax -1 positions ({int((a[neg] != -1).sum())} wrong)")
    bad_rows = 0
    for p, S in enumerate(sims):
        if S is None:
            continue
        ql = min(S.shape[0], width)
        ka = a[p, :ql]
        if ((ka < 0) | (ka >= S.shape[1])).any():
            bad_rows += 1
            continue
        got = S[torch.arange(ql, device=S.device), ka]
        best = S[torch.arange(ql, device=S.device), ref_a[p, :ql]]
        nanrow = best.isnan()
        # NaN rows: exact index; others: value within tolerance of the max, and exact when
        # the reference max is separated from the kernel's pick by more than rounding.
        if not torch.equal(ka[nanrow], ref_a[p, :ql][nanrow]):
            bad_rows += 1
            continue
        scale = q[pairs[p][0]:pairs[p][0] + ql].double().norm(dim=1) * d[pairs[p][2]:pairs[p][2] + S.shape[1]].double().norm(dim=1).max()
        ok = (got[~nanrow] >= best[~nanrow] - 1e-5 * scale[~nanrow] - 1e-12)
        if not ok.all():
            bad_rows += 1
    check(bad_rows == 0, f"{tag}: argmax wrong in {bad_rows} pairs")
    return ref_s, ref_a


def grad_tol(dtype):
    return {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[dtype]


def fwd_tol(dtype):
    # half inputs: reference uses the same rounded inputs, so only fp32 accumulation differs
    return {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-5, torch.bfloat16: 1e-5}[dtype]


def idx(t, dtype):
    return t.to(device=DEV, dtype=dtype)


# ----------------------------------------------------------------------------- surfaces

def pairs_padded(B, C, Lq, Ld, ql, dl):
    out = []
    for b in range(B):
        for c in range(C):
            out.append((b * Lq, max(0, min(int(ql[b]), Lq)), (b * C + c) * Ld, max(0, min(int(dl[b, c]), Ld)), False))
    return out


def pairs_contrastive(Nq, Lq, offs, ql):
    out = []
    Nb = len(offs) - 1
    for qq in range(Nq):
        qlen = Lq if ql is None else max(0, min(int(ql[qq]), Lq))
        for n in range(Nb):
            out.append((qq * Lq, qlen, int(offs[n]), int(offs[n + 1] - offs[n]), False))
    return out


def pairs_packed(qoffs, doffs, pq, pd, Tq, Td):
    out = []
    Nq, Nd = len(qoffs) - 1, len(doffs) - 1
    for a, b in zip(pq.tolist(), pd.tolist()):
        if not (0 <= a < Nq and 0 <= b < Nd):
            out.append((0, 0, 0, 0, True))
            continue
        out.append((int(qoffs[a]), int(qoffs[a + 1] - qoffs[a]), int(doffs[b]), int(doffs[b + 1] - doffs[b]), False))
    return out


def make_data(shape, dtype, kind):
    if kind == "int":  # small integers: every product and sum exact -> exact ties
        return torch.randint(-2, 3, shape, device=DEV).to(dtype)
    x = torch.randn(shape, device=DEV, dtype=torch.float32)
    return x.to(dtype)


def run_padded(ops, dtype, B, C, Lq, Ld, D, kind="randn", idt=torch.int64, nan=False, full=False, backward=True):
    if "padded" not in SURFACES:
        return
    tag = f"padded {str(dtype)[6:]} B{B} C{C} Lq{Lq} Ld{Ld} D{D} {kind}{' nan' if nan else ''} {str(idt)[6:]}"
    q = make_data((B, Lq, D), dtype, kind)
    d = make_data((B, C, Ld, D), dtype, kind)
    if full:
        ql = torch.full((B,), Lq)
        dl = torch.full((B, C), Ld)
    else:
        ql = torch.randint(0, Lq + 1, (B,))
        dl = torch.randint(0, Ld + 1, (B, C))
        if B * C > 1:
            dl.view(-1)[0] = Ld
            ql[0] = Lq
        if B * C > 2:
            dl.view(-1)[1] = 0  # empty document
        if B > 1:
            ql[1] = 0  # empty query
        if B > 2:
            ql[2] = Lq + 5  # clamped
            dl[2, 0] = -3  # clamped to 0
    if nan and B * C > 0 and Ld > 2 and D > 0:
        d[0, 0, 2, 0] = float("nan")
        d[0, 0, 1, 0] = float("nan")
        q[0, 0, 0] = float("nan")
    pairs = pairs_padded(B, C, Lq, Ld, ql, dl)
    qli, dli = idx(ql, idt), idx(dl, idt)
    s, a = ops.padded_forward(q, d, qli, dli, True)
    s2, a2 = ops.padded_forward(q, d, qli, dli, True)
    s3, _ = ops.padded_forward(q, d, qli, dli, False)
    torch.cuda.synchronize()
    check(torch.equal(s.nan_to_num(7.0), s2.nan_to_num(7.0)) and torch.equal(a, a2), f"{tag}: forward deterministic")
    check(torch.equal(s.nan_to_num(7.0), s3.nan_to_num(7.0)), f"{tag}: scores same with/without argmax")
    check(tuple(s.shape) == (B, C) and tuple(a.shape) == (B, C, Lq), f"{tag}: output shapes")
    compare_forward(tag, dtype, q.reshape(-1, D), d.reshape(-1, D), pairs, Lq, s, a, fwd_tol(dtype))
    if backward and not nan and B * C > 0:
        g = torch.randn(B, C, device=DEV)
        gq, gd = ops.padded_backward(g, q, d, qli, dli, a, True, True)
        gq2, gd2 = ops.padded_backward(g, q, d, qli, dli, a, True, True)
        torch.cuda.synchronize()
        check(torch.equal(gq, gq2) and torch.equal(gd, gd2), f"{tag}: backward bitwise deterministic")
        rq, rd = ref_backward(q.reshape(-1, D), d.reshape(-1, D), pairs, a.reshape(B * C, Lq), g.reshape(-1))
        check(gq.dtype == dtype and gq.shape == q.shape and gd.shape == d.shape, f"{tag}: grad shapes/dtypes")
        eq, ed = rel(gq.reshape(-1, D), rq), rel(gd.reshape(-1, D), rd)
        check(eq <= grad_tol(dtype) and ed <= grad_tol(dtype), f"{tag}: grad rel err q {eq:.2e} d {ed:.2e}")
        gq3, gd3 = ops.padded_backward(g, q, d, qli, dli, a, False, True)
        check(gq3.numel() == 0 and torch.equal(gd3, gd), f"{tag}: need_grad_queries=False")


def run_contrastive(ops, dtype, Nq, Lq, Nb, Ld, D, kind="randn", idt=torch.int64, use_ql=True, nan=False, backward=True):
    if "contrastive" not in SURFACES:
        return
    tag = f"contrastive {str(dtype)[6:]} Nq{Nq} Lq{Lq} Nb{Nb} Ld{Ld} D{D} {kind}{' ql' if use_ql else ''}{' nan' if nan else ''}"
    lens = torch.randint(0, Ld + 1, (Nb,))
    if Nb > 0:
        lens[0] = Ld
    if Nb > 2:
        lens[1] = 0
    offs = torch.zeros(Nb + 1, dtype=torch.int64)
    offs[1:] = lens.cumsum(0)
    T = int(offs[-1])
    q = make_data((Nq, Lq, D), dtype, kind)
    d = make_data((T, D), dtype, kind)
    ql = None
    if use_ql:
        ql = torch.randint(0, Lq + 1, (Nq,))
        if Nq > 0:
            ql[0] = Lq
        if Nq > 1:
            ql[1] = 0
    if nan and T > 3 and D > 0:
        d[1, 0] = float("nan")
    pairs = pairs_contrastive(Nq, Lq, offs, ql)
    oi = idx(offs, idt)
    qli = idx(ql, idt) if ql is not None else None
    s, a = ops.contrastive_forward(q, d, oi, qli, True)
    s2, a2 = ops.contrastive_forward(q, d, oi, qli, True)
    torch.cuda.synchronize()
    check(torch.equal(s.nan_to_num(7.0), s2.nan_to_num(7.0)) and torch.equal(a, a2), f"{tag}: forward deterministic")
    check(tuple(s.shape) == (Nq, Nb) and tuple(a.shape) == (Nq, Nb, Lq), f"{tag}: output shapes")
    compare_forward(tag, dtype, q.reshape(-1, D), d, pairs, Lq, s, a, fwd_tol(dtype))
    if backward and not nan and Nq * Nb > 0:
        g = torch.randn(Nq, Nb, device=DEV)
        gq, gd = ops.contrastive_backward(g, q, d, oi, qli, a, True, True)
        gq2, gd2 = ops.contrastive_backward(g, q, d, oi, qli, a, True, True)
        torch.cuda.synchronize()
        check(torch.equal(gq, gq2) and torch.equal(gd, gd2), f"{tag}: backward bitwise deterministic")
        rq, rd = ref_backward(q.reshape(-1, D), d, pairs, a.reshape(Nq * Nb, Lq), g.reshape(-1))
        eq, ed = rel(gq.reshape(-1, D), rq), rel(gd, rd)
        check(eq <= grad_tol(dtype) and ed <= grad_tol(dtype), f"{tag}: grad rel err q {eq:.2e} d {ed:.2e}")


def csr(ids, n):
    order = torch.argsort(ids, stable=True)
    offs = torch.searchsorted(ids[order], torch.arange(n + 1, device=ids.device))
    return order, offs


def run_packed(ops, dtype, Nq, Nd, P, Lq, Ld, D, kind="randn", idt=torch.int64, sorted_pairs=True, bad=False, nan=False,
               backward=True):
    if "packed" not in SURFACES:
        return
    tag = f"packed {str(dtype)[6:]} Nq{Nq} Nd{Nd} P{P} Lq{Lq} Ld{Ld} D{D} {kind}{' sorted' if sorted_pairs else ''}{' bad' if bad else ''}"
    qlens = torch.randint(0, Lq + 1, (Nq,))
    dlens = torch.randint(0, Ld + 1, (Nd,))
    if Nq > 0:
        qlens[0] = Lq
    if Nd > 0:
        dlens[0] = Ld
    if Nd > 1:
        dlens[1] = 0
    qoffs = torch.zeros(Nq + 1, dtype=torch.int64)
    qoffs[1:] = qlens.cumsum(0)
    doffs = torch.zeros(Nd + 1, dtype=torch.int64)
    doffs[1:] = dlens.cumsum(0)
    q = make_data((int(qoffs[-1]), D), dtype, kind)
    d = make_data((int(doffs[-1]), D), dtype, kind)
    pq = torch.randint(0, max(Nq, 1), (P,))
    pd = torch.randint(0, max(Nd, 1), (P,))
    if sorted_pairs:
        pq, _ = pq.sort()
    if bad and P > 3:
        pd[1] = Nd + 5
        pq[3] = -1
    if nan and d.shape[0] > 1 and D > 0:
        d[0, 0] = float("nan")
    W = int(qlens.max()) if Nq > 0 else 0
    pairs = pairs_packed(qoffs, doffs, pq, pd, q.shape[0], d.shape[0])
    args = (q, idx(qoffs, idt), d, idx(doffs, idt), idx(pq, idt), idx(pd, idt))
    s, a = ops.packed_forward(*args, W, True)
    s2, a2 = ops.packed_forward(*args, W, True)
    torch.cuda.synchronize()
    check(torch.equal(s.nan_to_num(7.0), s2.nan_to_num(7.0)) and torch.equal(a, a2), f"{tag}: forward deterministic")
    check(tuple(s.shape) == (P,) and tuple(a.shape) == (P, W), f"{tag}: output shapes")
    compare_forward(tag, dtype, q, d, pairs, W, s, a, fwd_tol(dtype))
    if backward and not nan and P > 0:
        g = torch.randn(P, device=DEV)
        pqd, pdd = idx(pq, torch.int64), idx(pd, torch.int64)
        pbq, qpo = csr(pqd, Nq)
        pbd, dpo = csr(pdd, Nd)
        bargs = (g, q, idx(qoffs, idt), d, idx(doffs, idt), idx(pq, idt), idx(pd, idt), a, pbq, qpo, pbd, dpo, True, True)
        gq, gd = ops.packed_backward(*bargs)
        gq2, gd2 = ops.packed_backward(*bargs)
        torch.cuda.synchronize()
        check(torch.equal(gq, gq2) and torch.equal(gd, gd2), f"{tag}: backward bitwise deterministic")
        rq, rd = ref_backward(q, d, pairs, a, g)
        eq, ed = rel(gq, rq), rel(gd, rd)
        check(eq <= grad_tol(dtype) and ed <= grad_tol(dtype), f"{tag}: grad rel err q {eq:.2e} d {ed:.2e}")


def run_correctness(ops, quick=False):
    torch.manual_seed(0)
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    for dt in dtypes + [torch.float64]:
        run_padded(ops, dt, 3, 5, 7, 37, 3)
        run_contrastive(ops, dt, 5, 7, 6, 29, 3)
        run_packed(ops, dt, 4, 6, 17, 9, 41, 3, sorted_pairs=False, bad=True)
    for dt in dtypes:
        for D in (1, 64, 100, 128, 256, 300):
            run_padded(ops, dt, 2, 3, 32, 150, D)
        run_padded(ops, dt, 3, 4, 33, 65, 128, idt=torch.int32)
        run_padded(ops, dt, 2, 3, 64, 200, 128, full=True)
        run_padded(ops, dt, 1, 2, 150, 70, 64)       # M-chunks (BM=128)
        run_padded(ops, dt, 1, 2, 300, 90, 256)      # chunks at KD=256
        run_padded(ops, dt, 3, 4, 16, 100, 128, kind="int")  # exact ties
        run_padded(ops, dt, 3, 4, 16, 40, 128, nan=True)
        run_padded(ops, dt, 2, 3, 8, 1030, 128)
        run_contrastive(ops, dt, 9, 32, 13, 180, 128)
        run_contrastive(ops, dt, 7, 32, 11, 100, 128, use_ql=False, idt=torch.int32)
        run_contrastive(ops, dt, 3, 130, 5, 70, 96)   # G=1, chunked
        run_contrastive(ops, dt, 40, 1, 9, 50, 64)    # Lq=1, many stacked
        run_contrastive(ops, dt, 6, 20, 7, 64, 128, kind="int")
        run_contrastive(ops, dt, 4, 12, 5, 30, 128, nan=True)
        run_contrastive(ops, dt, 3, 16, 4, 40, 300)
        run_packed(ops, dt, 8, 30, 60, 32, 256, 128)
        run_packed(ops, dt, 8, 30, 60, 32, 256, 128, sorted_pairs=False, idt=torch.int32, bad=True)
        run_packed(ops, dt, 5, 9, 20, 150, 100, 64)   # long queries, chunks
        run_packed(ops, dt, 5, 9, 20, 20, 80, 128, kind="int")
        run_packed(ops, dt, 5, 9, 20, 20, 80, 100, nan=True)
        run_packed(ops, dt, 4, 6, 12, 10, 30, 260)
    if not quick:
        run_padded(ops, torch.float16, 1, 2, 2048, 300, 128)
        run_padded(ops, torch.bfloat16, 2, 2, 8, 5000, 128)
    # empty / zero-size
    for dt in (torch.float16, torch.float32):
        q = torch.randn(3, 4, 8, device=DEV, dtype=dt)
        s, a = ops.padded_forward(q, torch.randn(3, 0, 5, 8, device=DEV, dtype=dt), idx(torch.full((3,), 4), torch.int64),
                                  idx(torch.zeros(3, 0), torch.int64), True)
        check(tuple(s.shape) == (3, 0) and tuple(a.shape) == (3, 0, 4), "padded C=0 shapes")
        s, a = ops.contrastive_forward(q, torch.randn(0, 8, device=DEV, dtype=dt), idx(torch.zeros(1), torch.int64), None, True)
        check(tuple(s.shape) == (3, 0), "contrastive Nb=0 shape")
        s, a = ops.packed_forward(q.reshape(-1, 8), idx(torch.tensor([0, 12]), torch.int64), q.reshape(-1, 8),
                                  idx(torch.tensor([0, 12]), torch.int64), idx(torch.zeros(0), torch.int64),
                                  idx(torch.zeros(0), torch.int64), 12, True)
        check(tuple(s.shape) == (0,) and tuple(a.shape) == (0, 12), "packed P=0 shapes")
        s, a = ops.padded_forward(torch.randn(2, 0, 8, device=DEV, dtype=dt), torch.randn(2, 3, 5, 8, device=DEV, dtype=dt),
                                  idx(torch.zeros(2), torch.int64), idx(torch.full((2, 3), 5), torch.int64), True)
        torch.cuda.synchronize()
        check(bool((s == 0).all()) and tuple(a.shape) == (2, 3, 0), "padded Lq=0 -> zeros")
    torch.cuda.synchronize()


def run_streams_and_graphs(ops):
    torch.manual_seed(1)
    B, C, Lq, Ld, D = 4, 8, 32, 256, 128
    q = torch.randn(B, Lq, D, device=DEV, dtype=torch.float16)
    d = torch.randn(B, C, Ld, D, device=DEV, dtype=torch.float16)
    ql = torch.randint(1, Lq + 1, (B,), device=DEV)
    dl = torch.randint(1, Ld + 1, (B, C), device=DEV)
    ref, refa = ops.padded_forward(q, d, ql, dl, True)
    st = torch.cuda.Stream()
    with torch.cuda.stream(st):
        s, a = ops.padded_forward(q, d, ql, dl, True)
    st.synchronize()
    check(torch.equal(s, ref) and torch.equal(a, refa), "non-default stream forward")
    # CUDA graph capture of forward + backward
    g = torch.randn(B, C, device=DEV)
    st.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(st):
        ops.padded_forward(q, d, ql, dl, True)  # warm (attributes/occupancy cached)
        ops.padded_backward(g, q, d, ql, dl, refa, True, True)
        with torch.cuda.graph(graph, stream=st):
            gs, ga = ops.padded_forward(q, d, ql, dl, True)
            gq, gd = ops.padded_backward(g, q, d, ql, dl, ga, True, True)
    graph.replay()
    torch.cuda.synchronize()
    eq, ed = ops.padded_backward(g, q, d, ql, dl, refa, True, True)
    torch.cuda.synchronize()
    check(torch.equal(gs, ref) and torch.equal(ga, refa) and torch.equal(gq, eq) and torch.equal(gd, ed),
          "CUDA graph capture + replay (padded forward+backward)")
    # packed + contrastive under capture
    offs = torch.arange(0, 9 * 50, 50, device=DEV)
    dd = torch.randn(8 * 50, D, device=DEV, dtype=torch.bfloat16)
    qq = torch.randn(6, 32, D, device=DEV, dtype=torch.bfloat16)
    r0, _ = ops.contrastive_forward(qq, dd, offs, None, False)
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.stream(st):
        with torch.cuda.graph(graph2, stream=st):
            r1, _ = ops.contrastive_forward(qq, dd, offs, None, False)
    graph2.replay()
    torch.cuda.synchronize()
    check(torch.equal(r0, r1), "CUDA graph capture contrastive")


# ----------------------------------------------------------------------------- timing

def bench(fn, reps=30, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts)


def peak_extra(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    outb = sum(t.numel() * t.element_size() for t in out)
    return peak, outb


ROWS: list[tuple] = []


def naive_padded(q, d, ql, dl, full=False):
    S = torch.einsum("bid,bcjd->bcij", q, d)
    if full:
        return S.amax(-1).float().sum(-1)
    Ld = d.shape[2]
    jm = torch.arange(Ld, device=DEV)[None, None, None, :] >= dl[:, :, None, None]
    S = S.masked_fill(jm, float("-inf"))
    m = S.amax(-1).float()
    im = torch.arange(q.shape[1], device=DEV)[None, None, :] < ql[:, None, None]
    return (m * im).nan_to_num(0.0, neginf=0.0).sum(-1)


def bench_padded(ops, name, B, C, Lq, Ld, D, dtype, ragged):
    torch.manual_seed(2)
    q = torch.nn.functional.normalize(torch.randn(B, Lq, D, device=DEV), dim=-1).to(dtype)
    d = torch.nn.functional.normalize(torch.randn(B, C, Ld, D, device=DEV), dim=-1).to(dtype)
    if ragged:
        ql = torch.randint(Lq // 2, Lq + 1, (B,), device=DEV)
        dl = torch.randint(Ld // 4, Ld + 1, (B, C), device=DEV)
    else:
        ql = torch.full((B,), Lq, device=DEV)
        dl = torch.full((B, C), Ld, device=DEV)
    t_ours = bench(lambda: ops.padded_forward(q, d, ql, dl, False))
    t_arg = bench(lambda: ops.padded_forward(q, d, ql, dl, True))
    t_naive = bench(lambda: naive_padded(q, d, ql, dl, full=not ragged))
    s, _ = ops.padded_forward(q, d, ql, dl, False)
    err = rel(s, naive_padded(q.double(), d.double(), ql, dl))
    peak, outb = peak_extra(lambda: ops.padded_forward(q, d, ql, dl, True))
    gbs = d.numel() * d.element_size() / (t_ours * 1e-3) / 1e9
    ROWS.append((name, "padded", f"{t_ours:.3f}", f"{t_arg:.3f}", f"{t_naive:.3f}", f"{gbs:.0f} GB/s", f"{err:.1e}",
                 f"{peak}/{outb}"))
    # packed, same tokens
    qlc, dlc = ql.cpu(), dl.cpu()
    qs = torch.cat([q[b, :int(qlc[b])] for b in range(B)])
    ds = torch.cat([d[b, c, :int(dlc[b, c])] for b in range(B) for c in range(C)])
    qoffs = torch.zeros(B + 1, dtype=torch.int64, device=DEV)
    qoffs[1:] = ql.cumsum(0)
    doffs = torch.zeros(B * C + 1, dtype=torch.int64, device=DEV)
    doffs[1:] = dl.reshape(-1).cumsum(0)
    pq = torch.arange(B, device=DEV).repeat_interleave(C)
    pd = torch.arange(B * C, device=DEV)
    t_packed = bench(lambda: ops.packed_forward(qs, qoffs, ds, doffs, pq, pd, Lq, False))
    t_packed_a = bench(lambda: ops.packed_forward(qs, qoffs, ds, doffs, pq, pd, Lq, True))
    sp, _ = ops.packed_forward(qs, qoffs, ds, doffs, pq, pd, Lq, False)
    errp = rel(sp, s.reshape(-1))
    ROWS.append((name + "Packed", "packed", f"{t_packed:.3f}", f"{t_packed_a:.3f}", "-",
                 f"{ds.numel() * ds.element_size() / (t_packed * 1e-3) / 1e9:.0f} GB/s", f"{errp:.1e} vs padded",
                 f"{t_packed / t_ours:.2f}x padded"))


def naive_contrastive(q, dpad, dl, full=False):
    S = torch.einsum("qid,njd->qnij", q, dpad)
    if full:
        return S.amax(-1).float().sum(-1)
    jm = torch.arange(dpad.shape[1], device=DEV)[None, None, None, :] >= dl[None, :, None, None]
    S = S.masked_fill(jm, float("-inf"))
    return S.amax(-1).float().sum(-1)


def bench_contrastive(ops, name, Nq, Lq, Nb, Ld, D, dtype, ragged, train):
    torch.manual_seed(3)
    q = torch.nn.functional.normalize(torch.randn(Nq, Lq, D, device=DEV), dim=-1).to(dtype)
    dl = torch.randint(Ld // 4, Ld + 1, (Nb,), device=DEV) if ragged else torch.full((Nb,), Ld, device=DEV)
    dpad = torch.nn.functional.normalize(torch.randn(Nb, Ld, D, device=DEV), dim=-1).to(dtype)
    mask = torch.arange(Ld, device=DEV)[None, :] < dl[:, None]
    dcat = dpad[mask]
    offs = torch.zeros(Nb + 1, dtype=torch.int64, device=DEV)
    offs[1:] = dl.cumsum(0)
    if train:
        g = torch.randn(Nq, Nb, device=DEV)

        def ours():
            s, a = ops.contrastive_forward(q, dcat, offs, None, True)
            return ops.contrastive_backward(g, q, dcat, offs, None, a, True, True)

        def naive():
            qq = q.detach().requires_grad_(True)
            dd = dpad.detach().requires_grad_(True)
            s = naive_contrastive(qq, dd, dl, full=not ragged)
            (s * g).sum().backward()
            return qq.grad, dd.grad
    else:
        def ours():
            return ops.contrastive_forward(q, dcat, offs, None, False)

        def naive():
            return naive_contrastive(q, dpad, dl, full=not ragged)
    t_ours = bench(ours, reps=10 if Nb * Nq > 100000 else 30)
    t_fwd = bench(lambda: ops.contrastive_forward(q, dcat, offs, None, False), reps=10)
    try:
        t_naive = bench(naive, reps=5, warm=2)
    except torch.OutOfMemoryError:
        t_naive = float("nan")
    torch.cuda.empty_cache()
    s, _ = ops.contrastive_forward(q, dcat, offs, None, False)
    sub, nqs = min(Nb, 256), min(Nq, 8)
    err = rel(s[:nqs, :sub], naive_contrastive(q[:nqs].double(), dpad[:sub].double(), dl[:sub]))
    flops = 2.0 * Nq * Lq * int(dl.sum()) * D
    if train:
        s_, a_ = ops.contrastive_forward(q, dcat, offs, None, True)
        tq = bench(lambda: ops.contrastive_backward(g, q, dcat, offs, None, a_, True, False), reps=10)
        td = bench(lambda: ops.contrastive_backward(g, q, dcat, offs, None, a_, False, True), reps=10)
        log(f"{name}: backward grad_q only {tq:.3f} ms, grad_d only {td:.3f} ms")
    ROWS.append((name, "contrastive" + (" train" if train else ""), f"{t_ours:.3f}", f"fwd {t_fwd:.3f}",
                 f"{t_naive:.3f}", f"{flops / (t_fwd * 1e-3) / 1e12:.0f} TFLOP/s fwd", f"{err:.1e}", ""))


def run_bench(ops, which="all"):
    h = torch.float16
    if which in ("all", "rerank"):
        run_bench_rerank(ops, h)
    if which in ("all", "contrastive"):
        run_bench_contrastive(ops, h)


def run_bench_rerank(ops, h):
    bench_padded(ops, "SmallRerank", 32, 10, 32, 180, 128, h, False)
    bench_padded(ops, "Rerank", 32, 50, 32, 180, 128, h, False)
    bench_padded(ops, "HeavyRerank", 32, 100, 32, 256, 128, h, False)
    bench_padded(ops, "HeavyRerankRagged", 32, 100, 32, 256, 128, h, True)
    bench_padded(ops, "LongDocStress", 8, 16, 64, 1024, 128, h, False)
    bench_padded(ops, "ColPaliRerank", 16, 64, 32, 1030, 128, h, False)
    bench_padded(ops, "ColPaliRerankRagged", 16, 64, 32, 1030, 128, h, True)


def run_bench_contrastive(ops, h):
    bench_contrastive(ops, "Contrastive", 32, 32, 32, 80, 128, h, False, True)
    bench_contrastive(ops, "BigBatch", 64, 32, 64, 128, 128, h, False, True)
    bench_contrastive(ops, "ColPali", 32, 32, 32, 1030, 128, h, False, True)
    bench_contrastive(ops, "BigColBERT", 512, 32, 512, 180, 128, torch.bfloat16, False, True)
    bench_contrastive(ops, "DocDoc", 64, 1024, 64, 1024, 128, torch.bfloat16, False, True)
    bench_contrastive(ops, "ColBERTCorpus", 32, 32, 10000, 256, 128, h, True, False)
    bench_contrastive(ops, "ColPaliCorpus", 8, 32, 4096, 1030, 128, h, True, False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--only-bench", action="store_true")
    ap.add_argument("--surfaces", default="padded,contrastive,packed")
    ap.add_argument("--bench-set", default="all", choices=["all", "rerank", "contrastive"])
    args = ap.parse_args()
    SURFACES.clear()
    SURFACES.update(args.surfaces.split(","))
    ops = load_ops(args.lib)
    log(f"torch {torch.__version__} device {torch.cuda.get_device_name()}")
    t0 = time.time()
    if not args.only_bench:
        try:
            run_correctness(ops, args.quick)
        except Exception as e:  # keep going to report
            import traceback
            traceback.print_exc()
            FAIL.append(f"correctness crashed: {e!r}")
        try:
            run_streams_and_graphs(ops)
        except Exception as e:
            import traceback
            traceback.print_exc()
            FAIL.append(f"streams/graphs crashed: {e!r}")
        log(f"correctness: {PASS[0]} passed, {len(FAIL)} failed ({time.time() - t0:.0f} s)")
    if not args.no_bench:
        try:
            run_bench(ops, args.bench_set)
        except Exception as e:
            import traceback
            traceback.print_exc()
            FAIL.append(f"bench crashed: {e!r}")
        hdr = ("workload", "surface", "ours ms", "w/ argmax", "naive ms", "rate", "err", "peak/out bytes")
        log("\n" + " | ".join(hdr))
        for r in ROWS:
            log(" | ".join(str(x) for x in r))
    log(f"\nSUMMARY: {PASS[0]} checks passed, {len(FAIL)} failed")
    for f in FAIL[:40]:
        log(f"  FAIL {f}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "summary.txt").write_text("\n".join(LOG) + "\n")
    sys.exit(1 if FAIL else 0)


if __name__ == "__main__":
    main()
