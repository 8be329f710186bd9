"""A table's analyses of its trained cells (reproduce/runs/trained.py; yu2022_t5: greedy continuations and their
Uniq): declared domains, the metrics they give, pre-registration against the time an analysis was computed, and
one smoke table end to end whose numbers are recomputed by a brute-force greedy decoder."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest
import repdegen.reproduce.runs.tables  # noqa: F401  (registers the table schema)
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from repdegen.core.errors import CorruptFile
from repdegen.core.loaders import load_continuations
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.results.claims import validate_claims
from repdegen.reproduce.runs import registration
from repdegen.reproduce.runs.cells import TableConfig
from repdegen.reproduce.runs.tables import run_table
from repdegen.reproduce.settings.config import CONF_DIR


def make_table(analyses=None, columns=("test_ppl",), metric="test_ppl"):
    cfg = OmegaConf.structured(TableConfig)
    cfg.merge_with({"name": "t", "title": "T", "source": "S", "columns": list(columns),
                    "rows": [{"label": "Base", "experiment": "x"}, {"label": "New", "experiment": "x"}],
                    "claims": [{"text": "New beats Base", "source": "Sec. 1", "quote": "q",
                                "checks": [{"metric": metric, "row": "New", "relation": "higher", "than": "Base"}]}],
                    **({"analyses": analyses} if analyses is not None else {})})
    return cfg


def test_an_analysis_metric_needs_its_analysis_and_a_value_in_its_domain():
    validate_claims(make_table({"continuations": 500}, ["cont_uniq_mean"], "cont_uniq_mean"), ["lite"])
    validate_claims(make_table({"continuations": 5}, ["test_ppl"], "cont_uniq_total"), ["lite"])  # a claim only
    with pytest.raises(ConfigError, match=r"'cont_uniq_mean' comes from the table's analyses.continuations, which is "
                                          r"not set; add `analyses: \{continuations: 500\}`"):
        validate_claims(make_table(None, ["cont_uniq_mean"]), ["lite"])
    with pytest.raises(ConfigError, match="'cont_uniq_total' comes from"):
        validate_claims(make_table({"continuations": 0}, ["test_ppl"], "cont_uniq_total"), ["lite"])
    with pytest.raises(ConfigError, match=r"analyses.continuations=-3 must be an integer >= 0"):
        validate_claims(make_table({"continuations": -3}), ["lite"])
    with pytest.raises(Exception, match="continuations"):  # the schema: an integer
        make_table({"continuations": "many"})


def test_the_claim_hash_covers_the_analysis_a_claim_reads_and_only_then():
    plain = make_table({"continuations": 500}).claims[0]
    assert registration.claim_hash(plain, [1], "lite", {"continuations": 500}) == registration.claim_hash(plain, [1], "lite")
    reads = make_table({"continuations": 500}, ["cont_uniq_mean"], "cont_uniq_mean").claims[0]
    assert (registration.claim_hash(reads, [1], "lite", {"continuations": 500})
            != registration.claim_hash(reads, [1], "lite", {"continuations": 100}))


def test_a_continuations_file_is_checked(tmp_path):
    path = tmp_path / "continuations_5.json"
    path.write_text(json.dumps({"mean_uniq": 3.5, "uniq_total": "7", "n": 2, "computed": "2026-01-01T00:00:00"}))
    with pytest.raises(CorruptFile, match="'uniq_total' is a string"):
        load_continuations(path)
    path.write_text(json.dumps({"mean_uniq": 3.5, "uniq_total": 7, "n": 2, "computed": "2026-01-01T00:00:00"}))
    assert load_continuations(path)["uniq_total"] == 7


def test_yu_t5_at_smoke_computes_each_cells_continuations_once_and_registers_against_them(tiny_data, tmp_path):
    from repdegen.reproduce.runs.ledger import Ledger
    from repdegen.reproduce.runs.trained import continuations_path, load_lm

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose("table_app", overrides=["table=yu2022_t5", "scale=smoke", f"paths.output_dir={tmp_path}/out",
                                             f"paths.tables_dir={tmp_path}/tables", "launch.backend=inline",
                                             "progress=false"])
        app.overrides = [f"dataset.data_dir={tiny_data}", "trainer.progress=false"]
        assert run_table(app) == 0
        out = Path(app.paths.tables_dir) / "yu2022_t5" / "smoke"
        cells = json.loads((out / "cells.json").read_text())["cells"]
        ledger = Ledger(app.paths.runs_dir)
        hashes = sorted({c["config_hash"] for c in cells if c.get("config_hash")})
        assert len(hashes) == 2
        files = {h: continuations_path(ledger.run_dir(h), 500) for h in hashes}
        stamps = {h: os.stat(p).st_mtime_ns for h, p in files.items()}
        rows = {r["label"]: r for r in csv.DictReader(io.StringIO((out / "table.csv").read_text()))}
        for h, path in files.items():
            # the counting itself is checked against lm_continue prefix by prefix in tests/test_analysis.py; here:
            # every full 50-token test prefix (at most 500) of the corpus the cell trained on, and the row shows it
            data = load_continuations(path)
            lm = load_lm(ledger.run_dir(h), torch.device("cpu"))
            assert data["n"] == min(500, lm.corpus.test.numel() // 50) >= 1
            # the mean is over every prefix's count, and the examples are the first prefixes' counts
            assert len(data["uniq"]) == data["n"] and data["mean_uniq"] == pytest.approx(sum(data["uniq"]) / data["n"])
            assert [e["uniq"] for e in data["examples"]] == data["uniq"][:5]
            assert (data["prefix_len"], data["steps"]) == (50, 100) and data["weights"] == "best.pt"
            # the first prefixes again, by a brute-force greedy decoder: the whole sequence rerun at every step (no
            # key/value cache), the argmax of the last position's logits with <pad> never chosen
            model = lm.model.eval()
            stoi = lm.corpus.vocab.stoi
            forbid = [stoi["<pad>"]] if "<pad>" in stoi else []
            max_positions = getattr(model.cfg, "max_positions", None)
            for i in range(min(2, data["n"])):
                seq, gen = lm.corpus.test[50 * i:50 * (i + 1)].tolist(), []
                with torch.no_grad():
                    for _ in range(100):
                        ctx = (seq + gen)[-max_positions:] if max_positions else seq + gen
                        z = model.logits(model(torch.tensor(ctx).unsqueeze(1), None).hidden[-1, 0]).double()
                        z[forbid] = float("-inf")
                        gen.append(int(z.argmax()))
                assert len(set(gen)) == data["uniq"][i], f"prefix {i}"
            row = next(r for r in rows.values() if r["config_hash"] == h)
            assert float(row["cont_uniq_mean_ours"]) == pytest.approx(data["mean_uniq"], abs=0.05)
        md = (out / "table.md").read_text()
        assert "Uniq per continuation" in md and "23.4" in md and "52.2" in md
        claims = json.loads((out / "claims.json").read_text())["claims"]
        assert claims[0]["registration"] is None and claims[0]["state"] in ("holds", "fails", "tie")

        # run again: nothing trains, nothing is computed again
        assert run_table(app) == 0
        assert {h: os.stat(p).st_mtime_ns for h, p in files.items()} == stamps

        # the claim is judged against the time the analysis was computed, not the time the cells started: registered
        # after the cells started but before the analyses -> pre-registered; after the analyses -> changed after run
        reg_path = out / "registration.json"
        reg = json.loads(reg_path.read_text())
        started = max(json.loads((ledger.run_dir(h) / "result.json").read_text())["started"] for h in hashes)
        computed = min(load_continuations(p)["computed"] for p in files.values())
        assert started <= computed
        (h_claim,) = reg["claims"]
        for registered, changed in ((started, False), (computed + "9", True)):  # "...:SS9" sorts after "...:SS"
            reg["claims"][h_claim]["registered"] = registered
            reg_path.write_text(json.dumps(reg))
            app.render_only = True
            assert run_table(app) == 0
            claim = json.loads((out / "claims.json").read_text())["claims"][0]
            assert (claim["registration"] is not None) == changed, claim["registration"]
