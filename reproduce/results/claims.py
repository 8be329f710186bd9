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
