"""Metrics derived from a whole run record rather than from one evaluation (the audited claims that read a run's
history): each takes the record (``result.json``) and returns a number or NaN.

- ``valid_ppl_curve_mean`` (Inan et al. 2017, Fig. 2: the validation curves of AL/RE/REAL below the baseline's):
  over the first training session's epochs, b(e) = the best validation PPL up to epoch e (an early-stopped run
  keeps its best to ``trainer.max_epochs``); the mean of b(e) over e = D .. E_max, with D =
  ``optim.decay_after_epoch`` (1 when unset) and E_max = ``trainer.max_epochs``. Rows of one table group share D
  and E_max, so their means cover the same epochs.
- ``degeneration_onset_<g>``, ``onset_lag_medium_rare``, ``onset_lag_frequent_rare``, ``onset_frac_medium``,
  ``onset_frac_frequent`` (Yu et al. 2022 Fig. 1: the rare group degenerates first, the others follow; definitions in
  docs/claims_audit/yu2022a.md, New metrics 2-4) from the run's group-geometry trace (``trace.geom_isotropy_<g>``,
  ``trainer.analysis.geometry_every``): the onset of group g is the first traced update u > 0 with
  I_g(u) <= (1 - TAU) I_g(0) and I_g also <= (1 - TAU) I_g(0) at the next traced point (the last point counts alone);
  none: u_last + the trace interval (censored). Lags are in trace intervals (> 0: the rare group first; both censored:
  0); fractions are onset / u_last (<= 1: within the trace).
- ``sv_norm_mean`` / ``sv_ratio_3_2`` from the recorded singular values, for records made before they were recorded
  (analysis/geometry.py computes them for new runs, and ``spectrum_metrics`` for older records).

The metric registry (``repdegen.reproduce.results.metrics``) names, for each of these metrics, the function here that
derives it (its entry's ``derive``); the tables' renderer computes them from each cell's record through it.
"""

from __future__ import annotations

import math


def valid_ppl_curve_mean(record: dict) -> float:
    cfg = record.get("config") or {}
    first = [h for h in record.get("history") or []
             if h.get("stage") == "train" and h.get("session", 1) in (None, 1) and h.get("valid_ppl") is not None]
    e_max = int((cfg.get("trainer") or {}).get("max_epochs") or 0)
    d = int((cfg.get("optim") or {}).get("decay_after_epoch") or 1)
    if not first or e_max < 1:
        return float("nan")
    by_epoch = {int(h["epoch"]): float(h["valid_ppl"]) for h in first}
    best, curve = math.inf, []
    for e in range(1, e_max + 1):
        if e in by_epoch:
            best = min(best, by_epoch[e])
        elif e <= max(by_epoch):
            return float("nan")  # a gap in the history: not a curve
        curve.append(best)
    window = curve[max(d, 1) - 1:]
    return sum(window) / len(window) if window and math.isfinite(window[0]) else float("nan")


TAU = 0.10  # fixed before any traced run (docs/claims_audit/yu2022a.md)
GROUPS = ("frequent", "medium", "rare")


def degeneration_onset(points: list, interval: int) -> float:
    """The onset (an update) of one group's trace [[update, I(W)], ...] (see the module doc); NaN without update 0."""
    points = sorted((int(u), float(v)) for u, v in points)
    if not points or points[0][0] != 0:
        return float("nan")
    bound = (1 - TAU) * points[0][1]
    later = points[1:]
    for k, (u, v) in enumerate(later):
        if v <= bound and (k + 1 == len(later) or later[k + 1][1] <= bound):
            return float(u)
    return float(points[-1][0] + interval)


def onset_metrics(record: dict) -> dict:
    trace = record.get("trace") or {}
    every = (((record.get("config") or {}).get("trainer") or {}).get("analysis") or {}).get("geometry_every")
    if not every or not all(trace.get(f"geom_isotropy_{g}") for g in GROUPS):
        return {}
    onset = {g: degeneration_onset(trace[f"geom_isotropy_{g}"], every) for g in GROUPS}
    u_last = max(int(u) for u, _ in trace["geom_isotropy_rare"])
    out = {f"degeneration_onset_{g}": onset[g] for g in GROUPS}
    censored = u_last + every
    for g in ("medium", "frequent"):
        both = onset[g] == censored and onset["rare"] == censored
        out[f"onset_lag_{g}_rare"] = 0.0 if both else (onset[g] - onset["rare"]) / every
        out[f"onset_frac_{g}"] = onset[g] / u_last if u_last else float("nan")
    return {k: v for k, v in out.items() if math.isfinite(v)}
