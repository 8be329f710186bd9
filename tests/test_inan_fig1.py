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


def test_unit_norm_axis_dimension_normalises_each_embedding_dimension_over_the_vocabulary():
    """The paper's L is d_x x |V| (Sec. 3): its rows are our columns. ``unit_norm_axis=dimension`` divides each column
    of our V x d input embedding by its norm, as a hand computation does; the word vectors keep their directions
    only up to that per-dimension scaling; a value outside the two readings is refused."""
    torch.manual_seed(0)
    model = build_model(LSTMLMConfig(name="t", hidden_size=8), 15, tie_weights=False)
    before = model.input_embedding.detach().clone()
    obj = build_objective(ALConfig(beta=1.0, temperature=10.0, unit_norm_embedding=True, unit_norm_axis="dimension"), 15)
    obj.after_update(model, 0)
    expected = torch.stack([before[:, j] / math.sqrt(sum(float(v) ** 2 for v in before[:, j]))
                            for j in range(before.shape[1])], dim=1)
    assert torch.allclose(model.input_embedding, expected, atol=1e-6)
    assert torch.allclose(model.input_embedding.norm(dim=0), torch.ones(8), atol=1e-6)
    assert not torch.allclose(model.input_embedding.norm(dim=1), torch.ones(15), atol=1e-3)
    from repdegen.core.errors import ConfigError
    from repdegen.losses.al import AugmentedLoss

    with pytest.raises(ConfigError, match="unit_norm_axis='rows'"):
        AugmentedLoss.validate_config(ALConfig(beta=1.0, unit_norm_embedding=True, unit_norm_axis="rows"))


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


def test_the_distance_is_recorded_at_every_evaluation(compose_cfg):
    """An untied run's history holds the subspace distance at every epoch; the last epoch's (Fig. 1 keeps the last
    weights) is the final one and the pinv-projection formula on the last weights; a tied model records none."""
    cfg = finalize(compose_cfg("experiment=inan2017/fig1", "objective=al", "scale=smoke", "dataset.train_tokens=1000",
                               "objective.beta=1.0", "objective.target_grad=none", "trainer.max_epochs=2",
                               "trainer.early_stopping=null"))
    assert cfg.trainer.final_weights == "last"
    record = train(cfg)
    distances = [h["subspace_distance"] for h in record["history"]]
    assert len(distances) == 2 and all(0.0 < d < 1.0 for d in distances)
    (run_dir,) = (Path(cfg.paths.output_dir) / "runs").iterdir()
    weights = torch.load(run_dir / "last.pt", weights_only=False)["model"]
    L, W = weights["embedding.weight"].double(), weights["output_weight"].double()
    PL, PW = L @ torch.linalg.pinv(L), W @ torch.linalg.pinv(W)
    expected = float(torch.linalg.norm(PL - PW) / math.sqrt(2 * L.shape[1]))
    assert distances[-1] == pytest.approx(expected, rel=1e-6)
    assert record["metrics"]["final"]["subspace_distance"] == pytest.approx(expected, rel=1e-6)

    from repdegen.analysis.inspection import input_output_distance

    tied = build_model(LSTMLMConfig(name="t", hidden_size=8), 15, tie_weights=True)
    untied = build_model(LSTMLMConfig(name="t", hidden_size=8), 15, tie_weights=False)
    assert input_output_distance(tied) == {}
    assert 0.0 < input_output_distance(untied)["subspace_distance"] < 1.0


def test_the_table_draws_both_panels_from_its_rows(tiny_data, tmp_path):
    """`repdegen table table=inan2017_fig1` at smoke: figure.json holds, for each panel and curve, each run row's x
    (its config's beta or tau), its distance as recorded, and the random-subspace level sqrt(1 - k/|V|) of its runs."""
    import json

    from hydra import initialize_config_dir
    from repdegen.reproduce.runs.tables import run_table
    from repdegen.reproduce.settings.config import CONF_DIR

    from tests.test_table import compose_app

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app("inan2017_fig1", "smoke", tmp_path, tiny_data)
        assert run_table(app) == 0
    out = Path(app.paths.tables_dir) / "inan2017_fig1" / "smoke"
    assert (out / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    panels = json.loads((out / "figure.json").read_text())["panels"]
    records = [json.loads(p.read_text()) for p in (tmp_path / "out" / "runs").glob("*/result.json")]
    by_point = {(r["config"]["objective"]["beta"], r["config"]["objective"]["temperature"]): r for r in records}
    assert len(by_point) == 6  # the registered rows; the second reading runs at paper only
    k = len(records[0]["metrics"]["final"]["singular_values"])
    level = math.sqrt(1 - k / records[0]["corpus"]["vocab_size"])
    (a, b) = panels
    assert (a["x"], b["x"]) == ("objective.beta", "objective.temperature")
    assert a["random_level"] == pytest.approx(level) and b["random_level"] == pytest.approx(level)
    registered_a, constant_a = a["curves"]
    assert [p["x"] for p in registered_a["points"]] == [0.0, 0.25, 0.5, 1.0]
    for p in registered_a["points"]:
        assert p["mean"] == pytest.approx(by_point[(p["x"], 10.0)]["metrics"]["final"]["subspace_distance"])
        assert p["n"] == 1 and p["sd"] is None
    # the y~-constant rows are not run at smoke: its one point is the registered curve's beta = 0, not drawn again
    assert [p["row"] for p in constant_a["points"]] == ["beta = 0"] and constant_a["drawn"] is False
    assert registered_a["drawn"] is True
    assert [p["x"] for p in b["curves"][0]["points"]] == [2.0, 5.0, 10.0]
    assert b["curves"][0]["points"][-1]["paper"] == 0.06  # beta = 1, tau = 10: the paper's "around 0.06"
    assert json.loads((out / "cells.json").read_text())["figures"]["figure"].startswith("The figure's panels")


def test_a_panel_naming_a_missing_row_or_key_is_one_error(tmp_path):
    from hydra import initialize_config_dir
    from repdegen.core.errors import ConfigError
    from repdegen.reproduce.runs.cells import expand_cells
    from repdegen.reproduce.settings.config import CONF_DIR

    from tests.test_table import compose_app

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app("inan2017_fig1", "smoke", tmp_path)
        app.table.panels[0].curves[0].rows.append("beta = 7")
        with pytest.raises(ConfigError, match="names the row 'beta = 7', which is not a row"):
            expand_cells(app)
        app = compose_app("inan2017_fig1", "smoke", tmp_path)
        app.table.panels[1].x = "objective.temprature"
        with pytest.raises(ConfigError, match="has x: objective.temprature, which is not a numeric key .* None"):
            expand_cells(app)
        app = compose_app("inan2017_fig1", "smoke", tmp_path)
        app.table.panels[1].x = "objective.target_grad"
        with pytest.raises(ConfigError, match="not a numeric key of the config of row 'beta = 1' .*'official'"):
            expand_cells(app)
