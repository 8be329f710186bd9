"""Render a paper table with our numbers beside the paper's: Markdown, CSV and LaTeX.

At scale ``paper`` each metric column becomes three: the paper's value, ours, and the difference
(ours - paper). At ``smoke`` and ``lite`` (other corpora, widths and budgets) a difference from the
paper's number says nothing, so each metric shows the paper's value and ours, then each row's change
against the table's baseline row, the paper's beside ours (e.g. REAL - VD-LSTM: paper -4.6, ours -7.3).
With several seeds, ours is the mean ± sd over the seeds. The header states the scale, what the cells
ran (corpus, vocabulary, model, budget), the seeds, the commit, the hardware and the wall time; the
table's claims and their verdicts follow it (reproduce/results/claims.py).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

from repdegen.core.provenance import uncommitted_note
from repdegen.reproduce.results.metrics import label, metric, sd_places


@dataclass
class RenderedRow:
    label: str
    group: str | None
    paper: dict[str, float | None]
    ours: dict[str, float | None]
    status: str  # complete | missing | failed | paper-only | running | interrupted
    note: str | None = None
    config_hash: str | None = None
    extra: dict = field(default_factory=dict)


def _fmt(value, column: str) -> str:
    return metric(column).format(value)


def _delta(paper, ours, column: str, places: int | None = None) -> str:
    """ours - paper, signed; ``places``: the decimals of the mean ± sd it is printed beside (metrics.sd_places)."""
    if paper is None or ours is None:
        return ""
    d = ours - paper
    if not math.isfinite(d):
        return _fmt(d, column)
    text = _fmt(abs(d), column) if places is None else f"{round(abs(d), places):.{max(places, 0)}f}"
    return ("+" if d >= 0 else "−") + text


def _ours(row: RenderedRow, column: str) -> str:
    """Ours: the value, or mean ± sd over the row's seeds (the sd to two significant figures, the mean to match)."""
    return metric(column).format_mean_sd(row.ours.get(column), (row.extra.get("sd") or {}).get(column))


def _vs_base(rows: list[RenderedRow], row: RenderedRow, column: str, which: str, places: int | None = None) -> str:
    """The row's change against its baseline row (which = "paper" | "ours"); empty for the baseline itself."""
    j = row.extra.get("baseline")
    if j is None:
        return ""
    base = rows[j]
    return _delta(getattr(base, which).get(column), getattr(row, which).get(column), column, places)


def _label(row: RenderedRow) -> str:
    mark = {"failed": " (failed)", "missing": " (not run)", "running": " (unfinished)", "interrupted": " (unfinished)",
            "preempted": " (unfinished)", "not-at-scale": f" (paper only at {row.extra.get('scale', 'this scale')})"}
    n, done = row.extra.get("n_seeds", 1), row.extra.get("n_done", None)
    if done and n > 1 and done < n:  # some of its seeds are complete
        return f"{row.label} ({done}/{n} seeds)"
    return row.label + mark.get(row.status, "")


def _header_lines(meta: dict) -> list[str]:
    git = meta.get("git", {})
    # cells run at different commits come as "a+b": shorten each, keep them all
    commit = "+".join(c[:10] for c in str(git.get("commit", "unknown")).split("+"))
    commit += uncommitted_note(git)
    seeds = meta.get("seeds") or []
    lines = [
        f"Source: {meta['source']}.",
        f"Scale: `{meta['scale']}` ({meta.get('scale_note', '')})."
        + (f" Seeds: {', '.join(map(str, seeds))} (ours = mean ± sd)." if len(seeds) > 1 else "")
        + f" Commit: `{commit}`. Hardware: {meta.get('hardware', 'n/a')}. "
        f"Wall time of the cells: {meta.get('wall_time', 'n/a')}. Generated {meta.get('generated', '')}.",
    ]
    if meta.get("differences"):
        lines.append(f"Not the paper's setting: {meta['differences']} Compare each row's change against the baseline "
                     f"(Δ base), not the absolute numbers.")
    return lines


# The Markdown table: at most MAX_COLUMNS columns (the label and two per metric: the paper's value and ours, each with
# its Δ in brackets); a table with more metrics is split into one table per family of metrics.
MAX_COLUMNS = 12
FAMILY_TITLES = {"ppl": "Perplexity", "isotropy": "Isotropy I(W)", "cos": "Cosines", "bleu": "BLEU", "uniq": "Uniq",
                 "wordsim": "Word similarity", "params": "Parameters", None: "Other metrics"}


def _with_delta(value: str, delta: str) -> str:
    return f"{value} ({delta})" if delta and value != "–" else value


def _subcolumns(rows: list[RenderedRow], columns: list[str], relative: bool, paper: bool) -> list[tuple[str, str]]:
    """(metric, "paper" | "ours") for each column the Markdown shows: a paper or ours column that is "–" in every
    row is left out (the CSV keeps it)."""
    subs = []
    for c in columns:
        for which in (("paper", "ours") if paper else ("ours",)):
            if any(getattr(r, which).get(c) is not None for r in rows):
                subs.append((c, which))
    return subs


def _subcolumn_header(column: str, which: str, relative: bool, paper: bool) -> str:
    return f"{label(column)} ({which})" if paper else label(column)


def _cell(rows: list[RenderedRow], r: RenderedRow, column: str, which: str, relative: bool, paper: bool) -> str:
    value = _fmt(r.paper.get(column), column) if which == "paper" else _ours(r, column)
    if not paper:
        return value
    places = sd_places((r.extra.get("sd") or {}).get(column)) if which == "ours" else None
    if relative:
        return _with_delta(value, _vs_base(rows, r, column, which, places))
    return value if which == "paper" else _with_delta(value, _delta(r.paper.get(column), r.ours.get(column), column,
                                                                    places))


def _chunks(subs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The subcolumns in tables of at most MAX_COLUMNS - 1 each, a family of metrics kept together where it fits."""
    width, chunks = MAX_COLUMNS - 1, [[]]
    if len(subs) <= width:
        return [subs]  # one table, in the table's own column order
    families: dict = {}
    for sub in subs:
        families.setdefault(metric(sub[0]).family, []).append(sub)
    for family_subs in families.values():
        if chunks[-1] and len(chunks[-1]) + len(family_subs) > width:
            chunks.append([])
        for sub in family_subs:
            # a metric's paper and ours columns stay in one table
            if len(chunks[-1]) >= width or (len(chunks[-1]) == width - 1 and sub[1] == "paper"):
                chunks.append([])
            chunks[-1].append(sub)
    return [c for c in chunks if c]


def _markdown_table(rows: list[RenderedRow], subs: list[tuple[str, str]], relative: bool, paper: bool,
                    first_column: str) -> list[str]:
    head = [first_column, *(_subcolumn_header(c, w, relative, paper) for c, w in subs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    last_group = None
    for r in rows:
        if r.group and r.group != last_group:
            lines.append(f"| **{r.group}** |" + " |" * (len(head) - 1))
            last_group = r.group
        lines.append("| " + " | ".join([_label(r), *(_cell(rows, r, c, w, relative, paper) for c, w in subs)]) + " |")
    return lines


def to_markdown(title: str, columns: list[str], rows: list[RenderedRow], meta: dict, notes: list[str],
                relative: bool = False, claims: list[str] | None = None, paper: bool = True,
                first_column: str = "Model", cells: list[dict] | None = None) -> str:
    """The table as Markdown. ``paper=False``: our numbers only (a sweep: no paper column to compare with).
    ``cells``: a last section with each cell's provenance (paper scale: :func:`cells_markdown`).

    Each metric shows the paper's value and ours (mean ± sd over seeds); in brackets the change against the row's
    baseline (``relative``: lite, smoke) or ours minus the paper's (paper scale). Over MAX_COLUMNS columns, one
    table per family of metrics (perplexity, isotropy, Uniq, ...)."""
    lines = [f"## {title}", "", *_header_lines(meta)]
    subs = _subcolumns(rows, columns, relative, paper) or [(c, "ours") for c in columns[:1]]
    chunks = _chunks(subs)
    for chunk in chunks:
        lines.append("")
        if len(chunks) > 1:
            families = dict.fromkeys(FAMILY_TITLES.get(metric(c).family, "Other metrics") for c, _ in chunk)
            lines += [f"**{' · '.join(families)}**", ""]
        lines += _markdown_table(rows, chunk, relative, paper, first_column)
    if paper and relative and any(r.extra.get("baseline") is not None for r in rows):
        bases = sorted({rows[r.extra["baseline"]].label for r in rows if r.extra.get("baseline") is not None})
        lines += ["", f"In brackets (Δ base): the row minus its baseline row ({', '.join(bases)}; within the row's "
                      "group), the paper's numbers and ours."]
    elif paper and not relative:
        lines += ["", "In brackets (Δ): ours minus the paper's."]
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    if claims:
        lines += ["", *claims]
    lines += cells_markdown(cells or [])
    return "\n".join(lines) + "\n"


def cells_markdown(cells: list[dict]) -> list[str]:
    """The "Cells" section: one line per complete cell with what a paper-scale number needs beside it (each cell
    may have run on another machine, at another commit, over several sessions of this suite). ``cells``: the
    dicts of :func:`cell_provenance`."""
    if not cells:
        return []
    lines = ["", "### Cells", "", "| Row | Seed | Config | Epochs (per training session) | Wall time | Hardware | Commit "
                                  "| Started |", "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        seed = "preset's" if c.get("seed") is None else str(c["seed"])
        epochs = " + ".join(map(str, c.get("epochs") or [])) or "–"
        mark = " (recovered)" if c.get("recovered") else ""
        lines.append(f"| {c['row']} | {seed} | `{c['config_hash']}`{mark} | {epochs} | {c.get('wall_time', '–')} | "
                     f"{c.get('hardware', '–')} | `{c.get('commit', '–')}` | {c.get('started', '–')} |")
    recovered = sorted({c["recovered"] for c in cells if c.get("recovered")})
    figures = sorted({c["recovered_figures"] for c in cells if c.get("recovered_figures")})
    if recovered:
        lines += ["", "(recovered): the cell's run record was lost with its ledger (a work tree lost between sessions) "
                  "before renderings kept their records; it was rebuilt from the committed rendering "
                  f"({'; '.join(f'`{r}`' for r in recovered)}): the numbers shown here and the claims' numbers are "
                  "the ones measured; its learning curve, geometry over training and weights are gone, so the figures "
                  "above leave it out" + (f"; the figures as drawn before, with it: {', '.join(f'`{f}/`' for f in figures)}"
                                          if figures else "") + " (reproduce/runs/archive.py)."]
    return lines


def to_csv(columns: list[str], rows: list[RenderedRow]) -> str:
    """One line per row: paper, ours (mean over seeds), sd, number of seeds, ours − paper, and the change
    against the row's baseline (paper and ours)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    header = ["group", "label", "status", "config_hash", "seeds"]
    for c in columns:
        header += [f"{c}_paper", f"{c}_ours", f"{c}_sd", f"{c}_delta", f"{c}_vs_base_paper", f"{c}_vs_base_ours"]
    writer.writerow(header)

    def num(v):
        return "" if v is None else v

    for r in rows:
        line = [r.group or "", r.label, r.status, r.config_hash or "", r.extra.get("n_done", "")]
        j = r.extra.get("baseline")
        for c in columns:
            p, o = r.paper.get(c), r.ours.get(c)
            bp, bo = (rows[j].paper.get(c), rows[j].ours.get(c)) if j is not None else (None, None)
            line += [num(p), num(o), num((r.extra.get("sd") or {}).get(c)),
                     (o - p) if (p is not None and o is not None) else "",
                     (p - bp) if (p is not None and bp is not None) else "",
                     (o - bo) if (o is not None and bo is not None) else ""]
        writer.writerow(line)
    return buf.getvalue()


def _metric_cells(rows: list[RenderedRow], r: RenderedRow, columns: list[str], relative: bool) -> list[str]:
    """The LaTeX table's cells of one row: per metric, paper, ours and the Δ (two Δs, paper and ours, when relative)."""
    cells = []
    for c in columns:
        if relative:
            cells += [_fmt(r.paper.get(c), c), _ours(r, c), _vs_base(rows, r, c, "paper"), _vs_base(rows, r, c, "ours")]
        else:
            cells += [_fmt(r.paper.get(c), c), _ours(r, c), _delta(r.paper.get(c), r.ours.get(c), c)]
    return cells


def _tex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("$", r"\$")):
        text = text.replace(a, b)
    return text


def to_latex(title: str, columns: list[str], rows: list[RenderedRow], meta: dict, relative: bool = False,
             claims: list[str] | None = None) -> str:
    k = 4 if relative else 3
    spec = "l" + "r" * k * len(columns)
    top = " & ".join([""] + [rf"\multicolumn{{{k}}}{{c}}{{{_tex_escape(label(c))}}}" for c in columns])
    sub = " & ".join(["Model"] + [("paper & ours & $\\Delta_{base}$ paper & $\\Delta_{base}$ ours" if relative
                                   else "paper & ours & $\\Delta$")] * len(columns))
    lines = [
        "% " + " ".join(_header_lines(meta)).replace("`", ""),
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_tex_escape(title)} (scale: {_tex_escape(meta['scale'])})}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        top + r" \\",
        sub + r" \\",
        r"\midrule",
    ]
    last_group = None
    for r in rows:
        if r.group and r.group != last_group:
            if last_group is not None:
                lines.append(r"\midrule")
            lines.append(rf"\multicolumn{{{1 + k * len(columns)}}}{{l}}{{\textit{{{_tex_escape(r.group)}}}}} \\")
            last_group = r.group
        cells = [_tex_escape(_label(r))] + [v.replace("−", "-").replace("±", r"$\pm$")
                                            for v in _metric_cells(rows, r, columns, relative)]
        lines.append(" & ".join(cells).replace("–", "--") + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    if claims:
        lines += ["", *claims]
    return "\n".join(lines) + "\n"
