"""``plan=true``: each cell's cost from the training budget and a measured (or FLOP-based) throughput, checked against
hand computations on made-up benchmark files; the command itself trains and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf
from repdegen.models import build_model
from repdegen.models.transformer import TransformerLMConfig
from repdegen.reproduce.runs.plan import (
    budget_tokens,
    flops_per_token,
    format_plan,
    ledger_measurements,
    load_measurements,
    rate_of,
)


def bench_file(path, gpu: str | None, rows: list[tuple]):
    """A scripts/bench.py JSON with ``rows`` = (model, objective, precision, tokens/s, FLOPs per token, MFU)."""
    hw = {"device": "cuda", "gpu": gpu} if gpu else {"device": "cpu", "cpu": "Some CPU"}
    results = [dict(model=m, objective=o, precision=p, tokens_per_s=t, flops_per_token=f, mfu=u)
               for m, o, p, t, f, u in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hardware": hw, "results": results}))


def cell_cfg(model="gpt2_medium", objective="mle", kind="lm", precision="auto", dataset="a_corpus", **trainer):
    t = dict(batch_size=4, bptt=1024, update_freq=8, max_updates=50_000, max_epochs=1000, precision=precision,
             early_stopping=None, retrain_sessions=0, finetune_epochs=0, max_tokens=None)
    t.update(trainer)
    return OmegaConf.create({"model": {"name": model}, "objective": {"name": objective},
                             "dataset": {"kind": kind, "name": dataset, "tokenizer": "word"}, "trainer": t})


@pytest.fixture
def bench(tmp_path):
    bench_file(tmp_path / "gpu" / "a.json", "NVIDIA H100 80GB HBM3",
               [("gpt2_medium", "mle", "bf16", 100.0, 2e9, 0.4), ("gpt2_medium", "agg", "bf16", 90.0, 2e9, 0.36)])
    bench_file(tmp_path / "gpu" / "b.json", "NVIDIA H100 80GB HBM3",
               [("gpt2_medium", "mle", "bf16", 160.0, 2e9, 0.4), ("gpt2_medium", "agg", "bf16", 120.0, 2e9, 0.3),
                ("transformer_base", "mle", "bf16", 300.0, 4e8, 0.1), ("transformer_base", "ul", "bf16", 270.0, 4e8, 0.1)])
    bench_file(tmp_path / "cpu" / "c.json", None, [("vd_lstm_small", "mle", "fp32", 5000.0, 3e7, None)])
    (tmp_path / "cpu" / "notes.json").write_text("[1, 2]")  # not a benchmark file: skipped
    return load_measurements(tmp_path)


def test_measured_rates_and_ratios(bench):
    assert len(bench) == 7
    mle = rate_of(cell_cfg(), "h100", bench, 2e9)
    assert (mle.tokens_per_s, mle.how) == (160.0, "measured")  # the best MLE measured
    agg = rate_of(cell_cfg(objective="agg"), "h100", bench, 2e9)
    # AGG = the best MLE x the median of AGG/MLE measured side by side: (0.9, 0.75) -> the upper middle, 0.9
    assert agg.tokens_per_s == pytest.approx(160.0 * 0.9) and agg.how == "MLE x 0.90"
    # an objective not measured on this model borrows its ratio from another model on the device (UL: 0.9)
    assert rate_of(cell_cfg(objective="ul"), "h100", bench, 2e9).tokens_per_s == pytest.approx(144.0)
    assert rate_of(cell_cfg(objective="cosreg"), "h100", bench, 2e9).how == "MLE's rate"


def test_flop_based_rates(bench):
    # no measurement of the model on the device: the FLOP rate another model of its family reached there
    big = rate_of(cell_cfg(model="transformer_big"), "h100", bench, 1.2e9)
    assert big.how == "FLOP-based" and big.tokens_per_s == pytest.approx(160.0 * 2e9 / 1.2e9)
    lstm = rate_of(cell_cfg(model="zaremba_lstm_large"), "cpu", bench, 6e7)
    assert lstm.tokens_per_s == pytest.approx(5000.0 * 3e7 / 6e7)
    # a device with nothing measured: its peak x the MFU the model reached on another GPU
    a100 = rate_of(cell_cfg(), "a100", bench, 2e9)
    assert a100.how == "FLOP-based" and a100.tokens_per_s == pytest.approx(312e12 * 0.4 / 2e9)
    none = rate_of(cell_cfg(), "someaccelerator", bench, 2e9)
    assert none.tokens_per_s is None and "nothing measured" in none.source


def test_budget_tokens_take_the_tighter_bound():
    tokens, bound = budget_tokens(cell_cfg(), [])
    assert tokens == 50_000 * 4 * 1024 * 8 and bound == "50,000 updates"
    # PTB (929,589 training tokens), 39 epochs, no update cap
    tokens, bound = budget_tokens(cell_cfg(dataset="ptb", batch_size=20, bptt=35, update_freq=1, max_updates=None,
                                           max_epochs=39), [])
    assert tokens == 39 * 929_589 and bound == "39 epochs"
    tokens, bound = budget_tokens(cell_cfg(dataset="ptb", max_updates=None, max_epochs=10, early_stopping=5,
                                           retrain_sessions=2, finetune_epochs=3), [])
    assert tokens == (10 * 3 + 3) * 929_589 and bound == "33 epochs at most"
    mt = cell_cfg(kind="translation", max_tokens=8192, update_freq=3, max_updates=100_000)
    assert budget_tokens(mt, [])[0] == 100_000 * 8192 * 3
    # an epoch-bound cell of a corpus whose size is not known has no estimate, and says why
    assert budget_tokens(cell_cfg(max_updates=None), []) == (None, "corpus size unknown")
    # the size of a BPE corpus comes from a ledger record of the same corpus
    record = {"config": {"dataset": {"name": "a_corpus", "tokenizer": "word"}}, "corpus": {"used_tokens": {"train": 7}}}
    assert budget_tokens(cell_cfg(max_updates=None, max_epochs=3), [record]) == (21, "3 epochs")


def test_flops_per_token_is_the_hand_count():
    cfg = TransformerLMConfig(name="t", d_model=16, n_layers=2, n_heads=4, d_ffn=24)
    model = build_model(cfg, vocab_size=50, tie_weights=True)
    # per layer: attention q, k, v, out (4 x 16 x 16) + FFN (16 x 24 + 24 x 16); + the output projection 50 x 16
    matmul = 2 * (4 * 16 * 16 + 2 * 16 * 24) + 50 * 16
    got = flops_per_token(model, OmegaConf.create({"model": {"n_layers": 2, "d_model": 16}}), 10)
    assert got == 6 * matmul + 12 * 2 * 16 * 10
    with torch.device("meta"):  # the plan counts on the meta device: same count, no memory
        meta = build_model(cfg, vocab_size=50, tie_weights=True)
    assert flops_per_token(meta, OmegaConf.create({"model": {"n_layers": 2, "d_model": 16}}), 10) == got


def test_a_ledger_run_paces_its_own_cell(bench):
    record = {"config": {"model": {"name": "gpt2_medium"}, "objective": {"name": "agg"}, "trainer": {"bptt": 1024}},
              "hardware": {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"},
              "corpus": {"used_tokens": {"train": 1000}, "vocab_size": 10},
              "history": [{"epoch_seconds": s, "valid_seconds": 1.0} for s in (9.0, 19.0, 4.0)]}
    runs = ledger_measurements({"abc": record})
    assert runs[0].tokens_per_s == pytest.approx(1000 / 10.0)  # the median epoch, validation included
    rate = rate_of(cell_cfg(objective="agg"), "h100", bench + runs, 2e9)
    assert (rate.tokens_per_s, rate.how) == (pytest.approx(100.0), "ledger")


def test_format_fits_120_columns(bench):
    from repdegen.reproduce.runs.plan import PlannedCell

    rate = rate_of(cell_cfg(objective="agg"), "h100", bench, 2e9)
    cells = [PlannedCell("a row label far longer than the column it is shown in, with its seed at the end, seed 3",
                         "h", "missing", 1.6e9, "50,000 updates", rate, 2.5, 8)]
    text = format_plan("t", "paper", "h100", cells)
    assert all(len(line) <= 120 for line in text.splitlines())
    assert "seed 3" in text and "2.5" in text and "total: 1 cells, 0 complete; 2.5 device-hours to go" in text


@pytest.mark.slow
def test_plan_command_lists_the_cells_and_trains_nothing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.table", "table=yu2022_t3", "scale=paper",
                          "plan=true", "plan_device=h100", f"paths.output_dir={tmp_path}"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.strip().startswith("MLE ") and "missing" in line and "1.64B" in line for line in lines)
    assert any(line.strip().startswith("AGG ") for line in lines)
    assert "device-hours to go" in out.stdout
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_runs_committed_with_the_tables_count_as_done_and_pace_the_plan(tmp_path, bench):
    """A complete record under results/tables/<t>/paper/records/ is a measurement and a done cell though the ledger
    lacks it; a record that is not complete, or does not read, is neither."""
    from repdegen.reproduce.runs.plan import PlannedCell, committed_records, plan_total

    record = {"config_hash": "aaa", "status": "complete", "config": {"model": {"name": "vd_lstm_small"},
                                                                     "objective": {"name": "al"},
                                               "trainer": {"bptt": 35}},
              "hardware": {"device": "cpu", "cpu": "Some CPU"}, "corpus": {"used_tokens": {"train": 6000}},
              "history": [{"epoch_seconds": s, "valid_seconds": 0.0} for s in (2.0, 3.0, 4.0)]}
    for h, rec in (("aaa", record), ("bbb", dict(record, status="failed"))):
        (tmp_path / "t1" / "paper" / "records" / h).mkdir(parents=True)
        (tmp_path / "t1" / "paper" / "records" / h / "result.json").write_text(json.dumps(rec))
    (tmp_path / "t1" / "paper" / "records" / "ccc").mkdir()
    (tmp_path / "t1" / "paper" / "records" / "ccc" / "result.json").write_text("{not json")
    committed = committed_records(tmp_path)
    assert list(committed) == ["aaa"]
    (run,) = ledger_measurements(committed)
    assert run.tokens_per_s == pytest.approx(6000 / 3.0) and run.device == "cpu"
    rate = rate_of(cell_cfg(model="vd_lstm_small", objective="al", bptt=35), "cpu", bench + [run], None)
    assert (rate.tokens_per_s, rate.how) == (pytest.approx(2000.0), "ledger")
    cells = [PlannedCell("a", "aaa", "committed", 1.0, "took 1 h", rate, 0.0, 1),
             PlannedCell("b", "ddd", "missing", 1.0, "1 epoch", rate, 2.0, 1)]
    assert plan_total(cells) == ("total: 2 cells, 1 complete (1 committed with the tables, not in the ledger: "
                                 "restore=true); 2.0 device-hours to go")
