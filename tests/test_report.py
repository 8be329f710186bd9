"""results/README.md from results/: a tiny ledger (one real smoke cell on the tiny corpus) rendered by
`repdegen.reproduce.table render_only=true` into a tiny results folder -> the report reads that rendering (it composes
nothing), shows paper / ours / delta, links figures that exist, lists what is not reproduced, keeps a committed
rendering verbatim, is idempotent, and --check sees staleness."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from repdegen.reproduce.results import report, report_inputs
from repdegen.reproduce.results.render import _delta, _fmt
from repdegen.reproduce.runs.ledger import Ledger
from repdegen.reproduce.settings.config import CONF_DIR

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = ["trainer.test_batch_size=10"]


@pytest.fixture(scope="module")
def tiny_results(tiny_data, tmp_path_factory):
    """One trained cell of inan2016_t1 at smoke in a tmp ledger, and a results folder holding a committed
    rendering of another table (no ledger entries here), a figure, a benchmark, a sanity check and notes."""
    from repdegen.reproduce.runs.cells import expand_cells
    from repdegen.reproduce.train import train

    root = tmp_path_factory.mktemp("report")
    runs, results = root / "runs", root / "results"
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose("table_app", overrides=["table=inan2016_t1", "scale=smoke", f"paths.runs_dir={runs}",
                                              f"paths.tables_dir={results / 'tables'}"])
        # the data directory and progress bar are not in the config hash; the test batch size is (a faster
        # test pass): the report is given it, as repdegen.reproduce.runs.tables would be
        app.overrides = [f"dataset.data_dir={tiny_data}", "trainer.progress=false", *OVERRIDES]
        cells = expand_cells(app)
    first = cells[0]
    record = train(first.cfg)
    assert record["status"] == "complete"

    committed = results / "tables" / "inan2017_t1" / "smoke"
    committed.mkdir(parents=True)
    for f in ("table.md", "cells.json", "curves.png"):
        shutil.copy(REPO / "results" / "tables" / "inan2017_t1" / "smoke" / f, committed / f)
    fig = results / "figures" / "inan2017_fig1" / "lite"
    fig.mkdir(parents=True)
    shutil.copy(committed / "curves.png", fig / "fig1.png")
    (fig / "fig1.json").write_text("{}")
    (fig / "README.md").write_text("# Figure 1 notes\n\nOne seed per point; see [the data](fig1.json).\n")
    (results / "bench" / "cpu").mkdir(parents=True)
    (results / "bench" / "cpu" / "b.json").write_text(json.dumps({
        "command": "python scripts/bench.py", "git": {"commit": "abcdef1234567"}, "hardware": {"cpu": "X", "torch_threads": 2},
        "results": [{"model": "m", "objective": "mle", "step_time_s": 1.0, "tokens_per_s": 512.0, "step_time_vs_mle": 1.0},
                    {"model": "m", "objective": "cosreg", "step_time_s": 1.54, "tokens_per_s": 332.0,
                     "step_time_vs_mle": 1.54}]}))
    (results / "sanity").mkdir()
    (results / "sanity" / "s.md").write_text("# A sanity check\n\n```\n# not a heading\n```\n")
    (results / "NOTES.md").write_text("# Notes\n\nCAVEAT-SENTINEL: smoke checks plumbing.\n")
    return {"runs": runs, "results": results, "record": record, "cells": cells, "app": app}


def _rerender_and_report(tiny) -> Path:
    """What `make rerender` then `repdegen report` do: the table rendered from the ledger (render only),
    then the README from results/."""
    from repdegen.reproduce.runs.tables import run_tables

    app = tiny["app"].copy()
    app.render_only = True
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        assert run_tables([app]) == 3  # 1 of its 4 cells is complete: the other 3 are reported, not run
    return report.write_report(tiny["results"])


def _links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", text)


def _anchors(text: str) -> set[str]:
    """The anchors GitHub makes for a page's headings (a repeated slug gets -1, -2, ...)."""
    slugs, seen = set(), {}
    for _, _, title in report_inputs._headings(text.splitlines()):
        s = report_inputs.slug(title)
        slugs.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return slugs


def _check_links(results: Path) -> None:
    """Every relative link of every generated page resolves: files, and anchors of headings of the linked page."""
    for page in [results / "README.md", results / "smoke.md", results / "more.md", *results.glob("tables/*/README.md")]:
        if not page.is_file():
            continue
        text = page.read_text()
        for link in _links(text):
            if re.match(r"^[a-z]+:", link):
                continue
            target, _, anchor = link.partition("#")
            path = (page.parent / target).resolve() if target else page
            assert path.exists(), (page, link)
            if anchor:
                assert anchor in _anchors(path.read_text()), (page, link)


def test_report_regenerates_tables_from_the_ledger(tiny_results):
    results, record = tiny_results["results"], tiny_results["record"]
    text = _rerender_and_report(tiny_results).read_text()

    # the index: the headline, then per paper one line per table with its verdict counts per scale and links
    assert re.search(r"\*\*0 of \d+ claims shown at `lite`\*\*", text)
    papers = ("Inan & Khosravi (2016)", "Inan, Khosravi & Socher (2017)", "Gao et al. (2019)", "Yu et al. (2022)")
    order = [text.index(f"\n## {p}") for p in papers]
    assert order == sorted(order)
    line = next(ln for ln in text.splitlines() if "(`inan2016_t1`)" in ln)
    assert line.startswith("| [") and "(tables/inan2016_t1/README.md)" in line and "[rendered](smoke.md#inan2016_t1)" in line
    # tables never rendered: listed with the command that makes them
    not_reproduced = text.split("\n## Not yet reproduced\n")[1].split("\n## ")[0]
    assert "`make reproduce-table TABLE=yu2022_t7 SCALE=lite`" in not_reproduced and "`inan2016_t1`" not in not_reproduced

    # smoke on its own page: the trained cell, the table's baseline, paper and ours (no Δ for the baseline itself);
    # a row not run: the paper's change against the baseline (98.2 - 104.5), ours empty
    smoke = (results / "smoke.md").read_text()
    ours = record["metrics"]["final"]["test_ppl"]
    assert f"| 200 hidden units (keep 0.5) | {_fmt(104.5, 'test_ppl')} | {_fmt(ours, 'test_ppl')} |" in smoke
    assert (f"| 200 hidden units, only augmented KL loss (keep 0.7, alpha 0.3) (not run) | 98.20 "
            f"({_delta(104.5, 98.2, 'test_ppl')}) | – |") in smoke
    assert "Scale: `smoke`" in smoke and "Hardware: CPU" in smoke
    committed_row = next(ln for ln in (results / "tables" / "inan2017_t1" / "smoke" / "table.md").read_text().splitlines()
                         if ln.startswith("| VD-LSTM+REAL |"))
    assert committed_row in smoke  # a committed rendering, kept verbatim

    # the table's page: its claims with their marks at lite and paper (none rendered: "–"), smoke linked
    page = (results / "tables" / "inan2016_t1" / "README.md").read_text()
    verdicts = json.loads((results / "tables" / "inan2016_t1" / "smoke" / "claims.json").read_text())["claims"]
    registered = OmegaConf.load(Path(__file__).parents[1] / "conf" / "table" / "inan2016_t1.yaml").claims
    assert [v["text"] for v in verdicts] == [c.text for c in registered]
    assert all(v["state"] == "undecided" for v in verdicts)
    for v in verdicts:
        assert any(ln.startswith(f"| {v['text']} |") for ln in page.splitlines())
    # a claim for the paper's settings only, or needing rows lite does not run: n/a at lite
    assert "## At `smoke`" in page and "smoke.md#inan2016_t1" in page

    # figures, benchmarks and sanity checks on their page; included files' links made relative to it
    more = (results / "more.md").read_text()
    assert "![inan2017_fig1 (lite): fig1](figures/inan2017_fig1/lite/fig1.png)" in more
    assert "[the data](figures/inan2017_fig1/lite/fig1.json)" in more
    assert "| m | cosreg |  |  | 1.540 | 332 | – | – | 1.54 |" in more
    assert "### A sanity check" in more and "\n# not a heading\n" in more
    assert "CAVEAT-SENTINEL" in (results / "NOTES.md").read_text() and "(NOTES.md)" in text
    for generated in (text, smoke, more, page):
        assert generated.count(report.GENERATED_PREFIX) == 1
    _check_links(results)


def test_a_table_page_links_each_fail_and_tie_to_its_diagnosis(tmp_path):
    """A ✗ or ≈ links to the heading of its diagnosis in the table's NOTES.md ("`<scale>` <mark> <claim text>");
    one without a diagnosis is listed as not yet diagnosed; a ✓ links to the table at its scale."""
    conf = tmp_path / "conf" / "table"
    conf.mkdir(parents=True)
    (conf / "t1.yaml").write_text(
        "name: t1\ntitle: T one\nsource: Someone (2020), Table 1\nrows: [{label: A, experiment: x}, {label: B, experiment: x}]\n"
        "claims:\n"
        "  - {text: first, checks: [{row: B, than: A}]}\n"
        "  - {text: second, checks: [{row: B, than: A}]}\n"
        "  - {text: third, checks: [{row: B, than: A}]}\n"
        "  - {text: fourth, na: {lite: 'a measured reason'}, checks: [{row: B, than: A}]}\n")
    results = tmp_path / "results"
    out = results / "tables" / "t1" / "lite"
    out.mkdir(parents=True)
    (out / "table.md").write_text("## T one\n\n| Model |\n")
    (out / "cells.json").write_text(json.dumps({"cells": [{"status": "complete", "config_hash": "h"}]}))
    claims = [{"text": t, "state": s, "shown": s, "mark": m, "checks": []}
              for t, s, m in (("first", "fails", "✗"), ("second", "tie", "≈"), ("third", "holds", "✓"),
                              ("fourth", "undecided", "–"))]
    (out / "claims.json").write_text(json.dumps({"claims": claims}))
    (results / "tables" / "t1" / "NOTES.md").write_text("# Diagnoses\n\n## `lite` ✗ first\n\nWhy it fails.\n")
    report.write_report(results, tmp_path / "conf")
    page = (results / "tables" / "t1" / "README.md").read_text()
    assert "| first | [✗](#lite--first) | – |" in page  # the heading "`lite` ✗ first" -> anchor "lite--first"
    assert "| third | [✓](#at-lite) | – |" in page
    assert "| fourth | [n/a](#at-lite) | – |" in page  # `na` at lite, with its measured reason: n/a, not –
    assert "Not yet diagnosed: `lite` ≈ second." in page
    assert "Why it fails." in page and page.index("## Verdicts") < page.index("Why it fails.") < page.index("## At `lite`")
    index = (results / "README.md").read_text()
    assert "[1 ✓ · 1 ✗ · 1 ≈ (1 n/a)](tables/t1/README.md#at-lite)" in index
    assert report.check_report(results, tmp_path / "conf") == []
    _check_links(results)


def test_report_is_idempotent_restores_a_deleted_table_and_checks(tiny_results, capsys):
    runs, results = tiny_results["runs"], tiny_results["results"]
    first = _rerender_and_report(tiny_results).read_text()
    table_md = results / "tables" / "inan2016_t1" / "smoke" / "table.md"
    table_md.unlink()
    second = _rerender_and_report(tiny_results).read_text()
    assert table_md.is_file() and "| 200 hidden units (keep 0.5) | 104.5" in table_md.read_text()
    differ = [(a, b) for a, b in zip(first.splitlines(), second.splitlines()) if a != b]
    assert len(first.splitlines()) == len(second.splitlines())
    assert all(a.startswith(report.GENERATED_PREFIX) for a, _ in differ)
    cells = json.loads((table_md.parent / "cells.json").read_text())
    assert cells["command"] == "repdegen table table=inan2016_t1 scale=smoke"  # what trains the cells
    assert "rendered_by" in cells  # how this rendering was made (render only)
    assert Ledger(runs).is_complete(cells["cells"][0]["config_hash"])

    assert report.check_report(results) == [] and report.main(["--check", "--results", str(results)]) == 0
    (results / "README.md").write_text(second.replace("## Gao et al. (2019)", "## edited by hand"))
    assert report.main(["--check", "--results", str(results)]) == 1
    assert "stale" in capsys.readouterr().err
    (results / "README.md").write_text(second)
    (results / "sanity" / "new.md").write_text("# Another check\n")  # a new result file: the README is stale
    assert report.check_report(results)
    (results / "sanity" / "new.md").unlink()


def test_a_render_and_report_of_unchanged_results_change_no_file(tiny_results, monkeypatch, capsys):
    """A second rendering and report at a later time, with nothing changed, leaves every file under results/ byte for
    byte (no timestamp-only diff to commit); a changed input rewrites its page with the new time."""
    import datetime as real_dt

    import repdegen.reproduce.results.table_render as tables_mod

    results = tiny_results["results"]
    _rerender_and_report(tiny_results)
    before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}

    class Later(real_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return real_dt.datetime(2099, 1, 2, 3, 4, 5)

    monkeypatch.setattr(tables_mod, "dt", type("dt", (), {"datetime": Later}))
    monkeypatch.setattr(report, "_generated_line", lambda: "2099-01-02T03:04:05 at commit `later`.")
    _rerender_and_report(tiny_results)
    after = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    assert sorted(after) == sorted(before)
    assert [p for p in before if before[p] != after[p]] == []

    sanity = results / "sanity" / "s.md"
    sanity.write_text(sanity.read_text() + "\nA NEW FINDING.\n")
    _rerender_and_report(tiny_results)
    more = (results / "more.md").read_text()
    assert "A NEW FINDING." in more and "2099-01-02T03:04:05 at commit `later`." in more
    assert (results / "README.md").read_bytes() == before[results / "README.md"]
    table_md = results / "tables" / "inan2016_t1" / "smoke" / "table.md"
    assert table_md.read_bytes() == before[table_md]  # its table did not change: its time stays
    cells = json.loads((table_md.parent / "cells.json").read_text())
    cells["meta"]["wall_time"] = "9h"  # a rendering that differs: the next render writes the new time
    (table_md.parent / "cells.json").write_text(json.dumps(cells))
    _rerender_and_report(tiny_results)
    assert "Generated 2099-01-02T03:04:05." in table_md.read_text()
    capsys.readouterr()
    assert report.main(["--results", str(results)]) == 0
    assert "repdegen: no page under" in capsys.readouterr().out  # says nothing changed rather than "wrote"
    sanity.write_text(sanity.read_text().replace("\nA NEW FINDING.\n", ""))
    assert report.main(["--results", str(results)]) == 0
    said = capsys.readouterr().out
    assert "wrote 1 page(s)" in said and "(more.md)" in said  # the sanity check's page, back without the finding


def test_slug_and_demote():
    assert report_inputs.slug("Inan & Khosravi (2016), Improved learning") == "inan--khosravi-2016-improved-learning"
    assert report_inputs.slug("`inan2016_t1` at scale `smoke`") == "inan2016_t1-at-scale-smoke"
    assert report_inputs.slug("Per-group PPL and I(W) (Yu et al. 2022, Table 2)") == "per-group-ppl-and-iw-yu-et-al-2022-table-2"
    assert report_inputs.demote("# A\n\n## B\n```\n# code\n```", 3) == "### A\n\n#### B\n```\n# code\n```"
    md = "## T\n\nSource: S.\nScale: x. Wall time of the cells: 1m. Generated 2026-01-02T03:04:05.\n\n| a |"
    assert report_inputs.table_md_body(md) == "Source: S.\nScale: x. Wall time of the cells: 1m.\n\n| a |"


def test_the_project_readme_gets_the_claims_headline(tmp_path):
    from repdegen.reproduce.results.report import STATUS_END, STATUS_START, claims_headline, sync_status_line

    results_readme = ("# Reproduced results\n\n## Claims\n\n**3 of 7 claims shown at `lite`** (1 not shown, 3 not yet decided; "
                      "2 more cannot be decided at `lite`).\n\n| Table | Claim |\n")
    assert claims_headline(results_readme).startswith("**3 of 7 claims shown at `lite`** (1 not shown")
    assert claims_headline("# no claims here\n") is None
    project = tmp_path / "README.md"
    project.write_text(f"# repdegen\n\nintro\n{STATUS_START}\nStatus at `lite`: stale\n{STATUS_END}\n\nrest\n")
    assert sync_status_line(project, results_readme)
    text = project.read_text()
    assert "Status at `lite`: **3 of 7 claims shown at `lite`** (1 not shown" in text and "stale" not in text
    assert text.startswith("# repdegen\n\nintro\n") and text.endswith("\n\nrest\n")
    assert not sync_status_line(project, results_readme)  # idempotent
    plain = tmp_path / "other.md"
    plain.write_text("no markers\n")
    assert not sync_status_line(plain, results_readme) and plain.read_text() == "no markers\n"


def test_a_re_rendering_keeps_the_command_that_trained_the_cells(tiny_results):
    """cells.json's `command` stays the one that trained the cells (what a reader reruns) through a render-only
    pass, which says in `rendered_by` how it was made; a cells.json with only a render-only command (older reports)
    gets the table's training command back."""
    from repdegen.reproduce.results.provenance import training_command

    out = tiny_results["results"] / "tables" / "inan2016_t1" / "smoke"
    _rerender_and_report(tiny_results)
    data = json.loads((out / "cells.json").read_text())
    trained = "repdegen table table=inan2016_t1 scale=smoke progress=false"
    data["command"] = trained
    (out / "cells.json").write_text(json.dumps(data))
    _rerender_and_report(tiny_results)
    data = json.loads((out / "cells.json").read_text())
    assert data["command"] == trained and training_command(out / "cells.json") == trained
    assert data["rendered_by"] != trained

    data["command"] = "repdegen table table=inan2016_t1 scale=smoke render_only=true paths.runs_dir=x"
    (out / "cells.json").write_text(json.dumps(data))
    assert training_command(out / "cells.json") is None
    _rerender_and_report(tiny_results)
    assert json.loads((out / "cells.json").read_text())["command"] == "repdegen table table=inan2016_t1 scale=smoke"
    assert training_command(out / "missing" / "cells.json") is None


def test_a_v1_rendering_shows_no_verdict_and_a_claim_na_at_a_scale_is_counted_there(tmp_path):
    """claims.json of the v1 rule (no tie margin: its records lack "shown") gives no verdict in the status table;
    a claim marked na at lite is not one of lite's decidable claims."""
    from omegaconf import OmegaConf
    from repdegen.reproduce.results.report_inputs import _verdicts, claim_scales

    out = tmp_path / "tables" / "t" / "lite"
    out.mkdir(parents=True)
    (out / "table.md").write_text("# t\n")
    (out / "cells.json").write_text(json.dumps({"cells": [{"status": "complete", "config_hash": "h"}]}))
    v1 = {"claims": [{"text": "c", "state": "holds", "mark": "✓", "checks": []}]}
    (out / "claims.json").write_text(json.dumps(v1))
    assert _verdicts(tmp_path, "t", "lite") == {}
    v1["claims"][0]["shown"] = "holds"
    (out / "claims.json").write_text(json.dumps(v1))
    assert _verdicts(tmp_path, "t", "lite")["c"]["state"] == "holds"
    table = OmegaConf.create({"rows": [{"label": "A", "experiment": "x"}, {"label": "B", "experiment": "x"}]})
    claim = OmegaConf.create({"checks": [{"row": "A", "than": "B"}], "na": {"lite": "measured reason"}})
    assert claim_scales(table, claim) == ["paper", "smoke"]


def test_an_orphan_rendering_is_titled_from_its_cells_json_not_its_markdown(tmp_path):
    """The report reads a rendering's structured record (cells.json meta), never parses its Markdown."""
    for name, meta in (("gone_t1", {"title": "From the record", "source": "Someone (2020), Table 1"}), ("gone_t2", None)):
        out = tmp_path / "tables" / name / "lite"
        out.mkdir(parents=True)
        (out / "table.md").write_text("## A Markdown heading the report must not read\n")
        if meta is not None:
            (out / "cells.json").write_text(json.dumps({"cells": [], "meta": meta}))
    found = {t.name: (t.title, t.source) for t in report_inputs.orphan_tables(tmp_path, [])}
    assert found["gone_t1"] == ("From the record (its config is no longer in conf/table)", "Someone (2020), Table 1")
    assert found["gone_t2"] == ("gone_t2 (its config is no longer in conf/table)", "gone")


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line_error(capsys, *words) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out and "wrote" not in captured.out
    assert captured.err.startswith("repdegen: error: ") and captured.err.count("\n") == 1
    for w in words:
        assert w in captured.err, (w, captured.err)
    return captured.err


def test_a_results_folder_that_is_not_one_is_an_error_and_nothing_is_created(tmp_path, capsys):
    """--results naming no folder, or a folder without tables/: exit status 2 naming the path and what was expected;
    the folder is not created and nothing is written into it."""
    missing, empty = tmp_path / "nonexistent", tmp_path / "empty"
    empty.mkdir()
    for argv in ([], ["--check"]):
        assert report.main(["--results", str(missing), *argv]) == 2
        _one_line_error(capsys, f"--results {missing} is not a directory", "expected a results directory holding tables/")
        assert report.main(["--results", str(empty), *argv]) == 2
        _one_line_error(capsys, f"--results {empty} has no tables/ folder")
    assert not missing.exists() and list(empty.iterdir()) == []


def _good_results(root: Path) -> Path:
    """A results folder with one rendering of a real table (inan2017_t1 at lite) and a benchmark."""
    results = root / "results"
    out = results / "tables" / "inan2017_t1" / "lite"
    out.mkdir(parents=True)
    (out / "table.md").write_text("## Inan 2017\n\n| Model | PPL |\n|---|---|\n| A | 1 |\n")
    (out / "table.csv").write_text("group,label,status,config_hash\n,A,complete,h\n")
    (out / "cells.json").write_text(json.dumps({"cells": [{"status": "complete", "config_hash": "h", "label": "A"}],
                                                "command": "repdegen table table=inan2017_t1 scale=lite",
                                                "figures": {"curves": "Validation PPL"}, "meta": {"title": "T"}}))
    (out / "claims.json").write_text(json.dumps({"claims": [{"text": "a claim", "state": "holds", "shown": "holds",
                                                             "mark": "✓", "checks": []}]}))
    (results / "bench" / "cpu").mkdir(parents=True)
    (results / "bench" / "cpu" / "b.json").write_text(json.dumps({"git": {"commit": "abc"}, "results": [
        {"model": "m", "objective": "mle", "step_time_s": 1.0, "tokens_per_s": 5.0, "step_time_vs_mle": 1.0}]}))
    return results


CORRUPT_RENDERINGS = [  # (file under results/, its bad content, words of the message, the fix)
    ("tables/inan2017_t1/lite/cells.json", '{"cells": [{"status": "compl', "invalid JSON",
     "repdegen table table=inan2017_t1 scale=lite render_only=true"),
    ("tables/inan2017_t1/lite/cells.json", '{"cells": [{"status": "complete", "config_hash": "h", "label": 3}]}',
     "the key cells[0].'label' is an integer; expected a string", "render_only=true"),
    ("tables/inan2017_t1/lite/cells.json", '{"cells": [], "figures": {"curves": ["x"]}}',
     "the key figures.'curves' is a list; expected a string", "render_only=true"),
    ("tables/inan2017_t1/lite/cells.json", '{"cells": [], "meta": {"title": 7}}',
     "the key meta.'title' is an integer", "render_only=true"),
    ("tables/inan2017_t1/lite/claims.json", '{"claims": [{"text": "a cl', "invalid JSON",
     "repdegen table table=inan2017_t1 scale=lite render_only=true"),
    ("tables/inan2017_t1/lite/claims.json", '{"claims": [{"text": "a claim", "shown": "bogus", "mark": "x"}]}',
     "claims[0].shown is 'bogus'; expected one of holds, fails, tie", "render_only=true"),
    ("tables/inan2017_t1/lite/table.md", b"\xff\xfe| broken", "not UTF-8 text", "render_only=true"),
    ("bench/cpu/b.json", '{"results": [{"model": "m", "step_', "invalid JSON", "run the benchmark again"),
    ("bench/cpu/b.json", '{"results": [{"model": "m", "step_time_s": "fast"}]}',
     "the key results[0].'step_time_s' is a string; expected an integer or a number or null",
     "run the benchmark again"),
]


@pytest.mark.parametrize("rel, content, why, fix", CORRUPT_RENDERINGS)
def test_a_corrupt_rendering_is_one_error_before_anything_is_written(tmp_path, capsys, rel, content, why, fix):
    """A file the report reads that is truncated or not of its schema: exit status 2 with one line naming the file,
    what is wrong and how to render it again (or restore it from git), before any page is written: the pages of the
    good results are kept as they are, and --check says the same (not "stale")."""
    results = _good_results(tmp_path)
    assert report.main(["--results", str(results)]) == 0
    assert (results / "tables" / "inan2017_t1" / "README.md").is_file()
    capsys.readouterr()
    path = results / rel
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = _snapshot(tmp_path)
    for argv in ([], ["--check"]):
        assert report.main(["--results", str(results), *argv]) == 2
        _one_line_error(capsys, f"{path}: ", why, fix, f"git checkout -- {path}")
        assert _snapshot(tmp_path) == before  # nothing written, nothing overwritten


def test_the_front_page_lists_the_finished_paper_rows_with_their_delta(tmp_path):
    """A paper rendering's complete rows go on results/README.md with paper vs ours and Δ % (hand-worked), and the
    cell's provenance; a row not run is not listed; a table with no paper rendering adds no section."""
    results = _good_results(tmp_path)
    assert "Rows at `paper`" not in report.build_pages(results, report_inputs.load_tables(), "now")["README.md"]
    out = results / "tables" / "inan2017_t1" / "paper"
    out.mkdir(parents=True)
    (out / "table.md").write_text("## Inan 2017\n")
    (out / "table.csv").write_text("group,label,status,config_hash,valid_ppl_paper,valid_ppl_ours,test_ppl_paper,"
                                   "test_ppl_ours\nMedium,VD-LSTM,complete,h1,82.0,84.05,77.7,76.923\n"
                                   "Medium,VD-LSTM+RE,missing,h2,77.1,,73.9,\n")
    (out / "cells.json").write_text(json.dumps({"cells": [
        {"status": "complete", "config_hash": "h1", "label": "VD-LSTM",
         "provenance": {"epochs": [52], "wall_time": "10m27s", "hardware": "GPU X", "commit": "abc"}}]}))
    page = report.build_pages(results, report_inputs.load_tables(), "now")["README.md"]
    # (84.05 - 82) / 82 = +2.50 %; (76.923 - 77.7) / 77.7 = -1.00 %
    assert ("| inan2017_t1 | Medium / VD-LSTM | test_ppl 77.7 vs 76.92 (-1.00%); valid_ppl 82.0 vs 84.05 (+2.50%) | "
            "52 | 10m27s | GPU X | abc |") in page
    assert "VD-LSTM+RE" not in page.split("## Rows at `paper` so far")[1].split("\n## ")[0]


def test_the_committed_results_pages_are_up_to_date():
    """results/README.md, results/more.md and the tables' pages are what `repdegen report` makes of the
    committed renderings and notes now: a page left stale after an edit fails here, not in a reader's hands."""
    diff = report.check_report(REPO / "results")
    assert diff == [], "\n".join(diff[:40]) + "\nrun `repdegen report` and commit the pages"
