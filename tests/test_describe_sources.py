"""`reproduce.describe table=... row=...` and `sources=true`: a cell's config with where each value comes from
(reproduce/sources.py), checked against the YAML files themselves and against the table's own cell hashes."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from reproduce.config import CONF_DIR, config_hash
from reproduce.sources import compose_with_sources, flatten
from reproduce.table import expand_cells

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
    final = flatten(OmegaConf.to_container(cfg, resolve=True))
    assert set(sources) == set(final) and all(sources[k] for k in final)
    checked = 0
    for key, steps in sources.items():
        last = steps[-1]
        if last.startswith("conf/"):
            # the file that is named last really sets the key (as written, or under its group's package)
            values = _file_values(last.split(" = ")[0])
            short = key.split(".", 1)[1] if "." in key else key
            assert key in values or short in values, f"{key}: {last} does not set it"
            checked += 1
        elif last.startswith("override "):
            assert last.split(" ", 1)[1].split("=")[0].lstrip("+") in (key, key.rsplit(".", 1)[0])
    assert checked > 5


def test_scale_caps_and_width_are_attributed_to_the_scale():
    experiment = yaml.safe_load((CONF_DIR / "experiment" / "gao2019" / "awd_lstm_wt2.yaml").read_text())
    epochs_in_preset = experiment["trainer"]["max_epochs"]  # read from the file, not through our code
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg, sources = compose_with_sources(["experiment=gao2019/awd_lstm_wt2", "objective=cosreg", "scale=smoke"])
    assert cfg.trainer.max_epochs == 1
    assert sources["trainer.max_epochs"][-1] == f"scale cap: min({epochs_in_preset}, scale.max_epochs=1)"
    assert "conf/experiment/gao2019/awd_lstm_wt2.yaml" in sources["trainer.max_epochs"]
    assert sources["model.hidden_size"][-1].startswith("scale.width_mult=0.1")
    assert sources["dataset.train_tokens"][-1] == "scale cap: scale.train_tokens=30000 (the preset sets none)"


def test_a_table_cell_described_is_the_cell_the_table_runs():
    from reproduce.describe import table_cell

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose("table_app", overrides=["table=yu2022_t4", "scale=lite"])
        app.overrides = []
        hashes = {c.config_hash for c in expand_cells(app)}
        cell, mine = table_cell("yu2022_t4", "UL + AGG", "lite", 2, [])
        cfg, _ = compose_with_sources([f"experiment={cell.experiment}", *cell.overrides])
    assert [c.seed for c in mine] == [1, 2] and cell.seed == 2
    assert config_hash(cfg) == cell.config_hash and cell.config_hash in hashes


def test_describe_cli_annotates_and_names_the_rows_on_a_bad_label():
    ok = subprocess.run([sys.executable, "-m", "reproduce.describe", "table=yu2022_t7", "row=AGG", "scale=lite"],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "objective.alpha: 0.08  # conf/objective_hparams/yu2022/transformer_base_wmt14/agg.yaml" in ok.stdout
    assert "# config hash " in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "reproduce.describe", "table=yu2022_t7", "row=agg", "scale=lite"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "row='agg' is not a row of yu2022_t7" in bad.stderr and "'AGG'" in bad.stderr
    assert "Traceback" not in bad.stderr
