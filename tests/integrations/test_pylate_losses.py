"""PyLate's training losses with and without maxsim patched in: same losses, same gradients.

A stub encoder (an embedding table and a linear map, no weights to download) stands in for
the ColBERT model: the losses only need `model(features)["token_embeddings"]`, `skiplist`
and `do_query_expansion`. The skiplist puts holes in the document masks, as punctuation does
in real training, and the attention masks are prefixes of random lengths.
"""
from __future__ import annotations

import pytest
import torch

import compat_semantics as sem

VOCAB, DIM, SKIPLIST = 40, 16, [3, 5, 7, 11]


class StubEncoder(torch.nn.Module):
    def __init__(self, dtype, do_query_expansion):
        super().__init__()
        gen = torch.Generator().manual_seed(1234)
        self.table = torch.nn.Parameter(torch.randn(VOCAB, DIM, generator=gen, dtype=dtype))
        self.project = torch.nn.Parameter(torch.randn(DIM, DIM, generator=gen, dtype=dtype))
        self.skiplist = SKIPLIST
        self.do_query_expansion = do_query_expansion

    def forward(self, features):
        return {"token_embeddings": self.table[features["input_ids"]] @ self.project}


def features(gen, batch, length, device):
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[0] = length
    mask = (torch.arange(length) < lengths[:, None]).long()
    ids = torch.randint(1, VOCAB, (batch, length), generator=gen) * mask
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def _loss_and_grads(make_loss, model, sentence_features, labels):
    model.zero_grad()
    loss = make_loss(model)
    value = loss(sentence_features, labels) if labels is not None else loss(sentence_features)
    value.backward()
    return value.detach(), [p.grad.detach().clone() for p in model.parameters()]


LOSSES = {
    "Contrastive": lambda losses: (lambda m: losses.Contrastive(model=m), False),
    "Contrastive-chunked": lambda losses: (
        lambda m: losses.Contrastive(model=m, score_mini_batch_size=3), False),
    "CachedContrastive": lambda losses: (
        lambda m: losses.CachedContrastive(model=m, mini_batch_size=3), False),
    "Distillation": lambda losses: (lambda m: losses.Distillation(model=m), True),
}


@pytest.mark.parametrize("do_query_expansion", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_and_gradients_with_and_without_maxsim(device, name, dtype, do_query_expansion,
                                                    rng, monkeypatch):
    losses = sem.import_library("pylate.losses")
    make_loss, distillation = LOSSES[name](losses)
    dev = device.device
    model = StubEncoder(dtype, do_query_expansion).to(dev)
    batch, n_ways = 8, 3
    if distillation:
        sentence_features = [features(rng, batch, 6, dev), features(rng, batch * n_ways, 13, dev)]
        labels = torch.randn(batch, n_ways, generator=rng, dtype=dtype).to(dev)
    else:
        sentence_features = [features(rng, batch, 6, dev), features(rng, batch, 13, dev),
                             features(rng, batch, 13, dev)]
        labels = None

    # PyLate's "auto" picks late-interaction-kernels on CUDA where it is installed (a kernel
    # with other semantics, and no float64): the baseline is PyLate's own torch path.
    monkeypatch.setenv("PYLATE_SCORES_BACKEND", "torch")
    torch_loss, torch_grads = _loss_and_grads(make_loss, model, sentence_features, labels)
    monkeypatch.setenv("PYLATE_SCORES_BACKEND", "auto")  # patched: "auto" means maxsim
    calls = []
    api = device.ms.compat._api
    trains = [name for name in dir(api) if name.startswith("score_") and name.endswith("_train")]
    for form in trains:
        original = getattr(api, form)
        monkeypatch.setattr(api, form, lambda *a, _f=original, **k: calls.append(1) or _f(*a, **k))
    device.ms.patch_pylate()
    try:
        ours_loss, ours_grads = _loss_and_grads(make_loss, model, sentence_features, labels)
    finally:
        device.ms.unpatch_pylate()
    assert calls, "the patched loss did not score through maxsim"

    tol = 1e-10 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(ours_loss, torch_loss, rtol=tol, atol=tol)
    for mine, theirs in zip(ours_grads, torch_grads):
        torch.testing.assert_close(mine, theirs, rtol=tol, atol=tol * theirs.abs().max())


def test_patch_rebinds_every_call_site_and_unpatch_restores_them(device):
    colbert = sem.import_library("pylate.scores.colbert")
    modules = {name: sem.import_library(name) for name in (
        "pylate.scores", "pylate.scores.similarity_functions", "pylate.rank.rank",
        "pylate.losses.distillation", "pylate.evaluation.colbert_distillation",
        "pylate.evaluation.colbert_triplet")}
    before = {(m, n): getattr(mod, n) for m, mod in modules.items()
              for n in ("colbert_scores", "colbert_kd_scores", "colbert_scores_pairwise")
              if hasattr(mod, n)}
    call_before = colbert.ColBERTScores.__call__
    default_before = modules["pylate.losses.distillation"].Distillation.__init__.__defaults__
    device.ms.patch_pylate()
    try:
        for (m, n), original in before.items():
            assert getattr(modules[m], n) is not original, (m, n)
        assert colbert.ColBERTScores.__call__ is not call_before
        defaults = modules["pylate.losses.distillation"].Distillation.__init__.__defaults__
        assert colbert.colbert_kd_scores in defaults and defaults != default_before
    finally:
        device.ms.unpatch_pylate()
    for (m, n), original in before.items():
        assert getattr(modules[m], n) is original, (m, n)
    assert colbert.ColBERTScores.__call__ is call_before
    assert modules["pylate.losses.distillation"].Distillation.__init__.__defaults__ \
        == default_before


def test_patched_backend_switch_keeps_its_meaning(device, monkeypatch):
    """backend="torch" (or PYLATE_SCORES_BACKEND=torch) still runs PyLate's own code."""
    colbert = sem.import_library("pylate.scores.colbert")
    q = torch.tensor([[[1.0]]], device=device.device)
    d = torch.tensor([[[-2.0], [5.0]]], device=device.device)
    m = torch.tensor([[True, False]], device=device.device)
    device.ms.patch_pylate()
    try:
        assert colbert.colbert_scores(q, d, None, m).item() == 0.0
        assert colbert.colbert_scores(q, d, None, m, backend="torch").item() == 0.0
        with pytest.raises(ValueError, match="backend"):
            colbert.colbert_scores(q, d, backend="nope")
    finally:
        device.ms.unpatch_pylate()


def test_colpali_patch_and_unpatch(device):
    maxsim_mod = sem.import_library("colpali_engine.utils.maxsim")
    losses = sem.import_library("colpali_engine.loss.late_interaction_losses")
    processing = sem.import_library("colpali_engine.utils.processing_utils")
    base = processing.BaseVisualRetrieverProcessor
    before = (maxsim_mod.maxsim_inbatch, maxsim_mod.maxsim_kd, losses.maxsim_inbatch,
              losses.maxsim_kd, processing.maxsim_inbatch, vars(base)["score_multi_vector"])
    device.ms.patch_colpali_engine()
    try:
        after = (maxsim_mod.maxsim_inbatch, maxsim_mod.maxsim_kd, losses.maxsim_inbatch,
                 losses.maxsim_kd, processing.maxsim_inbatch, vars(base)["score_multi_vector"])
        assert all(a is not b for a, b in zip(after, before))
    finally:
        device.ms.unpatch_colpali_engine()
    restored = (maxsim_mod.maxsim_inbatch, maxsim_mod.maxsim_kd, losses.maxsim_inbatch,
                losses.maxsim_kd, processing.maxsim_inbatch, vars(base)["score_multi_vector"])
    assert all(a is b for a, b in zip(restored, before))
