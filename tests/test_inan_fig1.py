"""Inan 2017 Sec. 6.2 / Fig. 1: eq. 6.1, unit-norm embedding rows, the training window, and the
subspace distance reported by untied runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from repdegen.losses import build_objective
from repdegen.losses.al import ALConfig, augmented_loss
from repdegen.models import build_model
from repdegen.models.lstm_lm import LSTMLMConfig
from repdegen.reproduce.settings.config import finalize
from repdegen.reproduce.train import train


def test_eq_6_1_and_unit_norm_rows():
    torch.manual_seed(0)
    model = build_model(LSTMLMConfig(name="t", hidden_size=8), 15, tie_weights=False)
    h, y = torch.randn(6, 8), torch.randint(0, 15, (6,))
    obj = build_objective(ALConfig(beta=0.3, temperature=4.0, unit_norm_embedding=True), 15)
    out = obj(h, y, model)
    logits = model.logits(h)
    aug = augmented_loss(logits, y, model.input_embedding, 4.0).mean()
    nll = torch.nn.functional.cross_entropy(logits, y)
    assert torch.allclose(out.token_loss, 0.3 * 16 * 15 * aug + 0.7 * nll, rtol=1e-5)
    obj.after_update(model, 0)
    assert torch.allclose(model.input_embedding.norm(dim=1), torch.ones(15), atol=1e-6)


def test_fig1_run_uses_the_window_and_reports_the_subspace_distance(compose_cfg):
    cfg = finalize(compose_cfg("experiment=inan2017/fig1", "objective=al", "scale=smoke", "dataset.train_start=100",
                               "dataset.train_tokens=1000", "objective.beta=0.5"))
    assert cfg.dataset.train_tokens == 1000  # the scale's 30k cap keeps the preset's smaller window
    record = train(cfg)
    assert record["corpus"]["used_tokens"]["train"] == 1000
    d = record["metrics"]["final"]["subspace_distance"]
    # recomputed from the best weights: ||P_L - P_W||_F / sqrt(2k), the projections onto the column spaces of L^T
    # (V x d, the input embedding) and W (V x d, the output projection) from pinv
    (run_dir,) = (Path(cfg.paths.output_dir) / "runs").iterdir()
    weights = torch.load(run_dir / "best.pt", weights_only=False)["model"]
    L, W = weights["embedding.weight"].double(), weights["output_weight"].double()
    assert not torch.equal(L, W)
    PL, PW = L @ torch.linalg.pinv(L), W @ torch.linalg.pinv(W)
    assert d == pytest.approx(float(torch.linalg.norm(PL - PW) / math.sqrt(2 * L.shape[1])), rel=1e-6)
    assert 0.0 < d < 1.0
