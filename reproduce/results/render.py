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

from reproduce.results.metrics import label, metric


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


def _delta(paper, ours, column: str) -> str:
    if paper is None or ours is None:
        return ""
    d = ours - paper
    if not math.isfinite(d):
        return _fmt(d, column)
    return ("+" if d >= 0 else "−") + _fmt(abs(d), column)


def _ours(row: RenderedRow, column: str) -> str:
    """Ours: the value, or mean±sd over the row's seeds."""
    sd = (row.extra.get("sd") or {}).get(column)
    value = _fmt(row.ours.get(column), column)
    return value if sd is None or value == "–" else f"{value}±{_fmt(sd, column)}"


def _vs_base(rows: list[RenderedRow], row: RenderedRow, column: str, which: str) -> str:
    """The row's change against its baseline row (which = "paper" | "ours"); empty for the baseline itself."""
    j = row.extra.get("baseline")
    if j is None:
        return ""
    base = rows[j]
    return _delta(getattr(base, which).get(column), getattr(row, which).get(column), column)


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
    commit += " (uncommitted changes)" if git.get("dirty") else ""
    seeds = meta.get("seeds") or []
    lines = [
        f"Source: {meta['source']}.",
        f"Scale: `{meta['scale']}` ({meta.get('scale_note', '')})."
        + (f" Seeds: {', '.join(map(str, seeds))} (ours = mean±sd)." if len(seeds) > 1 else "")
        + f" Commit: `{commit}`. Hardware: {meta.get('hardware', 'n/a')}. "
        f"Wall time of the cells: {meta.get('wall_time', 'n/a')}. Generated {meta.get('generated', '')}.",
    ]
    if meta.get("differences"):
        lines.append(f"Not the paper's setting: {meta['differences']} Compare each row's change against the baseline "
                     f"(Δ vs base), not the absolute numbers.")
    return lines


def _metric_header(columns: list[str], relative: bool, paper: bool = True) -> list[str]:
    head = []
    for c in columns:
        name = label(c)
        head += ([name] if not paper else
                 [f"{name} (paper)", f"{name} (ours)", "Δ vs base (paper)", "Δ vs base (ours)"] if relative
                 else [f"{name} (paper)", f"{name} (ours)", "Δ"])
    return head


def _metric_cells(rows: list[RenderedRow], r: RenderedRow, columns: list[str], relative: bool,
                  paper: bool = True) -> list[str]:
    cells = []
    for c in columns:
        if not paper:
            cells.append(_ours(r, c))
        elif relative:
            cells += [_fmt(r.paper.get(c), c), _ours(r, c), _vs_base(rows, r, c, "paper"), _vs_base(rows, r, c, "ours")]
        else:
            cells += [_fmt(r.paper.get(c), c), _ours(r, c), _delta(r.paper.get(c), r.ours.get(c), c)]
    return cells


def to_markdown(title: str, columns: list[str], rows: list[RenderedRow], meta: dict, notes: list[str],
                relative: bool = False, claims: list[str] | None = None, paper: bool = True,
                first_column: str = "Model") -> str:
    """The table as Markdown. ``paper=False``: our numbers only (a sweep: no paper column to compare with)."""
    head = [first_column, *_metric_header(columns, relative, paper)]
    lines = [f"## {title}", "", *_header_lines(meta), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    last_group = None
    for r in rows:
        if r.group and r.group != last_group:
            lines.append(f"| **{r.group}** |" + " |" * (len(head) - 1))
            last_group = r.group
        lines.append("| " + " | ".join([_label(r), *_metric_cells(rows, r, columns, relative, paper)]) + " |")
    if relative and any(r.extra.get("baseline") is not None for r in rows):
        bases = sorted({rows[r.extra["baseline"]].label for r in rows if r.extra.get("baseline") is not None})
        lines += ["", f"Δ vs base: the row minus its baseline row ({', '.join(bases)}; within the row's group), "
                      "the paper's numbers and ours."]
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    if claims:
        lines += ["", *claims]
    return "\n".join(lines) + "\n"


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
