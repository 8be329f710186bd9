"""Stale references (scripts/check_references.py): hand-made Markdown in a tmp repository -> one message per path it
names that does not exist (file and line), nothing for existing paths, templates, URLs, anchors, run output and
fenced code; its command line over a results folder; and none in this repository's committed Markdown."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from repdegen.reproduce.results import report

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from check_references import check_stale_references, code_span_path, main, stale_references, top_level_names  # noqa: E402

NOTES = """\
# Notes

Existing: `conf/table/a.yaml`, `scripts/x.py:12`, `scripts/x.py:main`, `tests/test_x.py::test_y`, `conf/table/a`,
`results/pilots/`, `results/pilots`, `Makefile`, `conf/table/a.yaml#L3`, [pilot](pilots/yu_lm.md) and [top](/Makefile).
Missing: `conf/scale_patch/inan2017/small/lite.yaml` and `scripts/gone.py:main`.
Templates and commands: `results/tables/<t>/lite/`, `conf/{a,b}.yaml`, `results/...`, `python scripts/gone.py`,
`trainer.max_epochs=3`, `$REPDEGEN_DATA_DIR/gone`, `outputs/runs/abc/result.json`, `losses/my_obj.py`, `gone/x.py`.
Links: [gone](pilots/gone.md#section), [web](https://example.com/conf/gone.yaml), [mail](mailto:a@b.c), [here](#notes).
Plain text: see conf/objective_hparams/inan2017/ and conf/table/a.yaml, not https://example.com/conf/gone.yaml.
```
`conf/in_a_code_block.yaml` [x](in_a_code_block.md)
```
Globs: `conf/table/*.yaml` and `conf/experiment/*/` match, `conf/nothing/*.yaml` does not; `[x](gone.md)` is code.
Run output is not checked: [run](../outputs/runs/abc/result.json).

[ref]: ../docs/missing.md
"""


@pytest.fixture()
def repo(tmp_path):
    """A tmp repository: conf/, scripts/, tests/, results/, docs/, a Makefile, git-ignored outputs/."""
    for d in ("conf/table", "conf/experiment/inan2017", "scripts", "tests", "results/pilots", "docs", "outputs/runs"):
        (tmp_path / d).mkdir(parents=True)
    for f in ("conf/table/a.yaml", "scripts/x.py", "tests/test_x.py", "results/pilots/yu_lm.md", "Makefile"):
        (tmp_path / f).write_text("x\n")
    (tmp_path / ".gitignore").write_text("# run output\noutputs/\n*.egg-info/\n")
    return tmp_path


def _paths(messages: list[str]) -> list[str]:
    """Each message without its fix hint."""
    return [m.split("; fix: ")[0] for m in messages]


def test_top_level_names_and_code_spans(repo):
    top = top_level_names(repo)
    assert top == {"conf", "scripts", "tests", "results", "docs", "Makefile"}  # no outputs/ (ignored), no .gitignore
    assert code_span_path("scripts/x.py:12", top) == "scripts/x.py"
    assert code_span_path("tests/test_x.py::test_y", top) == "tests/test_x.py"
    assert code_span_path("conf/x.yaml#L3", top) == "conf/x.yaml"
    for not_a_path in ("results/tables/<t>/lite/", "conf/{a,b}.yaml", "results/...", "python scripts/x.py",
                       "trainer.max_epochs=3", "outputs/runs/x", "losses/x.py", "conf/model/my_model.yaml", "x.py"):
        assert code_span_path(not_a_path, top) is None, not_a_path


def test_stale_references_names_each_missing_path_with_its_line(repo):
    notes = repo / "results" / "NOTES.md"
    notes.write_text(NOTES)
    assert _paths(stale_references([notes], repo)) == [
        "results/NOTES.md:5: names conf/scale_patch/inan2017/small/lite.yaml, which does not exist",
        "results/NOTES.md:5: names scripts/gone.py, which does not exist",
        "results/NOTES.md:8: names pilots/gone.md, which does not exist",
        "results/NOTES.md:9: names conf/objective_hparams/inan2017/, which does not exist",
        "results/NOTES.md:13: names conf/nothing/*.yaml, which does not exist",
        "results/NOTES.md:16: names ../docs/missing.md, which does not exist",
    ]
    assert all(m.endswith("; fix: edit results/NOTES.md") for m in stale_references([notes], repo))


def test_fix_hints_point_at_the_source_of_rendered_text(repo):
    table_md = repo / "results" / "tables" / "inan2017_t1" / "smoke" / "table.md"
    table_md.parent.mkdir(parents=True)
    table_md.write_text("## T\n\n- see conf/objective_hparams/inan2017/ and conf/table/a.yaml.\n")
    readme = repo / "results" / "README.md"
    readme.write_text("# Results\n\n- see conf/objective_hparams/inan2017/.\n")
    doc = repo / "docs" / "config.md"
    doc.write_text("Budgets: `conf/scale_patch/`\n")
    assert stale_references([table_md, readme, doc], repo) == [
        "results/tables/inan2017_t1/smoke/table.md:3: names conf/objective_hparams/inan2017/, which does not exist; "
        "fix: edit the text's source (conf/table/inan2017_t1.yaml, or the preset whose notes it shows), then re-render "
        "(repdegen table table=inan2017_t1 scale=smoke render_only=true) or make the same edit in this "
        "committed rendering",
        "results/README.md:3: names conf/objective_hparams/inan2017/, which does not exist; fix: results/README.md is "
        "generated by repdegen report; edit the file the text comes from (a table's rendering or config, "
        "its NOTES.md, a figure's notes, results/NOTES.md, ...), then run it",
        "docs/config.md:1: names conf/scale_patch/, which does not exist; fix: edit docs/config.md",
    ]
    # the files the report checks: every *.md under results/, README.md and docs/*.md beside it
    (repo / "README.md").write_text("See [the results](results/README.md) and `docs/gone.md`.\n")
    assert _paths(check_stale_references(repo / "results")) == [
        "results/README.md:3: names conf/objective_hparams/inan2017/, which does not exist",
        "results/tables/inan2017_t1/smoke/table.md:3: names conf/objective_hparams/inan2017/, which does not exist",
        "README.md:1: names docs/gone.md, which does not exist",
        "docs/config.md:1: names conf/scale_patch/, which does not exist",
    ]


def test_the_command_lists_stale_references_of_a_results_folder(tmp_path, capsys):
    """A rendered results folder whose sanity note names a config that is gone: the command fails on the note and on
    the generated page that includes it (more.md), each with its fix; once the note is fixed and the pages rewritten,
    it passes."""
    for d in ("conf/dataset", "conf/budget", "docs"):
        (tmp_path / d).mkdir(parents=True)
    for f in ("conf/dataset/ptb.yaml", "conf/budget/inan2017_small_lite.yaml", "README.md"):
        (tmp_path / f).write_text("x\n")
    results = tmp_path / "results"
    (results / "sanity").mkdir(parents=True)
    (results / "tables").mkdir()  # a results folder (none rendered yet)
    (results / "NOTES.md").write_text("# Notes\n\nNothing yet.\n")  # the README links it
    note = results / "sanity" / "check.md"
    note.write_text("# A check\n\nBudget in `conf/scale_patch/inan2017/small/lite.yaml`; data in `conf/dataset/ptb.yaml`.\n")
    report.write_report(results)
    problems = check_stale_references(results)
    assert len(problems) == 2
    in_readme = next(p for p in problems if p.startswith("results/more.md:"))
    assert "names conf/scale_patch/inan2017/small/lite.yaml" in in_readme and "repdegen report" in in_readme
    assert "results/sanity/check.md:3: names conf/scale_patch/inan2017/small/lite.yaml, which does not exist" in _paths(problems)
    assert main(["--repo", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "conf/scale_patch/inan2017/small/lite.yaml" in err and "2 stale reference(s)" in err

    note.write_text("# A check\n\nBudget in `conf/budget/inan2017_small_lite.yaml`; data in `conf/dataset/ptb.yaml`.\n")
    report.write_report(results)
    assert check_stale_references(results) == [] and main(["--repo", str(tmp_path)]) == 0


def test_the_committed_markdown_names_no_missing_path():
    """results/**/*.md, README.md and docs/*.md of this repository name only paths that exist."""
    problems = check_stale_references(REPO / "results", REPO)
    assert problems == [], "\n".join(problems[:40])


def test_the_command_refuses_a_missing_file_or_folder_in_one_line(tmp_path, capsys):
    """A Markdown file that does not exist, or a --repo that is not a folder: argparse's one-line error, exit 2."""
    for argv in ([str(tmp_path / "gone.md")], ["--repo", str(tmp_path / "nothere")]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "error:" in err and ("gone.md: no such file" in err or "nothere: not a folder" in err)
