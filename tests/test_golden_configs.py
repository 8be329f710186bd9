"""The golden-config guard (scripts/golden_configs.py): every table cell's and preset's resolved config at every scale
equals tests/golden/, so a refactor of the config tree changes no experiment by accident."""

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import golden_configs  # noqa: E402


@pytest.mark.e2e  # composes every cell of every table at every scale (minutes)
def test_every_cell_config_equals_the_golden_files():
    index, views = golden_configs.collect()
    problems = golden_configs.check(index, views)
    assert not problems, "\n".join(problems[:20])
    # every committed lite rendering names cells the golden files hold (their hashes are the ledger's keys): a table
    # rendered at lite and then changed by a config edit would fail here. (lite v1's renderings, kept under
    # results/history/lite_v1, name the v1 budgets' cells, which v2 replaced on purpose: docs/lite_v2.md.)
    repo = Path(__file__).resolve().parents[1]
    rendered = sorted((repo / "results" / "tables").glob("*/lite/cells.json"))
    assert rendered, "no committed lite rendering to check"
    for path in rendered:
        table = path.parents[1].name
        cells = json.loads(path.read_text())["cells"]
        hashes = {c["config_hash"] for c in cells if c["config_hash"]}
        assert hashes <= {c["hash"] for c in index[f"table/{table}/lite"]}, table


def test_view_diff_names_each_changed_key():
    old = {"trainer": {"max_updates": 3500, "lr": 1.0}, "model": {"d_model": 128}}
    new = {"trainer": {"max_updates": 3000, "lr": 1.0}, "model": {"d_model": 128, "n_layers": 6}}
    assert golden_configs.view_diff(old, new) == ["model.n_layers: (absent) -> 6", "trainer.max_updates: 3500 -> 3000"]
    assert golden_configs.view_diff(old, old) == []


def test_check_reports_changed_new_and_removed_cells(tmp_path):
    index = {"table/t/lite": [{"row": "MLE", "seed": 1, "hash": "aaa"}, {"row": "AGG", "seed": 1, "hash": "bbb"}],
             "experiment/e/lite": [{"row": None, "seed": None, "hash": "ccc"}]}
    views = {"aaa": {"objective": {"name": "mle"}}, "bbb": {"objective": {"name": "agg", "alpha": 0.03}},
             "ccc": {"seed": 1}}
    assert golden_configs.check(index, views, tmp_path)[0].endswith("--write)")  # no golden files yet
    golden_configs.write(index, views, tmp_path)
    assert golden_configs.check(index, views, tmp_path) == []
    assert yaml.safe_load((tmp_path / "configs" / "bbb.yaml").read_text()) == views["bbb"]

    now = {"table/t/lite": [{"row": "MLE", "seed": 1, "hash": "aaa"}, {"row": "AGG", "seed": 1, "hash": "ddd"},
                            {"row": "UL", "seed": 1, "hash": "aaa"}]}
    problems = golden_configs.check(now, {**views, "ddd": {"objective": {"name": "agg", "alpha": 0.1}}}, tmp_path)
    assert problems == [
        "experiment/e/lite: in the golden files, composes no more (a table, scale or preset was removed)",
        "table/t/lite row='AGG' seed=1: hash bbb -> ddd\n    objective.alpha: 0.03 -> 0.1",
        "table/t/lite row='UL' seed=1: new",
    ]
