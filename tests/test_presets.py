"""An experiment preset's values per objective (conf/experiment_objective/), a budget's (conf/budget_objective/) and
what the preset sets at a scale (conf/experiment_scale/, which may choose a stand-in model, dataset and budget) are
options of Hydra's defaults list, composed once; the scale file states what a scale sets (no hidden caps); a table
row and the command line win over all of them. Expected values are read from the YAML files themselves
(yaml.safe_load, not our code)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from repdegen.reproduce.runs.cells import compose_cell, expand_cells
from repdegen.reproduce.settings.config import CONF_DIR, config_hash, finalize

REPO = Path(__file__).resolve().parents[1]


def _yaml(*parts):
    return yaml.safe_load((CONF_DIR.joinpath(*parts)).read_text())


def _overrides_of(*parts) -> dict:
    """The group choices an experiment_scale file makes (its defaults list's ``override /<group>: <option>``)."""
    entries = _yaml(*parts).get("defaults") or []
    return {k.split("/", 1)[1].replace("override ", ""): v for e in entries if isinstance(e, dict) for k, v in e.items()}


def _cells(experiment, *overrides):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return [finalize(compose_cell(experiment, list(o))) for o in overrides]


def test_the_preset_chooses_its_stand_in_unless_the_command_line_does():
    lite, paper, mine = _cells("yu2022/gpt2_wt103", ["scale=lite", "objective=agg"], ["scale=paper", "objective=agg"],
                               ["scale=lite", "objective=agg", "model=gpt2_medium"])
    assert (lite.model.name, lite.dataset.name) == ("transformer_lm6", "wikitext2_bpe")
    assert (paper.model.name, paper.dataset.name) == ("gpt2_medium", "wikitext103")
    assert (mine.model.name, mine.dataset.name) == ("gpt2_medium", "wikitext2_bpe")  # the command line's model wins
    section = _overrides_of("experiment_scale", "yu2022", "gpt2_wt103", "lite.yaml")
    assert (section["dataset"], section["model"], section["budget"]) == ("wikitext2_bpe", "transformer_lm6",
                                                                        "transformer_lm_lite")
    budget = _yaml("budget", "transformer_lm_lite.yaml")
    assert lite.trainer.max_epochs == budget["trainer"]["max_epochs"] and lite.model.d_model == budget["model"]["d_model"]


def test_objective_values_come_from_the_preset_and_the_command_line_wins():
    values = _yaml("experiment_objective", "inan2016", "h650", "al.yaml")
    al, real_mine, mle = _cells("inan2016/h650", ["objective=al"], ["objective=real", "objective.alpha=0.5"],
                                ["objective=mle"])
    assert (al.objective.alpha, al.objective.form) == (values["alpha"], values["form"]) == (0.35, "ce")
    assert (real_mine.objective.alpha, real_mine.objective.form) == (0.5, "ce")
    assert "alpha" not in mle.objective  # an objective the preset does not name keeps its own fields


def test_a_budget_sets_objective_values_at_its_scale_and_the_command_line_wins():
    budget = {o: _yaml("budget_objective", "transformer_lm_lite", f"{o}.yaml") for o in ("agg", "ul_agg_gated")}
    preset = {o: _yaml("experiment_objective", "yu2022", "gpt2_wt103", f"{o}.yaml") for o in ("agg", "ul_agg_gated")}
    lite, paper, lite_ul, mine = _cells("yu2022/gpt2_wt103", ["scale=lite", "objective=agg"], ["scale=paper", "objective=agg"],
                                        ["scale=lite", "objective=ul_agg_gated"],
                                        ["scale=lite", "objective=agg", "objective.alpha=0.05"])
    assert lite.objective.alpha == budget["agg"]["alpha"] != preset["agg"]["alpha"] == paper.objective.alpha
    assert lite_ul.objective.alpha == budget["ul_agg_gated"]["alpha"]
    assert lite_ul.objective.alpha_ul == preset["ul_agg_gated"]["alpha_ul"]  # what the budget does not set: the preset's
    assert mine.objective.alpha == 0.05


def test_scale_sections_budgets_and_the_scale_file_are_stated_and_the_command_line_wins():
    # values in a preset's file for the scale (zaremba2014/small), and a budget the file names (inan2017/small)
    section = _yaml("experiment_scale", "zaremba2014", "small", "lite.yaml")
    lite, lite_mine, paper = _cells("zaremba2014/small", ["scale=lite"], ["scale=lite", "trainer.max_epochs=5"],
                                    ["scale=paper"])
    assert lite.trainer.max_epochs == section["trainer"]["max_epochs"] != paper.trainer.max_epochs
    assert lite.dataset.train_tokens == section["dataset"]["train_tokens"] and paper.dataset.train_tokens is None
    assert _overrides_of("experiment_scale", "inan2017", "small", "lite.yaml")["budget"] == "inan2017_small_lite"
    budget = _yaml("budget", "inan2017_small_lite.yaml")
    small, smoke, smoke_mine, small_paper = _cells("inan2017/small", ["scale=lite"], ["scale=smoke"],
                                                   ["scale=smoke", "trainer.max_epochs=2"], ["scale=paper"])
    assert small.trainer.max_epochs == budget["trainer"]["max_epochs"] != small_paper.trainer.max_epochs
    assert small.optim.decay_after_epoch == budget["optim"]["decay_after_epoch"] != small_paper.optim.decay_after_epoch
    assert small.dataset.vocab_from == budget["dataset"]["vocab_from"] == "slice"
    assert small_paper.dataset.vocab_from == "split"
    paper = small_paper
    assert lite_mine.trainer.max_epochs == 5
    smoke_file = _yaml("scale", "smoke.yaml")
    assert smoke.trainer.max_epochs == smoke_file["scale"]["max_epochs"] == 1
    assert smoke.dataset.train_tokens == smoke_file["scale"]["train_tokens"]
    assert smoke_mine.trainer.max_epochs == 2  # the command line wins over the scale too (no min() cap)
    assert paper.trainer.max_epochs == _yaml("experiment", "inan2017", "small.yaml")["trainer"]["max_epochs"]
    # a shared budget named by the preset's section
    (mt,) = _cells("gao2019/transformer_base_en_de", ["scale=lite"])
    budget = _yaml("budget", "mt_lite.yaml")
    assert mt.trainer.max_updates == budget["trainer"]["max_updates"] and mt.dataset.name == "multi30k_en_de"


def test_no_table_row_repeats_its_presets_stand_in():
    for path in (CONF_DIR / "table").glob("*.yaml"):
        table = yaml.safe_load(path.read_text())
        for row in table.get("rows", []):
            if not row.get("experiment"):
                continue
            for scale, overrides in (row.get("scale_overrides") or {}).items():
                path = CONF_DIR / "experiment_scale" / row["experiment"] / f"{scale}.yaml"
                section = _overrides_of(path) if path.is_file() else {}
                stand_in = {f"{k}={v}" for k, v in section.items()}
                assert not stand_in & set(overrides), (path.name, row["label"], scale)


def test_train_runs_the_tables_cell_at_smoke(tiny_data, tmp_path):
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.train", "experiment=yu2022/gpt2_wt103", "objective=mle",
                          "scale=smoke", "trainer.progress=false", f"dataset.data_dir={tiny_data}",
                          f"paths.output_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'h'}"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("experiment=yu2022/gpt2_wt103 at scale=smoke: conf/experiment_scale/yu2022/gpt2_wt103/smoke.yaml, "
            "model=transformer_lm6 dataset=wikitext2_bpe budget=transformer_lm_smoke") in out.stderr
    (path,) = (tmp_path / "out" / "runs").glob("*/result.json")
    record = json.loads(path.read_text())
    assert record["choices"]["model"] == "transformer_lm6" and record["choices"]["dataset"] == "wikitext2_bpe"
    assert record["choices"]["budget"] == "transformer_lm_smoke"
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose("table_app", overrides=["table=yu2022_t3", "scale=smoke"])
        app.overrides = []
        mle = [c for c in expand_cells(app) if c.cfg.objective.name == "mle"]
        assert record["config_hash"] == mle[0].config_hash == config_hash(finalize(compose_cell(
            "yu2022/gpt2_wt103", ["scale=smoke", "objective=mle"])))


def test_cells_composed_with_one_memo_are_not_mixed_up_between_presets_or_scales():
    """A table's expansion shares one defaults tree among the cells that differ in values only: cells of other
    presets, objectives or scales get their own files' values (read from the YAML files)."""
    from repdegen.reproduce.settings.resolve import resolve

    h650 = _yaml("experiment_objective", "inan2016", "h650", "al.yaml")["alpha"]
    h200 = _yaml("experiment_objective", "inan2016", "h200", "al.yaml")["alpha"]
    memo: dict = {}
    spec = lambda *o: resolve(list(o), memo=memo).cfg  # noqa: E731
    cells = [spec("experiment=inan2016/h650", "objective=al", f"seed={s}") for s in (1, 2, 2)]
    other = spec("experiment=inan2016/h200", "objective=al", "seed=2")
    assert [c.objective.alpha for c in cells] == [h650] * 3 and other.objective.alpha == h200 != h650
    lite, smoke, lite_again = (spec("experiment=inan2017/small", f"scale={s}", f"seed={n}")
                               for s, n in (("lite", 5), ("smoke", 5), ("lite", 6)))
    lite_epochs = _yaml("budget", "inan2017_small_lite.yaml")["trainer"]["max_epochs"]  # its lite file's budget
    assert lite.trainer.max_epochs == lite_again.trainer.max_epochs == lite_epochs != 1 == smoke.trainer.max_epochs
