"""An objective is one module plus one YAML: added from a temporary folder (REPDEGEN_PLUGINS and Hydra's search
path), it trains through `repdegen train`; the objectives and models of the repository are found
without a list; a bad plugin entry is one error line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from repdegen.core.registry import load_plugins

REPO = Path(__file__).resolve().parents[1]

MODULE = '''
import os
from dataclasses import dataclass
from pathlib import Path

from repdegen.losses import ObjectiveConfig, register_objective
from repdegen.losses.mle import MLE


@dataclass
class ScaledMLEConfig(ObjectiveConfig):
    name: str = "scaled_mle"
    weight: float = 1.0


@register_objective("scaled_mle", ScaledMLEConfig)
class ScaledMLE(MLE):
    def forward(self, hidden, targets, model, step=0, layout=None):
        Path(os.environ["SCALED_MLE_MARK"]).write_text(str(self.cfg.weight))
        out = super().forward(hidden, targets, model, step, layout)
        out.token_loss = self.cfg.weight * out.token_loss
        return out
'''
YAML = "defaults:\n  - schema_scaled_mle\n  - _self_\nname: scaled_mle\nweight: 0.25\n"


def test_an_objective_from_a_temporary_folder_trains_through_the_entrypoint(tmp_path, tiny_data):
    (tmp_path / "scaled_mle.py").write_text(MODULE)
    (tmp_path / "conf" / "objective").mkdir(parents=True)
    (tmp_path / "conf" / "objective" / "scaled_mle.yaml").write_text(YAML)
    mark = tmp_path / "called"
    env = dict(os.environ, REPDEGEN_PLUGINS=str(tmp_path / "scaled_mle.py"), SCALED_MLE_MARK=str(mark),
               OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.train", "experiment=inan2017/small", "scale=smoke",
                          "objective=scaled_mle", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "trainer.progress=false",
                          f"dataset.data_dir={tiny_data}", f"paths.output_dir={tmp_path / 'out'}",
                          f"hydra.run.dir={tmp_path / 'h'}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (record_path,) = (tmp_path / "out" / "runs").glob("*/result.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "complete" and record["choices"]["objective"] == "scaled_mle"
    assert record["config"]["objective"] == {"name": "scaled_mle", "tie_weights": False, "chunk_rows": None, "weight": 0.25}
    assert mark.read_text() == "0.25"  # its forward ran, with the YAML's value


def test_a_bad_plugin_entry_is_one_error_line(tmp_path):
    env = dict(os.environ, REPDEGEN_PLUGINS=str(tmp_path / "missing.py"))
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.train", f"paths.output_dir={tmp_path}",
                          f"hydra.run.dir={tmp_path / 'h'}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "REPDEGEN_PLUGINS entry" in out.stderr and "missing.py" in out.stderr and ".py file or a module" in out.stderr
    from repdegen.core.errors import ConfigError

    with pytest.raises(ConfigError, match="no_such_module_xyz"):
        load_plugins("no_such_module_xyz")


def test_every_module_of_losses_and_models_registers_without_a_list():
    import pkgutil

    from repdegen import losses, models

    # each module file that defines a @register_objective / @register_model decorator call is imported
    for package, registry, decorator in ((losses, losses.OBJECTIVES, "@register_objective("),
                                         (models, models.MODELS, "@register_model(")):
        for info in pkgutil.iter_modules(package.__path__):
            if info.ispkg:  # a subpackage (losses/hf: repdegen.hf) registers nothing and is not imported with them
                continue
            text = (Path(package.__path__[0]) / f"{info.name}.py").read_text()
            names = [line.split("(", 1)[1].split(",")[0].strip("\"') ") for line in text.splitlines()
                     if line.startswith(decorator)]
            assert set(names) <= set(registry.names()), (info.name, names)


# ---- extending, measured: an objective, a model and a table of one's own, from a temporary folder -----------------
TOY_MODEL = '''
from dataclasses import dataclass

from repdegen.models import register_model
from repdegen.models.lstm_lm import LSTMLanguageModel, LSTMLMConfig


@dataclass
class ToyLSTMConfig(LSTMLMConfig):
    arch: str = "toy_lstm"


@register_model("toy_lstm", ToyLSTMConfig)
class ToyLSTM(LSTMLanguageModel):
    """The LSTM LM under a name of its own: what a model from outside takes."""
'''
TOY_METRIC = '''
from repdegen.reproduce.results.metrics import Metric, register_metric


def epochs_run(record, values):
    return float(sum(h.get("stage", "train") == "train" for h in record["history"]))


register_metric(Metric("epochs_run", "Epochs run", better=None, source="record", derive=epochs_run))
'''
TOY_MODEL_YAML = "defaults:\n  - schema_toy_lstm\n  - _self_\nname: toy_lstm\nhidden_size: 40\nnum_layers: 1\n"
TOY_TABLE = """defaults:
  - schema_table
  - _self_
name: toy_t1
title: "A table of one's own: MLE against a scaled MLE"
source: "the extension test (tests/test_plugins.py)"
columns: [valid_ppl, test_ppl, epochs_run]
rows:
  - {label: MLE, experiment: inan2017/small, overrides: [objective=mle], paper: {valid_ppl: 100.0}}
  - {label: Scaled MLE, experiment: inan2017/small, overrides: [objective=scaled_mle], paper: {valid_ppl: 99.0}}
  - {label: Toy model, experiment: inan2017/small, overrides: [objective=mle, model=toy_lstm], paper: {}}
baseline: MLE
claims:
  - text: "The scaled loss lowers the validation PPL"
    source: "the extension test"
    quote: "none"
    checks:
      - {metric: valid_ppl, row: "Scaled MLE", relation: lower, than: MLE}
"""


def test_an_objective_a_model_and_a_table_from_a_temporary_folder_run_at_smoke(tmp_path, tiny_data):
    """The files each extension takes, counted: an objective is its module and its YAML, a model its module and its
    YAML, a table its YAML, a metric one registry entry (a module); with REPDEGEN_PLUGINS and hydra.searchpath the
    table command runs them all, and renders the metric from each cell's record."""
    ext = tmp_path / "ext"
    files = {"scaled_mle.py": MODULE, "conf/objective/scaled_mle.yaml": YAML, "toy_lstm.py": TOY_MODEL,
             "conf/model/toy_lstm.yaml": TOY_MODEL_YAML, "conf/table/toy_t1.yaml": TOY_TABLE,
             "epochs_run.py": TOY_METRIC}
    for name, text in files.items():
        (ext / name).parent.mkdir(parents=True, exist_ok=True)
        (ext / name).write_text(text)
    env = dict(os.environ, REPDEGEN_PLUGINS=f"{ext / 'scaled_mle.py'},{ext / 'toy_lstm.py'},{ext / 'epochs_run.py'}",
               SCALED_MLE_MARK=str(tmp_path / "called"), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.table", "table=toy_t1", "scale=smoke",
                          f"hydra.searchpath=[file://{ext / 'conf'}]", f"paths.output_dir={tmp_path / 'out'}",
                          f"paths.tables_dir={tmp_path / 'tables'}", "progress=false", f"dataset.data_dir={tiny_data}",
                          "trainer.progress=false", f"hydra.run.dir={tmp_path / 'h'}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    cells = json.loads((tmp_path / "tables" / "toy_t1" / "smoke" / "cells.json").read_text())["cells"]
    assert [(c["label"], c["status"]) for c in cells] == [("MLE", "complete"), ("Scaled MLE", "complete"),
                                                          ("Toy model", "complete")]
    records = [json.loads((Path(c["run_dir"]) / "result.json").read_text()) for c in cells]
    assert [r["choices"]["objective"] for r in records] == ["mle", "scaled_mle", "mle"]
    assert records[2]["config"]["model"]["arch"] == "toy_lstm" and records[2]["config"]["model"]["num_layers"] == 1
    assert (tmp_path / "called").read_text() == "0.25"
    # the metric, derived from each cell's record by its registry entry: its epochs, by hand from the records
    import csv

    with open(tmp_path / "tables" / "toy_t1" / "smoke" / "table.csv") as f:
        rendered = {r["label"]: r for r in csv.DictReader(f)}
    for c, r in zip(cells, records):
        assert float(rendered[c["label"]]["epochs_run_ours"]) == len([h for h in r["history"] if h["stage"] == "train"])
    # the counts docs/architecture.md states
    per_extension = {"objective": [n for n in files if "scaled_mle" in n], "model": [n for n in files if "toy_lstm" in n],
                     "table": [n for n in files if "table/" in n], "metric": [n for n in files if "epochs_run" in n]}
    assert {k: len(v) for k, v in per_extension.items()} == {"objective": 2, "model": 2, "table": 1, "metric": 1}
