"""A table's verdicts in words: the claims section of its Markdown page, LaTeX and CSV files, the record each
verdict keeps in ``claims.json``, and the terminal summary (one line a claim, at most ``CONSOLE_WIDTH`` columns).
The verdicts themselves are :mod:`repdegen.reproduce.results.claims`'."""

from __future__ import annotations

import statistics

from repdegen.reproduce.results.claims import (
    FAILS,
    HOLDS,
    MARK,
    RULE,
    TIE,
    UNDECIDED,
    CheckResult,
    ClaimCheck,
    Verdict,
    stated_margin,
)
from repdegen.reproduce.results.metrics import metric


def mean_sd(values: list[float], column: str) -> str:
    """One seed's value, or mean ± sd over the seeds as the tables print it (Metric.format_mean_sd)."""
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else None
    return metric(column).format_mean_sd(statistics.fmean(values), sd)


def _ratio_note(check: ClaimCheck, a: float | None, b: float | None) -> str:
    if a is None or b is None or not b:
        return ""
    if check.relation.startswith("ratio"):
        return f" (×{a / b:.2f})"
    if check.relation == "within":
        return f" ({100 * (a / b - 1):+.1f} %)"
    return ""


def _relation_words(check: ClaimCheck) -> str:
    v = check.value
    if check.relation == "lower":
        return "<"
    if check.relation == "higher":
        return ">"
    words = {"ratio_at_least": f"≥ {v:g}×", "ratio_at_most": f"≤ {v:g}×", "within": f"within {100 * v:g} % of",
             "above": f"> {v:g}", "below": f"< {v:g}"}
    return words[check.relation]


def _fmt_amount(x: float | None, signed: bool = True) -> str:
    """A difference or margin, to 2 significant digits (3 from 100 up)."""
    if x is None:
        return "–"
    digits = 3 if abs(x) >= 100 else 2
    return f"{x:+.{digits}g}" if signed else f"{x:.{digits}g}"


def describe_check(r: CheckResult) -> tuple[str, str, str]:
    """(what is checked, the paper's values, ours) of one check, as text."""
    from repdegen.reproduce.results.render import _fmt

    c, m = r.check, r.check.metric
    # a row by its label alone (the claim's text names the group), unless both sides share the label (the same
    # model in two groups, e.g. footnote 5's first-session rows): then each by its full "group / label"
    same = c.than is not None and c.row.split(" / ")[-1] == c.than.split(" / ")[-1]
    short = lambda ref: ref if same else ref.split(" / ")[-1]  # noqa: E731
    what = f"{metric(m).label}: {short(c.row)} {_relation_words(c)}" + (f" {short(c.than)}" if c.than else "")
    if c.than is not None:
        paper = (f"{_fmt(r.paper_than, m)} → {_fmt(r.paper_row, m)}" + _ratio_note(c, r.paper_row, r.paper_than)
                 if r.paper_row is not None or r.paper_than is not None else "–")
        if r.row_values:
            ma, mb = statistics.fmean(r.row_values), statistics.fmean(r.than_values)
            ours = f"{mean_sd(r.than_values, m)} → {mean_sd(r.row_values, m)}" + _ratio_note(c, ma, mb)
        else:
            ours = "–"
    else:
        paper = _fmt(r.paper_row, m) if r.paper_row is not None else "–"
        ours = mean_sd(r.row_values, m) if r.row_values else "–"
    if r.state != UNDECIDED and r.difference is not None:
        ours += f" [{_fmt_amount(r.difference)} vs margin {_fmt_amount(r.margin, signed=False)}"
        ours += f"; {r.agree}/{len(r.seeds)} seeds]" if len(r.seeds) > 1 else "]"
    elif r.state == UNDECIDED and r.reason and ours == "–":
        ours += f" ({r.reason})"
    return what, paper, ours


def verdict_record(v: Verdict) -> dict:
    """A verdict as JSON (claims.json; the report's status table reads it)."""
    checks = []
    for r in v.checks:
        what, paper, ours = describe_check(r)
        checks.append({"metric": r.check.metric, "row": r.check.row, "relation": r.check.relation, "than": r.check.than,
                       "value": r.check.value, "margin": stated_margin(r.check)[0],
                       "margin_abs": stated_margin(r.check)[1], "effective_margin": r.margin, "difference": r.difference,
                       "state": r.state, "paper_state": r.paper_state, "seeds": r.seeds,
                       "ours_row": r.row_values, "ours_than": r.than_values, "agree": r.agree,
                       "paper_row": r.paper_row, "paper_than": r.paper_than, "what": what, "paper": paper, "ours": ours,
                       "reason": r.reason})
    return {"text": v.claim.text, "source": v.claim.source, "quote": v.claim.quote, "state": v.state,
            "mark": verdict_mark(v), "shown": shown_state(v), "paper_state": v.paper_state,
            "registration": v.registration or None, "checks": checks}


def verdict_mark(v: Verdict) -> str:
    """✓ ✗ ≈ –, or ⚠ when the claim or a cell's config changed after its cells ran (no verdict)."""
    return "⚠" if v.registration else MARK[v.state]


def _scale_caveat(scale: str) -> str:
    return " — **not meaningful at smoke** (plumbing-sized runs)" if scale == "smoke" else ""


CHANGED, NA = "changed", "n/a"


def _off_scale(v: Verdict) -> str | None:
    """Why a claim is not decidable at this scale (its rows or settings are not run here, or it is marked n/a)."""
    if v.state != UNDECIDED:
        return None
    return next((r.reason for r in v.checks if "not run at this scale" in r.reason or "meaningful at" in r.reason
                 or r.reason.startswith("n/a at")), None)


def shown_state(v: Verdict) -> str:
    """What a verdict counts as: changed after run (⚠), n/a at this scale, or its state."""
    if _off_scale(v):
        return NA
    return CHANGED if v.registration else v.state


def tally(verdicts: list[Verdict]) -> dict[str, int]:
    counts = {k: 0 for k in (HOLDS, FAILS, TIE, UNDECIDED, CHANGED, NA)}
    for v in verdicts:
        counts[shown_state(v)] += 1
    return counts


def tally_words(counts: dict[str, int]) -> str:
    decidable = sum(counts.values()) - counts[NA]
    parts = [f"{counts[HOLDS]} ✓", f"{counts[FAILS]} ✗", f"{counts[TIE]} ≈ (ties)", f"{counts[UNDECIDED]} –"]
    if counts[CHANGED]:
        parts.append(f"{counts[CHANGED]} ⚠ changed after run")
    return f"{', '.join(parts)} of {decidable} decidable" + (f" ({counts[NA]} n/a at this scale)" if counts[NA] else "")


def claims_markdown(verdicts: list[Verdict], source: str, scale: str, seeds: list) -> list[str]:
    if not verdicts:
        return []
    n = len(seeds)
    head = f"### Claims ({source}){_scale_caveat(scale)}"
    seed_text = ", ".join("preset's" if s is None else str(s) for s in seeds)
    lines = [head, "",
             f"At `{scale}`: {tally_words(tally(verdicts))}; {n} seed{'s' if n != 1 else ''} ({seed_text}). "
             f"Rule: {RULE}. ⚠: the claim, its margin, the seeds or a cell's config changed after its cells ran "
             f"(no verdict until they run again).", "",
             f"| | Claim | Paper | Ours ({n} seed{'s' if n != 1 else ''}, mean ± sd) [Δ in the claim's direction vs "
             f"margin] |", "|---|---|---|---|"]
    for v in verdicts:
        parts = [describe_check(r) for r in v.checks]
        claim = f"{v.claim.text} ({v.claim.source})"
        mark = verdict_mark(v)
        off_scale = _off_scale(v)
        note = f"<br>⚠ {v.registration}" if v.registration else ""
        if off_scale:
            paper = "<br>".join(p[1] for p in parts)
            lines.append(f"| {'n/a' if off_scale.startswith('n/a') else mark} | {claim} | {paper} | – ({off_scale}) |")
        elif len(parts) == 1:
            lines.append(f"| {mark} | {claim} | {parts[0][1]} | {parts[0][2]}{note} |")
        else:
            paper = "<br>".join(f"{p[0]}: {p[1]}" for p in parts)
            ours = "<br>".join(f"{p[0]}: {p[2]}" for p in parts)
            lines.append(f"| {mark} | {claim} | {paper} | {ours}{note} |")
    quotes = list(dict.fromkeys((v.claim.source, v.claim.quote.strip()) for v in verdicts if v.claim.quote))
    if quotes:
        lines += ["", "The paper's words:", ""] + [f"- {src}: “{q.strip()}”" for src, q in quotes]
    return lines


def claims_latex(verdicts: list[Verdict], scale: str) -> list[str]:
    from repdegen.reproduce.results.render import _tex_escape

    if not verdicts:
        return []
    mark = {HOLDS: r"\checkmark", FAILS: r"$\times$", TIE: r"$\approx$", UNDECIDED: "--", CHANGED: "(changed)",
            NA: "n/a"}
    lines = [r"\begin{table}[t]", r"\centering",
             rf"\caption{{Claims (scale: {_tex_escape(scale)}){' --- not meaningful at smoke' if scale == 'smoke' else ''}}}",
             r"\begin{tabular}{clll}", r"\toprule", r" & Claim & Paper & Ours \\", r"\midrule"]
    for v in verdicts:
        parts = [describe_check(r) for r in v.checks]
        paper = "; ".join(p[1] for p in parts).replace("→", r"$\to$").replace("±", r"$\pm$").replace("×", r"$\times$")
        ours = "; ".join(p[2] for p in parts).replace("→", r"$\to$").replace("±", r"$\pm$").replace("×", r"$\times$")
        lines.append(f"{mark[shown_state(v)]} & {_tex_escape(v.claim.text)} & {_tex_escape(paper)} & {_tex_escape(ours)} \\\\"
                     .replace("–", "--"))
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return lines


def claims_csv(verdicts: list[Verdict], scale: str) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["scale", "claim", "source", "verdict", "check", "relation", "value", "metric", "row", "than",
                "paper_row", "paper_than", "ours_row_mean", "ours_than_mean", "seeds", "seeds_agree",
                "ours_row_per_seed", "ours_than_per_seed", "margin", "margin_abs", "effective_margin", "difference",
                "check_state", "registration"])
    for v in verdicts:
        for k, r in enumerate(v.checks, 1):
            rel, ab = stated_margin(r.check)
            w.writerow([scale, v.claim.text, v.claim.source, shown_state(v), k, r.check.relation,
                        "" if r.check.value is None else r.check.value, r.check.metric, r.check.row, r.check.than or "",
                        "" if r.paper_row is None else r.paper_row, "" if r.paper_than is None else r.paper_than,
                        statistics.fmean(r.row_values) if r.row_values else "",
                        statistics.fmean(r.than_values) if r.than_values else "",
                        " ".join(map(str, r.seeds)), r.agree if r.state != UNDECIDED else "",
                        " ".join(f"{x:.6g}" for x in r.row_values), " ".join(f"{x:.6g}" for x in r.than_values),
                        rel, ab, "" if r.margin is None else f"{r.margin:.6g}",
                        "" if r.difference is None else f"{r.difference:.6g}", r.state, v.registration])
    return buf.getvalue()


CONSOLE_WIDTH = 120


def _console_evidence(r: CheckResult) -> str:
    """One check in a few characters: ours (the means, ``than → row``) vs the paper's."""
    from repdegen.reproduce.results.render import _fmt

    m = r.check.metric
    mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
    if r.check.than is not None:
        ours = f"{_fmt(mean(r.than_values), m)} → {_fmt(mean(r.row_values), m)}" if r.row_values else "–"
        paper = (f"{_fmt(r.paper_than, m)} → {_fmt(r.paper_row, m)}"
                 if r.paper_row is not None or r.paper_than is not None else "–")
    else:
        ours = _fmt(mean(r.row_values), m) if r.row_values else "–"
        paper = _fmt(r.paper_row, m) if r.paper_row is not None else "–"
    return f"ours {ours}, paper {paper}"


def claims_console(verdicts: list[Verdict], source: str, scale: str, seeds: list) -> str:
    """The verdicts for the end of ``repdegen table``'s output: one line per claim, at most :data:`CONSOLE_WIDTH`
    characters (mark, the claim's text shortened, ours vs the paper's for its first check); the margins, the per-seed
    values and every check are in the rendered table.md / claims.csv and the table's page."""
    n = len(seeds)
    caveat = " — not meaningful at smoke" if scale == "smoke" else ""
    head = f"  Claims ({source}){caveat}: ours ({n} seed{'s' if n != 1 else ''}) vs paper; the evidence is in table.md"
    lines = [_fit(head, CONSOLE_WIDTH)]
    rows = []
    for v in verdicts:
        evidence = _console_evidence(v.checks[0]) if v.checks else ""
        if len(v.checks) > 1:
            evidence += f" (+{len(v.checks) - 1} check{'s' if len(v.checks) > 2 else ''})"
        rows.append((f"  {verdict_mark(v):<3} ", v.claim.text, evidence))
    # the evidence in one column: the claim's text gets what the longest evidence leaves (at least 40 characters),
    # a longer evidence is cut instead
    lead = max((len(m) for m, _, _ in rows), default=6)
    room = max(40, CONSOLE_WIDTH - lead - 2 - max((len(e) for _, _, e in rows), default=0))
    for mark, text, evidence in rows:
        line = f"{mark:<{lead}}{_fit(text, room):<{room}}  {_fit(evidence, CONSOLE_WIDTH - lead - room - 2)}"
        lines.append(line.rstrip())
    return "\n".join(lines)


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)].rstrip() + "…"


def summary_line(verdicts: list[Verdict], table: str, scale: str) -> str:
    tail = " (not meaningful at smoke)" if scale == "smoke" else ""
    return f"repdegen: claims of {table} at {scale}: {tally_words(tally(verdicts))}{tail}"
