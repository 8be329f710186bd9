"""An experiment preset's stand-ins at a scale (`scale_choices`): `reproduce.train experiment=yu2022/gpt2_wt103
scale=smoke` trains the very cell the Yu tables run at smoke (the 6-layer LM on WikiText-2 BPE), a choice on the
command line wins, and the tables no longer repeat the stand-ins row by row."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir

from reproduce.config import CONF_DIR, config_hash, finalize
from reproduce.table import compose_cell, expand_cells

REPO = Path(__file__).resolve().parents[1]


def test_the_preset_chooses_its_stand_in_unless_the_command_line_does():
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        lite = compose_cell("yu2022/gpt2_wt103", ["scale=lite", "objective=agg"])
        paper = compose_cell("yu2022/gpt2_wt103", ["scale=paper", "objective=agg"])
        mine = compose_cell("yu2022/gpt2_wt103", ["scale=lite", "objective=agg", "model=gpt2_medium"])
    assert (lite.model.name, lite.dataset.name) == ("transformer_lm6", "wikitext2_bpe")
    assert (paper.model.name, paper.dataset.name) == ("gpt2_medium", "wikitext103")
    assert (mine.model.name, mine.dataset.name) == ("gpt2_medium", "wikitext2_bpe")  # the command line's model wins
    # the preset file says so itself (read as YAML, not through our code)
    preset = yaml.safe_load((CONF_DIR / "experiment" / "yu2022" / "gpt2_wt103.yaml").read_text())
    assert preset["scale_choices"]["lite"] == {"dataset": "wikitext2_bpe", "model": "transformer_lm6"}


def test_no_table_row_repeats_its_presets_stand_in():
    for path in (CONF_DIR / "table").glob("*.yaml"):
        table = yaml.safe_load(path.read_text())
        for row in table.get("rows", []):
            if not row.get("experiment"):
                continue
            preset = yaml.safe_load((CONF_DIR / "experiment" / f"{row['experiment']}.yaml").read_text()) or {}
            for scale, overrides in (row.get("scale_overrides") or {}).items():
                stand_in = {f"{g}={o}" for g, o in ((preset.get("scale_choices") or {}).get(scale) or {}).items()}
                assert not stand_in & set(overrides), (path.name, row["label"], scale)


def test_train_runs_the_tables_cell_at_smoke(tiny_data, tmp_path):
    out = subprocess.run([sys.executable, "-m", "reproduce.train", "experiment=yu2022/gpt2_wt103", "objective=mle",
                          "scale=smoke", "trainer.progress=false", f"dataset.data_dir={tiny_data}",
                          f"paths.output_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'h'}"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "the preset yu2022/gpt2_wt103 runs dataset=wikitext2_bpe model=transformer_lm6" in out.stdout
    (path,) = (tmp_path / "out" / "runs").glob("*/result.json")
    record = json.loads(path.read_text())
    assert record["choices"]["model"] == "transformer_lm6" and record["choices"]["dataset"] == "wikitext2_bpe"
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose("table_app", overrides=["table=yu2022_t3", "scale=smoke"])
        app.overrides = []
        mle = [c for c in expand_cells(app) if c.cfg.objective.name == "mle"]
        assert record["config_hash"] == mle[0].config_hash == config_hash(finalize(compose_cell(
            "yu2022/gpt2_wt103", ["scale=smoke", "objective=mle"])))
