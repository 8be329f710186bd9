"""``Trainer.train_update``: a parameter penalty (CosReg) enters once per optimizer update, however many
micro-batches the update has, and ``trainer.compile`` gives the eager losses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from repdegen.data.corpus import load_corpus
from repdegen.losses import build_objective
from repdegen.losses.cosreg import cosine_regularizer
from repdegen.models import build_model
from repdegen.reproduce.engine.optim import cpu_runs_bf16_lstm
from repdegen.reproduce.engine.trainer import Trainer
from repdegen.reproduce.settings.config import finalize

VD_SMOKE = ("experiment=inan2017/small", "scale=smoke", "model.dropout=0", "optim.clip_grad_norm=null",
            "objective.tie_weights=true", "trainer.bptt=7")


def make_trainer(compose_cfg, run_dir: Path, *overrides):
    cfg = finalize(compose_cfg(*VD_SMOKE, *overrides))
    torch.manual_seed(0)
    corpus = load_corpus(cfg.dataset)
    model = build_model(cfg.model, len(corpus.vocab), True)
    obj = build_objective(cfg.objective, len(corpus.vocab))
    trainer = Trainer(cfg, model, obj, corpus, run_dir, torch.device("cpu"))
    trainer.task.stream = trainer.task.stream[:15]  # exactly two 7-step segments
    return trainer


def test_cosreg_penalty_enters_once_per_update_of_two_micro_batches(compose_cfg, tmp_path, monkeypatch):
    lr, gamma = 0.5, 3.0
    common = ("optim.name=sgd", f"optim.lr={lr}", "trainer.update_freq=2")
    mle = make_trainer(compose_cfg, tmp_path, "objective=mle", *common)
    cos = make_trainer(compose_cfg, tmp_path, "objective=cosreg", f"objective.gamma={gamma}", *common)
    W0 = cos.model.output_embedding.detach().clone().double().requires_grad_(True)
    cosine_regularizer(W0).backward()  # autograd of the plain formula: the independent gradient
    calls = []
    original = cos.objective.update_penalty
    monkeypatch.setattr(cos.objective, "update_penalty", lambda m, s: (calls.append(s), original(m, s)))
    for a, b in zip(mle.params, cos.params):
        assert torch.equal(a, b)
    for t in (mle, cos):
        batches = t.task.train_batches(1, "train")
        assert len(batches) == 2
        t.model.train()
        t.task.begin_epoch(t.model)
        t.train_update(batches, lr)
    assert calls == [0]
    emb = cos.model.output_embedding
    for (name, a), b in zip(mle.model.named_parameters(), cos.params):
        if a is mle.model.output_embedding:
            assert torch.allclose((b - a).double(), -lr * gamma * W0.grad, rtol=1e-3, atol=1e-7), name
            assert (b - a).abs().max() > 0
        else:
            assert torch.allclose(a, b, atol=1e-7), name
    assert emb.requires_grad


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compile_mode_reaches_torch_compile_and_a_bad_one_is_refused(compose_cfg, tmp_path, monkeypatch, mode):
    from repdegen.reproduce.errors import ConfigError

    seen = {}

    def fake_compile(model, **kwargs):
        seen.update(kwargs)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    make_trainer(compose_cfg, tmp_path, "trainer.compile=true", f"trainer.compile_mode={mode}")
    assert seen == {"backend": "inductor", "mode": None if mode == "default" else mode}
    with pytest.raises(ConfigError, match="trainer.compile_mode='fast' is not one of default, reduce-overhead"):
        make_trainer(compose_cfg, tmp_path, "trainer.compile=true", "trainer.compile_mode=fast")


@pytest.mark.parametrize("objective", ["mle", "agg"])
def test_compiled_model_gives_the_eager_losses(compose_cfg, tmp_path, objective):
    losses = {}
    for compile_ in (False, True):
        t = make_trainer(compose_cfg, tmp_path, f"objective={objective}", "optim.name=sgd", "optim.lr=0.5",
                         "trainer.update_freq=1", f"trainer.compile={str(compile_).lower()}",
                         "trainer.compile_backend=aot_eager")
        assert (t.forward_model is not t.model) == compile_
        t.model.train()
        t.task.begin_epoch(t.model)
        out = []
        for b in t.task.train_batches(1, "train"):
            _, nll_sum, n, _ = t.train_update([b], 0.5)
            t.state.updates += 1
            out.append(float(nll_sum) / n)
        losses[compile_] = out
    assert len(losses[True]) == 2
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


def _old_update(t, group, lr):
    """``train_update`` as it was before the update-wide autocast context: one autocast context a micro-batch (the
    bf16 weight copies cast again for each), backward outside it; MLE, no clipping, no penalty (VD_SMOKE)."""
    for g in t.optimizer.param_groups:
        g["lr"] = lr
    t.optimizer.zero_grad(set_to_none=True)
    total = sum(t.task.n_targets(b) for b in group)
    for b in group:
        with t.autocast():
            loss, _, n = t.task.loss(t.forward_model, t.objective, b, t.state.updates)
        (loss * (n / total)).backward()
    t.optimizer.step()


def test_bf16_on_a_cpu_without_a_bf16_lstm_kernel_is_a_config_error_before_training(compose_cfg, tmp_path, monkeypatch):
    """An AMD EPYC without AVX512-BF16/AMX has no oneDNN bf16 LSTM: the trainer says so and how to fix it, instead of
    oneDNN's "could not create a primitive descriptor" at the first update."""
    from repdegen.reproduce.engine import optim
    from repdegen.reproduce.errors import ConfigError

    monkeypatch.setattr(optim, "cpu_runs_bf16_lstm", lambda: False)
    with pytest.raises(ConfigError, match=r"trainer.precision=bf16: .* no bf16 LSTM kernel .* trainer.precision=fp32"):
        make_trainer(compose_cfg, tmp_path, "objective=mle", "trainer.precision=bf16")
    make_trainer(compose_cfg, tmp_path, "objective=mle", "trainer.precision=fp32")  # the fix it names


@pytest.mark.skipif(not cpu_runs_bf16_lstm(),
                    reason="this CPU has no oneDNN bf16 LSTM kernel (no AVX512-BF16 or AMX)")
def test_bf16_update_casts_the_weights_once_and_gives_the_same_numbers(compose_cfg, tmp_path):
    """Under bf16 autocast an update of two micro-batches gives bit-identical parameters with one autocast context
    for the whole update (the weights' bf16 copies cached across micro-batches) as with one context a micro-batch,
    and casts fewer tensors (aten::_to_copy, counted by the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    args = ("objective=mle", "optim.name=sgd", "optim.lr=0.5", "trainer.update_freq=2", "trainer.precision=bf16")
    new, old = make_trainer(compose_cfg, tmp_path, *args), make_trainer(compose_cfg, tmp_path, *args)
    casts = {}
    for name, t, step in (("new", new, lambda t, g: t.train_update(g, 0.5)), ("old", old, lambda t, g: _old_update(t, g, 0.5))):
        batches = t.task.train_batches(1, "train")
        t.model.train()
        t.task.begin_epoch(t.model)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(t, batches)
        casts[name] = sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy")
    for (name, a), b in zip(new.model.named_parameters(), old.params):
        assert torch.equal(a, b), name
    assert any((a != b).any() for a, b in zip(new.params, make_trainer(compose_cfg, tmp_path, *args).params))  # it trained
    assert casts["new"] < casts["old"], casts
