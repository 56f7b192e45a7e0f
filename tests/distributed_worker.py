"""What each process of tests/test_distributed.py runs (kept apart from the test module so
that spawned children import only torch and kernels).

Every rank draws the inputs of *all* ranks from one seed, so each can compute the
single-process result on the concatenated batch itself and compare its own part of the
distributed result with it. A failed comparison is recorded, not raised, so every rank
keeps making the same collectives in the same order; the records go to a JSON file per
rank that the test reads.
"""
from __future__ import annotations

import datetime
import json
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

D = 16
LQ = 5


class Checks:
    def __init__(self):
        self.count = 0
        self.failures: list[str] = []

    def that(self, ok: bool, what: str) -> None:
        self.count += 1
        if not ok:
            self.failures.append(what)

    def close(self, actual, expected, what: str, *, rtol: float, scale=None) -> None:
        """|actual - expected| <= rtol * (|expected| + scale) elementwise (NaN/inf must match)."""
        a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
        if a.shape != e.shape:
            return self.that(False, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}")
        special = ~torch.isfinite(e)
        same_special = torch.equal(torch.isnan(a), torch.isnan(e)) and torch.equal(
            a[special & ~torch.isnan(e)], e[special & ~torch.isnan(e)])
        scale = e[~special].abs().max().item() if scale is None and (~special).any() else (scale or 0.0)
        err = (a - e).abs()[~special]
        tol = rtol * (e[~special].abs() + scale)
        ok = same_special and bool((err <= tol).all())
        worst = f"{err.max().item():.3g}" if err.numel() else "-"
        self.that(ok, f"{what}: max error {worst} (rtol {rtol:g}, scale {scale:.3g})")


def _offsets(lengths: list[int], dtype) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist(), dtype=dtype)


def _unit(gen, *shape):
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True)


def _lattice(gen, *shape):
    """Multiples of 1/4: every dot product and score is exact, so ties are exact."""
    x = torch.randint(-3, 4, shape, generator=gen).double() / 4
    x[..., 0] = torch.where((x == 0).all(dim=-1), 0.5, x[..., 0])
    return x


# ---- gather + contrastive -------------------------------------------------------------------

# (name, dtype, offsets dtype, documents per rank, queries per rank, with query_lengths);
# per-rank lists are cut to the world size.
CONTRASTIVE_CASES = [
    ("uneven fp32 int64", torch.float32, torch.int64, [3, 1, 4], [3, 2, 1], False),
    ("empty rank bf16 int32", torch.bfloat16, torch.int32, [2, 0, 3], [2, 3, 0], False),
    ("query_lengths fp16 int64", torch.float16, torch.int64, [1, 2, 2], [2, 1, 3], True),
    ("empty rank fp32 int32", torch.float32, torch.int32, [0, 4, 1], [1, 0, 2], True),
    ("fp64", torch.float64, torch.int64, [2, 3, 1], [1, 2, 2], False),
]

# Per element, relative to |expected| + the largest |expected|: each rank's partial gradient is
# rounded to the input dtype before the ranks' sum is, so two roundings where one process has one.
GRAD_RTOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _contrastive_inputs(seed, world, dtype, doc_counts, query_counts, with_lengths):
    gen = torch.Generator().manual_seed(seed)
    ranks = []
    for r in range(world):
        lengths = torch.randint(0, 9, (doc_counts[r],), generator=gen).tolist()
        if lengths:
            lengths[0] = 8  # one full document per rank; the others may be empty
        q = _unit(gen, query_counts[r], LQ, D).to(dtype)
        d = _unit(gen, sum(lengths), D).to(dtype)
        q_lens = torch.randint(0, LQ + 1, (query_counts[r],), generator=gen) if with_lengths else None
        ranks.append((q, d, lengths, q_lens))
    # positives among the non-empty documents (an empty one scores -inf: an infinite loss)
    non_empty = torch.tensor([n > 0 for r in ranks for n in r[2]]).nonzero().flatten()
    picks = torch.randint(0, len(non_empty), (sum(query_counts[:world]),), generator=gen)
    return ranks, non_empty[picks]


def check_contrastive(ms, checks, rank, world, device, seed):
    for name, dtype, index_dtype, doc_counts, query_counts, with_lengths in CONTRASTIVE_CASES:
        what = f"[{name}, world {world}, rank {rank}]"
        ranks, targets = _contrastive_inputs(seed + len(name), world, dtype, doc_counts,
                                             query_counts, with_lengths)

        def put(t):
            return None if t is None else t.to(device)

        # single process, whole batch
        q_all = torch.cat([r[0] for r in ranks]).to(device).requires_grad_()
        d_all = torch.cat([r[1] for r in ranks]).to(device).requires_grad_()
        off_all = _offsets([n for r in ranks for n in r[2]], index_dtype).to(device)
        ql_all = put(torch.cat([r[3] for r in ranks]).to(index_dtype)) if with_lengths else None
        scores_all = ms.score_contrastive_train(q_all, d_all, off_all, query_lengths=ql_all)
        loss_all = F.cross_entropy(scores_all, targets.to(device))
        loss_all.backward()

        # this rank's part
        q, d, lengths, q_lens = ranks[rank]
        q, d = q.to(device).requires_grad_(), d.to(device).requires_grad_()
        q_lens = put(q_lens.to(index_dtype)) if with_lengths else None
        out = ms.score_contrastive_train_global(q, d, _offsets(lengths, index_dtype).to(device),
                                                query_lengths=q_lens)
        q0 = sum(query_counts[:rank])
        mine = slice(q0, q0 + query_counts[rank])
        loss = F.cross_entropy(out.scores, targets[mine].to(device), reduction="sum") / out.total_queries
        loss.backward()
        loss_sum = loss.detach().double().reshape(1)
        dist.all_reduce(loss_sum)

        checks.that((out.document_start, out.query_start, out.total_queries)
                    == (sum(doc_counts[:rank]), q0, sum(query_counts[:world])),
                    f"{what} starts/total {out[1:]}")
        checks.close(out.scores, scores_all[mine], f"{what} scores", rtol=1e-5, scale=LQ)
        reference = ms.score_contrastive_reference(
            q_all.detach().cpu().double(), d_all.detach().cpu().double(), off_all.cpu(),
            query_lengths=None if ql_all is None else ql_all.cpu())
        checks.close(out.scores, reference[mine], f"{what} scores vs float64", rtol=1e-4, scale=LQ)
        checks.close(loss_sum, loss_all.reshape(1), f"{what} loss", rtol=1e-5)
        checks.close(q.grad, q_all.grad[mine], f"{what} grad queries", rtol=GRAD_RTOL[dtype])
        t0 = sum(sum(r[2]) for r in ranks[:rank])
        checks.close(d.grad, d_all.grad[t0:t0 + d.shape[0]], f"{what} grad documents",
                     rtol=GRAD_RTOL[dtype])


def check_gather(ms, checks, rank, world, device, seed):
    """The gather alone: exact concatenation, and backward = the rank-ordered sum of every
    rank's gradient of this rank's rows (each rank weighs the global rows differently)."""
    gen = torch.Generator().manual_seed(seed)
    for dtype, index_dtype, counts in ((torch.float32, torch.int64, [2, 0, 3]),
                                       (torch.bfloat16, torch.int32, [1, 3, 0]),
                                       (torch.float16, torch.int64, [0, 0, 0])):
        what = f"[gather {dtype} {counts[:world]}, world {world}, rank {rank}]"
        lengths = [torch.randint(0, 6, (counts[r],), generator=gen).tolist() for r in range(world)]
        docs = [_unit(gen, sum(lens), D).to(dtype) for lens in lengths]
        total = sum(sum(lens) for lens in lengths)
        weights = [torch.randn(total, D, generator=gen) for _ in range(world)]
        mine = docs[rank].to(device).requires_grad_()
        grads = []
        for _ in range(2):
            mine.grad = None
            g = ms.gather_documents(mine, _offsets(lengths[rank], index_dtype).to(device))
            (g.documents.float() * weights[rank].to(device)).sum().backward()
            grads.append(mine.grad.clone())
        flat = [n for lens in lengths for n in lens]
        checks.that(torch.equal(g.documents.detach().cpu(), torch.cat(docs)), f"{what} documents")
        checks.that(g.document_offsets.dtype == index_dtype and
                    torch.equal(g.document_offsets.cpu(), _offsets(flat, index_dtype)), f"{what} offsets")
        checks.that((g.document_start, g.document_counts) == (sum(counts[:rank]), tuple(counts[:world])),
                    f"{what} start/counts")
        t0 = sum(sum(lens) for lens in lengths[:rank])
        # what each rank's backward hands over (its weights in dtype), added in rank order
        parts = [w[t0:t0 + mine.shape[0]].to(dtype).float() for w in weights]
        expected = parts[0].clone()
        for part in parts[1:]:
            expected += part
        checks.that(torch.equal(grads[0].cpu(), expected.to(dtype)), f"{what} backward")
        checks.that(torch.equal(grads[0], grads[1]), f"{what} backward deterministic")
    try:  # ranks disagreeing on D: every rank raises, none hangs
        ms.gather_documents(torch.zeros(1, 4 + rank, device=device), _offsets([1], torch.int64).to(device))
        checks.that(False, "mismatched D did not raise")
    except ValueError as e:
        checks.that("embedding dim" in str(e), f"mismatched D message: {e}")


# ---- sharded search -------------------------------------------------------------------------

# (name, dtype, documents per shard, k values); cut to the world size
SEARCH_CASES = [
    ("fp32 empty shard", torch.float32, [5, 0, 3], (0, 1, 4, 6, 20)),
    ("bf16 uneven", torch.bfloat16, [2, 7, 1], (3, 9)),
]
N_QUERIES = 4


def reference_top_k(scores: torch.Tensor, k: int):
    """Stable sort, higher first (NaN highest, as torch.sort has it), ties by lower id;
    slots past the corpus: id -1, score -inf."""
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    top = scores.gather(1, order)
    missing = k - order.shape[1]
    if missing > 0:
        top = torch.cat([top, top.new_full((top.shape[0], missing), float("-inf"))], dim=1)
        order = torch.cat([order, order.new_full((order.shape[0], missing), -1)], dim=1)
    return top, order


def _search_corpus(gen, counts):
    """Per-shard document lengths and tokens (lattice values), with an exact tie between
    two documents (on different shards where two hold documents) and a NaN document."""
    world = len(counts)
    lengths = torch.randint(1, 6, (sum(counts),), generator=gen).tolist()
    firsts = [sum(counts[:r]) for r in range(world) if counts[r] > 0]
    a, b = (firsts[0], firsts[-1]) if len(firsts) > 1 else (firsts[0], firsts[0] + 1)
    lengths[b] = lengths[a]
    tokens = [_lattice(gen, n, 8) for n in lengths]
    tokens[b] = tokens[a].clone()
    biggest = max(range(world), key=lambda r: counts[r])
    tokens[sum(counts[:biggest + 1]) - 1][-1, 0] = float("nan")
    cuts = [sum(counts[:r]) for r in range(world + 1)]
    return ([lengths[cuts[r]:cuts[r + 1]] for r in range(world)],
            [torch.cat(tokens[cuts[r]:cuts[r + 1]] or [torch.zeros(0, 8, dtype=torch.float64)])
             for r in range(world)])


def check_search(ms, checks, rank, world, device, seed):
    gen = torch.Generator().manual_seed(seed)
    for name, dtype, counts, ks in SEARCH_CASES:
        lengths, docs = _search_corpus(gen, counts[:world])
        docs = [x.to(dtype) for x in docs]
        queries = _lattice(gen, N_QUERIES, 3, 8).to(dtype).to(device)
        q_lens = torch.tensor([3, 1, 0, 2]).to(device)
        all_docs = torch.cat(docs).to(device)
        all_offsets = _offsets([n for lens in lengths for n in lens], torch.int64).to(device)
        for with_lengths in (False, True):
            kw = {"query_lengths": q_lens} if with_lengths else {}
            scores = ms.score_contrastive(queries, all_docs, all_offsets, **kw).cpu()
            for k in ks:
                for dst in (None, world - 1):
                    what = f"[search {name} k={k} dst={dst} lengths={with_lengths}, world {world}, rank {rank}]"
                    got = ms.search_sharded(queries, docs[rank].to(device),
                                            _offsets(lengths[rank], torch.int32).to(device), k,
                                            dst=dst, **kw)
                    if dst is not None and rank != dst:
                        checks.that(got is None, f"{what}: non-dst rank got a result")
                        continue
                    top, ids = reference_top_k(scores, k)
                    checks.that(got.document_ids.dtype == torch.int64 and
                                torch.equal(got.document_ids.cpu(), ids), f"{what} ids\n{got.document_ids}\n{ids}")
                    checks.that(torch.allclose(got.scores.cpu(), top, rtol=0, atol=0, equal_nan=True),
                                f"{what} scores\n{got.scores}\n{top}")
    if device.type == "cpu":  # ranks disagreeing on k: found (value checks run on CPU tensors)
        try:
            ms.search_sharded(queries, docs[rank].to(device),
                              _offsets(lengths[rank], torch.int64).to(device), 1 + rank)
            checks.that(False, "mismatched k did not raise")
        except ValueError as e:
            checks.that("k differs" in str(e), f"mismatched k message: {e}")


# ---- entry point ----------------------------------------------------------------------------

def run(rank, world, backend, init_method, kernel_repo, kernel_backend, result_dir, seed):
    checks = Checks()
    try:
        import kernels

        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        torch.set_num_threads(1)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=180))
        ms = kernels.get_local_kernel(Path(kernel_repo), backend=kernel_backend)
        check_gather(ms, checks, rank, world, device, seed)
        check_contrastive(ms, checks, rank, world, device, seed)
        check_search(ms, checks, rank, world, device, seed)
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001  (reported to the test, which fails on it)
        checks.failures.append(traceback.format_exc())
    Path(result_dir, f"rank{rank}.json").write_text(
        json.dumps({"checks": checks.count, "failures": checks.failures}))
