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
            text = (Path(package.__path__[0]) / f"{info.name}.py").read_text()
            names = [line.split("(", 1)[1].split(",")[0].strip("\"') ") for line in text.splitlines()
                     if line.startswith(decorator)]
            assert set(names) <= set(registry.names()), (info.name, names)
