"""What ``repdegen report`` reads under ``results/``: the tables rendered at each scale (``cells.json``,
``claims.json``, ``table.md`` and their figures), the table configs' titles and claims, the benchmark JSON and the
hand-written notes, each read through its checked loader; and the Markdown helpers that put them into one page
(headings demoted, links made relative to the page). The pages themselves are :mod:`repdegen.reproduce.results.report`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf
from repdegen.core.errors import CorruptFile, UserError
from repdegen.core.loaders import (
    STATUS_COMPLETE,
    BadFile,
    check_keys,
    load_bench_json,
    load_cells_json,
    load_claims_json,
    rendering_fix,
)
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
    notes: list[str] = field(default_factory=list)  # the table config's notes: what a reader must know of its rows

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
                               {str(r.experiment) for r in raw.get("rows", []) if r.get("experiment")}, claims,
                               [str(n) for n in raw.get("notes", []) or []]))
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
