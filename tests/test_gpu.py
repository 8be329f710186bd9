"""GPU checks (`make test-gpu`); skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from models import build_model
from models.awd_lstm import AWDLSTMConfig
from models.lstm_lm import LSTMLMConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("cfg", [LSTMLMConfig(name="vd", hidden_size=64, dropout=0.5, variational=True),
                                 LSTMLMConfig(name="z", hidden_size=64, dropout=0.5),
                                 AWDLSTMConfig(embedding_size=32, hidden_size=64)])
def test_models_match_on_cpu_and_gpu_in_eval(cfg):
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=100, tie_weights=True).eval()
    tokens = torch.randint(0, 100, (30, 4))
    cpu = model(tokens, model.init_state(4)).hidden
    gpu_model = model.cuda()
    gpu = gpu_model(tokens.cuda(), gpu_model.init_state(4)).hidden.cpu()
    assert torch.allclose(cpu, gpu, atol=1e-4)


def test_awd_weight_drop_trains_on_gpu():
    model = build_model(AWDLSTMConfig(embedding_size=32, hidden_size=64), vocab_size=100, tie_weights=True).cuda().train()
    out = model(torch.randint(0, 100, (30, 4), device="cuda"), model.init_state(4))
    model.logits(out.hidden).logsumexp(-1).mean().backward()
    assert model.rnns[1].weight_hh_l0.grad is not None and torch.isfinite(model.rnns[1].weight_hh_l0.grad).all()
