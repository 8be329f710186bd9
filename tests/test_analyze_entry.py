"""repdegen.reproduce.analyze on a finished run: the same group metrics as the run's own final metrics, the
figures, neighbours and predictions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from repdegen.reproduce.analyze import AnalyzeConfig, analyze
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.config import finalize
from repdegen.reproduce.train import train


def test_analyze_a_run_directory(compose_cfg, tiny_data, monkeypatch):
    cfg = finalize(compose_cfg("experiment=inan2017/small", "scale=smoke", "objective=mle"))
    record = train(cfg)
    run = Path(cfg.paths.runs_dir) / record["config_hash"]
    monkeypatch.chdir(Path(cfg.paths.output_dir).parent)  # the run's relative cache dir resolves as in training
    app = OmegaConf.merge(OmegaConf.structured(AnalyzeConfig), {"checkpoint": str(run), "words": ["w1", "w3", "nope"],
                                                                "phrases": ["w1 w2"], "continuations": 2})
    report = analyze(app)
    final = record["metrics"]["final"]
    for key in ("ppl_frequent", "ppl_medium", "ppl_rare", "uniq", "isotropy_rare", "cos_rare_frequent"):
        assert report["metrics"][key] == pytest.approx(final[key], rel=1e-9)
    assert set(report["neighbours"]) == {"w1", "w3"} and all(len(v) == 5 for v in report["neighbours"].values())
    top = report["top_predictions"]["w1 w2"]
    assert len(top) == 10 and all(a[1] >= b[1] for a, b in zip(top, top[1:]))
    assert report["continuations"]["mean_uniq"] >= 1
    out = run / "analysis"
    assert json.loads((out / "analysis.json").read_text())["weights"] == "best.pt"
    for name in ("svd_projection.png", "singular_values.png", "token_frequency.png", "geometry_over_training.png"):
        assert (out / name).stat().st_size > 1000
    with pytest.raises(ConfigError):
        analyze(OmegaConf.merge(OmegaConf.structured(AnalyzeConfig), {"checkpoint": str(run / "missing")}))
