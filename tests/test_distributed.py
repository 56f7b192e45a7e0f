"""maxsim.distributed against the single-process result, in real process groups.

Each parametrisation spawns one group (2 or 3 processes; gloo on CPU, and NCCL when enough
GPUs are present) that runs every case of tests/distributed_worker.py: the gather alone,
contrastive scores / loss / both gradients (uneven and empty ranks, int32 and int64
offsets, float32, bfloat16, float16, with and without query_lengths), and sharded top-k
(ties, NaN, empty shard, k beyond a shard and beyond the corpus, on all ranks or on one).
Spawning is slow, so the cases share a group rather than each getting one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

import distributed_worker
from conftest import KERNEL_REPO, REPO_ROOT, load_kernel, seed_for

GROUPS = [("gloo", "cpu", 2), ("gloo", "cpu", 3), ("nccl", "cuda", 2), ("nccl", "cuda", 3)]


def _available(backend: str, world: int) -> str | None:
    if not torch.distributed.is_available():
        return "torch.distributed is not available"
    if backend == "nccl":
        if not torch.distributed.is_nccl_available():
            return "NCCL is not available"
        if torch.cuda.device_count() < world:
            return f"needs {world} GPUs"
    return None


@pytest.mark.parametrize("backend,kernel_backend,world", GROUPS,
                         ids=[f"{b}-{w}" for b, _, w in GROUPS])
def test_matches_single_process(backend, kernel_backend, world, tmp_path, request):
    reason = _available(backend, world)
    if reason:
        pytest.skip(reason)
    load_kernel(kernel_backend)  # build once here; the children only load it
    init = f"file://{tmp_path / 'rendezvous'}"
    seed = seed_for(request.node.nodeid)
    env_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # world processes on a few cores
    try:
        mp.spawn(distributed_worker.run, nprocs=world, join=True,
                 args=(world, backend, init, str(KERNEL_REPO), kernel_backend, str(tmp_path), seed))
    finally:
        if env_threads is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = env_threads
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    failures = [f for report in reports for f in report["failures"]]
    assert not failures, "\n".join(failures[:20])
    counts = [report["checks"] for report in reports]
    assert min(counts) > 50, counts  # every rank ran its cases


@pytest.mark.parametrize("example", ["05_distributed_training.py", "06_sharded_search.py"])
def test_example_under_torchrun(example, cpu_kernel, tmp_path):
    """The examples as the docs launch them, with 2 processes: on 2 GPUs (NCCL) where there
    are, else on the CPU (gloo); each example asserts its result."""
    del cpu_kernel  # makes sure the build exists
    env = dict(os.environ, LOCAL_KERNELS=f"maxsim/maxsim={KERNEL_REPO}", HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf"))
    if torch.cuda.device_count() < 2:
        env["CUDA_VISIBLE_DEVICES"] = ""  # two processes must not share one GPU
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(REPO_ROOT / "examples" / example)],
        env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


# ---- one process, no process group: the helpers act as a single rank -------------------------

def test_single_rank_without_process_group(cpu_kernel, rng):
    ms = cpu_kernel
    assert not torch.distributed.is_initialized()
    q = torch.randn(3, 4, 8, generator=rng)
    d = torch.randn(10, 8, generator=rng)
    offsets = torch.tensor([0, 4, 4, 10], dtype=torch.int32)
    g = ms.gather_documents(d, offsets)
    assert g.documents is d and g.document_offsets is offsets
    assert (g.document_start, g.document_counts) == (0, (3,))
    out = ms.score_contrastive_train_global(q, d, offsets)
    assert torch.equal(out.scores, ms.score_contrastive(q, d, offsets))
    assert (out.document_start, out.query_start, out.total_queries) == (0, 0, 3)
    top = ms.search_sharded(q, d, offsets, 5)
    expected, ids = distributed_worker.reference_top_k(ms.score_contrastive(q, d, offsets), 5)
    assert torch.equal(top.document_ids, ids) and torch.equal(top.scores, expected)
    assert ids[:, 3:].eq(-1).all()  # 3 documents, k = 5


def test_search_keys_order_like_sort(cpu_kernel):
    """The packed (score, id) keys rank exactly as a stable descending sort: signed zeros
    equal, NaN of either sign highest, infinities, subnormals, ties by id."""
    search_keys, decode_keys = cpu_kernel.distributed._search_keys, cpu_kernel.distributed._decode_keys
    values = torch.tensor([0.0, -0.0, float("nan"), -float("nan"), float("inf"), -float("inf"),
                           1e-45, -1e-45, 1.5, 1.5, -2.0, 3.4e38, -3.4e38, 0.0])
    ids = torch.arange(values.numel())
    keys = search_keys(values[None], ids)
    order = keys.topk(values.numel(), dim=1).indices[0]
    expected = torch.sort(values, descending=True, stable=True).indices
    assert torch.equal(order, expected), (order, expected)
    scores, back = decode_keys(keys)
    assert torch.equal(back[0], ids)
    same = (scores[0] == values) | (torch.isnan(scores[0]) & torch.isnan(values))
    assert same.all()


def test_bad_arguments(cpu_kernel):
    ms = cpu_kernel
    q = torch.randn(2, 3, 8)
    d = torch.randn(5, 8)
    offsets = torch.tensor([0, 2, 5])
    with pytest.raises(TypeError, match="float64"):
        ms.search_sharded(q.double(), d.double(), offsets, 1)
    with pytest.raises(ValueError, match="k must be"):
        ms.search_sharded(q, d, offsets, -1)
    with pytest.raises(ValueError, match="dst"):
        ms.search_sharded(q, d, offsets, 1, dst=1)
    with pytest.raises(ValueError, match="document_offsets"):
        ms.gather_documents(d, torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="embedding dim"):
        ms.score_contrastive_train_global(torch.randn(2, 3, 4), d, offsets)
    with pytest.raises(ValueError, match="query_lengths"):
        ms.score_contrastive_train_global(q, d, offsets, query_lengths=torch.tensor([1, 4]))
