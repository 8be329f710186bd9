"""Write ``results/README.md``: every reproduced table and figure in one page, from the files under ``results/``.

    repdegen report                       # write results/README.md from results/
    repdegen report --results results
    repdegen report --check               # exit 1 if results/README.md is stale (CI)

It reads what was rendered and composes nothing: ``tables/*/*`` as ``repdegen.reproduce.table`` rendered them (``table.md``,
``claims.json`` for the verdicts, ``cells.json``, figures; grouped by paper, titles and claims' wording from
``conf/table``), ``figures/*/*`` (with their README/notes), ``bench/*/`` (the JSON as a table of ratios to MLE),
``sweeps/*.md``, ``sanity/*.md``, ``device/*.md`` and ``NOTES.md`` (hand-written caveats, included verbatim), into one
README with a table of contents. Tables rendered at no scale are listed as not yet reproduced, with the command that makes them.

To bring a ledger's runs into ``results/`` first, render the tables from it (no training; a committed rendering with
more complete cells than the ledger is kept): ``make rerender`` (``repdegen table table=all
scale=<scale> render_only=true`` for each scale).

The README is idempotent: a page whose content did not change is left as it is, ``Generated:`` line (date and commit)
included, so a second run changes no file. ``--check`` compares the README with what the files under ``results/`` give
now, ignoring the ``Generated:`` line.

A ``--results`` that is not a folder holding ``tables/``, or a file it reads that is corrupt (a truncated or reshaped
``cells.json``, ``claims.json``, benchmark JSON, a Markdown file that is not UTF-8), is one ``repdegen: error:`` line
naming it and the fix, exit status 2, before any page is written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import re
import sys
from collections import defaultdict
from pathlib import Path

from repdegen.core.errors import UserError
from repdegen.core.files import atomic_write_bytes
from repdegen.reproduce.errors import EXIT_USER_ERROR, report_user_error
from repdegen.reproduce.results.paper_rows import HEADER, all_rows
from repdegen.reproduce.results.report_inputs import (
    CLAIM_SCALES,
    GENERATED_PREFIX,
    NOTE_FILES,
    SCALES,
    VERDICT_KEYS,
    Page,
    TableInfo,
    _count_text,
    _headings,
    _rel,
    bench_table,
    claim_marks,
    headline,
    include,
    is_rendered,
    load_tables,
    orphan_tables,
    paper_order,
    read_text,
    rendered_cells,
    slug,
    table_figures,
    table_md_body,
    verdict_counts,
)
from repdegen.reproduce.settings.config import CONF_DIR

MARK_WORDS = ("✓ holds, ✗ does not, ≈ a tie (inside its margin, or the seeds disagree), ⚠ changed after its cells ran "
              "(no verdict), – not decided (a cell it needs is not complete), n/a not decidable at that scale")


def _md_text(text: str) -> str:
    """A claim's text in Markdown: a literal ``<unk>`` would be read as an HTML tag and vanish."""
    return text.replace("<", "&lt;").replace(">", "&gt;")


def diagnosis_anchors(notes: Path) -> dict[tuple[str, str], str]:
    """{(scale, claim text): anchor} of a table's diagnoses file: a heading "`<scale>` <mark> <claim text>" per
    diagnosed claim (e.g. "### `lite` ✗ Freezing does not raise total test PPL")."""
    if not notes.is_file():
        return {}
    lines = read_text(notes).splitlines()
    out, seen = {}, defaultdict(int)
    for _i, _level, title in _headings(lines):
        s = slug(title)
        anchor = s if seen[s] == 0 else f"{s}-{seen[s]}"
        seen[s] += 1
        m = re.match(r"`(\w+)`\s+\S+\s+(.*)$", title)
        if m:  # the claim's text; `<unk>` in backticks in a heading (a bare <unk> is an HTML tag there) matches <unk>
            out[(m.group(1), m.group(2).replace("`", "").strip())] = anchor
    return out


def table_page(results_dir: Path, t: TableInfo, marks: list, generated: str) -> str:
    """results/tables/<t>/README.md: the verdicts first (each ✗ and ≈ linked to its diagnosis), the diagnoses, then
    the table and its figures at paper and lite; smoke is on its own page."""
    base = results_dir / "tables" / t.name
    notes = base / "NOTES.md"
    anchors = diagnosis_anchors(notes)
    notes_link = " · [notes](../../NOTES.md)" if (results_dir / "NOTES.md").is_file() else ""
    lines = [f"# {t.title}", "", f"{t.source}. [All tables](../../README.md){notes_link}", "",
             GENERATED_PREFIX + generated, ""]
    shown_scales = [s for s in ("lite", "paper") if is_rendered(results_dir, t.name, s)]
    undiagnosed = []
    if marks:
        lines += ["## Verdicts", "", f"{MARK_WORDS}. The rule: `docs/claims.md`.", "",
                  "| Claim | " + " | ".join(f"`{s}`" for s in ("lite", "paper")) + " |", "|---|---|---|"]
        for text, by_scale in marks:
            cells = []
            for s in ("lite", "paper"):
                shown, v = by_scale[s]
                mark = "n/a" if shown == "paper_only" else (v["mark"] if v else "–")
                anchor = anchors.get((s, text))
                if anchor:
                    mark = f"[{mark}](#{anchor})"
                elif shown in ("fails", "tie") and s in shown_scales:
                    undiagnosed.append((s, mark, text))
                elif shown_scales and s in shown_scales:
                    mark = f"[{mark}](#at-{s})"
                cells.append(mark)
            lines.append(f"| {_md_text(text)} | " + " | ".join(cells) + " |")
        lines.append("")
        if undiagnosed:
            lines += ["Not yet diagnosed: " + "; ".join(f"`{s}` {m} {_md_text(text)}" for s, m, text in undiagnosed) + ".",
                      ""]
    if t.notes:  # what the table's config says of its rows (e.g. rows that are not reproductions yet)
        lines += ["## About the rows", "", *[f"- {_md_text(n)}" for n in t.notes], ""]
    if notes.is_file():
        lines += ["## Diagnoses", "", include(notes, base, 3), ""]
    for scale in ("paper", "lite"):
        if scale not in shown_scales:
            continue
        out = base / scale
        lines += [f"## At `{scale}`", "", table_md_body(read_text(out / "table.md")), ""]
        lines += [_files_line(out, base), ""]
        lines += table_figures(out, base)
    if is_rendered(results_dir, t.name, "smoke"):
        lines += ["## At `smoke`", "", f"Plumbing only: [the smoke rendering](../../smoke.md#{slug(f'`{t.name}`')}).", ""]
    if not shown_scales and not is_rendered(results_dir, t.name, "smoke"):
        lines += [_make_it(t), ""]
    return "\n".join(lines)


def _files_line(out: Path, base: Path) -> str:
    files = " · ".join(f"[{f}]({_rel(out / f, base)})" for f in ("table.md", "table.csv", "table.tex", "cells.json")
                       if (out / f).is_file())
    command = (rendered_cells(out) or {}).get("command")
    return f"Files: {files}." + (f" Made by `{command}`." if command else "")


def _make_it(t: TableInfo) -> str:
    return (f"Not reproduced yet: `make reproduce-table TABLE={t.name} SCALE=lite` (or `repdegen table "
            f"table={t.name} scale=lite`; `SCALE=smoke` for a CPU check).")


def smoke_page(results_dir: Path, tables: list[TableInfo], generated: str) -> str:
    """results/smoke.md: every table at smoke (plumbing-sized runs, numbers that say nothing about the papers)."""
    lines = ["# Every table at `smoke`", "", "Plumbing, not numbers: the smoke scale runs each table's cells for "
             "minutes on a CPU (tiny budgets) so CI checks that every row trains, evaluates and renders. Its "
             "verdicts are not findings. [All tables](README.md).", "", GENERATED_PREFIX + generated, ""]
    for t in tables:
        out = results_dir / "tables" / t.name / "smoke"
        if not is_rendered(results_dir, t.name, "smoke"):
            continue
        lines += [f"## `{t.name}`", "", f"{t.title}. [Its page](tables/{t.name}/README.md).", "",
                  table_md_body(read_text(out / "table.md")), "", _files_line(out, results_dir), ""]
    return "\n".join(lines)


def more_page(results_dir: Path, generated: str) -> str | None:
    """results/more.md: the figures made by scripts, benchmarks, sweeps, sanity checks and GPU runs."""
    page = Page()
    for d in sorted(d for d in (results_dir / "figures").glob("*") if d.is_dir()):
        page.heading(2, f"Figure: `{d.name}`")
        for f in NOTE_FILES:
            if (d / f).is_file():
                page.add(include(d / f, results_dir, 3), "")
        subs = sorted((s for s in d.iterdir() if s.is_dir()),
                      key=lambda s: (SCALES.index(s.name) if s.name in SCALES else len(SCALES), s.name))
        for sub in subs:
            page.heading(3, f"`{d.name}` at scale `{sub.name}`", toc=False)
            for f in NOTE_FILES:
                if (sub / f).is_file():
                    page.add(include(sub / f, results_dir, 4), "")
            for png in sorted(sub.glob("*.png")):
                page.add(f"![{d.name} ({sub.name}): {png.stem}]({_rel(png, results_dir)})", "")
            data = sorted(p for p in sub.iterdir() if p.suffix in (".json", ".csv"))
            if data:
                page.para("Data: " + " · ".join(f"[{p.name}]({_rel(p, results_dir)})" for p in data) + ".")
        page.para("Figures under `results/figures/` were drawn outside the tables (each folder's notes say by what) "
                  "and are not re-rendered by this report.")
    bench_dirs = sorted(d for d in (results_dir / "bench").glob("*") if d.is_dir())
    if bench_dirs:
        page.heading(2, "Benchmarks")
        for d in bench_dirs:
            page.heading(3, f"`bench/{d.name}`")
            for f in NOTE_FILES:
                if (d / f).is_file():
                    page.add(include(d / f, results_dir, 4), "")
            for j in sorted(d.glob("*.json")):
                page.add(*bench_table(j), "")
    for folder, title in (("sweeps", "Sweeps"), ("sanity", "Sanity checks"), ("device", "Runs on a GPU")):
        docs = sorted((results_dir / folder).glob("*.md"))
        if docs:
            page.heading(2, title)
            for doc in docs:
                page.add(include(doc, results_dir, 3), "", f"Source: [{_rel(doc, results_dir)}]({_rel(doc, results_dir)}).", "")
    if not page.lines:
        return None
    head = ["# Figures, benchmarks, sweeps and sanity checks", "", "[All tables](README.md).", "",
            GENERATED_PREFIX + generated, ""]
    return "\n".join(head + page.lines)


def build_pages(results_dir: Path, tables: list[TableInfo], generated: str) -> dict[str, str]:
    """{path relative to results/: text} of every generated page: README.md (the index), smoke.md, more.md and one
    tables/<t>/README.md per table rendered at some scale."""
    results_dir = Path(results_dir)
    tables = tables + orphan_tables(results_dir, tables)
    by_paper: dict[str, list[TableInfo]] = defaultdict(list)
    for t in tables:
        by_paper[t.paper_key].append(t)
    papers = sorted(by_paper, key=paper_order)
    ordered = [t for key in papers for t in by_paper[key]]
    marks = {t.name: claim_marks(results_dir, t) for t in ordered}
    total_counts = {s: dict.fromkeys(VERDICT_KEYS, 0) for s in CLAIM_SCALES}
    for t in ordered:
        for s, n in verdict_counts(marks[t.name]).items():
            for k, v in n.items():
                total_counts[s][k] += v
    total = sum(len(m) for m in marks.values())

    pages: dict[str, str] = {}
    lines = ["# Reproduced results", "",
             "Generated by `repdegen report` from the files under `results/` (the tables as "
             "`repdegen.reproduce.table` rendered them; `make rerender` renders them again from a run ledger); "
             "`repdegen report --check` tells whether these pages are up to date. Do not edit them by hand.",
             "", GENERATED_PREFIX + generated, ""]
    if total:
        lines += [headline(total_counts, total), "",
                  "Each claim is a paper's finding written as a check over its table's rows before the cells ran "
                  f"(`conf/table/<table>.yaml`). {MARK_WORDS}. Scales: `lite` = the claims on a 2-core CPU (real "
                  "corpora, small budgets), `paper` = the papers' settings, `smoke` = plumbing for CI "
                  "([its own page](smoke.md)). Each table's page gives its verdicts first, each ✗ and ≈ with its "
                  "diagnosis, then the table and its figures.", ""]
    paper_lines = all_rows(results_dir / "tables")
    if paper_lines:
        lines += ["## Rows at `paper` so far", "",
                  "The papers' settings, row by row: the paper's number vs ours (one run each, as the papers report), "
                  "Δ % = (ours − paper) / paper, and where the cell ran. Rows not listed have not finished; "
                  "`python scripts/paper_rows.py --all` lists them too.", "", *HEADER, *paper_lines, ""]
    not_reproduced = []
    for key in papers:
        infos = by_paper[key]
        lines += [f"## {infos[0].paper if infos else key}", "",
                  "| Table | `lite` | `paper` | `smoke` |", "|---|---|---|---|"]
        for t in infos:
            rendered = [s for s in SCALES if is_rendered(results_dir, t.name, s)]
            if not rendered:
                not_reproduced.append(t)
            counts = verdict_counts(marks[t.name])
            cells = []
            for s in ("lite", "paper", "smoke"):
                if s not in rendered:
                    cells.append("–")
                elif s == "smoke":
                    cells.append(f"[rendered](smoke.md#{slug(f'`{t.name}`')})")
                else:
                    cells.append(f"[{_count_text(counts[s])}](tables/{t.name}/README.md#at-{s})")
            name = f"[{t.title}](tables/{t.name}/README.md)" if rendered else t.title
            lines.append(f"| {name} (`{t.name}`) | " + " | ".join(cells) + " |")
            if rendered:
                pages[f"tables/{t.name}/README.md"] = table_page(results_dir, t, marks[t.name], generated)
        lines.append("")
    if not_reproduced:
        lines += ["## Not yet reproduced", "", *(f"- **{t.title}** (`{t.name}`): {_make_it(t)}" for t in not_reproduced),
                  ""]
    pages["smoke.md"] = smoke_page(results_dir, ordered, generated)
    more = more_page(results_dir, generated)
    if more:
        pages["more.md"] = more
    lines += ["## More", ""]
    if (results_dir / "NOTES.md").is_file():
        lines.append("- [Notes](NOTES.md): caveats, what each lite budget is and why, the history of lite v1.")
    lines.append("- [Every table at `smoke`](smoke.md) (plumbing, not numbers).")
    if more:
        lines.append("- [Figures, benchmarks, sweeps and sanity checks](more.md).")
    pages["README.md"] = "\n".join(lines)
    return {k: re.sub(r"\n{3,}", "\n\n", v).rstrip() + "\n" for k, v in pages.items()}


def _generated_line() -> str:
    from repdegen.core.provenance import git_commit, uncommitted_note

    git = git_commit()
    commit = git["commit"][:10] + uncommitted_note(git)
    return f"{dt.datetime.now().isoformat(timespec='seconds')} at commit `{commit}`."


def comparable(text: str) -> list[str]:
    """The README without what changes between two runs: the Generated line."""
    return [line for line in text.splitlines() if not line.startswith(GENERATED_PREFIX.strip())]


def _same_page(path: Path, text: str) -> bool:
    """Whether the page at ``path`` is ``text`` but for its Generated line (a missing or unreadable page is not)."""
    try:
        return comparable(Path(path).read_text()) == comparable(text)
    except (OSError, UnicodeDecodeError):
        return False


def write_report(results_dir: Path, conf_dir: Path = CONF_DIR, written: list[str] | None = None) -> Path:
    """Write every generated page (build_pages) under ``results_dir`` whose content changed; returns the index,
    results/README.md. ``written``, when given, gets each page written (relative to results/)."""
    results_dir = Path(results_dir)
    pages = build_pages(results_dir, load_tables(conf_dir), _generated_line())
    for rel, text in pages.items():
        path = results_dir / rel
        if _same_page(path, text):
            continue  # the same page but for its Generated line: left as it is (no timestamp-only diff to commit)
        atomic_write_bytes(path, lambda f, t=text: f.write(t.encode()))
        if written is not None:
            written.append(rel)
    sync_status_line(results_dir.parent / "README.md", pages["README.md"])
    return results_dir / "README.md"


STATUS_START, STATUS_END = "<!-- claims-status: written by repdegen report -->", "<!-- /claims-status -->"


def claims_headline(readme: str) -> str | None:
    """The Claims section's headline of a results README ("**N of M claims shown at `lite`** (...)"), or None."""
    return next((line for line in readme.splitlines() if re.match(r"\*\*\d+ of \d+ claims shown at `lite`\*\*", line)),
                None)


def sync_status_line(project_readme: Path, results_readme: str) -> bool:
    """Copy the claims headline into the project README, between the claims-status markers (when it has them):
    the status a user sees first stays the one results/README.md gives. Returns whether the file changed."""
    headline = claims_headline(results_readme)
    if headline is None or not project_readme.is_file():
        return False
    old = read_text(project_readme)
    if STATUS_START not in old or STATUS_END not in old:
        return False
    head, rest = old.split(STATUS_START, 1)
    _, tail = rest.split(STATUS_END, 1)
    new = f"{head}{STATUS_START}\nStatus at `lite`: {headline}\n{STATUS_END}{tail}"
    if new == old:
        return False
    atomic_write_bytes(project_readme, lambda f: f.write(new.encode()))
    return True


def check_report(results_dir: Path, conf_dir: Path = CONF_DIR) -> list[str]:
    """The differences between the generated pages under results/ and what its files give now ([] = up to date)."""
    results_dir = Path(results_dir)
    pages = build_pages(results_dir, load_tables(conf_dir), "")
    diff = []
    for rel, fresh in pages.items():
        path = results_dir / rel
        if not path.is_file():
            diff.append(f"{path} does not exist")
            continue
        diff += difflib.unified_diff(comparable(path.read_text()), comparable(fresh), str(path), "regenerated",
                                     lineterm="", n=1)
    for page in (results_dir / "tables").glob("*/README.md"):
        if page.relative_to(results_dir).as_posix() not in pages:
            diff.append(f"{page} is not a page of any rendered table any more (delete it)")
    project = results_dir.parent / "README.md"
    headline = claims_headline(pages["README.md"])
    if headline and project.is_file() and STATUS_START in project.read_text() and headline not in project.read_text():
        diff.append(f"{project}: the claims status line is not {headline!r}")
    return diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="repdegen report", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write results/README.md and the pages it links (a page per table, smoke.md, more.md): every\n"
                    "reproduced table and figure, from the files under results/. It composes and trains nothing.",
        epilog="""\
examples:
  repdegen report                 # write results/README.md from results/
  repdegen report --check         # exit 1 if the pages under results/ are stale (CI)
  make rerender                              # render every table again from the ledger, then write the README

where next:
  results/README.md (every table and claim); repdegen table --help (makes and renders the tables;
  render_only=true renders from the ledger only); docs/claims.md, docs/cli.md (every entry point)""")
    parser.add_argument("--results", default="results", help="the results folder (default: results)")
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale; writes nothing")
    args = parser.parse_args(argv)
    try:
        results = Path(args.results)
        if not (results / "tables").is_dir():
            what = "has no tables/ folder" if results.is_dir() else "is not a directory"
            raise UserError(f"--results {args.results} {what}; expected a results directory holding tables/ (the "
                            f"repository's results/, the default); pass that folder (nothing was written)")
        if args.check:
            diff = check_report(results)
            if diff:
                print(f"repdegen: the pages under {args.results}/ are stale; run `repdegen report`:",
                      file=sys.stderr)
                print("\n".join(diff[:60]), file=sys.stderr)
                return 1
            print(f"repdegen: the pages under {args.results}/ are up to date")
            return 0
        written: list[str] = []
        path = write_report(results, written=written)  # every page is built (every file read) before one is written
    except UserError as err:  # a wrong --results, a corrupt rendering: one line, nothing written
        report_user_error(err)
        return EXIT_USER_ERROR
    if not written:
        print(f"repdegen: no page under {args.results}/ changed ({path} and the others are up to date; a page's "
              f"Generated line changes only with its content)")
    else:
        print(f"repdegen: wrote {len(written)} page(s) under {args.results}/ ({', '.join(written[:8])}"
              f"{', ...' if len(written) > 8 else ''}); the others had not changed")
    return 0
