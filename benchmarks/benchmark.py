"""maxsim workloads for the Hugging Face `kernels benchmark` CLI.

    pip install 'kernels[benchmark]'
    kernels benchmark ./ --warmup 2 --iterations 5        # from the repository root

One Benchmark class per surface; each `benchmark_<Workload>` times one maxsim call on
the inputs of that workload (benchmarks/workloads.py defines the shapes and inputs) and
`verify_<Workload>` recomputes the scores with the package's pure-PyTorch *_reference
functions (the CLI compares them with torch.allclose(atol=1e-2)).

- Reranking (padded and packed) and corpus scoring use ragged lengths; training steps
  use the full layout, as in the project's benchmark table. A training workload times
  forward + backward of (scores * g).sum() and leaves the forward scores in self.out.
- dtype: float16 on a GPU (bfloat16 for BigColBERT and DocDoc), float32 on the CPU.
- On the CPU every workload runs a scaled-down shape (fewer queries / candidates /
  documents, same Lq, Ld and D) so the whole run takes a few minutes on 2 cores; the
  factor per workload is listed at the top of workloads.py (`Workload.cpu_scale`).
- The CLI's "Ref(ms)" column times the reference, which materialises every similarity
  in float32 (computed in query chunks on big GPU workloads to bound memory); the side-by-
  side numbers against naive PyTorch and the peer packages come from benchmarks/compare.py.
"""
from __future__ import annotations

import os
import sys

from kernels.benchmark import Benchmark

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402


class _Workloads:
    """Shared setup / run / verify; not a Benchmark itself (the CLI would collect it)."""

    seed = 0

    def _setup(self, name: str) -> None:
        self.x = W.build_inputs(W.WORKLOADS[name], self.device)
        self.leaves = W.train_leaves(self.x) if self.x.workload.train else None

    def _run(self) -> None:
        self.out = W.maxsim_call(self.kernel, self.x, self.leaves)

    def _verify(self):
        return W.reference(self.kernel, self.x)


def _with_workloads(*names):
    """Adds setup_<name>, benchmark_<name> and verify_<name> for each workload."""
    def add(cls):
        for name in names:
            setattr(cls, f"setup_{name}", lambda self, name=name: self._setup(name))
            setattr(cls, f"benchmark_{name}", lambda self: self._run())
            setattr(cls, f"verify_{name}", lambda self: self._verify())
        return cls
    return add


RERANK = ("SmallRerank", "Rerank", "HeavyRerank", "LongDocStress", "ColPaliRerank",
          "SingleQueryRerank")


@_with_workloads(*RERANK)
class PaddedRerank(_Workloads, Benchmark):
    """score_candidates_padded: B queries x C candidates each, ragged lengths."""


@_with_workloads(*(n + "Packed" for n in RERANK))
class PackedRerank(_Workloads, Benchmark):
    """score_pairs_packed: the same ragged data packed, B*C (query, document) pairs."""


@_with_workloads("Contrastive", "LongDocs", "BigBatch", "ColPali", "BigColBERT", "DocDoc")
class ContrastiveTrain(_Workloads, Benchmark):
    """score_contrastive_train: one in-batch training step (forward + backward)."""


@_with_workloads("ColBERTCorpus", "ColPaliCorpus")
class CorpusScoring(_Workloads, Benchmark):
    """score_contrastive: a few queries against a whole corpus of packed documents."""
