"""scripts/eval_batches.py on a finished run: at the run's own test batch size it gives the PPL the run recorded (an
independent path: the trainer's final metrics), and the carried state it traces is that of a by-hand segment loop."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from repdegen.reproduce.settings.config import finalize
from repdegen.reproduce.train import train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import eval_batches  # noqa: E402


def test_recorded_ppl_and_state_trace(compose_cfg, tiny_data, monkeypatch):
    cfg = finalize(compose_cfg("experiment=inan2017/small", "scale=smoke", "objective=mle"))
    record = train(cfg)
    run = Path(cfg.paths.runs_dir) / record["config_hash"]
    monkeypatch.chdir(Path(cfg.paths.output_dir).parent)  # the run's relative cache dir resolves as in training
    tb, vb = int(cfg.trainer.test_batch_size), int(cfg.trainer.eval_batch_size)
    out = eval_batches.evaluate_run(run, "best.pt", sorted({tb, vb}), ["valid", "test"], "cpu", trace=True)
    final = record["metrics"]["final"]
    assert out["ppl"][f"test@{tb}"] == pytest.approx(final["test_ppl"], rel=1e-9)
    assert out["ppl"][f"valid@{vb}"] == pytest.approx(final["valid_ppl"], rel=1e-9)
    assert out["recorded"] == {"valid_ppl": final["valid_ppl"], "test_ppl": final["test_ppl"]}

    # the state trace against a hand loop over the same segments (the model's own forward, state carried)
    from repdegen.reproduce.runs.trained import load_lm

    lm = load_lm(run / "best.pt", torch.device("cpu"))
    ids = lm.corpus.split("test")
    # the trace reads the state carried at segment ends, so the hand loop uses the trainer's segment length at this
    # batch size (at batch 1 at least 256, reproduce/engine/tasks.py eval_bptt)
    bptt = int(lm.cfg.trainer.eval_bptt) if tb > 1 else max(int(lm.cfg.trainer.eval_bptt), 256)
    stream = ids[: ids.numel() // tb * tb].view(tb, -1).t().contiguous()
    state, peak = lm.model.init_state(tb, torch.device("cpu")), 0.0
    with torch.no_grad():
        for i in range(0, stream.size(0) - 1, bptt):
            n = min(bptt, stream.size(0) - 1 - i)
            o = lm.model(stream[i:i + n], state)
            state = o.state
            peak = max([peak] + [float(t.abs().max()) for t in eval_batches._tensors(state) if t.numel()])
    assert out["max_abs_cell_state"][f"test@{tb}"] == pytest.approx(peak, rel=1e-12)


def test_bad_batch_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as e:
        eval_batches.main(["outputs/runs/x", "--batches", "0", "20"])
    assert "--batches [0, 20]" in str(e.value) and "positive integer" in str(e.value)
