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

**The decision rule (docs/claims.md).** A table runs each row with the same seeds (``seeds:`` per scale).
A check turns each seed's paired values into a signed difference d in the claim's direction (``lower``:
than − row; ``ratio_at_least``: (row/than − value)·|than|; ``within``: value·|than| − |row − than|; ...).
Every check has a **tie margin** M, fixed before the run: the larger of its stated margin (``margin``, a
fraction of the compared value; ``margin_abs``, in the metric's units; defaults per metric family in the metric
registry, ``repdegen.reproduce.results.metrics.FAMILY_MARGINS``) and the seed sd of the row it is compared with.
The check **holds** (✓) when the mean of d over the seeds exceeds M and every seed's d is positive, **fails** (✗)
when the mean is below −M and every seed's d is negative, and is a **tie** (≈) otherwise: inside the margin, or
seeds that disagree.
A claim holds when all its checks hold, fails when one fails, is a tie when none fails and one ties, and
is not decided (–) while a cell it needs is not complete at that scale (not run, unfinished, failed) or
a value is not finite. Seeds, claims and margins are fixed in the table config before a run (the
rendering tells when they were edited after: reproduce/runs/registration.py); every seed is reported. The
same claims are also evaluated on the paper's own numbers (the stated margin only), as a check on the
transcription.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from omegaconf import MISSING
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.results.metrics import metric, recorded

RELATIONS = ("lower", "higher", "ratio_at_least", "ratio_at_most", "within", "above", "below")
PAIRWISE = ("lower", "higher", "ratio_at_least", "ratio_at_most", "within")
NEEDS_VALUE = ("ratio_at_least", "ratio_at_most", "within", "above", "below")
# metrics every run records besides a table's columns (language models also record the group metrics): the
# registry (reproduce/results/metrics.py)
ALWAYS_RECORDED = recorded("any")
LM_RECORDED = recorded("lm")
HOLDS, FAILS, TIE, UNDECIDED = "holds", "fails", "tie", "undecided"
MARK = {HOLDS: "✓", FAILS: "✗", TIE: "≈", UNDECIDED: "–"}
RULE = ("a check holds when the mean paired difference in the claim's direction exceeds its margin and every seed "
        "agrees, fails when it is beyond the margin the other way with every seed, and is a tie (≈) otherwise; the "
        "margin is the larger of the stated one and the compared row's seed sd; a claim holds when all its checks "
        "hold; – = a cell it needs is not complete at this scale")

def default_margin(name: str) -> tuple[float, float] | None:
    """(relative, absolute) stated margin of a metric without one in its check (the metric registry's family
    margin); None when no family matches."""
    return metric(name).margin


@dataclass
class ClaimCheck:
    metric: str = MISSING
    row: str = MISSING
    relation: str = MISSING
    than: str | None = None
    value: float | None = None
    # the tie margin: a fraction of the compared value, and/or an absolute amount in the metric's units
    # (None: the metric family's margin, metrics.FAMILY_MARGINS); the effective margin is also at least the compared
    # row's seed sd
    margin: float | None = None
    margin_abs: float | None = None


@dataclass
class Claim:
    text: str = MISSING
    source: str = MISSING
    quote: str | None = None
    checks: list[ClaimCheck] = field(default_factory=list)
    # the scales at which the claim is meaningful (None: every scale); e.g. a comparison with another
    # paper's number holds only at the papers' settings: scales: [paper]. Elsewhere it shows "–".
    scales: list[str] | None = None
    # scales at which the claim cannot be decided, each with the measured reason ("the paper's BLEU difference,
    # 0.3, is below our seed sd of 0.5 at lite"); rendered n/a with that reason
    na: dict[str, str] | None = None


def stated_margin(check) -> tuple[float, float]:
    """(relative, absolute) margin a check states, or its metric's default."""
    rel, ab = getattr(check, "margin", None), getattr(check, "margin_abs", None)
    if rel is None and ab is None:
        rel, ab = default_margin(check.metric) or (None, None)
    return float(rel or 0.0), float(ab or 0.0)


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
    """The metrics a claim of this table may check: its columns, what every one of its runs records, and what its
    ``analyses`` give."""
    from repdegen.reproduce.results.metrics import analysis_metrics

    extra = list(ALWAYS_RECORDED)
    if not any(str(c).startswith("bleu") for c in table.columns):
        extra += LM_RECORDED
    given = dict(getattr(table, "analyses", None) or {})
    extra += [m for analysis, names in analysis_metrics().items() if given.get(analysis) for m in names]
    return list(dict.fromkeys([*table.columns, *extra]))


def _validate_analyses(table) -> None:
    """The table's ``analyses`` in their domain, and set wherever a column or a claim reads a metric they give."""
    from repdegen.reproduce.results.metrics import analysis_metrics

    name, given = table.name, dict(table.get("analyses") or {})
    for analysis, value in given.items():
        if value is None or int(value) < 0:
            raise ConfigError(f"table {name}: analyses.{analysis}={value} must be an integer >= 0 (0: none; "
                              f"Yu et al.'s Tables 5/15 use continuations: 500)")
    read = {*table.columns, *(c.metric for claim in table.get("claims") or [] for c in claim.checks)}
    for analysis, names in analysis_metrics().items():
        for m in sorted(read & set(names)):
            if not given.get(analysis):
                raise ConfigError(f"table {name}: the metric {m!r} comes from the table's analyses.{analysis}, which "
                                  f"is not set; add `analyses: {{{analysis}: 500}}` to the table config")


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
    _validate_analyses(table)
    for k, claim in enumerate(table.get("claims") or [], 1):
        what = f"claim {k} ({claim.text!r})"
        if not claim.checks:
            raise ConfigError(f"table {name}: {what} has no checks; give at least one")
        for scale in claim.get("scales") or []:
            if scale not in scales:
                raise ConfigError(f"table {name}: {what} has scales [{scale!r}]; scales are {', '.join(scales)}")
        for scale, reason in (claim.get("na") or {}).items():
            if scale not in scales:
                raise ConfigError(f"table {name}: {what} has na.{scale}; scales are {', '.join(scales)}")
            if not str(reason or "").strip():
                raise ConfigError(f"table {name}: {what} has na.{scale} without a reason; give the measured reason "
                                  f"why {scale} cannot decide it")
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
            for key in ("margin", "margin_abs"):
                v = check.get(key)
                if v is not None and not (math.isfinite(v) and v >= 0):
                    raise ConfigError(f"table {name}: {what}: {key}={v!r}; expected a finite number >= 0 (a relative "
                                      f"margin is a fraction: 0.01 = 1 %)")
            if check.get("margin") is not None and check.margin >= 1:
                raise ConfigError(f"table {name}: {what}: margin={check.margin!r} is a fraction of the compared value; "
                                  f"expected < 1 (0.01 = 1 %); an amount in the metric's units is margin_abs")
            if check.get("margin") is None and check.get("margin_abs") is None and default_margin(check.metric) is None:
                raise ConfigError(f"table {name}: {what}: the metric {check.metric!r} has no default tie margin; give "
                                  f"margin=<fraction> or margin_abs=<amount> in the check")


# --------------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------------
def signed_difference(relation: str, a: float, b: float | None, value: float | None) -> float:
    """How far the row's value ``a`` is on the claim's side (> 0) of the comparison with ``b`` (the compared
    row's value) or the constant ``value``, in the metric's units."""
    if relation == "lower":
        return b - a
    if relation == "higher":
        return a - b
    if relation == "ratio_at_least":
        return (a / b - value) * abs(b)
    if relation == "ratio_at_most":
        return (value - a / b) * abs(b)
    if relation == "within":
        return value * abs(b) - abs(a - b)
    if relation == "above":
        return a - value
    if relation == "below":
        return value - a
    raise ValueError(relation)


def margin_reference(relation: str, b: float | None, value: float | None) -> float:
    """The value a relative margin is a fraction of: the compared row's value (times the ratio for ratios), or
    the constant."""
    if relation in ("above", "below"):
        return abs(value)
    if relation.startswith("ratio"):
        return abs(value * b)
    return abs(b)


def decide(differences: list[float], margin: float) -> str:
    """The rule: ✓ when the mean difference exceeds the margin and every seed is on the claim's side, ✗ when
    it is below −margin and every seed is on the other side, ≈ (a tie) otherwise."""
    mean = statistics.fmean(differences)
    if mean > margin and all(d > 0 for d in differences):
        return HOLDS
    if mean < -margin and all(d < 0 for d in differences):
        return FAILS
    return TIE


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


@dataclass
class CheckResult:
    check: ClaimCheck
    state: str
    seeds: list = field(default_factory=list)
    row_values: list[float] = field(default_factory=list)   # ours, per seed (paired with than_values)
    than_values: list[float] = field(default_factory=list)
    agree: int = 0                                          # seeds whose difference is on the claim's side
    difference: float | None = None                         # mean signed difference (claim's side > 0)
    margin: float | None = None                             # the effective margin
    paper_row: float | None = None
    paper_than: float | None = None
    paper_state: str = UNDECIDED
    paper_difference: float | None = None
    paper_margin: float | None = None
    reason: str = ""


@dataclass
class Verdict:
    claim: Claim
    state: str
    checks: list[CheckResult]
    paper_state: str
    registration: str = ""                                  # "" or why the verdict is not a pre-registered one


def effective_margin(check: ClaimCheck, row_values: list[float], than_values: list[float]) -> float:
    """The larger of the stated margin (relative to the mean compared value, and absolute) and the seed sd of
    the compared row (of the row itself for a constant), scaled like the difference."""
    rel, ab = stated_margin(check)
    b = statistics.fmean(than_values) if than_values else None
    stated = max(rel * margin_reference(check.relation, b, check.value), ab)
    spread_of = than_values if check.relation in PAIRWISE else row_values
    sd = statistics.stdev(spread_of) if len(spread_of) > 1 else 0.0
    if check.relation.startswith("ratio"):
        sd *= abs(check.value)
    return max(stated, sd)


def evaluate_check(check: ClaimCheck, row: int, than: int | None, ours: dict[int, dict], seeds: list,
                   paper: dict[int, dict]) -> CheckResult:
    """``ours[row][seed]`` = the row's metrics for that seed (None: the cell is not complete);
    ``seeds``: the table's seeds at this scale; ``paper[row]`` = the paper's numbers."""
    res = CheckResult(check, UNDECIDED, seeds=list(seeds))
    p_a, p_b = paper.get(row, {}).get(check.metric), (paper.get(than, {}).get(check.metric) if than is not None else None)
    res.paper_row, res.paper_than = p_a, p_b
    if _finite(p_a) and (than is None or _finite(p_b)):
        res.paper_difference = signed_difference(check.relation, p_a, p_b, check.value)
        res.paper_margin = effective_margin(check, [p_a], [p_b] if than is not None else [])
        res.paper_state = decide([res.paper_difference], res.paper_margin)
    for role, i in (("row", row), ("than", than)):
        if i is not None and not ours.get(i):
            res.reason = f"its {role} is not run at this scale"
            return res
    differences = []
    for s in seeds:
        a_rec = ours.get(row, {}).get(s)
        b_rec = ours.get(than, {}).get(s) if than is not None else {}
        if a_rec is None or b_rec is None:
            res.reason = "not every cell it needs is complete at this scale"
            return res
        a, b = a_rec.get(check.metric), (b_rec.get(check.metric) if than is not None else None)
        if not _finite(a) or (than is not None and not _finite(b)):
            seed = "" if s is None else f" (seed {s})"
            unrecorded = [ref for ref, v in ((check.row, a), (check.than, b)) if ref is not None and v is None]
            res.reason = (f"{check.metric} is not in the record of {' and '.join(unrecorded)}{seed}" if unrecorded
                          else f"{check.metric} is not finite{seed}")
            return res
        res.row_values.append(float(a))
        if than is not None:
            res.than_values.append(float(b))
        differences.append(signed_difference(check.relation, float(a), None if b is None else float(b), check.value))
    if not seeds:
        res.reason = "no seed"
        return res
    res.agree = sum(d > 0 for d in differences)
    res.difference = statistics.fmean(differences)
    res.margin = effective_margin(check, res.row_values, res.than_values)
    res.state = decide(differences, res.margin)
    return res


def evaluate_claims(table, ours: dict[int, dict], seeds: list, paper: dict[int, dict],
                    scale: str | None = None) -> list[Verdict]:
    verdicts = []
    for claim in table.get("claims") or []:
        results = []
        na = (claim.get("na") or {}).get(scale) if scale is not None else None
        meaningful = (scale is None or claim.get("scales") is None or scale in claim.scales) and na is None
        for check in claim.checks:
            row = resolve_row(table, check.row, "a claim")
            than = resolve_row(table, check.than, "a claim") if check.than is not None else None
            result = evaluate_check(check, row, than, ours if meaningful else {}, seeds, paper)
            if not meaningful:
                result.reason = f"n/a at {scale}: {na}" if na else f"meaningful at {', '.join(claim.scales)} only"
            results.append(result)
        verdicts.append(Verdict(claim, _combine([r.state for r in results]), results,
                                _combine([r.paper_state for r in results])))
    return verdicts


def _combine(states: list[str]) -> str:
    if any(s == FAILS for s in states):  # one failing check decides: all must hold
        return FAILS
    if states and all(s == HOLDS for s in states):
        return HOLDS
    if any(s == UNDECIDED for s in states):
        return UNDECIDED
    return TIE if states else UNDECIDED


# --------------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------------
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
