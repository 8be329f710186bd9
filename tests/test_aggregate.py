"""Sweeps: a real Hydra multirun on the tiny corpus, aggregated by the callback and by the command line,
checked against statistics computed straight from the ledger's result.json files."""

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
from repdegen.reproduce.runs.sweeps import AggregateError, aggregate, parse_overrides, swept_keys

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


def test_the_callback_writes_the_expected_table(sweep):
    """Means and stds in aggregate.json / .csv / .md equal those computed here from the ledger."""
    agg = json.loads((sweep / "aggregate.json").read_text())
    assert agg["swept"] == ["objective.gamma"] and agg["replicates"] == ["seed"]
    assert agg["metrics"][:3] == list(METRICS) and "ppl_rare" in agg["metrics"]  # group PPLs where present
    assert agg["not_complete"] == [] and len(agg["jobs"]) == 4
    assert agg["fixed"] == {"sweep": "cosreg_gamma", "experiment": "inan2017/small", "scale": "smoke"}

    expected: dict[float, list[dict]] = {}
    for rec in ledger_records(sweep):
        assert rec["status"] == "complete" and rec["config"]["objective"]["name"] == "cosreg"
        expected.setdefault(rec["config"]["objective"]["gamma"], []).append(rec)
    assert sorted(expected) == [0.1, 10.0]
    rows = {row["values"]["objective.gamma"]: row for row in agg["rows"]}
    assert sorted(rows) == [0.1, 10.0]
    with open(sweep / "aggregate.csv") as f:
        csv_rows = {float(r["objective.gamma"]): r for r in csv.DictReader(f)}
    md = (sweep / "aggregate.md").read_text()
    for gamma, recs in expected.items():
        row = rows[gamma]
        assert row["n"] == 2 and sorted(row["seeds"]) == [1, 2]
        assert sorted(row["config_hashes"]) == sorted(r["config_hash"] for r in recs)
        for m in agg["metrics"]:
            values = [r["metrics"]["final"][m] for r in recs]
            mean, std = statistics.mean(values), statistics.stdev(values)
            assert row["metrics"][m]["mean"] == pytest.approx(mean, rel=1e-12)
            assert row["metrics"][m]["std"] == pytest.approx(std, rel=1e-9, abs=1e-12)
            assert float(csv_rows[gamma][f"{m}_mean"]) == pytest.approx(mean, rel=1e-12)
            assert float(csv_rows[gamma][f"{m}_std"]) == pytest.approx(std, rel=1e-9, abs=1e-12)
        assert csv_rows[gamma]["n"] == "2"
        # the Markdown table comes from the tables' renderer (repdegen.reproduce.results.render): ours = mean±sd, no paper column
        valid = [r["metrics"]["final"]["valid_ppl"] for r in recs]
        # the sd to two significant figures (Python's own "g" rounding), the mean to as many decimals
        sd_text = f"{statistics.stdev(valid):#.2g}".rstrip(".")
        places = len(sd_text.split(".")[1]) if "." in sd_text else 0
        mean_sd = f"{statistics.mean(valid):.{places}f} ± {sd_text}"
        assert f"| {gamma:g} | {mean_sd} |" in md
    assert md.startswith("# Sweep over `objective.gamma`\n")
    assert "| objective.gamma | Valid PPL | Test PPL | I(W) |" in md and "Seeds: 1, 2 (ours = mean ± sd)." in md


def test_one_plot_per_metric(sweep):
    agg = json.loads((sweep / "aggregate.json").read_text())
    assert agg["figures"] == [f"aggregate_{m}.png" for m in agg["metrics"]]
    for name in agg["figures"]:
        assert (sweep / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert use_log_x([0.1, 10]) and not use_log_x([0.01, 0.05]) and not use_log_x([0.0, 1.0])


def test_the_command_line_gives_what_the_callback_gave(sweep, tmp_path):
    main([str(sweep), "--out", str(tmp_path)])
    by_callback = json.loads((sweep / "aggregate.json").read_text())
    by_cli = json.loads((tmp_path / "aggregate.json").read_text())
    by_callback.pop("generated"), by_cli.pop("generated")
    assert by_cli == by_callback
    assert (tmp_path / "aggregate.csv").read_text() == (sweep / "aggregate.csv").read_text()
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(by_callback["figures"])


def test_failed_and_unfinished_jobs_are_listed(sweep, tmp_path):
    """Copies of the sweep and its ledger in the states real failures leave behind."""
    sweep_copy, runs = tmp_path / "multirun", tmp_path / "runs"
    shutil.copytree(sweep, sweep_copy)
    shutil.copytree(sweep.parent / "out" / "runs", runs)
    hashes = {Path(j["job_dir"]).name: j["config_hash"] for j in json.loads((sweep / "aggregate.json").read_text())["jobs"]}
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
    assert [(r.values["objective.gamma"], r.n) for r in agg.rows] == [(0.1, 1), (10.0, 1)]
    md = (sweep_copy / "aggregate.md").read_text()
    assert "**failed**" in md and "the loss became nan at update 3" in md and "CUDA out of memory" in md
    on_disk = json.loads((sweep_copy / "aggregate.json").read_text())
    assert sorted(Path(j["job_dir"]).name for j in on_disk["not_complete"]) == ["1", "3", "5"]


def test_clear_errors(sweep, tmp_path):
    with pytest.raises(AggregateError, match="does not exist"):
        aggregate([tmp_path / "nowhere"])
    with pytest.raises(AggregateError, match="holds no Hydra jobs"):
        aggregate([tmp_path])
    with pytest.raises(AggregateError, match=r"--metrics bleu: no complete run has it .*expected some of: .*valid_ppl"):
        aggregate([sweep], metrics=["bleu"])
    with pytest.raises(AggregateError, match="--stage cache: no complete run has metrics for it; expected one of: final"):
        aggregate([sweep], stage="cache")
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
    agg = json.loads((study / "aggregate.json").read_text())
    assert agg["swept"] == ["objective.gamma"] and [r["n"] for r in agg["rows"]] == [1, 1]
    assert agg["optuna"]["best_value"] == pytest.approx(best.best_value)
    assert all(math.isfinite(r["metrics"]["valid_ppl"]["mean"]) and r["metrics"]["valid_ppl"]["std"] is None
               for r in agg["rows"])


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
