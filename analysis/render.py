"""Render a paper table with our numbers beside the paper's: Markdown, CSV and LaTeX.

Each metric column becomes three: the paper's value, ours, and the difference (ours - paper).
The header states the scale, the commit, the hardware and the wall time of the cells.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

COLUMN_LABELS = {
    "valid_ppl": "Valid PPL",
    "test_ppl": "Test PPL",
    "params": "Params (M)",
    "isotropy": "I(W)",
    "mean_cos": "Mean cos",
    "bleu_tok": "BLEU tokenized",
    "uniq": "Uniq",
    "cos_rare_frequent": "cos(rare, freq)",
    **{f"ppl_{g}": f"PPL {g}" for g in ("frequent", "medium", "rare")},
    **{f"uniq_{g}": f"Uniq {g}" for g in ("frequent", "medium", "rare")},
    **{f"isotropy_{g}": f"I(W) {g}" for g in ("frequent", "medium", "rare")},
    **{f"wordsim_{d}": d.upper() for d in ("men", "ws353", "rg65", "rw")},
    "bleu": "SacreBLEU",
}


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
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if column == "params":
        return f"{value:.1f}" if value < 100 else f"{value:.0f}"
    if column.startswith(("isotropy", "mean_cos", "cos_")):
        return f"{value:.3g}"
    if column.startswith("uniq"):
        return f"{value:.0f}"
    if column.startswith("bleu"):
        return f"{value:.2f}"
    if column.startswith("ppl_") or column in ("valid_ppl", "test_ppl"):
        return f"{value:.2f}" if abs(value) < 100 else (f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}")
    return f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"


def _delta(paper, ours, column: str) -> str:
    if paper is None or ours is None:
        return ""
    d = ours - paper
    return ("+" if d >= 0 else "−") + _fmt(abs(d), column)


def _label(row: RenderedRow) -> str:
    mark = {"failed": " (failed)", "missing": " (not run)", "running": " (unfinished)", "interrupted": " (unfinished)"}
    return row.label + mark.get(row.status, "")


def _header_lines(meta: dict) -> list[str]:
    git = meta.get("git", {})
    commit = git.get("commit", "unknown")[:10] + (" (uncommitted changes)" if git.get("dirty") else "")
    return [
        f"Source: {meta['source']}.",
        f"Scale: `{meta['scale']}` ({meta.get('scale_note', '')}). Commit: `{commit}`. Hardware: {meta.get('hardware', 'n/a')}. "
        f"Wall time of the cells: {meta.get('wall_time', 'n/a')}. Generated {meta.get('generated', '')}.",
    ]


def to_markdown(title: str, columns: list[str], rows: list[RenderedRow], meta: dict, notes: list[str]) -> str:
    head = ["Model"]
    for c in columns:
        name = COLUMN_LABELS.get(c, c)
        head += [f"{name} (paper)", f"{name} (ours)", "Δ"]
    lines = [f"## {title}", "", *_header_lines(meta), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    last_group = None
    for r in rows:
        if r.group and r.group != last_group:
            lines.append(f"| **{r.group}** |" + " |" * (len(head) - 1))
            last_group = r.group
        cells = [_label(r)]
        for c in columns:
            cells += [_fmt(r.paper.get(c), c), _fmt(r.ours.get(c), c), _delta(r.paper.get(c), r.ours.get(c), c)]
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def to_csv(columns: list[str], rows: list[RenderedRow]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    header = ["group", "label", "status", "config_hash"]
    for c in columns:
        header += [f"{c}_paper", f"{c}_ours", f"{c}_delta"]
    writer.writerow(header)
    for r in rows:
        line = [r.group or "", r.label, r.status, r.config_hash or ""]
        for c in columns:
            p, o = r.paper.get(c), r.ours.get(c)
            line += [p if p is not None else "", o if o is not None else "", (o - p) if (p is not None and o is not None) else ""]
        writer.writerow(line)
    return buf.getvalue()


def _tex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("$", r"\$")):
        text = text.replace(a, b)
    return text


def to_latex(title: str, columns: list[str], rows: list[RenderedRow], meta: dict) -> str:
    spec = "l" + "rrr" * len(columns)
    top = " & ".join([""] + [rf"\multicolumn{{3}}{{c}}{{{_tex_escape(COLUMN_LABELS.get(c, c))}}}" for c in columns])
    sub = " & ".join(["Model"] + ["paper & ours & $\\Delta$"] * len(columns))
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
            lines.append(rf"\multicolumn{{{1 + 3 * len(columns)}}}{{l}}{{\textit{{{_tex_escape(r.group)}}}}} \\")
            last_group = r.group
        cells = [_tex_escape(_label(r))]
        for c in columns:
            cells += [_fmt(r.paper.get(c), c), _fmt(r.ours.get(c), c), _delta(r.paper.get(c), r.ours.get(c), c).replace("−", "-")]
        lines.append(" & ".join(cells).replace("–", "--") + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"
