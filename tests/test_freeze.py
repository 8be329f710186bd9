"""The freezing experiments (Yu et al. Sec. 3) and UL+AGG, against direct computations."""

from __future__ import annotations

import pytest
import torch
from repdegen.losses import TokenLayout, build_objective
from repdegen.losses.freeze import FreezeConfig
from repdegen.losses.ul import unlikelihood_token_sum
from repdegen.losses.ul_agg import ULAGGConfig
from repdegen.models import build_model
from repdegen.models.lstm_lm import LSTMLMConfig
from repdegen.reproduce.settings.config import finalize
from repdegen.reproduce.train import train

V, D = 20, 8


def tiny_model():
    torch.manual_seed(0)
    return build_model(LSTMLMConfig(name="t", hidden_size=D), V, tie_weights=True).double()


def counts():
    return torch.arange(V, 0, -1)  # ids sorted by frequency: the last 4 (20%) are rare


def test_rare_group_is_the_rarest_fifth_without_specials():
    obj = build_objective(FreezeConfig(mode="parts"), V)
    obj.setup(updates_per_epoch=1, special_ids=[19], train_counts=counts())
    assert obj.rare.nonzero().squeeze(1).tolist() == [16, 17, 18]


@pytest.mark.parametrize("parts", [["b"], ["c"], ["b", "c"]])
def test_parts_freeze_removes_exactly_those_gradient_parts(parts):
    """grad W_r (rare r) = sum_i (p_ri - [y_i = r]) h_i over the rows whose part is kept (Yu eq. 4)."""
    model = tiny_model()
    obj = build_objective(FreezeConfig(mode="parts", parts=parts), V).double()
    obj.setup(updates_per_epoch=1, special_ids=[], train_counts=counts())
    torch.manual_seed(1)
    h = torch.randn(12, D, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 1, 16, 17, 2, 18, 3, 19, 5, 16, 4, 6])
    obj.train()
    out = obj(h, y, model, step=0)
    out.token_loss.backward()
    W = model.output_embedding
    p = torch.softmax(h.detach() @ W.detach().t(), -1)
    rare = obj.rare
    expected = torch.zeros_like(W)
    for i in range(len(y)):
        for r in range(V):
            coef = p[i, r] - (1.0 if y[i] == r else 0.0)
            if rare[r] and y[i] != r:
                part = "c" if rare[y[i]] else "b"
                if part in parts:
                    continue
            expected[r] += coef * h.detach()[i] / len(y)
    assert torch.allclose(W.grad, expected, atol=1e-10)
    # the hidden states get the plain softmax gradient
    onehot = torch.nn.functional.one_hot(y, V).double()
    assert torch.allclose(h.grad, (p - onehot) @ W.detach() / len(y), atol=1e-10)
    assert torch.isclose(out.nll, torch.nn.functional.cross_entropy(h.detach() @ W.detach().t(), y))


def test_parts_freeze_ends_at_until_step():
    model = tiny_model()
    obj = build_objective(FreezeConfig(mode="parts", until_step=3), V).double()
    obj.setup(updates_per_epoch=1, special_ids=[], train_counts=counts())
    h, y = torch.randn(5, D, dtype=torch.float64), torch.tensor([0, 16, 2, 17, 3])
    out = obj.train()(h, y, model, step=3)
    assert torch.isclose(out.token_loss, torch.nn.functional.cross_entropy(model.logits(h), y))  # plain MLE


def test_embedding_freeze_keeps_rare_rows_at_init_through_training(compose_cfg):
    cfg = finalize(compose_cfg("experiment=inan2017/small", "scale=smoke", "objective=freeze", "objective.tie_weights=true",
                               "optim.weight_decay=0.01"))
    record = train(cfg)
    assert record["status"] == "complete"
    from pathlib import Path

    run = Path(cfg.paths.runs_dir) / record["config_hash"]
    ckpt = torch.load(run / "checkpoint.pt", weights_only=False)
    rare = ckpt["objective"]["rare"]
    init_rows = ckpt["objective"]["init_rows"][0]
    emb = ckpt["model"]["embedding.weight"]
    assert rare.sum() > 0 and torch.equal(emb[rare], init_rows)
    torch.manual_seed(cfg.seed)  # the other rows did train
    assert not torch.equal(emb[~rare], build_model(cfg.model, emb.size(0), True).embedding.weight.detach()[~rare])


def test_ul_agg_is_agg_plus_unlikelihood():
    model = tiny_model()
    cfg = ULAGGConfig(alpha=0.5, alpha_ul=0.7, memory_updates=2)
    ulagg = build_objective(cfg, V).double()
    from repdegen.losses.agg import AGGConfig

    agg = build_objective(AGGConfig(alpha=0.5, memory_updates=2), V).double()
    for o in (ulagg, agg):
        o.setup(updates_per_epoch=2, special_ids=[], train_counts=counts())
        o.train()
    torch.manual_seed(2)
    h = torch.randn(6, D, dtype=torch.float64)
    y = torch.tensor([1, 2, 1, 3, 2, 2])
    layout = TokenLayout.time_major(3, 2)
    a, b = ulagg(h, y, model, 0, layout=layout), agg(h, y, model, 0, layout=layout)
    ul = unlikelihood_token_sum(model.logits(h), y, layout) / 6
    assert torch.isclose(a.token_loss, b.token_loss + 0.7 * ul)
    assert torch.isclose(a.logs["ul_loss"], ul)
    with pytest.raises(ValueError, match="layout"):
        ulagg(h, y, model, 1)


def test_with_the_evaluations_cutoffs_the_frozen_set_is_the_scored_rare_group():
    """Yu et al.'s paper cells score groups by dictionary index (13,000 / 36,000): the frozen set is then the ids at or
    after the second cut-off (specials excepted), the rare group the evaluation scores, not the rarest 20 %."""
    from repdegen.analysis.groups import frequency_groups

    obj = build_objective(FreezeConfig(mode="parts", group_cutoffs=[8, 15]), V)
    obj.setup(updates_per_epoch=1, special_ids=[0, 1, 2, 3], train_counts=counts())
    scored = frequency_groups(counts(), cutoffs=[8, 15], n_specials=4)["rare"]
    assert obj.rare.nonzero().squeeze(1).tolist() == list(range(V))[scored] == [15, 16, 17, 18, 19]
    by_fraction = build_objective(FreezeConfig(mode="parts", group_cutoffs=None), V)
    by_fraction.setup(updates_per_epoch=1, special_ids=[0, 1, 2, 3], train_counts=counts())
    assert by_fraction.rare.nonzero().squeeze(1).tolist() == [16, 17, 18, 19]


def test_the_freeze_objective_takes_the_runs_cutoffs(compose_cfg):
    paper = finalize(compose_cfg("experiment=yu2022/gpt2_wt103", "objective=freeze"))
    lite = finalize(compose_cfg("experiment=yu2022/gpt2_wt103", "objective=freeze", "scale=lite"))
    assert list(paper.objective.group_cutoffs) == list(paper.trainer.analysis.group_cutoffs) == [13000, 36000]
    assert lite.objective.group_cutoffs is None is lite.trainer.analysis.group_cutoffs
