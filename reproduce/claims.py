"""A table's claims: the paper's findings as checks over the table's own cells, and their verdicts.

A table config (``conf/table/<name>.yaml``) lists ``claims``; each has the paper's words and one or
more typed ``checks``, all of which must hold::

    claims:
      - text: "REAL lowers test PPL vs VD-LSTM (small)"
        source: "Sec. 5.1, Table 1"
        quote: "..."                      # the paper's words (optional)
        checks:
          - {metric: test_ppl, row: "Small (200 units) / VD-LSTM+REAL", relation: lower,
             than: "Small (200 units) / VD-LSTM"}

Relations: ``lower`` / ``higher`` (row's metric below / above than's), ``ratio_at_least`` /
``ratio_at_most`` (row / than >= / <= value), ``within`` (|row / than - 1| <= value), ``above`` /
``below`` (row's metric above / below the constant value). A row is named by its label, or by
``"<group> / <label>"`` where a label is in several groups.

**The decision rule.** A table runs each row with the same seeds (``seeds:`` per scale). A check is
evaluated per seed, on the paired values of the two rows for that seed, and **holds only when it
holds for every seed** (all seeds agree); with one seed that is the single comparison. A claim holds
when all its checks hold (✓), fails when one does not (✗), and is not decided (–) while any cell it
needs is not complete at that scale (not run, unfinished, failed) or a value is not finite. Seeds and
claims are fixed in the table config before a run; every seed is reported (mean ± sd and the count
of seeds that agree). The same claims are also evaluated on the paper's own numbers (where the paper
reports the metric), as a check on the transcription.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from omegaconf import MISSING

from reproduce.errors import ConfigError

RELATIONS = ("lower", "higher", "ratio_at_least", "ratio_at_most", "within", "above", "below")
PAIRWISE = ("lower", "higher", "ratio_at_least", "ratio_at_most", "within")
NEEDS_VALUE = ("ratio_at_least", "ratio_at_most", "within", "above", "below")
# metrics every run records besides a table's columns (language models also record the group metrics)
ALWAYS_RECORDED = ("valid_ppl", "test_ppl", "isotropy", "mean_cos")
LM_RECORDED = ("uniq", "cos_rare_frequent",
               *(f"{m}_{g}" for m in ("ppl", "uniq", "isotropy") for g in ("frequent", "medium", "rare")))
HOLDS, FAILS, UNDECIDED = "holds", "fails", "undecided"
MARK = {HOLDS: "✓", FAILS: "✗", UNDECIDED: "–"}
RULE = ("a check holds when it holds for every seed (paired by seed); a claim holds when all its checks hold; "
        "– = a cell it needs is not complete at this scale")


@dataclass
class ClaimCheck:
    metric: str = MISSING
    row: str = MISSING
    relation: str = MISSING
    than: str | None = None
    value: float | None = None


@dataclass
class Claim:
    text: str = MISSING
    source: str = MISSING
    quote: str | None = None
    checks: list[ClaimCheck] = field(default_factory=list)
    # the scales at which the claim is meaningful (None: every scale); e.g. a comparison with another
    # paper's number holds only at the papers' settings: scales: [paper]. Elsewhere it shows "–".
    scales: list[str] | None = None


# --------------------------------------------------------------------------------------------------
# row references and validation (at load)
# --------------------------------------------------------------------------------------------------
def row_references(rows) -> dict[str, int]:
    """Every accepted name of a row: ``"<group> / <label>"`` always, the bare label when it is unique."""
    refs: dict[str, int] = {}
    labels = [r.label for r in rows]
    for i, r in enumerate(rows):
        if r.get("group"):
            refs[f"{r.group} / {r.label}"] = i
        if labels.count(r.label) == 1:
            refs[r.label] = i
    return refs


def resolve_row(table, ref: str, what: str, group: str | None = None) -> int:
    """The index of the row ``ref`` names (tried first within ``group``), or a ConfigError that names
    the reference and the rows that exist."""
    refs = row_references(table.rows)
    if group and f"{group} / {ref}" in refs:
        return refs[f"{group} / {ref}"]
    if ref in refs:
        return refs[ref]
    names = ", ".join(repr(n) for n in refs)
    hint = ""
    if any(r.label == ref for r in table.rows):
        groups = [r.group for r in table.rows if r.label == ref]
        hint = f" The label {ref!r} is in several groups: write '<group> / {ref}' with one of {', '.join(map(repr, groups))}."
    raise ConfigError(f"table {table.name}: {what} names the row {ref!r}, which is not a row of this table.{hint} "
                      f"Rows: {names}")


def table_metrics(table) -> list[str]:
    """The metrics a claim of this table may check: its columns and what every one of its runs records."""
    extra = list(ALWAYS_RECORDED)
    if not any(str(c).startswith("bleu") for c in table.columns):
        extra += LM_RECORDED
    return list(dict.fromkeys([*table.columns, *extra]))


def validate_claims(table, scales: list[str]) -> None:
    """Every reference, metric, relation, seed list and baseline of a table config is checked here,
    so a typo fails when the table loads, naming the value and what exists."""
    name = table.name
    for scale, seeds in (table.get("seeds") or {}).items():
        if scale not in scales:
            raise ConfigError(f"table {name}: seeds has the scale {scale!r}; scales are {', '.join(scales)}")
        if not seeds or len(set(seeds)) != len(seeds):
            raise ConfigError(f"table {name}: seeds.{scale}={list(seeds)} must be a non-empty list of distinct seeds")
    for row in table.rows:
        for scale in row.get("scales") or []:
            if scale not in scales:
                raise ConfigError(f"table {name}: row {row.label!r} has scales [{scale!r}]; scales are {', '.join(scales)}")
    for row in table.rows:
        ref = row.get("baseline") or table.get("baseline")
        if ref and row.experiment:
            j = resolve_row(table, ref, f"the baseline of row {row.label!r}", row.get("group"))
            if not table.rows[j].experiment:
                raise ConfigError(f"table {name}: the baseline {ref!r} is a row of other work (no experiment); "
                                  f"name a row this suite runs")
    metrics = table_metrics(table)
    for k, claim in enumerate(table.get("claims") or [], 1):
        what = f"claim {k} ({claim.text!r})"
        if not claim.checks:
            raise ConfigError(f"table {name}: {what} has no checks; give at least one")
        for scale in claim.get("scales") or []:
            if scale not in scales:
                raise ConfigError(f"table {name}: {what} has scales [{scale!r}]; scales are {', '.join(scales)}")
        for check in claim.checks:
            if check.relation not in RELATIONS:
                raise ConfigError(f"table {name}: {what} has relation={check.relation!r}; expected one of "
                                  f"{', '.join(RELATIONS)}")
            if check.metric not in metrics:
                raise ConfigError(f"table {name}: {what} checks the metric {check.metric!r}, which this table does not "
                                  f"have; its metrics: {', '.join(metrics)}")
            for role in ("row", "than"):
                ref = check.get(role)
                if ref is None:
                    continue
                j = resolve_row(table, ref, f"{what} ({role})")
                if not table.rows[j].experiment:
                    raise ConfigError(f"table {name}: {what} checks the row {ref!r}, a row of other work that this "
                                      f"suite does not run; claims compare rows with an experiment")
            if check.relation in PAIRWISE and check.than is None:
                raise ConfigError(f"table {name}: {what}: relation {check.relation} compares two rows; give than=<row>")
            if check.relation not in PAIRWISE and check.than is not None:
                raise ConfigError(f"table {name}: {what}: relation {check.relation} compares a row with value=; "
                                  f"drop than={check.than!r}")
            if check.relation in NEEDS_VALUE and check.value is None:
                raise ConfigError(f"table {name}: {what}: relation {check.relation} needs value=<number>")


# --------------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------------
def _holds(relation: str, a: float, b: float | None, value: float | None) -> bool:
    if relation == "lower":
        return a < b
    if relation == "higher":
        return a > b
    if relation == "ratio_at_least":
        return a / b >= value
    if relation == "ratio_at_most":
        return a / b <= value
    if relation == "within":
        return abs(a / b - 1.0) <= value
    if relation == "above":
        return a > value
    if relation == "below":
        return a < value
    raise ValueError(relation)


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


@dataclass
class CheckResult:
    check: ClaimCheck
    state: str
    seeds: list = field(default_factory=list)
    row_values: list[float] = field(default_factory=list)   # ours, per seed (paired with than_values)
    than_values: list[float] = field(default_factory=list)
    agree: int = 0
    paper_row: float | None = None
    paper_than: float | None = None
    paper_state: str = UNDECIDED
    reason: str = ""


@dataclass
class Verdict:
    claim: Claim
    state: str
    checks: list[CheckResult]
    paper_state: str


def evaluate_check(check: ClaimCheck, row: int, than: int | None, ours: dict[int, dict], seeds: list,
                   paper: dict[int, dict]) -> CheckResult:
    """``ours[row][seed]`` = the row's metrics for that seed (None: the cell is not complete);
    ``seeds``: the table's seeds at this scale; ``paper[row]`` = the paper's numbers."""
    res = CheckResult(check, UNDECIDED, seeds=list(seeds))
    p_a, p_b = paper.get(row, {}).get(check.metric), (paper.get(than, {}).get(check.metric) if than is not None else None)
    res.paper_row, res.paper_than = p_a, p_b
    if _finite(p_a) and (than is None or _finite(p_b)):
        res.paper_state = HOLDS if _holds(check.relation, p_a, p_b, check.value) else FAILS
    for role, i in (("row", row), ("than", than)):
        if i is not None and not ours.get(i):
            res.reason = f"its {role} is not run at this scale"
            return res
    for s in seeds:
        a_rec = ours.get(row, {}).get(s)
        b_rec = ours.get(than, {}).get(s) if than is not None else {}
        if a_rec is None or b_rec is None:
            res.reason = "not every cell it needs is complete at this scale"
            return res
        a, b = a_rec.get(check.metric), (b_rec.get(check.metric) if than is not None else None)
        if not _finite(a) or (than is not None and not _finite(b)):
            res.reason = f"{check.metric} is not finite for seed {s}"
            return res
        res.row_values.append(float(a))
        if than is not None:
            res.than_values.append(float(b))
        res.agree += _holds(check.relation, float(a), None if b is None else float(b), check.value)
    if not seeds:
        res.reason = "no seed"
        return res
    res.state = HOLDS if res.agree == len(seeds) else FAILS
    return res


def evaluate_claims(table, ours: dict[int, dict], seeds: list, paper: dict[int, dict],
                    scale: str | None = None) -> list[Verdict]:
    verdicts = []
    for claim in table.get("claims") or []:
        results = []
        meaningful = scale is None or claim.get("scales") is None or scale in claim.scales
        for check in claim.checks:
            row = resolve_row(table, check.row, "a claim")
            than = resolve_row(table, check.than, "a claim") if check.than is not None else None
            result = evaluate_check(check, row, than, ours if meaningful else {}, seeds, paper)
            if not meaningful:
                result.reason = f"meaningful at {', '.join(claim.scales)} only"
            results.append(result)
        verdicts.append(Verdict(claim, _combine([r.state for r in results]), results,
                                _combine([r.paper_state for r in results])))
    return verdicts


def _combine(states: list[str]) -> str:
    if any(s == FAILS for s in states):  # one failing check decides: all must hold
        return FAILS
    return HOLDS if states and all(s == HOLDS for s in states) else UNDECIDED


# --------------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------------
def mean_sd(values: list[float], column: str) -> str:
    from analysis.render import _fmt

    if not values:
        return "–"
    if len(values) == 1:
        return _fmt(values[0], column)
    return f"{_fmt(statistics.fmean(values), column)}±{_fmt(statistics.stdev(values), column)}"


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


def describe_check(r: CheckResult) -> tuple[str, str, str]:
    """(what is checked, the paper's values, ours) of one check, as text."""
    from analysis.render import COLUMN_LABELS, _fmt

    c, m = r.check, r.check.metric
    short = lambda ref: ref.split(" / ")[-1]  # noqa: E731  (the claim's text names the group)
    what = f"{COLUMN_LABELS.get(m, m)}: {short(c.row)} {_relation_words(c)}" + (f" {short(c.than)}" if c.than else "")
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
    if r.state != UNDECIDED and len(r.seeds) > 1:
        ours += f" ({r.agree}/{len(r.seeds)} seeds)"
    elif r.state == UNDECIDED and r.reason and ours == "–":
        ours += f" ({r.reason})"
    return what, paper, ours


def verdict_record(v: Verdict) -> dict:
    """A verdict as JSON (claims.json; the report's status table reads it)."""
    checks = []
    for r in v.checks:
        what, paper, ours = describe_check(r)
        checks.append({"metric": r.check.metric, "row": r.check.row, "relation": r.check.relation, "than": r.check.than,
                       "value": r.check.value, "state": r.state, "paper_state": r.paper_state, "seeds": r.seeds,
                       "ours_row": r.row_values, "ours_than": r.than_values, "agree": r.agree,
                       "paper_row": r.paper_row, "paper_than": r.paper_than, "what": what, "paper": paper, "ours": ours,
                       "reason": r.reason})
    return {"text": v.claim.text, "source": v.claim.source, "quote": v.claim.quote, "state": v.state,
            "mark": MARK[v.state], "paper_state": v.paper_state, "checks": checks}


def _scale_caveat(scale: str) -> str:
    return " — **not meaningful at smoke** (plumbing-sized runs)" if scale == "smoke" else ""


def claims_markdown(verdicts: list[Verdict], source: str, scale: str, seeds: list) -> list[str]:
    if not verdicts:
        return []
    n = len(seeds)
    shown = sum(v.state == HOLDS for v in verdicts)
    off = sum(any("not run at this scale" in r.reason or "meaningful at" in r.reason for r in v.checks)
              and v.state == UNDECIDED for v in verdicts)
    head = f"### Claims ({source}){_scale_caveat(scale)}"
    seed_text = ", ".join("preset's" if s is None else str(s) for s in seeds)
    lines = [head, "",
             f"{shown} of {len(verdicts) - off} claims decidable at `{scale}` hold"
             + (f" ({off} more need rows or settings this scale does not run)" if off else "")
             + f"; {n} seed{'s' if n != 1 else ''} ({seed_text}). Rule: {RULE}.", "",
             f"| | Claim | Paper | Ours ({n} seed{'s' if n != 1 else ''}, mean±sd) |", "|---|---|---|---|"]
    for v in verdicts:
        parts = [describe_check(r) for r in v.checks]
        claim = f"{v.claim.text} ({v.claim.source})"
        off_scale = next((r.reason for r in v.checks if "not run at this scale" in r.reason or "meaningful at" in r.reason), None)
        if off_scale and v.state == UNDECIDED:
            paper = "<br>".join(p[1] for p in parts)
            lines.append(f"| {MARK[v.state]} | {claim} | {paper} | – ({off_scale}) |")
        elif len(parts) == 1:
            lines.append(f"| {MARK[v.state]} | {claim} | {parts[0][1]} | {parts[0][2]} |")
        else:
            paper = "<br>".join(f"{p[0]}: {p[1]}" for p in parts)
            ours = "<br>".join(f"{p[0]}: {p[2]}" for p in parts)
            lines.append(f"| {MARK[v.state]} | {claim} | {paper} | {ours} |")
    quotes = list(dict.fromkeys((v.claim.source, v.claim.quote.strip()) for v in verdicts if v.claim.quote))
    if quotes:
        lines += ["", "The paper's words:", ""] + [f"- {src}: “{q.strip()}”" for src, q in quotes]
    return lines


def claims_latex(verdicts: list[Verdict], scale: str) -> list[str]:
    from analysis.render import _tex_escape

    if not verdicts:
        return []
    mark = {HOLDS: r"\checkmark", FAILS: r"$\times$", UNDECIDED: "--"}
    lines = [r"\begin{table}[t]", r"\centering",
             rf"\caption{{Claims (scale: {_tex_escape(scale)}){' --- not meaningful at smoke' if scale == 'smoke' else ''}}}",
             r"\begin{tabular}{clll}", r"\toprule", r" & Claim & Paper & Ours \\", r"\midrule"]
    for v in verdicts:
        parts = [describe_check(r) for r in v.checks]
        paper = "; ".join(p[1] for p in parts).replace("→", r"$\to$").replace("±", r"$\pm$").replace("×", r"$\times$")
        ours = "; ".join(p[2] for p in parts).replace("→", r"$\to$").replace("±", r"$\pm$").replace("×", r"$\times$")
        lines.append(f"{mark[v.state]} & {_tex_escape(v.claim.text)} & {_tex_escape(paper)} & {_tex_escape(ours)} \\\\"
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
                "ours_row_per_seed", "ours_than_per_seed"])
    for v in verdicts:
        for k, r in enumerate(v.checks, 1):
            w.writerow([scale, v.claim.text, v.claim.source, v.state, k, r.check.relation,
                        "" if r.check.value is None else r.check.value, r.check.metric, r.check.row, r.check.than or "",
                        "" if r.paper_row is None else r.paper_row, "" if r.paper_than is None else r.paper_than,
                        statistics.fmean(r.row_values) if r.row_values else "",
                        statistics.fmean(r.than_values) if r.than_values else "",
                        " ".join(map(str, r.seeds)), r.agree if r.state != UNDECIDED else "",
                        " ".join(f"{x:.6g}" for x in r.row_values), " ".join(f"{x:.6g}" for x in r.than_values)])
    return buf.getvalue()


def claims_console(verdicts: list[Verdict], source: str, scale: str, seeds: list) -> str:
    """The verdicts as plain lines for the end of ``reproduce.table``'s output."""
    n = len(seeds)
    rows = [(MARK[v.state], v.claim.text, "; ".join(describe_check(r)[1] for r in v.checks),
             "; ".join(describe_check(r)[2] for r in v.checks)) for v in verdicts]
    width = max([len(r[1]) for r in rows] + [10])
    pw = max([len(r[2]) for r in rows] + [5])
    head = f"  Claims ({source}){' — not meaningful at smoke' if scale == 'smoke' else ''}"
    lines = [f"{head:<{width + 4}}  {'paper':<{pw}}  ours ({n} seed{'s' if n != 1 else ''})"]
    lines += [f"  {m} {t:<{width}}  {p:<{pw}}  {o}" for m, t, p, o in rows]
    return "\n".join(lines)


def summary_line(verdicts: list[Verdict], table: str, scale: str) -> str:
    counts = {s: sum(v.state == s for v in verdicts) for s in (HOLDS, FAILS, UNDECIDED)}
    tail = " (not meaningful at smoke)" if scale == "smoke" else ""
    return (f"repdegen: claims of {table} at {scale}: {counts[HOLDS]} ✓, {counts[FAILS]} ✗, {counts[UNDECIDED]} – "
            f"of {len(verdicts)}{tail}")
