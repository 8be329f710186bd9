"""scripts/schedule_probe.py (issue 27's diagnostic of a finished run's schedule): the learning rates it trains with
are the stated formula's, the weights it reports are the best it saw (the loaded ones included), their PPL is what an
independent evaluation of the saved weights gives, and the run it probes is left as it was."""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import pytest
from repdegen.reproduce.settings.config import finalize
from repdegen.reproduce.train import train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import eval_batches  # noqa: E402
import schedule_probe  # noqa: E402


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_probe_schedule_best_weights_and_untouched_run(compose_cfg, tiny_data, monkeypatch, tmp_path):
    cfg = finalize(compose_cfg("experiment=inan2017/small", "scale=smoke", "objective=mle"))
    record = train(cfg)
    run = Path(cfg.paths.runs_dir) / record["config_hash"]
    monkeypatch.chdir(Path(cfg.paths.output_dir).parent)  # the run's relative cache dir resolves as in training
    before = {n: _digest(run / n) for n in ("best.pt", "result.json")}
    out_dir = tmp_path / "probe"
    res = schedule_probe.probe(run, out_dir, decay=0.5, epochs=2, patience=5, lr=None)

    lr = float(cfg.optim.lr)
    assert [e["lr"] for e in res["epochs"]] == pytest.approx([lr * 0.5, lr * 0.25], rel=1e-12)
    best = min([res["start_valid_ppl"]] + [e["valid_ppl"] for e in res["epochs"]])
    assert res["final"]["valid_ppl"] == pytest.approx(best, rel=1e-9)
    assert len(res["git"]["commit"]) == 40 and res["hardware"]["device"] == "cpu" and res["command"]
    # the reported weights evaluated by another path (scripts/eval_batches.py loads best.pt as a run of its own)
    (out_dir / "result.json").write_text((run / "result.json").read_text())
    tb = int(cfg.trainer.test_batch_size)
    got = eval_batches.evaluate_run(out_dir, "best.pt", [tb], ["test"], "cpu", trace=False)
    assert got["ppl"][f"test@{tb}"] == pytest.approx(res["final"]["test_ppl"], rel=1e-9)
    assert {n: _digest(run / n) for n in before} == before
    assert math.isfinite(res["start_valid_ppl"])

    with pytest.raises(SystemExit) as e:  # no probe over an earlier one
        schedule_probe.probe(run, out_dir, decay=0.5, epochs=1, patience=1, lr=None)
    assert str(out_dir) in str(e.value) and "not empty" in str(e.value)


def test_bad_arguments_are_clear_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        schedule_probe.main([str(tmp_path), "--decay", "1.5"])
    assert "--decay must be in (0, 1] (got 1.5)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        schedule_probe.probe(tmp_path, tmp_path / "out", 0.5, 1, 1, None)
    assert "result.json is missing" in str(e.value)
