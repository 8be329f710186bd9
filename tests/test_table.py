"""Tables: every table composes at every scale; a smoke table runs end to end on the tiny corpus,
renders paper and ours side by side, is not re-run, and survives a failing cell."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
import repdegen.reproduce.runs.execute as train_mod
from hydra import compose, initialize_config_dir
from repdegen.reproduce.results.render import RenderedRow, to_csv, to_latex, to_markdown
from repdegen.reproduce.runs.cells import expand_cells
from repdegen.reproduce.runs.tables import run_table
from repdegen.reproduce.settings.config import CONF_DIR

TABLES = sorted(p.stem for p in (CONF_DIR / "table").glob("*.yaml"))


KNOWN_METRICS = (
    "params", "valid_ppl", "test_ppl", "bleu", "bleu_tok", "uniq", "isotropy", "cos_rare_frequent", "subspace_distance",
    *(f"{m}_{g}" for m in ("ppl", "uniq", "isotropy") for g in ("frequent", "medium", "rare")),
    *(f"wordsim_{d}" for d in ("men", "ws353", "rg65", "rw")),
    "cont_uniq_mean", "cont_uniq_total",  # a table's analyses (reproduce/runs/trained.py)
)


def compose_app(table: str, scale: str, tmp_path: Path, data_dir: Path | None = None):
    app = compose("table_app", overrides=[f"table={table}", f"scale={scale}", f"paths.output_dir={tmp_path}/out",
                                         f"paths.tables_dir={tmp_path}/tables", "launch.backend=inline", "progress=false"])
    app.overrides = [f"dataset.data_dir={data_dir or tmp_path}", "trainer.progress=false", "trainer.cache.bptt=50"]
    return app


GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("scale", ["paper", "lite", "smoke"])
def test_every_table_expands_at_every_scale(table, scale, tmp_path):
    """The table's cells at each scale, read from the golden index (tests/golden/cells.json), which
    tests/test_golden_configs.py holds equal to what every cell composes to now (composing them all again here
    would double the suite's longest work): one cell per row and seed, at this scale."""
    import yaml

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app(table, scale, tmp_path)
    index = json.loads((GOLDEN / "cells.json").read_text())
    entries = index.get(f"table/{table}/{scale}", [])
    hashes = {e["hash"] for e in entries}
    rows_at_scale = [r for r in app.table.rows if r.experiment and (r.scales is None or scale in r.scales)]
    seeds = len(app.table.seeds.get(scale) or [None])
    # one cell per row and seed (rows of one run share a cell); a table may run no row at lite (inan2017_t2)
    assert len(hashes) <= len(rows_at_scale) * seeds and (len(hashes) > 0) == (len(rows_at_scale) > 0)
    assert scale == "lite" or rows_at_scale, f"{table} runs no row at {scale}"
    for h in hashes:
        view = yaml.safe_load((GOLDEN / "configs" / f"{h}.yaml").read_text())
        assert view["scale"]["name"] == scale
    for col in app.table.columns:
        assert col in KNOWN_METRICS
    for row in app.table.rows:
        # a training session before re-training (Inan 2017 footnote 5) is ours only: the paper reports the last,
        # and a figure's points (table.figure) carry the paper's numbers only where its text states one
        assert row.paper or row.stage.startswith("session") or app.table.figure, \
            f"{table}: row {row.label!r} has no paper numbers"
        assert row.stage in ("final", "finetune", "cache") or re.fullmatch(r"session[1-9]", row.stage)


def test_rows_selects_the_cells_to_run_and_names_bad_rows(tmp_path):
    from repdegen.reproduce.errors import ConfigError
    from repdegen.reproduce.runs.cells import selected_cells

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app("inan2017_t1", "paper", tmp_path)
        cells = expand_cells(app)
        assert selected_cells(app, cells) == cells  # rows unset: every cell
        app.rows = ["Small (200 units) / VD-LSTM+RE", "Medium (650 units) / VD-LSTM"]
        chosen = selected_cells(app, cells)
        labels = {(app.table.rows[i].group, app.table.rows[i].label) for c in chosen for i in c.rows}
        # the small RE cell also carries its first-session row (the same cell, stage session1)
        assert labels == {("Small (200 units)", "VD-LSTM+RE"), ("Small (200 units), first session", "VD-LSTM+RE"),
                          ("Medium (650 units)", "VD-LSTM")}
        app.rows = ["VD-LSTM"]  # in several groups: the error says to name the group
        with pytest.raises(ConfigError, match="in several groups"):
            selected_cells(app, cells)
        lite = compose_app("inan2017_t1", "lite", tmp_path)
        lite.rows = ["Medium (650 units) / VD-LSTM"]
        with pytest.raises(ConfigError, match="not run at scale=lite"):
            selected_cells(lite, expand_cells(lite))


def test_table_cells_dedupe_rows_of_one_run(tmp_path):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cells = expand_cells(compose_app("gao2019_t1", "paper", tmp_path))
    assert len(cells) == 2 and sorted(len(c.rows) for c in cells) == [3, 3]


def test_smoke_table_end_to_end(tiny_data, tmp_path, capsys):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app("gao2019_t1", "smoke", tmp_path, tiny_data)
        assert run_table(app) == 0
        out = Path(app.paths.tables_dir) / "gao2019_t1" / "smoke"
        md = (out / "table.md").read_text()
        # the paper's numbers, ours, and the scale/commit/hardware header
        assert "| MLE-CosReg (w.t. finetune) | 24.0 (+0.0) |" in md and "67.1" in md and "64.1" in md
        assert "Scale: `smoke`" in md and "Commit:" in md and "Hardware:" in md
        rows = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
        assert len(rows) == 7 and rows[0]["status"] == "paper-only"
        ours = [r for r in rows if r["status"] == "complete"]
        assert len(ours) == 6 and all(float(r["test_ppl_ours"]) > 1 for r in ours)
        assert float(ours[0]["params_ours"]) < 1  # smoke width: a tiny model
        # finetune and cache rows come from the same run's later stages
        assert ours[0]["config_hash"] == ours[1]["config_hash"] == ours[2]["config_hash"]
        assert ours[0]["test_ppl_ours"] != ours[2]["test_ppl_ours"]
        assert "\\begin{tabular}" in (out / "table.tex").read_text()
        assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # the claims section: shown, marked not meaningful at smoke, decided on the cells' own numbers
        assert "### Claims (Gao et al. (2019), Table 1) — **not meaningful at smoke**" in md
        assert "Claims (scale: smoke) --- not meaningful at smoke" in (out / "table.tex").read_text()
        claims = json.loads((out / "claims.json").read_text())["claims"]
        assert len(claims) == len(app.table.claims) >= 1
        # decided, or – where the tiny corpus leaves a metric undefined (a group under 50 rows); none changed after run
        assert all(c["state"] in ("holds", "fails", "tie", "undecided") and c["registration"] is None for c in claims)
        assert sum(c["state"] != "undecided" for c in claims) >= 3
        by_label = {r["label"]: r for r in rows}
        first = claims[0]["checks"][0]  # CosReg lowers test PPL (w.o. finetune), as the table's own cells say
        mle, cos = (float(by_label[k]["test_ppl_ours"]) for k in (first["than"], first["row"]))
        assert first["ours_than"] == [pytest.approx(mle)] and first["ours_row"] == [pytest.approx(cos)]
        # one seed: the margin is the stated 1 % of the baseline's PPL
        assert first["effective_margin"] == pytest.approx(0.01 * mle) and first["difference"] == pytest.approx(mle - cos)
        assert claims[0]["state"] == ("holds" if mle - cos > 0.01 * mle else "fails" if cos - mle > 0.01 * mle else "tie")
        claim_rows = list(csv.DictReader(io.StringIO((out / "claims.csv").read_text())))
        assert {r["claim"] for r in claim_rows} == {c["text"] for c in claims}
        capsys.readouterr()
        assert run_table(app) == 0  # again: nothing to run
        assert "2 cells, 2 already complete, 0 to run" in capsys.readouterr().out
        # the claims and cells were registered before the cells ran; a claim edited now renders changed after run
        reg = json.loads((out / "registration.json").read_text())
        assert len(reg["claims"]) == len(app.table.claims) and len(reg["cells"]) == 2
        app.table.claims[0].checks[0].margin = 0.2
        app.render_only = True
        assert run_table(app) == 0
        claims = json.loads((out / "claims.json").read_text())["claims"]
        assert claims[0]["mark"] == "⚠" and "changed after run" in claims[0]["registration"]
        assert all(c["registration"] is None for c in claims[1:])
        assert "⚠ changed after run" in (out / "table.md").read_text()


def test_a_failing_cell_does_not_stop_the_others(tiny_data, tmp_path, monkeypatch):
    real_train = train_mod.train

    def flaky(spec):  # a cell's process trains the RunSpec its table wrote
        if spec.cfg.objective.name == "al":
            raise RuntimeError("boom")
        return real_train(spec)

    monkeypatch.setattr(train_mod, "train", flaky)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose_app("inan2016_t1", "smoke", tmp_path, tiny_data)
        assert run_table(app) == 1
    md = (Path(app.paths.tables_dir) / "inan2016_t1" / "smoke" / "table.md").read_text()
    assert "(not run)" in md or "(failed)" in md
    assert md.count("| 200 hidden units") == len(app.table.rows) and "98.2" in md  # every row, failed or not


def test_command_line_splits_cell_overrides():
    from repdegen.reproduce.table import split_cell_args

    own, cell = split_cell_args(["table=x", "scale=lite", "trainer.device=cuda", "logger=wandb", "+model.foo=1",
                                 "paths.output_dir=o", "render_only=true", "seed=3", "scale.max_epochs=2"])
    assert own == ["table=x", "scale=lite", "paths.output_dir=o", "render_only=true", "scale.max_epochs=2"]
    assert cell == ["trainer.device=cuda", "logger=wandb", "+model.foo=1", "seed=3", "scale.max_epochs=2"]


def test_render_formats_deltas_and_groups():
    rows = [RenderedRow("A", "G1", {"test_ppl": 80.0}, {"test_ppl": 82.25}, "complete", config_hash="h1"),
            RenderedRow("B", "G1", {"test_ppl": 90.0}, {"test_ppl": 88.0}, "complete", config_hash="h2"),
            RenderedRow("C", "G2", {"test_ppl": 70.0}, {}, "paper-only")]
    meta = {"source": "S", "scale": "lite", "git": {"commit": "abc"}, "hardware": "hw", "wall_time": "1m", "generated": "now"}
    md = to_markdown("T", ["test_ppl"], rows, meta, ["a note"])
    # perplexities below 100 keep two decimals (Yu et al. print 15.51), others one; Δ as the values
    assert "| A | 80.00 | 82.25 (+2.25) |" in md and "| B | 90.00 | 88.00 (−2.00) |" in md and "| C | 70.00 | – |" in md
    assert "| Model | Test PPL (paper) | Test PPL (ours) |" in md and "In brackets (Δ): ours minus the paper's." in md
    wide = to_markdown("T", ["test_ppl", "uniq", "isotropy_rare"],
                       [RenderedRow("D", None, {"test_ppl": 224.24, "uniq": 13143.0, "isotropy_rare": 0.198},
                                    {"test_ppl": 1234.5, "uniq": 97.0, "isotropy_rare": 0.81349}, "complete")], meta, [])
    assert "| D | 224.2 | 1234 (+1010) | 13143 | 97 (−13046) | 0.198 | 0.813 (+0.615) |" in wide
    assert md.count("**G1**") == 1 and "- a note" in md
    parsed = list(csv.DictReader(io.StringIO(to_csv(["test_ppl"], rows))))
    assert float(parsed[0]["test_ppl_delta"]) == pytest.approx(2.25)
    tex = to_latex("T", ["test_ppl"], rows, meta)
    assert "A & 80.00 & 82.25 & +2.25" in tex and "C & 70.00 & -- &" in tex


def test_render_shows_a_diverged_value_rather_than_a_blank():
    """A non-finite metric (a run whose PPL overflowed, a seed spread with one nan run) is printed as such; only a
    missing value is "–" (not run)."""
    rows = [RenderedRow("MLE", None, {"test_ppl": 80.0}, {"test_ppl": 82.0}, "complete"),
            RenderedRow("X", None, {"test_ppl": 90.0}, {"test_ppl": float("inf")}, "complete", extra={"baseline": 0}),
            RenderedRow("Y", None, {"test_ppl": 85.0}, {"test_ppl": 84.0}, "complete",
                        extra={"sd": {"test_ppl": float("nan")}, "baseline": 0})]
    meta = {"source": "S", "scale": "lite", "git": {"commit": "abc"}, "hardware": "hw", "wall_time": "1m", "generated": "now"}
    assert "| X | 90.00 (+10.00) | inf (inf) |" in to_markdown("T", ["test_ppl"], rows, meta, [], relative=True)
    assert "| Y | 85.00 (+5.00) | 84.00 ± nan (+2.00) |" in to_markdown("T", ["test_ppl"], rows, meta, [], relative=True)
    assert "| X | 90.00 | inf (inf) |" in to_markdown("T", ["test_ppl"], rows, meta, [])


def test_render_header_names_every_commit_the_cells_ran_at():
    rows = [RenderedRow("A", None, {"test_ppl": 80.0}, {"test_ppl": 82.25}, "complete")]
    meta = {"source": "S", "scale": "lite", "hardware": "hw", "wall_time": "1m", "generated": "now",
            "git": {"commit": "9595316621c69b15000440dc7c77eb71d88e8a97+cf96068844098e6912dd6e61226535ed15d46ee9"}}
    assert "Commit: `9595316621+cf96068844`." in to_markdown("T", ["test_ppl"], rows, meta, [])
    meta["git"] = {"commit": "abcdef0123456789", "dirty": True}
    assert "Commit: `abcdef0123 (uncommitted changes)`." in to_markdown("T", ["test_ppl"], rows, meta, [])


def test_header_commit_and_dirty_flag_come_from_the_cells_records(monkeypatch):
    """A cell trained on a dirty tree keeps "uncommitted changes" in the header when a clean tree at another
    commit re-renders it (it used to drop the flag); several commits are all named; any dirty cell marks the table."""
    import repdegen.reproduce.results.provenance as tables

    monkeypatch.setattr(tables, "git_commit", lambda: {"commit": "ffff000011112222", "dirty": False})
    dirty = {"git": {"commit": "30bba3bdbde4b9f1", "dirty": True}}
    clean = {"git": {"commit": "760a1f4bf9758e75", "dirty": False}}
    assert tables.records_git([dirty]) == {"commit": "30bba3bdbde4b9f1", "dirty": True}
    assert tables.records_git([clean]) == {"commit": "760a1f4bf9758e75", "dirty": False}
    assert tables.records_git([clean, dirty, clean]) == {"commit": "30bba3bdbd+760a1f4bf9", "dirty": True}
    assert tables.records_git([]) == {"commit": "ffff000011112222", "dirty": False}
    # a cell resumed at another commit: its starts name both, the clean latest one does not hide the dirty first one
    resumed = {"git": clean["git"], "starts": [dirty, clean, clean]}
    assert tables.records_git([resumed]) == {"commit": "30bba3bdbd+760a1f4bf9", "dirty": True}
    assert tables.cell_provenance(dict(resumed, history=[]))["commit"] == "30bba3bdbd+dirty, 760a1f4bf9"
    # a start whose only uncommitted changes were rendered results says so, here and in the header
    rerendered = {"git": {"commit": "30bba3bdbde4b9f1", "dirty": True, "changed": ["results/tables/t/paper/table.md"]}}
    assert tables.cell_provenance(dict(rerendered, history=[]))["commit"] == "30bba3bdbd+dirty (results/ only)"
    head = tables.records_git([rerendered, clean])
    assert head["changed"] == ["results/tables/t/paper/table.md"]
    rows = [RenderedRow("A", None, {"test_ppl": 80.0}, {"test_ppl": 82.25}, "complete")]
    meta = {"source": "S", "scale": "paper", "hardware": "hw", "wall_time": "1m", "generated": "now", "git": head}
    assert "Commit: `30bba3bdbd+760a1f4bf9 (uncommitted changes in results/ only)`." in to_markdown("T", ["test_ppl"], rows,
                                                                                                     meta, [])
    code = {"git": {"commit": "30bba3bdbde4b9f1", "dirty": True, "changed": ["losses/al.py", "results/x.md"]}}
    assert tables.cell_provenance(dict(code, history=[]))["commit"] == "30bba3bdbd+dirty"
    assert "(uncommitted changes)`" in to_markdown("T", ["test_ppl"], rows, dict(meta, git=tables.records_git([code])), [])


def test_paper_rendering_names_each_cells_sessions_machine_and_commit():
    """A hand-made record of a cell retrained in a second session (footnote 5): 3 + 2 epochs, 1 h 1 min in all, on a
    CPU at a dirty commit; the Cells section and cells.json's provenance say so."""
    from repdegen.reproduce.results.provenance import cell_provenance

    history = [{"stage": "train", "epoch": e, "session": s} for s, n in ((1, 3), (2, 2)) for e in range(1, n + 1)]
    history += [{"stage": "test", "epoch": 2, "session": 2}]
    record = {"_row_label": "Small / VD-LSTM+RE", "_seed": None, "config_hash": "bdb22f8f3bb3e644",
              "history": history, "wall_time_s": 3660.0, "started": "2026-11-26T23:57:56",
              "git": {"commit": "476c724308aaaa", "dirty": True},
              "hardware": {"device": "cpu", "cpu": "Intel Xeon", "torch_threads": 1, "torch": "2.13.0+cpu"}}
    p = cell_provenance(record)
    assert p["epochs"] == [3, 2] and p["wall_time"] == "1h01m" and p["commit"] == "476c724308+dirty"
    assert p["hardware"] == "CPU: Intel Xeon x1 threads (torch 2.13.0+cpu)"
    rows = [RenderedRow("A", None, {"test_ppl": 80.0}, {"test_ppl": 82.25}, "complete")]
    meta = {"source": "S", "scale": "paper", "git": {"commit": "abc"}, "hardware": "hw", "wall_time": "1m",
            "generated": "now"}
    md = to_markdown("T", ["test_ppl"], rows, meta, [], cells=[p])
    assert md.rstrip().endswith("| Small / VD-LSTM+RE | preset's | `bdb22f8f3bb3e644` | 3 + 2 | 1h01m | CPU: Intel Xeon "
                                "x1 threads (torch 2.13.0+cpu) | `476c724308+dirty` | 2026-11-26T23:57:56 |")
    assert "### Cells" not in to_markdown("T", ["test_ppl"], rows, meta, [])
    assert cell_provenance({"config_hash": "x"})["hardware"] == "n/a"


def test_cells_json_gives_each_seed_its_own_status():
    """A row with one seed complete, one running, one interrupted and one not run: the row's status is the worst
    (running), and cells.json lists each seed with its own."""
    from omegaconf import OmegaConf
    from repdegen.reproduce.results.table_render import cell_index, collect_rows
    from repdegen.reproduce.runs.cells import Cell

    class Ledger:  # the ledger's two reads collect_rows makes
        records = {"h2": {"status": "running"}, "h3": {"status": "interrupted"}}

        def load(self, h):
            return self.records.get(h)

        def run_dir(self, h):
            return Path("/nonexistent") / h

    app = OmegaConf.create({"scale": {"name": "paper"}, "table": {"columns": ["test_ppl"], "rows": [
        {"label": "A", "group": None, "paper": {"test_ppl": 80.0}, "experiment": "e", "stage": "test",
         "note": None}]}})
    cells = [Cell([0], "A", OmegaConf.create({}), f"h{s}", seed=s) for s in (1, 2, 3, 4)]
    done = {"status": "complete", "metrics": {"test": {"test_ppl": 81.0}}, "parameters": {"total": 1e6}}
    Ledger.records["h1"] = done
    rows, records = collect_rows(app, cells, Ledger())
    assert rows[0].status == "running" and len(records) == 1
    index = cell_index(rows, "runs")
    assert [(c["seed"], c["status"]) for c in index] == [(1, "complete"), (2, "running"), (3, "interrupted"),
                                                        (4, "missing")]
    assert index[1]["run_dir"] == str(Path("runs") / "h2")


def test_render_at_lite_shows_the_change_against_the_baseline_and_seeds():
    base = RenderedRow("MLE", None, {"test_ppl": 87.3}, {"test_ppl": 141.2}, "complete", config_hash="h1+h2",
                       extra={"sd": {"test_ppl": 0.6}, "n_seeds": 2, "n_done": 2})
    new = RenderedRow("REAL", None, {"test_ppl": 82.7}, {"test_ppl": 133.9}, "complete", config_hash="h3+h4",
                      extra={"sd": {"test_ppl": 0.4}, "n_seeds": 2, "n_done": 2, "baseline": 0})
    half = RenderedRow("AL", None, {"test_ppl": 82.9}, {"test_ppl": 140.0}, "missing", extra={"n_seeds": 2, "n_done": 1,
                                                                                              "baseline": 0})
    skipped = RenderedRow("RE", None, {"test_ppl": 85.1}, {}, "not-at-scale", extra={"scale": "lite", "baseline": 0})
    rows = [base, new, half, skipped]
    meta = {"source": "S", "scale": "lite", "git": {"commit": "abc"}, "hardware": "hw", "wall_time": "1m",
            "generated": "now", "seeds": [1, 2], "differences": "Ours ran: ptb, vocabulary 10,000."}
    md = to_markdown("T", ["test_ppl"], rows, meta, [], relative=True)
    # REAL - MLE: paper 82.7 - 87.3 = -4.6, ours 133.9 - 141.2 = -7.3 (at the sd's 2 decimals: 0.40)
    assert "| REAL | 82.70 (−4.60) | 133.90 ± 0.40 (−7.30) |" in md
    assert "| MLE | 87.30 | 141.20 ± 0.60 |" in md
    assert "| AL (1/2 seeds) |" in md and "| RE (paper only at lite) | 85.10 (−2.20) | – |" in md
    assert "In brackets (Δ base): the row minus its baseline row (MLE;" in md
    assert "Seeds: 1, 2 (ours = mean ± sd)" in md
    assert "Not the paper's setting: Ours ran: ptb, vocabulary 10,000." in md
    parsed = list(csv.DictReader(io.StringIO(to_csv(["test_ppl"], rows))))
    assert float(parsed[1]["test_ppl_vs_base_ours"]) == pytest.approx(-7.3)
    assert float(parsed[1]["test_ppl_vs_base_paper"]) == pytest.approx(-4.6)
    assert float(parsed[1]["test_ppl_sd"]) == pytest.approx(0.4)
    assert "REAL & 82.70 & 133.90 $\\pm$ 0.40 & -4.60 & -7.30" in to_latex("T", ["test_ppl"], rows, meta, relative=True)


def test_table_cli_renders(tmp_path, tiny_data):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "repdegen.reproduce.table", "table=inan2016_t1", "scale=smoke",
                          "render_only=true",
                          f"paths.output_dir={tmp_path}/o", f"paths.tables_dir={tmp_path}/t", f"hydra.run.dir={tmp_path}/h",
                          f"dataset.data_dir={tiny_data}", "trainer.progress=false"],
                         cwd=repo, capture_output=True, text=True, timeout=120)
    # nothing has run: the table renders with "(not run)" marks and the exit status says so
    assert out.returncode == 1, out.stderr[-2000:]
    assert "(not run)" in out.stdout and (tmp_path / "t" / "inan2016_t1" / "smoke" / "table.md").is_file()
    # a render-only pass never records itself as the command that trains the cells: it keeps the one there
    cells_json = tmp_path / "t" / "inan2016_t1" / "smoke" / "cells.json"
    first = json.loads(cells_json.read_text())
    assert first["command"] == "repdegen table table=inan2016_t1 scale=smoke"
    assert "render_only=true" in first["rendered_by"]
    trained = "repdegen table table=inan2016_t1 scale=smoke launch.parallel=2"
    cells_json.write_text(json.dumps(dict(first, command=trained)))
    again = subprocess.run(out.args, cwd=repo, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1, again.stderr[-2000:]
    second = json.loads(cells_json.read_text())
    assert second["command"] == trained and "render_only=true" in second["rendered_by"]


def test_mean_sd_prints_two_significant_figures_of_the_sd():
    from repdegen.reproduce.results.metrics import metric, sd_places

    ppl, ratio, count = metric("valid_ppl"), metric("isotropy"), metric("uniq")
    # worked by hand: sd 9.46 -> 9.5 (1 decimal), the mean to 1 decimal
    assert ppl.format_mean_sd(213.4, 9.46) == "213.4 ± 9.5"
    assert ratio.format_mean_sd(0.627, 0.00686) == "0.6270 ± 0.0069"
    assert count.format_mean_sd(27063, 587.9) == "27060 ± 590"  # to tens
    assert ppl.format_mean_sd(1.0, 9.96) == "1 ± 10"  # 9.96 rounds to 10.0: two figures are "10"
    assert ppl.format_mean_sd(84.0, None) == "84.00" and ppl.format_mean_sd(None, 1.0) == "–"
    assert ppl.format_mean_sd(84.0, float("nan")) == "84.00 ± nan" and ppl.format_mean_sd(5.0, 0.0) == "5.00 ± 0"
    assert [sd_places(x) for x in (0.0123, 0.5, 3.0, 45.0, 999.0, 0.0, None)] == [3, 2, 1, 0, -2, None, None]


def test_markdown_splits_a_wide_table_by_family_and_drops_empty_columns():
    """12 metrics of four families (24 paper/ours columns) -> tables of at most 12 columns, each family whole where
    it fits; a metric the paper does not report loses its paper column, one nobody has is not shown."""
    from repdegen.reproduce.results.render import MAX_COLUMNS

    ppl = ["test_ppl", "ppl_frequent", "ppl_medium", "ppl_rare"]
    uniq = ["uniq", "uniq_frequent", "uniq_medium", "uniq_rare"]
    iso = ["isotropy", "isotropy_frequent", "isotropy_medium", "isotropy_rare"]
    columns = [*ppl, *uniq, *iso, "wordsim_men", "wordsim_rw"]
    paper = {c: 1.0 for c in ppl + uniq + iso}
    ours = {c: 2.0 for c in columns if c != "wordsim_rw"}
    rows = [RenderedRow("MLE", None, paper, ours, "complete"),
            RenderedRow("AGG", None, paper, ours, "complete", extra={"baseline": 0})]
    meta = {"source": "S", "scale": "lite", "git": {"commit": "abc"}, "hardware": "hw", "wall_time": "1m", "generated": "now"}
    md = to_markdown("T", columns, rows, meta, [], relative=True)
    tables = [line for line in md.splitlines() if line.startswith("| Model |")]
    widths = [line.count("|") - 1 for line in tables]
    assert all(w <= MAX_COLUMNS for w in widths), widths
    # every metric's columns appear exactly once over the tables; MEN has no paper value, RW no value at all
    assert sum(w - 1 for w in widths) == 2 * 12 + 1
    assert "MEN (ours)" in md and "MEN (paper)" not in md and "RW" not in md
    assert "**Perplexity**" in md and "**Uniq**" in md and "**Isotropy I(W) · Word similarity**" in md
    # a family that fits stays in one table: the 4 PPL metrics' 8 columns share a table
    assert any(all(f"{label} (ours)" in t for label in ("Test PPL", "PPL frequent", "PPL medium", "PPL rare"))
               for t in tables)


def test_the_tables_paper_lines_are_the_final_rows_printed_validation_ppl_at_paper_only():
    """A run is named in the curves by its (group, label) (a run shared by rows: their common label); its line is the
    paper validation PPL of the final-stage rows of its cell, never a first-session, finetuning or cache row's."""
    from omegaconf import OmegaConf
    from repdegen.reproduce.results.table_render import paper_valid_lines

    rows = OmegaConf.create([
        {"group": "Small", "label": "MLE", "paper": {"valid_ppl": 92.6, "test_ppl": 87.3}},
        {"group": "Small, first session", "label": "MLE", "stage": "session1", "paper": {}},
        {"group": None, "label": "AWD-LSTM (w.o. finetune)", "paper": {"valid_ppl": 69.3}},
        {"group": None, "label": "AWD-LSTM + cache", "stage": "cache", "paper": {"valid_ppl": 53.8}},
        {"group": None, "label": "T", "paper": {"test_ppl": 97.6}}])
    records = [{"_row_group": "Small", "_row_label": "MLE", "_rows": [0, 1]},
               {"_row_group": None, "_row_label": "AWD-LSTM", "_rows": [2, 3]},
               {"_row_group": None, "_row_label": "T", "_rows": [4]}]
    assert paper_valid_lines(rows, records, "paper") == {("Small", "MLE"): 92.6, (None, "AWD-LSTM"): 69.3}
    assert paper_valid_lines(rows, records, "lite") == {} and paper_valid_lines(rows, records, "smoke") == {}
