"""Sweeps: a real Hydra multirun on the tiny corpus, read as a generated table and rendered by the tables' pipeline
(by the callback and by the command line), checked against statistics computed straight from the ledger's
result.json files."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from repdegen.analysis.sweep_figures import use_log_x
from repdegen.reproduce.aggregate import main
from repdegen.reproduce.results.sweep_render import AggregateCallback
from repdegen.reproduce.results.sweep_render import run as run_aggregate
from repdegen.reproduce.runs.sweeps import AggregateError, parse_overrides, sweep_table, swept_keys

REPO = Path(__file__).resolve().parents[1]
TINY_LSTM = ("experiment=inan2017/small", "scale=smoke", "trainer.progress=false")
METRICS = ("valid_ppl", "test_ppl", "isotropy")


def multirun(tmp: Path, data: Path, *overrides: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "repdegen.reproduce.train", "-m", *TINY_LSTM, f"dataset.data_dir={data}",
            f"paths.output_dir={tmp / 'out'}", *overrides]
    # one thread: tiny models, and on a shared 2-core machine more threads only wait on each other (5x slower)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tiny_data) -> Path:
    """2 gammas x 2 seeds of CosReg on the tiny LSTM, through the cosreg_gamma preset (which turns the
    aggregation callback on); the preset's experiment is replaced by the tiny one."""
    tmp = tmp_path_factory.mktemp("sweep")
    proc = multirun(tmp, tiny_data, "+sweep=cosreg_gamma", "objective.gamma=0.1,10", "seed=1,2",
                    f"hydra.sweep.dir={tmp / 'multirun'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "aggregated 4 complete run(s) over objective.gamma" in proc.stdout
    return tmp / "multirun"


def ledger_records(sweep_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (sweep_dir.parent / "out" / "runs").glob("*/result.json")]


def sweep_record(folder: Path) -> dict:
    return json.loads((folder / "cells.json").read_text())


def test_the_callback_writes_the_expected_table(sweep):
    """Means and sds in table.csv / table.md equal those computed here from the ledger; cells.json lists every job."""
    record = sweep_record(sweep)
    info = record["sweep"]
    assert info["swept"] == ["objective.gamma"] and info["replicates"] == ["seed"]
    assert info["metrics"][:3] == list(METRICS) and "ppl_rare" in info["metrics"]  # group PPLs where present
    assert len(info["jobs"]) == 4 and all(j["status"] == "complete" for j in info["jobs"])
    assert info["fixed"] == {"sweep": "cosreg_gamma", "experiment": "inan2017/small", "scale": "smoke"}

    expected: dict[float, list[dict]] = {}
    for rec in ledger_records(sweep):
        assert rec["status"] == "complete" and rec["config"]["objective"]["name"] == "cosreg"
        expected.setdefault(rec["config"]["objective"]["gamma"], []).append(rec)
    assert sorted(expected) == [0.1, 10.0]
    cells = {}
    for c in record["cells"]:
        cells.setdefault(float(c["label"]), []).append(c)
    with open(sweep / "table.csv") as f:
        csv_rows = {float(r["label"]): r for r in csv.DictReader(f)}
    assert sorted(csv_rows) == [0.1, 10.0]
    md = (sweep / "table.md").read_text()
    for gamma, recs in expected.items():
        assert sorted(c["seed"] for c in cells[gamma]) == [1, 2]
        assert sorted(c["config_hash"] for c in cells[gamma]) == sorted(r["config_hash"] for r in recs)
        for m in info["metrics"]:
            values = [r["metrics"]["final"][m] for r in recs]
            mean, std = statistics.mean(values), statistics.stdev(values)
            assert float(csv_rows[gamma][f"{m}_ours"]) == pytest.approx(mean, rel=1e-12)
            assert float(csv_rows[gamma][f"{m}_sd"]) == pytest.approx(std, rel=1e-9, abs=1e-12)
        assert csv_rows[gamma]["seeds"] == "2"
        # the Markdown table is the tables' own (repdegen.reproduce.results.render): ours = mean±sd, no paper column
        valid = [r["metrics"]["final"]["valid_ppl"] for r in recs]
        # the sd to two significant figures (Python's own "g" rounding), the mean to as many decimals
        sd_text = f"{statistics.stdev(valid):#.2g}".rstrip(".")
        places = len(sd_text.split(".")[1]) if "." in sd_text else 0
        mean_sd = f"{statistics.mean(valid):.{places}f} ± {sd_text}"
        assert f"| {gamma:g} | {mean_sd} |" in md
    assert md.startswith("## Sweep over `objective.gamma`\n")
    assert "| objective.gamma | Valid PPL | Test PPL | I(W) |" in md and "Seeds: 1, 2 (ours = mean ± sd)." in md


def test_one_plot_per_metric(sweep):
    record = sweep_record(sweep)
    figures = [f"sweep_{m}" for m in record["sweep"]["metrics"]]
    assert [f for f in record["figures"] if f.startswith("sweep_")] == figures and "curves" in record["figures"]
    for name in figures:
        assert (sweep / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert use_log_x([0.1, 10]) and not use_log_x([0.01, 0.05]) and not use_log_x([0.0, 1.0])


def test_the_command_line_gives_what_the_callback_gave(sweep, tmp_path):
    main([str(sweep), "--out", str(tmp_path)])
    by_callback, by_cli = sweep_record(sweep), sweep_record(tmp_path)
    for key in ("cells", "sweep", "figures"):
        assert by_cli[key] == by_callback[key], key
    assert (tmp_path / "table.csv").read_text() == (sweep / "table.csv").read_text()
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(p.name for p in sweep.glob("*.png"))


def test_failed_and_unfinished_jobs_are_listed(sweep, tmp_path):
    """Copies of the sweep and its ledger in the states real failures leave behind."""
    sweep_copy, runs = tmp_path / "multirun", tmp_path / "runs"
    shutil.copytree(sweep, sweep_copy)
    shutil.copytree(sweep.parent / "out" / "runs", runs)
    hashes = {Path(j["job_dir"]).name: j["config_hash"] for j in sweep_record(sweep)["sweep"]["jobs"]}
    # job 1 diverged: repdegen.reproduce.train marks its ledger run failed (found by the hash its overrides compose to)
    h1 = hashes["1"]
    rec = json.loads((runs / h1 / "result.json").read_text())
    rec.update(status="failed", error="the loss became nan at update 3")
    (runs / h1 / "result.json").write_text(json.dumps(rec))
    # job 3 raised before its run existed: the callback's on_job_end writes the job's failure note
    h3 = hashes["3"]
    shutil.rmtree(runs / h3)
    from hydra.core.utils import JobReturn, JobStatus

    job_return = JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("CUDA out of memory"))
    AggregateCallback().on_job_end(OmegaConf.create({"hydra": {"runtime": {"output_dir": str(sweep_copy / "3")}}}), job_return)
    # job 4: a rerun of job 0 that was killed; its run (same overrides, same hash) is complete: counted once
    shutil.copytree(sweep_copy / "0" / ".hydra", sweep_copy / "4" / ".hydra")
    # job 5: started, never reached the ledger, no failure note (killed early): missing, with the hash it looked for
    shutil.copytree(sweep_copy / "2" / ".hydra", sweep_copy / "5" / ".hydra")
    (sweep_copy / "5" / ".hydra" / "overrides.yaml").write_text(
        (sweep_copy / "2" / ".hydra" / "overrides.yaml").read_text().replace("seed=1", "seed=7").replace("seed=2", "seed=7"))

    agg = run_aggregate([sweep_copy], metrics=["valid_ppl"], runs_dir=runs)
    bad = {Path(j.dir).name: j for j in agg.not_complete}
    assert sorted(bad) == ["1", "3", "5"]
    assert bad["1"].status == "failed" and "nan" in bad["1"].reason and bad["1"].config_hash == h1
    assert bad["3"].status == "failed" and "RuntimeError: CUDA out of memory" in bad["3"].reason
    assert bad["3"].config_hash == h3
    assert bad["5"].status == "missing" and f"no ledger run {bad['5'].config_hash} in {runs}" in bad["5"].reason
    assert [Path(j.dir).name for j in agg.duplicates] == ["4"]
    # each value's row holds its jobs' runs, the unfinished ones too: 0.1 seeds 1 (complete) and 2 (failed); 10 seeds
    # 1 (complete), 2 (raised) and 7 (never started)
    assert [(r.sweep_values["objective.gamma"], sorted(c.seed for c in agg.cells if i in c.rows))
            for i, r in enumerate(agg.table.rows)] == [(0.1, [1, 2]), (10.0, [1, 2, 7])]
    md = (sweep_copy / "table.md").read_text()
    assert "| 0.1 (1/2 seeds) |" in md and "| 10 (1/3 seeds) |" in md
    assert "**failed**" in md and "the loss became nan at update 3" in md and "CUDA out of memory" in md
    on_disk = sweep_record(sweep_copy)["sweep"]["jobs"]
    assert sorted(Path(j["job_dir"]).name for j in on_disk if j["status"] != "complete") == ["1", "3", "5"]


def test_clear_errors(sweep, tmp_path):
    with pytest.raises(AggregateError, match="does not exist"):
        sweep_table([tmp_path / "nowhere"])
    with pytest.raises(AggregateError, match="holds no Hydra jobs"):
        sweep_table([tmp_path])
    with pytest.raises(AggregateError, match=r"--metrics bleu: no complete run has it .*expected some of: .*valid_ppl"):
        sweep_table([sweep], metrics=["bleu"])
    with pytest.raises(AggregateError, match="--stage cache: no complete run has metrics for it; expected one of: final"):
        sweep_table([sweep], stage="cache")
    with pytest.raises(SystemExit) as err:  # the command line: one message, exit status 2
        main([str(tmp_path / "nowhere")])
    assert err.value.code == 2


def test_swept_keys_ignore_seeds_run_control_and_hydra_keys():
    from repdegen.reproduce.runs.sweeps import Job

    lines = [["objective.alpha=0.001", "seed=1", "paths.output_dir=/a", "hydra.sweep.dir=/x", "scale=smoke"],
             ["objective.alpha=1e-3", "seed=2", "paths.output_dir=/b", "hydra.sweep.dir=/y", "scale=smoke"],
             ["objective.alpha=0.01", "seed=1", "paths.output_dir=/a", "hydra/callbacks=aggregate", "scale=smoke"]]
    jobs = [Job(dir=Path(str(i)), overrides=o, params=parse_overrides(o)) for i, o in enumerate(lines)]
    assert "hydra.sweep.dir" not in jobs[0].params and "hydra/callbacks" not in jobs[2].params
    assert swept_keys(jobs) == ["objective.alpha"]
    assert swept_keys(jobs[:2]) == []  # 0.001 and 1e-3 are one value; seed is a replicate
    assert swept_keys(jobs, replicates=()) == ["objective.alpha", "seed"]


def test_optuna_searches_and_the_study_is_aggregated(tmp_path, tiny_data):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    proc = multirun(tmp_path, tiny_data, "+sweep=cosreg_gamma_optuna", "hydra.sweeper.n_trials=2",
                    f"hydra.sweep.dir={tmp_path / 'study'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = tmp_path / "study"
    best = OmegaConf.load(study / "optimization_results.yaml")
    valid = {r["config"]["objective"]["gamma"]: r["metrics"]["final"]["valid_ppl"] for r in ledger_records(study)}
    assert len(valid) == 2 and all(0.01 <= g <= 100 for g in valid)  # the search space
    assert best.best_value == pytest.approx(min(valid.values()))  # Optuna minimised what train returned
    assert valid[best.best_params["objective.gamma"]] == pytest.approx(best.best_value)
    info = sweep_record(study)["sweep"]
    assert info["swept"] == ["objective.gamma"] and len(info["jobs"]) == 2
    assert info["optuna"]["best_value"] == pytest.approx(best.best_value)
    with open(study / "table.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(math.isfinite(float(r["valid_ppl_ours"])) and r["valid_ppl_sd"] == "" for r in rows)
    assert "Optuna: best value" in (study / "table.md").read_text()


def test_values_a_preset_set_are_read_from_the_run():
    """A key missing from a job's command line takes the value its run used (a pooled baseline, a preset)."""
    from repdegen.reproduce.runs.sweeps import Job

    record = {"choices": {"objective": "cosreg"}, "config": {"objective": {"name": "cosreg", "gamma": 1.0}, "seed": 3}}
    job = Job(dir=Path("0"), overrides=["seed=3"], params=parse_overrides(["seed=3"]), record=record)
    assert job.value("objective") == "cosreg" and job.value("objective.gamma") == 1.0
    assert job.value("objective.alpha") is None and job.value("objective.gamma.x") is None and job.seed == 3
    other = Job(dir=Path("1"), overrides=["objective.gamma=1"], params=parse_overrides(["objective.gamma=1"]))
    assert swept_keys([job, other]) == []  # gamma 1 from the command line == gamma 1.0 of the run


@pytest.mark.parametrize("preset, key, objective, experiment", [
    ("agg_alpha", "objective.alpha", "agg", "yu2022/gpt2_wt103"),
    ("al_alpha", "objective.alpha", "al", "inan2017/small"),
    ("cosreg_gamma", "objective.gamma", "cosreg", "gao2019/awd_lstm_wt2"),
    ("adv_mle_eps", "objective.eps", "adv_mle", "yu2022/transformer_base_wmt14"),
    ("sc_lambda", "objective.lambda_prior", "sc", "yu2022/transformer_base_wmt14"),
])
def test_sweep_presets_compose_with_their_grid_and_the_callback(preset, key, objective, experiment):
    from hydra import compose, initialize_config_dir
    from repdegen.reproduce.settings.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"+sweep={preset}", "scale=smoke"], return_hydra_config=True)
    assert cfg.objective.name == objective and cfg.hydra.runtime.choices.experiment == experiment
    assert set(cfg.hydra.sweeper.params) == {key, "seed"} and len(str(cfg.hydra.sweeper.params[key]).split(",")) >= 4
    assert cfg.hydra.callbacks.aggregate._target_ == "repdegen.reproduce.results.sweep_render.AggregateCallback"


def test_sweep_figures_put_the_first_numeric_key_on_x_and_unset_rows_as_lines(tmp_path, monkeypatch):
    """Hand-made rows of a sweep over objective.alpha x objective (a baseline row without alpha): one curve per
    objective, the row without alpha a horizontal line; a categorical key alone gets positions 0, 1, ..."""
    from repdegen.reproduce.results import table_figures
    from repdegen.reproduce.results.render import RenderedRow
    from repdegen.reproduce.runs.cells import TableConfig

    drawn = []
    monkeypatch.setattr("repdegen.analysis.sweep_figures.plot_sweep_metric",
                        lambda series, path, *a, **k: drawn.append((path.name, series, k.get("categories"))))

    def row(values, mean, sd):
        return {"label": str(values), "sweep_values": values}, RenderedRow(
            str(values), None, {}, {"test_ppl": mean}, "complete", extra={"sd": {"test_ppl": sd}, "n_done": 2})

    made = [row({"objective.alpha": 0.01, "objective": "agg"}, 30.0, 1.0),
            row({"objective.alpha": 0.03, "objective": "agg"}, 28.0, 0.5),
            row({"objective.alpha": None, "objective": "mle"}, 35.0, 2.0)]
    table = OmegaConf.merge(OmegaConf.structured(TableConfig), {
        "name": "sweep", "title": "t", "source": "s", "columns": ["test_ppl"], "rows": [m[0] for m in made],
        "swept": ["objective.alpha", "objective"]})
    captions = table_figures.render_sweep_figures(table, [m[1] for m in made], tmp_path, "title")
    assert list(captions) == ["sweep_test_ppl.png"]
    ((name, series, categories),) = drawn
    by_label = {s.label: s for s in series}
    assert categories is None and sorted(by_label) == ["objective=agg", "objective=mle"]
    agg, mle = by_label["objective=agg"], by_label["objective=mle"]
    assert (agg.x, agg.mean, agg.std, agg.baseline) == ([0.01, 0.03], [30.0, 28.0], [1.0, 0.5], None)
    assert (mle.x, mle.baseline) == ([], (35.0, 2.0))

    drawn.clear()
    table.swept = ["objective"]
    table_figures.render_sweep_figures(table, [m[1] for m in made], tmp_path, "title")
    ((_, series, categories),) = drawn
    assert categories == {0.0: "agg", 1.0: "mle"} and series[0].x == [0.0, 0.0, 1.0]


def test_a_generated_tables_texts_stay_as_written():
    """An override such as model.embedding_size=${model.hidden_size} shared by every job goes into the table's notes
    as written: the generated config does not try to resolve it."""
    from repdegen.reproduce.runs.cells import TableConfig
    from repdegen.reproduce.runs.sweeps import _literal

    note = "Same in every job: `model.embedding_size=${model.hidden_size}`."
    table = OmegaConf.merge(OmegaConf.structured(TableConfig), {
        "name": "sweep", "title": "t", "source": "s", "notes": [_literal(note)],
        "rows": [{"label": _literal("${x}"), "sweep_values": {"k": _literal(["${y}", 1])}}]})
    assert list(table.notes) == [note] and table.rows[0].label == "${x}"
    assert OmegaConf.to_container(table.rows[0].sweep_values, resolve=True) == {"k": ["${y}", 1]}


def test_runs_told_apart_by_more_than_their_seed_are_numbered_not_called_seeds(sweep, tmp_path):
    """With gamma a replicate too, the four runs are one row ("all runs"), numbered 1-4: the header names no seeds,
    a note says so, and cells.json keeps each job's own seed."""
    agg = run_aggregate([sweep], out=tmp_path, replicates=["seed", "objective.gamma"])
    assert [r.label for r in agg.table.rows] == ["all runs"] and sorted(c.seed for c in agg.cells) == [1, 2, 3, 4]
    md = (tmp_path / "table.md").read_text()
    assert "Seeds:" not in md and "numbered 1, 2, ..." in md and "| all runs |" in md
    assert sorted(j["seed"] for j in sweep_record(tmp_path)["sweep"]["jobs"]) == [1, 1, 2, 2]


def test_a_run_with_a_non_finite_metric_is_named_and_its_values_mean_is_the_others(sweep, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(sweep.parent / "out" / "runs", runs)
    jobs = {Path(j["job_dir"]).name: j for j in sweep_record(sweep)["sweep"]["jobs"]}
    path = runs / jobs["0"]["config_hash"] / "result.json"
    rec = json.loads(path.read_text())
    rec["metrics"]["final"]["isotropy"] = float("nan")
    path.write_text(json.dumps(rec))
    other = json.loads((runs / jobs["1"]["config_hash"] / "result.json").read_text())["metrics"]["final"]["isotropy"]
    run_aggregate([sweep], out=tmp_path / "agg", metrics=["isotropy"], runs_dir=runs)
    md = (tmp_path / "agg" / "table.md").read_text()
    assert f"Not finite: job `{sweep / '0'}` [{jobs['0']['config_hash']}] has isotropy = nan" in md
    with open(tmp_path / "agg" / "table.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["label"] == "0.1")
    assert float(row["isotropy_ours"]) == pytest.approx(other) and row["isotropy_sd"] == ""
