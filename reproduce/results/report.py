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
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf
from repdegen.core.errors import CorruptFile, UserError
from repdegen.core.files import atomic_write_bytes
from repdegen.core.loaders import (
    STATUS_COMPLETE,
    BadFile,
    check_keys,
    load_bench_json,
    load_cells_json,
    load_claims_json,
    rendering_fix,
)
from repdegen.reproduce.errors import EXIT_USER_ERROR, report_user_error
from repdegen.reproduce.results.paper_rows import HEADER, all_rows
from repdegen.reproduce.settings.config import CONF_DIR

SCALES = ("paper", "lite", "smoke")
GENERATED_PREFIX = "Generated: "
# figures a table renders, in the order shown, with what they are
TABLE_FIGURES = {
    "curves": "Validation PPL per epoch of each row: mean over seeds (line), min–max (band)",
    "singular_values": "Normalised singular values of each row's output embedding, mean over seeds with min–max band "
                       "(Gao Fig. 2b, Yu Fig. 3c)",
    "geometry_over_training": "I(W), I(W) rare/frequent and cos(rare, freq) (and AL's target entropy, where a row "
                              "records it) at every evaluation, mean over seeds with min–max band (Yu Fig. 2)",
    "rare_group_size": "AGG's rare group size over the first updates, mean over seeds with min–max band (Yu Fig. 4)",
    "svd_projection": "Output embedding of each row (one seed) on its top-2 singular directions, side by side on the "
                      "same axes, by frequency group (Gao Figs 1, 2a; Yu Figs 1, 3)",
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
        # (also "Tables 5 and 15", "Fig. 5 and App. D", "Sec. 6.2 and Figure 1": what follows the paper's title)
        return re.sub(r",\s*(Tables?|Fig\.|Figure|Sec\.)\s.*$", "", self.source.strip())


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def paper_order(key: str) -> tuple:
    m = re.match(r"([a-z]+)(\d{4})", key)
    return (int(m.group(2)), m.group(1)) if m else (9999, key)


def claim_scales(table, claim) -> list[str] | None:
    """The scales at which a claim can be decided: its own ``scales`` and those where every row it
    compares runs, less those it is ``na`` at (None: every scale)."""
    from repdegen.reproduce.results.claims import resolve_row

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


def include(path: Path, page_dir: Path, top: int) -> str:
    """A Markdown file included in a page that lives in ``page_dir`` (results/ or a table's folder): headings nested
    under ``top``, relative links made relative to the page."""
    base = path.parent.resolve().relative_to(Path(page_dir).resolve()).as_posix()
    text = read_text(path).strip()
    return demote(relink(text, base) if base != "." else text, top)


def read_text(path: Path) -> str:
    """A text file the report includes; :class:`CorruptFile` (naming it, and the fix) when it is not UTF-8 text."""
    try:
        return Path(path).read_text()
    except UnicodeDecodeError:
        fix = (rendering_fix(path) if Path(path).parent.name in SCALES
               else f"restore it from git (git checkout -- {path}) or save it as UTF-8")
        raise CorruptFile(path, f"{path}: not UTF-8 text; expected the Markdown text the report includes; {fix}") from None


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


_OLD_SVD = re.compile(r"svd_\d+")


# what the report reads of each cell, when there (no hash: a row not run at that scale)
CELL_KEYS = {"status": str, "config_hash": (str, type(None)), "label": str}


def rendered_cells(out: Path) -> dict | None:
    """A rendering's cells.json, checked for what the report reads (``meta``'s title and source, ``figures``'
    captions, each cell's status and label: strings, its hash a string or null); None when there is none (an older
    rendering). A corrupt one raises :class:`CorruptFile` naming it and how to render it again: the report writes
    nothing then."""
    path = Path(out) / "cells.json"
    if not path.is_file():
        return None
    fix = rendering_fix(path)
    data = load_cells_json(path, fix)

    def error(why: str) -> CorruptFile:
        return BadFile(path, "rendered table's cells.json", why, "the JSON object repdegen.reproduce.runs.tables writes", fix)

    check_keys(data.get("meta") or {}, {}, error, {"title": str, "source": str}, where="meta.")
    figures = data.get("figures") or {}
    check_keys(figures, {}, error, dict.fromkeys(figures, str), where="figures.")
    for i, cell in enumerate(data["cells"]):
        check_keys(cell, {}, error, CELL_KEYS, where=f"cells[{i}].")
    return data


def _figure_captions(out: Path) -> dict:
    """cells.json's {figure stem: caption} (written by repdegen.reproduce.results.table_render.render); {} for none.
    A rendering made before the figures were keyed by name has {"svd_<k>": row label}: returned as it is."""
    return (rendered_cells(out) or {}).get("figures") or {}


def _svd_labels(out: Path, captions: dict) -> list[str]:
    """The labels of an older rendering's svd_<k>.png: cells.json's {svd_<k>: label}, or the k-th complete cell."""
    if captions and all(_OLD_SVD.fullmatch(k) for k in captions):
        return [captions.get(f"svd_{k}", f"svd_{k}") for k in range(1, len(captions) + 1)]
    cells = (rendered_cells(out) or {"cells": []})["cells"]
    seen, labels = set(), []
    for c in cells:
        if c.get("status") == STATUS_COMPLETE and c.get("config_hash") not in seen:
            seen.add(c.get("config_hash"))
            labels.append(c.get("label") or str(c.get("config_hash")))
    return labels


def table_figures(out: Path, page_dir: Path) -> list[str]:
    """The figures of a rendering as Markdown images, with their captions (cells.json's, else TABLE_FIGURES)."""
    pngs = {p.stem: p for p in out.glob("*.png")}
    recorded = _figure_captions(out)
    captions = TABLE_FIGURES if not recorded or any(_OLD_SVD.fullmatch(k) for k in recorded) else recorded
    lines = []
    for stem, caption in captions.items():
        if stem in pngs:
            caption = caption.replace("[", "\\[").replace("]", "\\]")
            lines += [f"![{caption}]({_rel(pngs.pop(stem), page_dir)})", ""]
    svds = sorted((p for s, p in pngs.items() if _OLD_SVD.fullmatch(s)), key=lambda p: _natural(p.stem))
    if svds:  # an older rendering: one svd_<k>.png per row
        labels = _svd_labels(out, recorded)
        lines += ["Output embeddings on their top-2 singular directions, by frequency group (Gao Figs 1, 2a; Yu Figs 1, 3):",
                  ""]
        for p in svds:
            k = int(p.stem.split("_")[1])
            label = labels[k - 1] if k <= len(labels) else p.stem
            pngs.pop(p.stem)
            lines.append(f"![SVD projection: {label}]({_rel(p, page_dir)})")
        lines.append("")
    for stem, p in sorted(pngs.items()):
        lines += [f"![{stem}]({_rel(p, page_dir)})", ""]
    return lines + kept_figures(out, page_dir)


def kept_figures(out: Path, page_dir: Path) -> list[str]:
    """The figures a rendering had before it lost rows (``records/figures-<commit>/``, reproduce/runs/archive.py: the
    cells' records were recovered, or a row's weights were lost with a work tree before its projection was kept): they
    hold those rows' curves, geometry or SVD projection, which no rendering can draw again."""
    lines = []
    for d in sorted((out / "records").glob("figures-*")):
        if not d.is_dir():
            continue
        path = d / "captions.json"
        try:
            captions = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError) as err:
            raise UserError(f"{path}: cannot be read as JSON ({err}); expected the object of figure name -> caption "
                            f"kept with the figures drawn before a rendering lost their rows; restore it from git "
                            f"(git checkout -- {path})") from None
        if not isinstance(captions, dict) or not all(isinstance(v, str) for v in captions.values()):
            raise UserError(f"{path}: expected a JSON object of figure name -> caption (strings), got "
                            f"{type(captions).__name__}; restore it from git (git checkout -- {path})")
        pngs = sorted(d.glob("*.png"), key=lambda p: (list(captions).index(p.stem) if p.stem in captions else len(captions),
                                                      p.stem))
        if not pngs:
            continue
        lines += [f"Figures as drawn at commit `{d.name.removeprefix('figures-')}`, with rows the renderings since cannot "
                  "draw (their run records were recovered, or their weights lost with a work tree): these show them "
                  "only:", ""]
        for p in pngs:
            caption = str(captions.get(p.stem, p.stem)).replace("[", "\\[").replace("]", "\\]")
            lines += [f"![{caption}]({_rel(p, page_dir)})", ""]
    return lines


def bench_table(path: Path) -> list[str]:
    """A benchmark JSON of scripts/bench.py as a small Markdown table."""
    data = load_bench_json(path)
    results = data.get("results") or []
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
        lines += ["```", data["command"], "```", ""]  # the command as it ran (a script may have left the product since)
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
        # the rendering's structured record (cells.json); its Markdown is only embedded, never parsed
        meta = (rendered_cells(mds[0].parent) or {}).get("meta") or {}
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
    data = rendered_cells(out)
    if data is None:
        return True  # an older rendering without cells.json
    return any(c.get("status") == STATUS_COMPLETE for c in data["cells"])


def _verdicts(results_dir: Path, table: str, scale: str) -> dict[str, dict] | None:
    """{claim text: its record} of a rendered table's claims.json, or None when not rendered at that scale; {} for a
    rendering of the v1 rule (no tie margin, no registration), whose verdicts are not shown."""
    if not is_rendered(results_dir, table, scale):
        return None
    path = results_dir / "tables" / table / scale / "claims.json"
    if not path.is_file():
        return None
    fix = rendering_fix(path)
    claims = load_claims_json(path, fix)["claims"]
    if any("shown" not in c for c in claims):
        return {}  # rendered under the v1 rule (no tie margin, no registration): no verdict in the status table

    def error(why: str) -> CorruptFile:
        return BadFile(path, "rendered table's claims.json", why, "the JSON object repdegen.reproduce.runs.tables writes", fix)

    shown = (*VERDICT_KEYS[:-1], "n/a")  # what a verdict is shown as (repdegen.reproduce.results.claims_text.shown_state)
    for i, c in enumerate(claims):
        check_keys(c, {"shown": str, "mark": str}, error, {"state": str}, where=f"claims[{i}].")
        if c["shown"] not in shown:
            raise error(f"claims[{i}].shown is {c['shown']!r}; expected one of {', '.join(shown)}")
    return {c["text"]: c for c in claims}


VERDICT_KEYS = ("holds", "fails", "tie", "undecided", "changed", "paper_only")


def claim_marks(results_dir: Path, t: TableInfo) -> list[tuple[str, dict[str, tuple[str, dict | None]]]]:
    """Per claim of a table: (text, {scale: (shown, its claims.json record or None)}); shown is a verdict key of
    VERDICT_KEYS ("paper_only" = n/a at that scale)."""
    rendered = {s: _verdicts(results_dir, t.name, s) for s in CLAIM_SCALES}
    out = []
    for text, scales in t.claims:
        marks = {}
        for s in CLAIM_SCALES:
            v = (rendered[s] or {}).get(text)
            shown = (v.get("shown") or v["state"]) if v else "undecided"
            if (scales is not None and s not in scales) or shown == "n/a":
                shown = "paper_only"
            marks[s] = (shown, v)
        out.append((text, marks))
    return out


def verdict_counts(marks: list[tuple[str, dict]]) -> dict[str, dict[str, int]]:
    counts = {s: dict.fromkeys(VERDICT_KEYS, 0) for s in CLAIM_SCALES}
    for _, by_scale in marks:
        for s, (shown, _) in by_scale.items():
            counts[s][shown] += 1
    return counts


def headline(counts: dict[str, dict[str, int]], total: int) -> str:
    """The status in one paragraph; its first words are what claims_headline finds and the project README shows."""
    c, p = counts["lite"], counts["paper"]
    changed = f", {c['changed']} changed after their cells ran (⚠, no verdict)" if c["changed"] else ""
    return (f"**{c['holds']} of {total - c['paper_only']} claims shown at `lite`** ({c['fails']} not shown, {c['tie']} "
            f"ties inside their margin, {c['undecided']} not yet decided{changed}; {c['paper_only']} more cannot be "
            f"decided at `lite`: they compare with other work's numbers, need rows `lite` does not run, or are n/a "
            f"there with a measured reason). At `paper`: {p['holds']} ✓, {p['fails']} ✗, {p['tie']} ≈"
            + (f", {p['changed']} ⚠" if p["changed"] else "") + f" of {total - p['paper_only']}.")


def _count_text(n: dict[str, int]) -> str:
    """"3 ✓ · 1 ✗ · 2 ≈ (4 n/a)" of one table at one scale."""
    parts = [f"{n[k]} {m}" for k, m in (("holds", "✓"), ("fails", "✗"), ("tie", "≈"), ("changed", "⚠"),
                                         ("undecided", "not decided")) if n[k]]
    text = " · ".join(parts) or "–"
    return text + (f" ({n['paper_only']} n/a)" if n["paper_only"] else "")


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
    # repository paths named in results/*.md, README.md and docs/*.md that no longer exist
    from repdegen.reproduce.results.stale import check_stale_references

    diff += check_stale_references(Path(results_dir), Path(conf_dir).resolve().parent)
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
