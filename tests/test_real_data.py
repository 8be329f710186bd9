"""Real-corpus runs (minutes): `make test-slow` or `pytest -m slow`, with REPDEGEN_DATA_DIR set."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from repdegen.reproduce.runs.tables import run_table
from repdegen.reproduce.settings.config import CONF_DIR, compose_config

from tests.conftest import REAL_DATA, requires_real_data

pytestmark = [pytest.mark.slow, requires_real_data("ptb", "wikitext-2")]


def test_inan2017_t1_smoke_table_on_real_ptb(tmp_path):
    """The README's main job: every cell trains on real PTB and beats a uniform model by far."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose("table_app", overrides=["table=inan2017_t1", "scale=smoke", f"paths.output_dir={tmp_path}/o",
                                             f"paths.tables_dir={tmp_path}/t"])
        app.overrides = [f"dataset.data_dir={REAL_DATA}", "trainer.progress=false"]
        assert run_table(app) == 0
    rows = list(csv.DictReader(io.StringIO((Path(tmp_path) / "t/inan2017_t1/smoke/table.csv").read_text())))
    assert len(rows) == 12
    for r in rows:
        assert r["status"] == "complete" and 1 < float(r["valid_ppl_ours"]) < 10000  # uniform: 10,000


def test_describe_counts_on_real_corpora(tmp_path):
    from repdegen.reproduce.describe import describe

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for overrides, expected in ((["model=awd_lstm", "dataset=wikitext2"], 33_556_078),
                                    (["model=awd_lstm", "dataset=ptb"], 24_221_600),
                                    (["experiment=inan2017/large", "objective=real"], 51_012_000)):
            cfg = compose_config([*overrides, f"dataset.data_dir={REAL_DATA}", f"paths.output_dir={tmp_path}"])
            out = describe(cfg)
            assert out["vocab_size_from"] == "corpus" and out["parameters"]["total"] == expected
