"""Embedding metrics and evaluation against their definitions and a per-position cache loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from repdegen.analysis.cache_pointer import evaluate_cache
from repdegen.analysis.evaluate import evaluate_nll
from repdegen.analysis.metrics import isotropy, mean_cosine, singular_values
from repdegen.models import build_model
from repdegen.models.awd_lstm import AWDLSTMConfig
from repdegen.models.lstm_lm import LSTMLMConfig


def isotropy_by_definition(W: np.ndarray) -> float:
    """min_a Z(a) / max_a Z(a), Z(a) = sum_i exp(w_i . a), a over +/- the eigenvectors of W^T W."""
    _, vecs = np.linalg.eigh(W.T @ W)
    zs = []
    for k in range(vecs.shape[1]):
        for sign in (1.0, -1.0):
            a = sign * vecs[:, k]
            zs.append(sum(math.exp(float(w @ a)) for w in W))
    return min(zs) / max(zs)


def test_isotropy_matches_definition():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(40, 5)) + np.array([0.5, 0, 0, 0, 0])
    assert isotropy(torch.tensor(W)) == pytest.approx(isotropy_by_definition(W), rel=1e-10)


def test_isotropy_hand_worked_examples():
    # two identical rows (1, 0): Z(+e1) = 2e, Z(-e1) = 2/e, Z(+-e2) = 2  ->  I = e^-2
    assert isotropy(torch.tensor([[1.0, 0.0], [1.0, 0.0]])) == pytest.approx(math.exp(-2))
    # a symmetric cross is perfectly isotropic
    assert isotropy(torch.tensor([[1.0, 0], [-1, 0], [0, 1], [0, -1]])) == pytest.approx(1.0)


def test_isotropy_survives_embeddings_whose_partition_function_overflows():
    rng = np.random.default_rng(1)
    W = rng.normal(size=(50, 4)) * 400 + 300  # exp(w.a) overflows float64
    with np.errstate(over="ignore"):
        assert not math.isfinite(sum(np.exp(W @ np.ones(4) / 2)))
    value = isotropy(torch.tensor(W))
    assert 0.0 <= value < 1e-10  # a degenerate cone: tiny, but computed


def test_mean_cosine_matches_pairwise_mean():
    W = torch.randn(9, 4, dtype=torch.float64)
    Wn = W / W.norm(dim=1, keepdim=True)
    pairs = [float(Wn[i] @ Wn[j]) for i in range(9) for j in range(9) if i != j]
    assert mean_cosine(W) == pytest.approx(sum(pairs) / len(pairs), abs=1e-12)


def test_singular_values_descending_and_correct():
    W = torch.randn(12, 5, dtype=torch.float64)
    sv = singular_values(W)
    assert sv == sorted(sv, reverse=True)
    assert np.allclose(sv, np.linalg.svd(W.numpy(), compute_uv=False))


def test_evaluate_nll_is_independent_of_bptt_and_equals_brute_force():
    torch.manual_seed(0)
    model = build_model(LSTMLMConfig(name="t", hidden_size=8), vocab_size=17, tie_weights=True).eval()
    ids = torch.randint(0, 17, (101,))
    a = evaluate_nll(model, ids, batch_size=1, bptt=7, device="cpu")
    b = evaluate_nll(model, ids, batch_size=1, bptt=100, device="cpu")
    assert a["nll"] == pytest.approx(b["nll"], rel=1e-6) and a["tokens"] == 100
    with torch.no_grad():
        h = model(ids[:-1].view(-1, 1), model.init_state(1)).hidden.squeeze(1)
        logp = torch.log_softmax(model.logits(h).double(), -1)
        brute = -logp[torch.arange(100), ids[1:]].mean().item()
    assert a["nll"] == pytest.approx(brute, rel=1e-6)
    assert a["ppl"] == pytest.approx(math.exp(brute), rel=1e-6)


def pointer_py_loop(model, ids, window, theta, lambdah):
    """A transcription of awd-lstm-lm's pointer.py evaluation, one position at a time."""
    with torch.no_grad():
        h = model(ids[:-1].view(-1, 1), model.init_state(1)).hidden.squeeze(1).double()
        p_vocab = torch.softmax(model.logits(h.float()).double(), -1)
    targets = ids[1:]
    total = 0.0
    for t in range(h.size(0)):
        p = p_vocab[t]
        if t > window:
            hist_h, hist_y = h[t - window : t], targets[t - window : t]
            attn = torch.softmax(theta * (hist_h @ h[t]), 0)
            ptr = torch.zeros_like(p).index_add_(0, hist_y, attn)
            p = lambdah * ptr + (1 - lambdah) * p
        total -= math.log(p[targets[t]].item())
    return total / h.size(0)


@pytest.mark.parametrize("bptt,block", [(13, 512), (50, 4), (500, 7)])
def test_cache_pointer_matches_per_position_loop(bptt, block):
    torch.manual_seed(1)
    cfg = AWDLSTMConfig(embedding_size=8, hidden_size=12)
    model = build_model(cfg, vocab_size=23, tie_weights=True).eval()
    ids = torch.randint(0, 23, (160,))
    ours = evaluate_cache(model, ids, window=20, theta=0.7, lambdah=0.3, bptt=bptt, device="cpu", block=block)
    assert ours["nll"] == pytest.approx(pointer_py_loop(model, ids, 20, 0.7, 0.3), rel=1e-6)
    # the cache helps on a corpus that repeats itself
    rep = torch.arange(10).repeat(16)
    with_cache = evaluate_cache(model, rep, window=30, theta=1.0, lambdah=0.5, bptt=bptt, device="cpu", block=block)
    plain = evaluate_nll(model, rep, 1, bptt, "cpu")
    assert with_cache["ppl"] < plain["ppl"]


def test_perplexity_of_a_diverged_model_is_inf_not_an_error():
    import math

    from repdegen.analysis.metrics import perplexity

    assert perplexity(800.0) == math.inf and perplexity(math.log(42.0)) == pytest.approx(42.0)
