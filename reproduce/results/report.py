"""Write ``results/README.md``: every reproduced table and figure in one page, from the files under ``results/``.

    python -m reproduce.report                       # write results/README.md from results/
    python -m reproduce.report --results results
    python -m reproduce.report --check               # exit 1 if results/README.md is stale (CI)

It reads what was rendered and composes nothing: ``tables/*/*`` as ``reproduce.table`` rendered them (``table.md``,
``claims.json`` for the verdicts, ``cells.json``, figures; grouped by paper, titles and claims' wording from
``conf/table``), ``figures/*/*`` (with their README/notes), ``bench/*/`` (the JSON as a table of ratios to MLE),
``sweeps/*.md``, ``sanity/*.md``, ``device/*.md`` and ``NOTES.md`` (hand-written caveats, included verbatim), into one
README with a table of contents. Tables rendered at no scale are listed as not yet reproduced, with the command that makes them.

To bring a ledger's runs into ``results/`` first, render the tables from it (no training; a committed rendering with
more complete cells than the ledger is kept): ``make rerender`` (``python -m reproduce.table table=all
scale=<scale> render_only=true`` for each scale).

The README is idempotent: two runs give the same file except the ``Generated:`` line (date and commit). ``--check``
compares the README with what the files under ``results/`` give now, ignoring the ``Generated:`` line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from core.errors import CorruptFile
from core.files import atomic_write_bytes
from core.loaders import STATUS_COMPLETE, load_cells_json, load_claims_json
from reproduce.settings.config import CONF_DIR

SCALES = ("paper", "lite", "smoke")
GENERATED_PREFIX = "Generated: "
# figures a table renders, in the order shown, with what they are
TABLE_FIGURES = {
    "curves": "Validation PPL per epoch of every cell",
    "singular_values": "Normalised singular values of each cell's output embedding (Gao Fig. 2b, Yu Fig. 3c)",
    "geometry_over_training": "I(W) and rare/frequent geometry at every evaluation (Yu Fig. 2)",
    "rare_group_size": "AGG's rare group size over the first updates (Yu Fig. 4)",
}
NOTE_FILES = ("README.md", "NOTES.md", "notes.md")


# ------------------------------------------------------------------------------------------------
# the tables and papers
# ------------------------------------------------------------------------------------------------
@dataclass
class TableInfo:
    name: str
    title: str
    source: str
    experiments: set[str] = field(default_factory=set)
    # (text, scales it is meaningful at or None) of each claim in the table config
    claims: list[tuple[str, list[str] | None]] = field(default_factory=list)

    @property
    def paper_key(self) -> str:  # "yu2022_t3" -> "yu2022"
        return self.name.split("_")[0]

    @property
    def paper(self) -> str:  # "Yu et al. (2022), Rare tokens degenerate ..., Table 3" -> without the table
        return re.sub(r",\s*Table\s+\S+$", "", self.source.strip())


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def paper_order(key: str) -> tuple:
    m = re.match(r"([a-z]+)(\d{4})", key)
    return (int(m.group(2)), m.group(1)) if m else (9999, key)


def claim_scales(table, claim) -> list[str] | None:
    """The scales at which a claim can be decided: its own ``scales`` and those where every row it
    compares runs, less those it is ``na`` at (None: every scale)."""
    from reproduce.results.claims import resolve_row

    allowed = set(claim.scales) if claim.get("scales") else set(SCALES)
    allowed -= set(claim.get("na") or {})  # n/a at a scale, with its measured reason
    for check in claim.checks:
        for ref in (check.get("row"), check.get("than")):
            if ref is None:
                continue
            row = table.rows[resolve_row(table, ref, "a claim")]
            if row.get("scales"):
                allowed &= set(row.scales)
    return None if allowed == set(SCALES) else [s for s in SCALES if s in allowed]


def load_tables(conf_dir: Path = CONF_DIR) -> list[TableInfo]:
    """Name, title, source and row experiments of every ``conf/table/*.yaml`` (read as YAML, not composed)."""
    infos = []
    for path in sorted((Path(conf_dir) / "table").glob("*.yaml"), key=lambda p: _natural(p.stem)):
        raw = OmegaConf.load(path)
        claims = [(str(c.text), claim_scales(raw, c)) for c in raw.get("claims", []) or []]
        infos.append(TableInfo(str(raw.get("name", path.stem)), str(raw.title), str(raw.source),
                               {str(r.experiment) for r in raw.get("rows", []) if r.get("experiment")}, claims))
    return infos


# ------------------------------------------------------------------------------------------------
# gather results/ into one Markdown page
# ------------------------------------------------------------------------------------------------
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


def _headings(lines: list[str]):
    """(index, level, text) of the Markdown headings outside code fences."""
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            yield i, len(m.group(1)), m.group(2)


def demote(text: str, top: int) -> str:
    """Shift the headings of an included document so that its highest one is at level ``top``."""
    lines = text.splitlines()
    found = list(_headings(lines))
    if not found:
        return text
    shift = top - min(level for _, level, _ in found)
    for i, level, title in found:
        lines[i] = "#" * max(1, min(6, level + shift)) + " " + title
    return "\n".join(lines)


def relink(text: str, base: str) -> str:
    """Relative links and images of a document in ``base`` (relative to results/), made relative to results/."""
    def fix(m):
        target = m.group(2)
        if re.match(r"^([a-z]+:|#|/)", target):
            return m.group(0)
        return f"{m.group(1)}{base}/{target}{m.group(3)}"

    return _LINK.sub(fix, text)


def include(path: Path, results_dir: Path, top: int) -> str:
    """A Markdown file of results/, ready to include: headings nested under ``top``, links fixed."""
    base = path.parent.relative_to(results_dir).as_posix()
    text = path.read_text().strip()
    return demote(relink(text, base) if base != "." else text, top)


def slug(title: str) -> str:
    """GitHub's anchor of a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    text = re.sub(r"[`*_~]", lambda m: "_" if m.group(0) == "_" else "", text)
    text = "".join(ch for ch in text.lower() if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def table_md_body(text: str) -> str:
    """A rendered table.md without its title (the README gives it one) and without its rendering time
    (which changes at every render; cells.json keeps it)."""
    lines = text.strip().splitlines()
    if lines and lines[0].startswith("#"):
        lines = lines[1:]
    body = "\n".join(lines).strip()
    return re.sub(r" Generated [0-9T:.\-+]+\.(?=\s*$)", "", body, flags=re.M)


def _rel(path: Path, results_dir: Path) -> str:
    return path.relative_to(results_dir).as_posix()


def _svd_labels(out: Path) -> list[str]:
    """The labels of svd_<k>.png: the k-th complete cell of cells.json (once per run), as render() numbers them."""
    try:
        data = load_cells_json(out / "cells.json")
        cells = data["cells"]
    except (OSError, CorruptFile):
        return []
    if data.get("figures"):  # {svd_<k>: label}, written by reproduce.runs.tables
        return [data["figures"].get(f"svd_{k}", f"svd_{k}") for k in range(1, len(data["figures"]) + 1)]
    seen, labels = set(), []
    for c in cells:
        if c.get("status") == STATUS_COMPLETE and c["config_hash"] not in seen:
            seen.add(c["config_hash"])
            labels.append(c["label"])
    return labels


def table_figures(out: Path, results_dir: Path) -> list[str]:
    pngs = {p.stem: p for p in out.glob("*.png")}
    lines = []
    for stem, caption in TABLE_FIGURES.items():
        if stem in pngs:
            lines += [f"![{caption}]({_rel(pngs.pop(stem), results_dir)})", ""]
    svds = sorted((p for s, p in pngs.items() if re.fullmatch(r"svd_\d+", s)), key=lambda p: _natural(p.stem))
    if svds:
        labels = _svd_labels(out)
        lines.append("Output embeddings on their top-2 singular directions, by frequency group (Gao Figs 1, 2a; Yu Figs 1, 3):")
        lines.append("")
        for p in svds:
            k = int(p.stem.split("_")[1])
            label = labels[k - 1] if k <= len(labels) else p.stem
            pngs.pop(p.stem)
            lines.append(f"![SVD projection: {label}]({_rel(p, results_dir)})")
        lines.append("")
    for stem, p in sorted(pngs.items()):
        lines += [f"![{stem}]({_rel(p, results_dir)})", ""]
    return lines


def bench_table(path: Path) -> list[str]:
    """A benchmark JSON of scripts/bench.py as a small Markdown table."""
    data = json.loads(path.read_text())
    results = data.get("results", [])
    if not results:
        return [f"`{path.name}`: no results."]
    git = data.get("git", {})
    hw = data.get("hardware", {})
    device = hw.get("gpu") or f"CPU {hw.get('cpu', '?')} ({hw.get('torch_threads', '?')} threads)"
    note = data.get("note")
    torch_version = data.get("torch", hw.get("torch", "?"))
    lines = [f"`{path.name}`: commit `{git.get('commit', 'unknown')[:10]}`, {device}, torch {torch_version}."
             + (f" {note[0].upper()}{note[1:]}." if note else ""), ""]
    if data.get("command"):
        lines += [f"    {data['command']}", ""]
    lines += ["| model | objective | precision | tokens/update | step time (s) | tokens/s | peak mem (GB) | MFU "
              "| step time vs MLE |",
              "|---|---|---|---|---|---|---|---|---|"]

    def num(v, fmt):
        return "–" if v is None else format(v, fmt)

    for r in results:
        lines.append(f"| {r.get('model')} | {r.get('objective')} | {r.get('precision', '')} | {r.get('tokens_per_update', '')} "
                     f"| {num(r.get('step_time_s'), '.3f')} | {num(r.get('tokens_per_s'), ',.0f')} "
                     f"| {num(r.get('peak_mem_gb'), '.2f')} | {num(r.get('mfu'), '.1%')} "
                     f"| {num(r.get('step_time_vs_mle'), '.2f')} |")
    return lines


class Page:
    """Lines of Markdown plus the headings that go in the table of contents."""

    def __init__(self):
        self.lines: list[str] = []
        self.toc: set[int] = set()

    def heading(self, level: int, title: str, toc: bool = True) -> None:
        if self.lines and self.lines[-1] != "":
            self.lines.append("")
        if toc:
            self.toc.add(len(self.lines))
        self.lines += ["#" * level + " " + title, ""]

    def add(self, *lines: str) -> None:
        for block in lines:
            self.lines += block.split("\n")

    def para(self, text: str) -> None:
        self.add(text, "")


def orphan_tables(results_dir: Path, tables: list[TableInfo]) -> list[TableInfo]:
    """Tables rendered under results/tables/ whose config is gone from conf/table (shown, from their files)."""
    known = {t.name for t in tables}
    out = []
    for d in sorted((Path(results_dir) / "tables").glob("*"), key=lambda p: _natural(p.name)):
        mds = sorted(d.glob("*/table.md"))
        if d.name in known or not mds:
            continue
        try:  # the rendering's structured record (cells.json); its Markdown is only embedded, never parsed
            meta = load_cells_json(mds[0].parent / "cells.json").get("meta") or {}
        except (OSError, CorruptFile):
            meta = {}
        title, source = meta.get("title") or d.name, meta.get("source") or d.name.split("_")[0]
        out.append(TableInfo(d.name, title + " (its config is no longer in conf/table)", source))
    return out


CLAIM_SCALES = ("lite", "smoke", "paper")


def is_rendered(results_dir: Path, table: str, scale: str) -> bool:
    """Whether a table is reproduced at a scale: rendered (``table.md``) with at least one complete cell (a
    render-only pass over a ledger without its cells writes a skeleton of "(not run)" rows, which is not)."""
    out = Path(results_dir) / "tables" / table / scale
    if not (out / "table.md").is_file():
        return False
    try:
        cells = load_cells_json(out / "cells.json")["cells"]
    except (OSError, CorruptFile):
        return True  # an older rendering without cells.json
    return any(c.get("status") == STATUS_COMPLETE for c in cells)


def _verdicts(results_dir: Path, table: str, scale: str) -> dict[str, dict] | None:
    """{claim text: its record} of a rendered table's claims.json, or None when not rendered at that scale; {} for a
    rendering of the v1 rule (before issue 23: no tie margin, no registration), whose verdicts are not shown."""
    if not is_rendered(results_dir, table, scale):
        return None
    try:
        data = load_claims_json(results_dir / "tables" / table / scale / "claims.json")
    except (OSError, CorruptFile):
        return None
    claims = data.get("claims", [])
    if any("shown" not in c for c in claims):
        return {}  # rendered under the v1 rule (no tie margin, no registration): no verdict in the status table
    return {c["text"]: c for c in claims}


def _ours_summary(claim: dict) -> str:
    return "; ".join(c["ours"] for c in claim.get("checks", []) if c.get("ours") and c["ours"] != "–") or "–"


def claims_status(page: Page, results_dir: Path, tables: list[TableInfo]) -> None:
    """The status of every claim: table x claim x scale x verdict, with the headline count at lite."""
    rows, counts = [], {s: {"holds": 0, "fails": 0, "tie": 0, "undecided": 0, "changed": 0, "paper_only": 0}
                        for s in CLAIM_SCALES}
    total = 0
    for t in tables:
        rendered = {s: _verdicts(results_dir, t.name, s) for s in CLAIM_SCALES}
        for text, scales in t.claims:
            total += 1
            marks = []
            for s in CLAIM_SCALES:
                v = (rendered[s] or {}).get(text)
                shown = (v.get("shown") or v["state"]) if v else "undecided"
                if (scales is not None and s not in scales) or shown == "n/a":
                    counts[s]["paper_only"] += 1
                    marks.append(f"[n/a](#{{{t.name}/{s}}})" if v and rendered[s] is not None else "n/a")
                    continue
                counts[s][shown] += 1
                mark = v["mark"] if v else "–"
                marks.append(f"[{mark}](#{{{t.name}/{s}}})" if rendered[s] is not None else mark)
            lite = (rendered["lite"] or {}).get(text)
            paper_vals = "; ".join(c["paper"] for c in lite["checks"]) if lite else ""
            rows.append(f"| [{t.name}](#{{{t.name}}}) | {text} | " + " | ".join(marks)
                        + f" | {paper_vals or '–'} | {_ours_summary(lite) if lite else '–'} |")
    if not total:
        return
    page.heading(2, "Claims")
    c = counts["lite"]
    meaningful = total - c["paper_only"]
    changed = f", {c['changed']} changed after their cells ran (⚠, no verdict)" if c["changed"] else ""
    p = counts["paper"]
    page.para(f"**{c['holds']} of {meaningful} claims shown at `lite`** ({c['fails']} not shown, {c['tie']} ties inside their "
              f"margin, {c['undecided']} not yet decided{changed}; {c['paper_only']} more cannot be decided at `lite`: they "
              f"compare with other work's numbers, need rows `lite` does not run, or are n/a there with a measured "
              f"reason). At `smoke`: {counts['smoke']['holds']} ✓, {counts['smoke']['fails']} ✗, {counts['smoke']['tie']} ≈ "
              f"— not meaningful (plumbing-sized runs). At `paper`: {p['holds']} ✓, {p['fails']} ✗, {p['tie']} ≈"
              + (f", {p['changed']} ⚠" if p["changed"] else "") + f" of {total - p['paper_only']}.")
    page.para("Each claim is a paper's finding as a check over its table's own rows (`conf/table/<table>.yaml`, "
              "`claims:`). ✓ holds, ✗ does not, ≈ a tie (the difference is inside its margin, or the seeds "
              "disagree), ⚠ the claim or its cells changed after they ran (no verdict), – not decided (a cell it needs "
              "is not run or not complete at that scale), n/a: meaningful at another scale only (it compares with "
              "another paper's number, needs rows that scale does not run, e.g. the 650- and 1500-unit nets at lite, or "
              "is marked n/a there with a measured reason). The rule (docs/claims.md): the mean paired difference in "
              "the claim's direction must exceed the margin fixed before the run (the larger of the stated one and the "
              "compared row's seed sd) with every seed agreeing. Scales: `smoke` = plumbing for CI, `lite` = the "
              "claims on a 2-core CPU (real corpora, small budgets), `paper` = the papers' settings. Paper and ours "
              "(lite) are the compared cells' values, "
              "baseline → row; ours is mean±sd over the seeds.")
    page.add("| Table | Claim | lite | smoke | paper | Paper | Ours (lite) |", "|---|---|---|---|---|---|---|", *rows, "")
    notes = results_dir / "NOTES.md"
    if notes.is_file():
        page.para("Why a claim does not show: see [Notes](NOTES.md).")


def build_readme(results_dir: Path, tables: list[TableInfo], generated: str) -> str:
    results_dir = Path(results_dir)
    tables = tables + orphan_tables(results_dir, tables)
    page = Page()
    by_paper: dict[str, list[TableInfo]] = defaultdict(list)
    for t in tables:
        by_paper[t.paper_key].append(t)
    figure_dirs = sorted(d for d in (results_dir / "figures").glob("*") if d.is_dir())
    for d in figure_dirs:
        by_paper.setdefault(d.name.split("_")[0], [])
    papers = sorted(by_paper, key=paper_order)

    def scales_of(t: TableInfo) -> list[str]:
        return [s for s in SCALES if is_rendered(results_dir, t.name, s)]

    # ---- the claims, first ----------------------------------------------------------------------
    claims_status(page, results_dir, [t for key in papers for t in by_paper[key]])

    # ---- summary ------------------------------------------------------------------------------
    page.heading(2, "Summary")
    page.add("| Paper | Table | " + " | ".join(SCALES) + " |", "|---|---|" + "---|" * len(SCALES))
    for key in papers:
        for t in by_paper[key]:
            done = scales_of(t)
            marks = [f"[{s}](#{{{t.name}/{s}}})" if s in done else "–" for s in SCALES]
            page.add(f"| {key} | [{t.name}](#{{{t.name}}}) | " + " | ".join(marks) + " |")
    page.add("")
    page.para("A link leads to the table at that scale; – means not rendered at that scale yet. Scales: `paper` = the "
              "papers' hyperparameters, `lite` = about one GPU-hour per table, `smoke` = minutes on a CPU (plumbing, "
              "not numbers). Each table shows the paper's number, ours and the difference (ours − paper), "
              "and states its scale, commit, hardware and wall time.")
    notes = results_dir / "NOTES.md"
    if notes.is_file():
        page.heading(2, "Notes")
        page.add(include(notes, results_dir, 3), "")

    anchors: dict[str, int] = {}  # {name}: line index of its heading, resolved to a slug at the end
    not_reproduced: list[TableInfo] = []
    for key in papers:
        infos = by_paper[key]
        paper = infos[0].paper if infos else key
        page.heading(2, paper)
        for t in infos:
            done = scales_of(t)
            if not done:
                not_reproduced.append(t)
                continue
            page.heading(3, t.title)
            anchors[t.name] = max(page.toc)
            for scale in done:
                out = results_dir / "tables" / t.name / scale
                page.heading(4, f"`{t.name}` at scale `{scale}`", toc=False)
                anchors[f"{t.name}/{scale}"] = len(page.lines) - 2
                page.para(table_md_body((out / "table.md").read_text()))
                files = " · ".join(f"[{f}]({_rel(out / f, results_dir)})"
                                   for f in ("table.md", "table.csv", "table.tex", "cells.json") if (out / f).is_file())
                try:
                    meta = load_cells_json(out / "cells.json")
                    command = meta.get("command")
                except (OSError, CorruptFile):
                    command = None
                page.para(f"Files: {files}." + (f" Rendered by `{command}`." if command else ""))
                page.add(*table_figures(out, results_dir))
        missing = [t for t in infos if not scales_of(t)]
        if missing:
            page.heading(3, f"Not yet reproduced ({key})")
            for t in missing:
                anchors[t.name] = max(page.toc)
                page.add(f"- **{t.title}** (`{t.name}`): `make reproduce-table TABLE={t.name} SCALE=lite` "
                         f"(or `python -m reproduce.table table={t.name} scale=lite`; `SCALE=smoke` for a CPU check)")
            page.add("")
        for d in (d for d in figure_dirs if d.name.split("_")[0] == key):
            page.heading(3, f"Figure: `{d.name}`")
            for f in NOTE_FILES:
                if (d / f).is_file():
                    page.add(include(d / f, results_dir, 5), "")
            subs = sorted((s for s in d.iterdir() if s.is_dir()),
                          key=lambda s: (SCALES.index(s.name) if s.name in SCALES else len(SCALES), s.name))
            for sub in subs:
                page.heading(4, f"`{d.name}` at scale `{sub.name}`", toc=False)
                for f in NOTE_FILES:
                    if (sub / f).is_file():
                        page.add(include(sub / f, results_dir, 5), "")
                for png in sorted(sub.glob("*.png")):
                    page.add(f"![{d.name} ({sub.name}): {png.stem}]({_rel(png, results_dir)})", "")
                data = sorted(p for p in sub.iterdir() if p.suffix in (".json", ".csv"))
                if data:
                    page.para("Data: " + " · ".join(f"[{p.name}]({_rel(p, results_dir)})" for p in data) + ".")
            page.para(f"Figures under `results/figures/` come from scripts (e.g. `scripts/{d.name}.py`) and are not "
                      "re-rendered by this report.")

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
    for folder, title in (("sweeps", "Sweeps"), ("sanity", "Sanity checks"), ("device", "Runs on a lent GPU")):
        docs = sorted((results_dir / folder).glob("*.md"))
        if docs:
            page.heading(2, title)
            for doc in docs:
                page.add(include(doc, results_dir, 3), "", f"Source: [{_rel(doc, results_dir)}]({_rel(doc, results_dir)}).", "")
    if not_reproduced:
        page.heading(2, "Not yet reproduced")
        page.para("Tables not rendered at any scale yet: "
                  + ", ".join(f"[`{t.name}`](#{{{t.name}}})" for t in not_reproduced)
                  + ". `make reproduce-table TABLE=<name> SCALE=lite` runs one (`TABLE=all` every table), and "
                    "`python -m reproduce.report` then brings it here.")

    head = [
        "# Reproduced results",
        "",
        "This page is generated by `python -m reproduce.report` from the files under `results/` (the tables as "
        "`reproduce.table` rendered them; `make rerender` renders them again from a run ledger). Do not edit it by "
        "hand: caveats go in [`NOTES.md`](NOTES.md) (included below), and `python -m reproduce.report --check` tells "
        "whether it is up to date.",
        "",
        GENERATED_PREFIX + generated,
        "",
        "## Contents",
        "",
    ]
    body = page.lines
    # anchors, as GitHub makes them: in document order, a repeated slug gets -1, -2...
    all_lines = head + body
    seen: dict[str, int] = defaultdict(int)
    slug_at: dict[int, str] = {}
    for i, _level, title in _headings(all_lines):
        s = slug(title)
        slug_at[i] = s if seen[s] == 0 else f"{s}-{seen[s]}"
        seen[s] += 1
    offset = len(head)
    toc = []
    for i in sorted(page.toc):
        m = _HEADING.match(body[i])
        level = len(m.group(1))
        toc.append("  " * (level - 2) + f"- [{m.group(2).replace('`', '')}](#{slug_at[i + offset]})")
    text = "\n".join(head + toc + [""] + body).rstrip() + "\n"
    for name, i in anchors.items():
        text = text.replace(f"(#{{{name}}})", f"(#{slug_at[i + offset]})")
    return re.sub(r"\n{3,}", "\n\n", text)


def _generated_line() -> str:
    from core.provenance import git_commit

    git = git_commit()
    commit = git["commit"][:10] + (" (uncommitted changes)" if git.get("dirty") else "")
    return f"{dt.datetime.now().isoformat(timespec='seconds')} at commit `{commit}`."


def comparable(text: str) -> list[str]:
    """The README without what changes between two runs: the Generated line."""
    return [line for line in text.splitlines() if not line.startswith(GENERATED_PREFIX)]


def write_report(results_dir: Path, conf_dir: Path = CONF_DIR) -> Path:
    results_dir = Path(results_dir)
    text = build_readme(results_dir, load_tables(conf_dir), _generated_line())
    path = results_dir / "README.md"
    atomic_write_bytes(path, lambda f: f.write(text.encode()))
    sync_status_line(results_dir.parent / "README.md", text)
    return path


STATUS_START, STATUS_END = "<!-- claims-status: written by python -m reproduce.report -->", "<!-- /claims-status -->"


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
    old = project_readme.read_text()
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
    """The differences between results/README.md and what the files under results/ give now ([] = up to date)."""
    path = Path(results_dir) / "README.md"
    if not path.is_file():
        return [f"{path} does not exist"]
    fresh = build_readme(Path(results_dir), load_tables(conf_dir), "")
    diff = list(difflib.unified_diff(comparable(path.read_text()), comparable(fresh), str(path), "regenerated", lineterm="", n=1))
    project = Path(results_dir).parent / "README.md"
    headline = claims_headline(fresh)
    if headline and project.is_file() and STATUS_START in project.read_text() and headline not in project.read_text():
        diff.append(f"{project}: the claims status line is not {headline!r}")
    return diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reproduce.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results", help="the results folder (default: results)")
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale; writes nothing")
    args = parser.parse_args(argv)
    if args.check:
        diff = check_report(Path(args.results))
        if diff:
            print(f"repdegen: {args.results}/README.md is stale; run `python -m reproduce.report`:", file=sys.stderr)
            print("\n".join(diff[:60]), file=sys.stderr)
            return 1
        print(f"repdegen: {args.results}/README.md is up to date")
        return 0
    path = write_report(Path(args.results))
    print(f"repdegen: wrote {path}")
    return 0
