"""The one registry of the metrics a run records and a table, a claim or a sweep names: each metric's label, how
its values print, which way is better, which task records it, where its value comes from (``source``), and its
family, whose default tie margin a claim's check takes when it states none (``FAMILY_MARGINS``).

Rendering (:mod:`repdegen.reproduce.results.render`), the claims (:mod:`repdegen.reproduce.results.claims`) and the sweeps' tables
(:mod:`repdegen.reproduce.runs.sweeps`) all read it. A name that is not registered (a key of ``result.json`` such as
``wall_time_s``, or a metric added by a new task) still gets a :class:`Metric`, derived by the same rules, so nothing
downstream needs a second list.

    from repdegen.reproduce.results.metrics import metric
    metric("ppl_rare").label             # 'PPL rare'
    metric("ppl_rare").format(1311.2)    # '1311'
    metric("uniq").better                # 'higher'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

GROUPS = ("frequent", "medium", "rare")
TASKS = ("any", "lm", "translation")  # any: every run records it; lm / translation: runs of that task only
KINDS = ("ppl", "count", "bleu", "params", "ratio", "number")  # how a value prints (Metric.format)
# where a metric's value comes from:
#   evaluation  recorded at every evaluation during training (analysis/metrics.py, analysis/geometry.py) and at the end
#   final       computed from the trained model at the end (analysis/final.py for language models, the translation
#               task's final_extras in reproduce/engine/tasks.py; reproduce/engine/stages.py final_metrics)
#   record      derived from the run record when it is rendered: the entry's ``derive`` (analysis/record_metrics.py),
#               or (the parameter count, the gains over the baseline) reproduce/results/table_render.py
#   analysis    a table's analysis of its trained cells (``analyses:``, reproduce/runs/trained.py)
SOURCES = ("evaluation", "final", "record", "analysis")

# The stated tie margin of a check whose config gives none, by metric family: (relative, absolute). A relative
# margin is a fraction of the compared value (|than|, |value·than| for ratios, |value| for constants).
FAMILY_MARGINS: dict[str, tuple[float, float]] = {
    "ppl": (0.01, 0.0),          # 1 % of the compared PPL
    "isotropy": (0.05, 0.0),     # 5 % of the compared I(W)
    "cos": (0.0, 0.01),          # cosines: 0.01 absolute (a relative margin of a value near 0 is none)
    "bleu": (0.0, 0.3),          # 0.3 BLEU
    "uniq": (0.02, 0.0),         # 2 % of the compared count of unique tokens
    "wordsim": (0.0, 2.0),       # word similarity, Spearman's rho x 100 (Yu et al. Table 6): 2 points (0.02 in rho)
    "params": (0.0, 0.0),        # parameter counts are exact
}
FAMILIES = tuple(FAMILY_MARGINS)

# prefixes / suffixes of the metrics that print with 3 significant digits (ratios, fractions, probabilities)
_RATIO_PREFIXES = ("isotropy", "mean_cos", "cos_", "subspace_", "uniq_rare_over", "frac_", "centroid_", "sv_",
                   "drift_cos", "nn_", "p_", "onset_")


def _kind(name: str) -> str:
    if name == "params":
        return "params"
    if name.startswith(_RATIO_PREFIXES) or name.endswith("_gain"):
        return "ratio"
    if name.startswith("uniq"):
        return "count"
    if name.startswith("bleu"):
        return "bleu"
    if name.startswith("ppl_") or name in ("valid_ppl", "test_ppl", "valid_ppl_curve_mean"):
        return "ppl"
    return "number"


def _family(name: str) -> str | None:
    """The family of the stated tie margin of a check on this metric that gives none (FAMILY_MARGINS)."""
    m = name.lower()
    if m == "params":
        return "params"
    for family in ("ppl", "isotropy", "cos", "bleu", "uniq"):
        if family in m:
            return family
    return "wordsim" if m.startswith("wordsim") else None


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    better: str | None = None  # "lower" | "higher" | None (neither: a trace, a ratio read against a paper's value)
    task: str = "any"  # TASKS
    recorded: bool = False  # every run of its task records it (besides a table's columns)
    source: str = "evaluation"  # SOURCES
    analysis: str | None = None  # source "analysis": given by this analysis of a table's (``analyses:``)
    # its value from a run record, ``derive(record, stage_values)`` -> a number or None: how the renderer computes a
    # source "record" metric (and fills a recorded one an older record lacks)
    derive: Callable[[dict, dict], float | None] | None = None

    @property
    def kind(self) -> str:
        return _kind(self.name)

    @property
    def family(self) -> str | None:
        return _family(self.name)

    @property
    def margin(self) -> tuple[float, float] | None:
        """(relative, absolute) default tie margin of a check on this metric that states none; None: no family."""
        return FAMILY_MARGINS[self.family] if self.family else None

    def format(self, value) -> str:
        """The value as the tables print it ("–" for none; a non-finite value as itself, not taken for "not run")."""
        if value is None:
            return "–"
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        kind = self.kind
        if kind == "params":
            return f"{value:.1f}" if value < 100 else f"{value:.0f}"
        if kind == "ratio":
            return f"{value:.3g}"
        if kind == "count":
            return f"{value:.0f}"
        if kind == "bleu":
            return f"{value:.2f}"
        if kind == "ppl":
            return f"{value:.2f}" if abs(value) < 100 else (f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}")
        return f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"

    def format_mean_sd(self, value, sd) -> str:
        """``mean ± sd`` with the sd to two significant figures and the mean to the same decimal place (213.4 ± 9.5,
        0.6270 ± 0.0069, 27060 ± 590); the plain format where the sd is missing, zero or not finite."""
        if value is None or sd is None:
            return self.format(value)
        places = sd_places(sd)
        if places is None or not math.isfinite(value):
            return f"{self.format(value)} ± {0 if sd == 0 else sd}"
        if places > 0:
            return f"{value:.{places}f} ± {sd:.{places}f}"
        return f"{round(value, places):.0f} ± {round(sd, places):.0f}"


def sd_places(sd) -> int | None:
    """The decimal places that print ``sd`` to two significant figures (negative: round to tens, hundreds, ...);
    None for no sd, a zero or a non-finite one."""
    if sd is None or not math.isfinite(sd) or sd == 0:
        return None
    places = 1 - math.floor(math.log10(abs(sd)))
    if abs(round(sd, places)) >= 10 ** (2 - places):  # 9.96 -> 10.0: two figures of the rounded sd
        places -= 1
    return places


def _m(name, label=None, better=None, task="any", recorded=False, source="evaluation", analysis=None,
       derive=None) -> Metric:
    return Metric(name, label or name, better, task, recorded, "analysis" if analysis else source, analysis, derive)


def _from_record(function: str, key: str | None = None, spectrum: bool = False):
    """A ``derive`` that calls ``repdegen.analysis.record_metrics.<function>`` on the record (imported when first
    used), or ``repdegen.analysis.geometry.<function>`` on the stage's recorded singular values (``spectrum``);
    ``key``: the entry of the dict it returns."""
    def derive(record: dict, values: dict):
        from repdegen.analysis import geometry, record_metrics

        fn = getattr(geometry if spectrum else record_metrics, function)
        if spectrum:
            out = fn(values["singular_values"]) if values.get("singular_values") else {}
        else:
            out = fn(record)
        value = out.get(key) if key is not None else out
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return derive


_ALL = [
    # every run, at every evaluation and at the end (analysis/metrics.py, analysis/geometry.py)
    _m("valid_ppl", "Valid PPL", "lower", recorded=True),
    _m("test_ppl", "Test PPL", "lower", recorded=True, source="final"),
    _m("isotropy", "I(W)", "higher", recorded=True),
    _m("mean_cos", "Mean cos", "lower", recorded=True),
    *(_m(n, recorded=True) for n in (
        "frac_pos_cos", "centroid_ratio", "cos_excess_rare", "drift_cos_unseen",
        "drift_cos_rare_unseen", "drift_cos_frequent_unseen", "drift_cos_gap_rare_frequent")),
    # recorded at every evaluation, and derived from the recorded spectrum of an older record that lacks them
    *(_m(n, recorded=True, derive=_from_record("spectrum_metrics", n, spectrum=True))
      for n in ("sv_norm_mean", "sv_ratio_3_2")),
    # the baseline's row gives these (reproduce/results/table_render.py add_gains); the record's history this one
    *(_m(n, recorded=True, source="record") for n in ("valid_ppl_gain", "test_ppl_gain")),
    _m("valid_ppl_curve_mean", better="lower", recorded=True, source="record",
       derive=_from_record("valid_ppl_curve_mean")),
    # reproduce/engine/stages.py final_metrics: a pass over the validation split when never-seen rows exist
    _m("frac_h_neg_drift_unseen", recorded=True, source="final"),
    # language models, from the trained model (analysis/final.py)
    _m("uniq", "Uniq", "higher", "lm", True, "final"),
    _m("cos_rare_frequent", "cos(rare, freq)", "lower", "lm", True, "final"),
    # AL / REAL runs, every epoch (losses/al.py AugmentedLoss.epoch_metrics)
    _m("al_target_entropy", "H(y~) of AL's target (nats)"),
    *(_m(n, task="lm", recorded=True, source="final") for n in (
        "uniq_target", "uniq_rare_over_human", "nn_rare_frac", "p_unk_nontarget", "p_articles_nontarget")),
    # analysis/record_metrics.py, from the group-geometry trace (trainer.analysis.geometry_every)
    *(_m(n, task="lm", recorded=True, source="record", derive=_from_record("onset_metrics", n)) for n in (
        "onset_lag_medium_rare", "onset_lag_frequent_rare", "onset_frac_medium", "onset_frac_frequent",
        *(f"degeneration_onset_{g}" for g in GROUPS))),
    *(_m(f"ppl_{g}", f"PPL {g}", "lower", "lm", True, "final") for g in GROUPS),
    *(_m(f"uniq_{g}", f"Uniq {g}", "higher", "lm", True, "final") for g in GROUPS),
    *(_m(f"uniq_target_{g}", task="lm", recorded=True, source="final") for g in GROUPS),
    *(_m(f"isotropy_{g}", f"I(W) {g}", "higher", "lm", True, "final") for g in GROUPS),
    # columns of some tables only
    *(_m(f"wordsim_{d}", d.upper(), "higher", "lm", source="final") for d in ("men", "ws353", "rg65", "rw")),
    _m("subspace_distance", "Subspace distance (L^T, W)", task="lm", source="final"),
    # a table's analyses of its trained cells (reproduce/runs/trained.py): greedy continuations of test prefixes
    _m("cont_uniq_mean", "Uniq per continuation", "higher", "lm", analysis="continuations"),
    _m("cont_uniq_total", "Uniq over continuations", "higher", "lm", analysis="continuations"),
    _m("params", "Params (M)", source="record"),
    _m("bleu", "SacreBLEU", "higher", "translation", source="final"),
    _m("bleu_tok", "BLEU tokenized (13a, approx.)", "higher", "translation", source="final"),
]
METRICS: dict[str, Metric] = {m.name: m for m in _ALL}
assert len(METRICS) == len(_ALL), "a metric is registered twice"


def register_metric(m: Metric) -> Metric:
    """Add a metric to the registry (a plugin's, ``REPDEGEN_PLUGINS``): a table can then name it as a column or in a
    claim; one with ``derive`` is computed from each cell's record when the table is rendered."""
    from repdegen.core.errors import ConfigError

    if m.name in METRICS:
        raise ConfigError(f"metric {m.name!r} is registered already; expected a new name (the registered ones: "
                          f"reproduce/results/metrics.py)")
    if m.source not in SOURCES:
        raise ConfigError(f"metric {m.name!r}: source {m.source!r} is not one of {', '.join(SOURCES)}")
    _ALL.append(m)
    METRICS[m.name] = m
    return m


def derived(record: dict, values: dict) -> dict[str, float]:
    """The values of the registered metrics with a ``derive`` that ``values`` (a stage's recorded metrics) lacks,
    from the run ``record``; a metric its record has nothing for (no trace, no spectrum) is left out, one it cannot
    compute (a gap in the history) is NaN."""
    out = {}
    for m in _ALL:
        if m.derive is not None and m.name not in values:
            value = m.derive(record, values)
            if value is not None:
                out[m.name] = float(value)
    return out


def metric(name: str) -> Metric:
    """The registered metric, or one derived by the registry's rules (label = the name, no direction)."""
    return METRICS.get(name) or Metric(name, name)


def label(name: str) -> str:
    return metric(name).label


def recorded(task: str) -> tuple[str, ...]:
    """The metrics every run of ``task`` records besides a table's columns (``any``: all runs)."""
    return tuple(m.name for m in _ALL if m.recorded and m.task == task)


def from_source(source: str) -> tuple[str, ...]:
    """The registered metrics whose value comes from ``source`` (SOURCES)."""
    return tuple(m.name for m in _ALL if m.source == source)


def analysis_metrics() -> dict[str, tuple[str, ...]]:
    """{analysis of a table: the metrics it gives} (``analyses: {continuations: 500}`` -> cont_uniq_mean, ...)."""
    out: dict[str, tuple[str, ...]] = {}
    for m in _ALL:
        if m.analysis:
            out[m.analysis] = (*out.get(m.analysis, ()), m.name)
    return out
