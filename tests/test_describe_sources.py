"""`repdegen.reproduce.describe table=... row=...` and `sources=true`: a cell's config with where each value comes from
(reproduce/settings/sources.py), checked against the YAML files themselves and against the table's own cell hashes."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from repdegen.reproduce.runs.cells import expand_cells
from repdegen.reproduce.settings.config import CONF_DIR, config_hash
from repdegen.reproduce.settings.sources import compose_with_sources, flatten

REPO = Path(__file__).resolve().parents[1]


def _file_values(label: str) -> dict:
    """The dotted keys a config file sets, as written in it."""
    return flatten(yaml.safe_load((REPO / label).read_text()) or {})


@pytest.mark.parametrize("overrides", [
    ["experiment=gao2019/awd_lstm_wt2", "objective=cosreg", "scale=smoke"],
    ["experiment=yu2022/transformer_base_wmt14", "objective=agg", "dataset=multi30k_en_de", "scale=lite"],
    ["experiment=inan2017/small", "objective=real", "scale=lite", "seed=3"],
])
def test_every_key_names_a_layer_that_sets_it(overrides):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg, sources = compose_with_sources(overrides)
    final = {k: v for k, v in flatten(OmegaConf.to_container(cfg, resolve=True)).items()
             if not k.startswith(("scales.", "objectives."))}  # the preset's sections: listed under the keys they set
    assert set(sources) == set(final) and all(sources[k] for k in final)
    checked = 0
    for key, steps in sources.items():
        last = steps[-1]
        if last.startswith("conf/experiment/") and (" scales." in last or " objectives." in last):
            # a preset's section: the section, read from the file, has that override
            path, rest = last.split(" ", 1)
            section, override = rest.split(": ", 1)
            dotted, value = override.split("=", 1)
            entries = yaml.safe_load((REPO / path).read_text())
            for part in section.split("."):
                entries = entries[part]
            field = dotted.removeprefix("objective.") if section.startswith("objectives.") else dotted
            assert field in entries and OmegaConf.select(cfg, key) == yaml.safe_load(value), (key, last)
            assert key == dotted or key.startswith(dotted + ".") or dotted in ("dataset", "model", "budget")
            checked += 1
        elif last.startswith("conf/"):
            # the file that is named last really sets the key (as written, or under its group's package)
            values = _file_values(last.split(" = ")[0])
            short = key.split(".", 1)[1] if "." in key else key
            assert key in values or short in values, f"{key}: {last} does not set it"
            checked += 1
        elif last.startswith("override "):
            assert last.split(" ", 1)[1].split("=")[0].lstrip("+") in (key, key.rsplit(".", 1)[0])
    assert checked > 5


def test_scale_budget_and_width_are_attributed_to_the_scale_file():
    experiment = yaml.safe_load((CONF_DIR / "experiment" / "gao2019" / "awd_lstm_wt2.yaml").read_text())
    smoke = yaml.safe_load((CONF_DIR / "scale" / "smoke.yaml").read_text())  # read from the files, not our code
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg, sources = compose_with_sources(["experiment=gao2019/awd_lstm_wt2", "objective=cosreg", "scale=smoke"])
    assert cfg.trainer.max_epochs == smoke["scale"]["max_epochs"] == 1 != experiment["trainer"]["max_epochs"]
    assert sources["trainer.max_epochs"][-1] == "conf/scale/smoke.yaml = ${scale.max_epochs}"
    assert "conf/experiment/gao2019/awd_lstm_wt2.yaml" in sources["trainer.max_epochs"]
    assert sources["model.hidden_size"][-1].startswith("scale.width_mult=0.1")
    assert sources["dataset.train_tokens"][-1] == "conf/scale/smoke.yaml = ${scale.train_tokens}"
    # the preset's own file for smoke sets what the scale leaves (one finetune epoch)
    at_smoke = yaml.safe_load((CONF_DIR / "experiment_scale" / "gao2019" / "awd_lstm_wt2" / "smoke.yaml").read_text())
    assert at_smoke["trainer"]["finetune_epochs"] == cfg.trainer.finetune_epochs == 1
    assert sources["trainer.finetune_epochs"][-1] == "conf/experiment_scale/gao2019/awd_lstm_wt2/smoke.yaml"
    # and the preset's values for the objective
    al = yaml.safe_load((CONF_DIR / "experiment_objective" / "inan2016" / "h650" / "al.yaml").read_text())
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg, sources = compose_with_sources(["experiment=inan2016/h650", "objective=al"])
    assert cfg.objective.alpha == al["alpha"] == 0.35
    assert sources["objective.alpha"][-1] == "conf/experiment_objective/inan2016/h650/al.yaml"


def test_a_table_cell_described_is_the_cell_the_table_runs():
    from repdegen.reproduce.describe import table_cell

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose("table_app", overrides=["table=yu2022_t4", "scale=lite"])
        app.overrides = []
        hashes = {c.config_hash for c in expand_cells(app)}
        cell, mine = table_cell("yu2022_t4", "UL + AGG", "lite", 2, [])
        cfg, _ = compose_with_sources([f"experiment={cell.experiment}", *cell.overrides])
    assert [c.seed for c in mine] == [1, 2] and cell.seed == 2
    assert config_hash(cfg) == cell.config_hash and cell.config_hash in hashes


def test_describe_cli_annotates_and_names_the_rows_on_a_bad_label():
    ok = subprocess.run([sys.executable, "-m", "repdegen.reproduce.describe", "table=yu2022_t7", "row=AGG", "scale=lite"],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "objective.alpha: 0.08  # conf/experiment_objective/yu2022/transformer_base_wmt14/agg.yaml" in ok.stdout
    assert "# config hash " in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "repdegen.reproduce.describe", "table=yu2022_t7", "row=agg", "scale=lite"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "row='agg' is not a row of yu2022_t7" in bad.stderr and "'Base / AGG'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_describe_of_a_table_cell_at_an_unknown_scale_is_one_error_line():
    """A composition Hydra refuses inside describe's own composing (scale=medium is not a scale): one
    ``repdegen: error:`` line naming the scales, exit 2, no traceback."""
    bad = subprocess.run([sys.executable, "-m", "repdegen.reproduce.describe", "table=inan2017_t1", "row=VD-LSTM",
                          "scale=medium"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stdout == ""
    assert bad.stderr.startswith("repdegen: error:") and "scale/medium" in bad.stderr and "lite, paper, smoke" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_describe_json_is_alone_on_stdout_when_a_presets_scale_file_applies():
    """The preset's file for the scale applies (inan2016/h200 at lite: its budget) and its values for the objective
    (AL: alpha, temperature and form): the note that names the file goes to stderr, and stdout parses as the JSON
    (for ``| python -c 'json.load(sys.stdin)'`` and jq)."""
    import json

    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.describe", "experiment=inan2016/h200", "scale=lite",
                          "objective=al", "model.dropout=0.3"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "conf/experiment_scale/inan2016/h200/lite.yaml, model=inan2016_lstm_200 dataset=ptb" in out.stderr
    d = json.loads(out.stdout)
    assert d["config"]["objective"]["alpha"] == 0.3 and d["config"]["objective"]["form"] == "kl"


def test_a_label_in_several_groups_is_refused_and_its_group_form_picks_one():
    """``row=VD-LSTM`` names a row in each size group of Inan 2017 Table 1: an error listing the group-qualified
    names, not the first group's row; ``'<group> / <label>'`` picks that group's cell."""
    from repdegen.reproduce.describe import table_cell
    from repdegen.reproduce.errors import ConfigError

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        with pytest.raises(ConfigError) as err:
            table_cell("inan2017_t1", "VD-LSTM", "smoke", None, [])
        cell, _ = table_cell("inan2017_t1", "Medium (650 units) / VD-LSTM+AL", "smoke", None, [])
    assert "the label 'VD-LSTM' is in" in str(err.value) and "'Medium (650 units) / VD-LSTM'" in str(err.value)
    assert cell.experiment == "inan2017/medium" and "objective=al" in cell.overrides
