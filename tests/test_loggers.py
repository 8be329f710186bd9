"""Loggers: ``logger=none`` creates nothing; ``logger=wandb`` (with a fake wandb module, and once with the
real one offline) flattens the config, logs every epoch, puts the final metrics in the summary, logs the
embedding figures and a table. No test needs network or a wandb account."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from repdegen.reproduce.engine.loggers import WandbLogger, flatten, log_table, make_logger, table_rows
from repdegen.reproduce.results.render import RenderedRow
from repdegen.reproduce.settings.config import finalize

REPO = Path(__file__).resolve().parents[1]
VD_SMOKE = ("experiment=inan2017/small", "scale=smoke")


class FakeRun:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.logged: list[tuple[int | None, dict]] = []
        self.summary: dict = {}
        self.saved: list[str] = []
        self.finished = 0

    def log(self, data, step=None):
        self.logged.append((step, dict(data)))

    def save(self, path, base_path=None, policy=None):
        self.saved.append(Path(path).name)

    def finish(self, exit_code=None):
        self.finished += 1


def fake_wandb_module() -> types.ModuleType:
    mod = types.ModuleType("wandb")
    mod.__version__ = "0.31.0"
    mod.runs = []

    def init(**kwargs):
        run = FakeRun(**kwargs)
        mod.runs.append(run)
        return run

    class Image:
        def __init__(self, path, caption=None):
            assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            self.path, self.caption = path, caption

    class Table:
        def __init__(self, columns, data):
            assert all(len(row) == len(columns) for row in data)
            self.columns, self.data = columns, data

    mod.init, mod.Image, mod.Table = init, Image, Table
    return mod


@pytest.fixture
def fake_wandb(monkeypatch):
    mod = fake_wandb_module()
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return mod


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """Keep the real wandb's files in tmp and away from any account or network."""
    for var, sub in (("WANDB_DIR", "wandb"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_flatten_gives_dot_keys():
    assert flatten({"optim": {"lr": 1.0, "betas": [0.9, 0.99]}, "seed": 1, "choices": {}, "a": {"b": {"c": None}}}) == {
        "optim.lr": 1.0, "optim.betas": [0.9, 0.99], "seed": 1, "choices": {}, "a.b.c": None}


def test_logger_none_creates_nothing(compose_cfg, tmp_path, monkeypatch):
    broken = types.ModuleType("wandb")
    broken.init = lambda **kw: pytest.fail("logger=none must not start wandb")
    monkeypatch.setitem(sys.modules, "wandb", broken)
    cfg = finalize(compose_cfg(*VD_SMOKE))
    assert cfg.logger.name == "none"
    assert make_logger(cfg, tmp_path / "run", "x") is None
    assert not (tmp_path / "run").exists()


def test_wandb_logger_config_epochs_summary_and_figures(compose_cfg, fake_wandb, tmp_path):
    raw = compose_cfg(*VD_SMOKE, "objective=real", "logger=wandb", "logger.project=p")
    raw.choices = {"experiment": "inan2017/small", "objective": "real"}  # as the entry points fill them in
    cfg = finalize(raw)
    logger = make_logger(cfg, tmp_path / "0123abcd", "inan2017/small/real")
    (run,) = fake_wandb.runs
    kw = run.kwargs
    assert (kw["project"], kw["group"], kw["job_type"], kw["mode"]) == ("p", "inan2017/small/smoke", "real", "offline")
    assert kw["dir"] == str(tmp_path / "0123abcd") and "scale=smoke" in kw["tags"] and "objective=real" in kw["tags"]
    config = kw["config"]
    # flattened: every value is a leaf, named by its dotted path, and the ledger hash is there
    assert config["config_hash"] == "0123abcd" and config["optim.lr"] == cfg.optim.lr
    assert config["objective.name"] == "real" and config["scale.name"] == "smoke" and config["trainer.cache.window"] > 0
    assert not any(isinstance(v, dict) and v for v in config.values()) and "_finalized" not in config
    assert config["choices.experiment"] == "inan2017/small"

    logger.log({"stage": "train", "epoch": 1, "valid_ppl": 120.5, "isotropy": 0.8, "lr": 1.0}, step=1)
    assert run.logged == [(1, {"epoch": 1, "valid_ppl": 120.5, "isotropy": 0.8, "lr": 1.0})]

    w = torch.randn(60, 8)
    counts = torch.arange(60, 0, -1)
    record = {"label": "inan2017/small/real", "status": "complete", "config_hash": "0123abcd", "wall_time_s": 3.5,
              "parameters": {"total": 1234},
              "metrics": {"final": {"test_ppl": 99.0, "isotropy": 0.7, "singular_values": [3.0, 1.0]},
                          "finetune": {"test_ppl": 97.0}}}
    paths = logger.log_final(record, w, counts)
    assert run.summary == {"test_ppl": 99.0, "isotropy": 0.7, "finetune/test_ppl": 97.0, "parameters": 1234,
                           "wall_time_s": 3.5, "status": "complete", "config_hash": "0123abcd"}
    step, images = run.logged[-1]
    assert sorted(images) == ["figures/singular_values", "figures/svd_projection"]
    assert {Path(i.path) for i in images.values()} == set(paths)
    assert all(p.parent == tmp_path / "0123abcd" / "figures" for p in paths)
    assert logger.log_final({"metrics": {}}, torch.randn(5), counts) == []  # a bad matrix: no figure, no exception
    logger.finish()
    logger.finish()
    assert run.finished == 1


def test_default_group_without_experiment_and_explicit_group(compose_cfg, fake_wandb, tmp_path):
    WandbLogger(finalize(compose_cfg("model=vd_lstm_small", "dataset=ptb", "scale=smoke", "logger=wandb")), tmp_path, "n")
    WandbLogger(finalize(compose_cfg(*VD_SMOKE, "logger=wandb", "logger.group=inan2017_t1/smoke")), tmp_path, "n")
    assert [r.kwargs["group"] for r in fake_wandb.runs] == ["vd_lstm_small/ptb/smoke", "inan2017_t1/smoke"]


def test_training_logs_every_epoch(compose_cfg, fake_wandb):
    from repdegen.reproduce.train import train

    rec = train(compose_cfg(*VD_SMOKE, "scale.max_epochs=2", "trainer.test_batch_size=10", "logger=wandb"))
    (run,) = fake_wandb.runs
    epochs = [(step, d) for step, d in run.logged if "valid_ppl" in d]
    assert [s for s, _ in epochs] == [1, 2]
    assert [d["valid_ppl"] for _, d in epochs] == pytest.approx([h["valid_ppl"] for h in rec["history"]])
    assert all(isinstance(v, (int, float, str, bool)) for _, d in epochs for v in d.values())
    assert run.finished == 1


def _png(path: Path) -> Path:
    from repdegen.analysis.embedding_figures import plot_singular_values

    return plot_singular_values({"a": [3.0, 2.0, 1.0]}, path, "t")


def test_log_table_logs_rows_images_and_files(fake_wandb, tmp_path):
    out = tmp_path / "tables" / "t1" / "smoke"
    _png(out / "curves.png")
    (out / "table.md").parent.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text("## T\n")
    rows = [RenderedRow("MLE", "G", {"test_ppl": 80.0}, {"test_ppl": 82.5}, "complete", config_hash="h1"),
            RenderedRow("Other work", None, {"test_ppl": 70.0}, {}, "paper-only"),
            RenderedRow("AL", "G", {"test_ppl": 75.0}, {"test_ppl": float("inf")}, "complete", config_hash="h2")]
    log_table("t1", "smoke", rows, ["test_ppl"], out, logger_cfg={"project": "p", "mode": "offline", "group": None},
              wandb_dir=tmp_path / "o")
    (run,) = fake_wandb.runs
    assert (run.kwargs["job_type"], run.kwargs["group"], run.kwargs["name"]) == ("table", "t1/smoke", "t1/smoke")
    (_, payload), = run.logged
    table = payload["table"]
    assert table.columns == ["group", "label", "status", "config_hash", "test_ppl/paper", "test_ppl/ours", "test_ppl/delta"]
    assert table.data[0] == ["G", "MLE", "complete", "h1", 80.0, 82.5, 2.5]
    assert table.data[1][4:] == [70.0, None, None] and table.data[2][4:] == [75.0, None, None]  # inf: no number
    assert payload["figures/curves"].path == str(out / "curves.png")
    assert run.saved == ["table.md"] and run.summary == {"cells_complete": 2, "cells": 2} and run.finished == 1


def test_table_rows_match_rendered_csv_columns():
    head, data = table_rows([RenderedRow("A", None, {"bleu": 27.3}, {"bleu": 26.0}, "complete")], ["bleu"])
    assert head[-3:] == ["bleu/paper", "bleu/ours", "bleu/delta"] and data[0][-1] == pytest.approx(-1.3)


def test_real_wandb_offline_writes_the_run_under_the_run_dir(compose_cfg, wandb_env, tmp_path):
    """The real wandb, offline: files land in <run dir>/wandb/offline-run-*/, images and the table included."""
    pytest.importorskip("wandb")
    cfg = finalize(compose_cfg(*VD_SMOKE, "logger=wandb"))
    run_dir = tmp_path / "runs" / "feedbeef"
    logger = WandbLogger(cfg, run_dir, "inan2017/small/mle")
    logger.log({"valid_ppl": 10.0, "isotropy": 0.5, "stage": "train"}, step=1)
    logger.log_final({"metrics": {"final": {"test_ppl": 9.0}}}, torch.randn(40, 6), torch.arange(40, 0, -1))
    logger.finish()
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    assert list(offline.glob("run-*.wandb"))
    assert len(list((offline / "files" / "media" / "images").rglob("*.png"))) == 2
    # the summary is in the run's transaction log; wandb-core may still be flushing it after finish()
    # returns (seen on a loaded 2-core machine), so give its writer a bounded moment
    log_file, deadline = next(offline.glob("run-*.wandb")), time.time() + 60
    while b"test_ppl" not in log_file.read_bytes() and time.time() < deadline:
        time.sleep(0.2)
    assert b"test_ppl" in log_file.read_bytes()

    out = tmp_path / "tables" / "t" / "smoke"
    _png(out / "curves.png")
    log_table("t", "smoke", [RenderedRow("A", None, {"test_ppl": 1.0}, {"test_ppl": 2.0}, "complete", config_hash="h")],
              ["test_ppl"], out, logger_cfg=cfg.logger, wandb_dir=tmp_path / "out")
    (table_run,) = (tmp_path / "out" / "wandb").glob("offline-run-*")
    assert list((table_run / "files" / "media" / "table").glob("*.table.json"))


def test_real_wandb_disabled_writes_nothing(compose_cfg, wandb_env, tmp_path):
    pytest.importorskip("wandb")
    cfg = finalize(compose_cfg(*VD_SMOKE, "logger=wandb", "logger.mode=disabled"))
    logger = make_logger(cfg, tmp_path / "run", "x")
    logger.log({"valid_ppl": 10.0}, step=1)
    assert logger.log_final({"metrics": {"final": {"test_ppl": 9.0}}}, torch.randn(40, 6), torch.arange(40, 0, -1)) == []
    logger.finish()
    assert not (tmp_path / "run" / "wandb").exists() and not (tmp_path / "run" / "figures").exists()


def test_dashboard_spec_names_metrics_the_runs_log():
    """docs/wandb_workspace.json (the saved dashboard layout) only charts keys the loggers write."""
    spec = json.loads((REPO / "docs" / "wandb_workspace.json").read_text())
    history = {"valid_ppl", "train_ppl", "test_ppl", "valid_nll", "train_nll", "lr", "isotropy", "mean_cos",
               "tokens_per_s", "epoch", "updates", "epoch_seconds", "epoch_updates",
               *(f"isotropy_{g}" for g in ("frequent", "medium", "rare")), "cos_rare_frequent"}
    summary = history | {"bleu", "bleu_tok", "uniq", "parameters", "wall_time_s",
                         *(f"{m}_{g}" for m in ("ppl", "uniq") for g in ("frequent", "medium", "rare"))}
    media = {"figures/svd_projection", "figures/singular_values", "table", "figures/curves"}
    for section in spec["sections"]:
        for panel in section["panels"]:
            keys = panel.get("y", []) + panel.get("metrics", [])
            known = media if panel["type"] == "media" else (summary if panel["type"] == "bar" else history)
            assert set(keys) <= known, (section["name"], set(keys) - known)
    assert spec["runset"]["groupby"] == ["job_type"]
