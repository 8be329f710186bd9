"""A paper-scale rendering keeps its cells' run records beside the table (results/tables/<t>/paper/records/), and
``restore=true`` brings them back into a ledger that lost them (reproduce/runs/archive.py): a lost run directory
must not lose a finished paper row, nor freeze its table."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import repdegen.reproduce.results.table_render as table_render
import repdegen.reproduce.runs.tables as table_mod
from hydra import initialize_config_dir
from repdegen.reproduce.errors import UserError
from repdegen.reproduce.runs.archive import archive_records, archived_records, restore_records, restored_from
from repdegen.reproduce.settings.config import CONF_DIR

from tests.test_table import compose_app


def record(h: str, started: str = "2026-11-27T10:00:00", status: str = "complete", **extra) -> dict:
    return {"config_hash": h, "status": status, "config": {"seed": 1}, "started": started,
            "metrics": {"final": {"valid_ppl": 90.5}}, **extra}


def test_archive_keeps_the_ledger_record_and_its_analyses_and_never_overwrites_another_run(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "tables" / "t1" / "paper"
    (runs / "aaaa" / "analysis").mkdir(parents=True)
    (runs / "aaaa" / "analysis" / "continuations_8.json").write_text(json.dumps({"mean_uniq": 3.0}))
    rendered = [dict(record("aaaa"), _row_label="row", _seed=None), record("bbbb", status="running")]
    written = archive_records(out, rendered, runs)
    text = (out / "records" / "aaaa" / "result.json").read_text()
    kept = json.loads(text)
    assert kept == record("aaaa")  # the rendering's own keys (_row_label, ...) are not part of the record
    assert text == json.dumps(record("aaaa"), separators=(",", ":")) + "\n"  # committed: compact, one line
    assert json.loads((out / "records" / "aaaa" / "analysis" / "continuations_8.json").read_text()) == {"mean_uniq": 3.0}
    assert not (out / "records" / "bbbb").exists()  # only complete cells
    assert len(written) == 2 and archive_records(out, rendered, runs) == []  # the same again: nothing rewritten
    # the cell trained again (another start) after a ledger was lost: the archived run is kept beside the new one
    archive_records(out, [record("aaaa", started="2026-11-29T08:00:00")], runs)
    assert json.loads((out / "records" / "aaaa" / "result.json").read_text())["started"] == "2026-11-29T08:00:00"
    assert json.loads((out / "records" / "aaaa" / "result.2026-11-27T100000.json").read_text()) == record("aaaa")
    assert archived_records(tmp_path / "tables") == {"aaaa": out / "records" / "aaaa"}


def test_restore_fills_only_what_the_ledger_lacks(tmp_path):
    tables, runs = tmp_path / "tables", tmp_path / "runs"
    archive_records(tables / "t1" / "paper", [record("aaaa"), record("bbbb"), record("cccc")], runs)
    (runs / "bbbb").mkdir(parents=True)  # partial, resumable: left to its trainer
    (runs / "bbbb" / "result.json").write_text(json.dumps(record("bbbb", status="preempted")))
    cells = [SimpleNamespace(config_hash=h, label=f"row {h}") for h in ("aaaa", "bbbb", "dddd")]
    said = []
    assert restore_records(tables, runs, cells, log=said.append) == ["aaaa"]
    assert json.loads((runs / "aaaa" / "result.json").read_text()) == record("aaaa")
    assert json.loads((runs / "bbbb" / "result.json").read_text())["status"] == "preempted"
    assert not (runs / "dddd").exists() and not (runs / "cccc").exists()  # cccc: not a cell asked for
    assert restored_from(runs / "aaaa") == str(tables / "t1" / "paper" / "records" / "aaaa")
    assert restored_from(runs / "bbbb") is None
    assert len(said) == 1 and "row aaaa [aaaa]" in said[0] and "weights are not on this machine" in said[0]
    assert restore_records(tables, runs, cells, log=said.append) == []  # the ledger holds it now


@pytest.mark.parametrize("bad", ['{"config_hash": "aa', "other-hash", "running"], ids=["truncated", "misfiled", "partial"])
def test_a_bad_archived_record_is_an_error_naming_it_and_nothing_is_restored(bad, tmp_path):
    tables, runs = tmp_path / "tables", tmp_path / "runs"
    archive_records(tables / "t1" / "paper", [record("aaaa"), record("bbbb")], runs)
    path = tables / "t1" / "paper" / "records" / "bbbb" / "result.json"
    if bad == "other-hash":
        path.write_text(json.dumps(record("cccc")))
    elif bad == "running":
        path.write_text(json.dumps(record("bbbb", status="running")))
    else:
        path.write_text(bad)
    cells = [SimpleNamespace(config_hash=h, label=h) for h in ("aaaa", "bbbb")]
    with pytest.raises(UserError) as err:
        restore_records(tables, runs, cells)
    assert str(path) in str(err.value) and "git checkout" in str(err.value)
    assert not runs.exists()  # checked before anything is copied


def test_a_lost_ledger_is_restored_and_renders_the_same_table(tiny_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(table_render, "ARCHIVED_SCALES", ("smoke",))  # paper's behaviour, at a scale a test can train
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app("gao2019_t1", "smoke", tmp_path, tiny_data)
        assert table_mod.run_table(app) == 0
        out = Path(app.paths.tables_dir) / "gao2019_t1" / "smoke"
        runs = Path(app.paths.runs_dir)
        hashes = sorted(p.name for p in (out / "records").iterdir())
        assert len(hashes) == 2
        for h in hashes:
            assert json.loads((out / "records" / h / "result.json").read_text()) == json.loads(
                (runs / h / "result.json").read_text())
        table = (out / "table.csv").read_text()
        shutil.rmtree(runs)  # the work tree lost between sessions; results/ was committed
        app.render_only = True
        capsys.readouterr()
        assert table_mod.run_table(app) == 2  # the rendering is left as it is, and says how to bring them back
        said = capsys.readouterr().out
        assert "left it as it is" in said and "lacks 2 of its cells" in said and "render_only=true restore=true" in said
        app.restore = True
        assert table_mod.run_table(app) == 0
        said = capsys.readouterr().out
        assert "2 run record(s) restored" in said and said.count("restored its run record from") == 2
        assert (out / "table.csv").read_text() == table  # the same numbers, from the restored records
        rows = list(csv.DictReader(io.StringIO(table)))
        assert sum(r["status"] == "complete" for r in rows) == 6
        app.render_only, app.restore = False, False
        assert table_mod.run_table(app) == 0  # complete: nothing is trained again
        assert "2 cells, 2 already complete, 0 to run" in capsys.readouterr().out


def test_a_restored_run_without_its_analyses_is_skipped_with_a_reason_not_loaded(tmp_path, capsys):
    from omegaconf import OmegaConf
    from repdegen.reproduce.runs.ledger import Ledger

    tables, runs = tmp_path / "tables", tmp_path / "runs"
    archive_records(tables / "t1" / "paper", [record("aaaa"), record("bbbb")], runs)
    kept = tables / "t1" / "paper" / "records" / "bbbb" / "analysis" / "continuations_8.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"mean_uniq": 3.0, "uniq_total": 40, "n": 8, "computed": "2026-11-27T12:00:00"}))
    cpu = OmegaConf.create({"trainer": {"device": "cpu"}})
    cells = [SimpleNamespace(config_hash=h, label=f"row {h}", cfg=cpu) for h in ("aaaa", "bbbb")]
    restore_records(tables, runs, cells, log=lambda _: None)
    app = OmegaConf.create({"table": {"name": "t1", "analyses": {"continuations": 8}}})
    table_mod.analyse_cells(app, cells, Ledger(runs))  # no weights here: loading them would raise
    said = capsys.readouterr().out
    assert "row aaaa [aaaa] was restored" in said and "analysis columns stay empty" in said and "bbbb" not in said
    from repdegen.reproduce.runs.trained import analysis_values

    assert analysis_values(runs / "bbbb", app.table.analyses)[0] == {"cont_uniq_mean": 3.0, "cont_uniq_total": 40.0}


def test_a_recovered_record_never_takes_the_weights_in_its_run_directory(tmp_path):
    import torch
    from repdegen.reproduce.runs.archive import output_embedding

    run = tmp_path / "aaaa"
    run.mkdir()
    w = torch.arange(12.0).reshape(4, 3)
    torch.save({"model": {"embedding.weight": w}}, run / "best.pt")
    torch.save(torch.tensor([5, 3, 2, 1]), run / "vocab_counts.pt")
    found = output_embedding(run, record("aaaa"))
    assert torch.equal(found[0], w) and found[1].tolist() == [5, 3, 2, 1]
    # rebuilt from a rendering, its weights are gone: these are a retrain's, of another run
    assert output_embedding(run, record("aaaa", recovered={"from": "table.csv", "commit": "abc"})) is None


def test_status_lists_a_restored_run_with_where_it_came_from(tmp_path):
    from repdegen.reproduce.runs.status import collect, format_row

    tables, runs = tmp_path / "tables", tmp_path / "runs"
    recovered = record("aaaa", recovered={"from": "table.csv", "commit": "abc"}, history=[])
    recovered["metrics"]["final"]["test_ppl"] = 87.25
    archive_records(tables / "t1" / "paper", [recovered], runs)
    restore_records(tables, runs, [SimpleNamespace(config_hash="aaaa", label="row")], log=lambda _: None)
    (row,) = collect(runs, include_complete=True)
    text = format_row(row)
    assert "complete" in text and "no epoch finished" not in text
    assert f"restored from {tables / 't1' / 'paper' / 'records' / 'aaaa'}" in text and "history lost" in text
    assert "valid_ppl 90.50, test_ppl 87.25" in text


def test_the_report_shows_the_figures_kept_from_before_a_recovery(tmp_path):
    from repdegen.reproduce.results.report_inputs import kept_figures

    out = tmp_path / "tables" / "t1" / "paper"
    kept = out / "records" / "figures-abc123"
    kept.mkdir(parents=True)
    for name in ("svd_projection", "curves"):
        (kept / f"{name}.png").write_bytes(b"\x89PNG")
    (kept / "captions.json").write_text(json.dumps({"curves": "Validation [PPL]", "svd_projection": "SVD"}))
    lines = kept_figures(out, tmp_path / "tables" / "t1")
    images = [x for x in lines if x.startswith("![")]
    assert images == ["![Validation \\[PPL\\]](paper/records/figures-abc123/curves.png)",
                      "![SVD](paper/records/figures-abc123/svd_projection.png)"]  # in the rendering's order
    assert "commit `abc123`" in lines[0]
    (kept / "captions.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="captions.json: expected a JSON object of figure name"):
        kept_figures(out, tmp_path / "tables" / "t1")
    assert kept_figures(tmp_path / "elsewhere", tmp_path) == []
