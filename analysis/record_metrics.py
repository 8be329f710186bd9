"""Metrics derived from a whole run record rather than from one evaluation (issue 23: claims that read a run's
history): each takes the record (``result.json``) and returns a number or NaN.

- ``valid_ppl_curve_mean`` (Inan et al. 2017, Fig. 2: the validation curves of AL/RE/REAL below the baseline's):
  over the first training session's epochs, b(e) = the best validation PPL up to epoch e (an early-stopped run
  keeps its best to ``trainer.max_epochs``); the mean of b(e) over e = D .. E_max, with D =
  ``optim.decay_after_epoch`` (1 when unset) and E_max = ``trainer.max_epochs``. Rows of one table group share D
  and E_max, so their means cover the same epochs.
- ``sv_norm_mean`` / ``sv_ratio_3_2`` from the recorded singular values, for records made before they were recorded
  (analysis/geometry.py computes them for new runs).
"""

from __future__ import annotations

import math

from analysis.geometry import spectrum_metrics


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


def derived_metrics(record: dict, values: dict) -> dict:
    """The record-level metrics a stage's values lack (``values``: that stage's recorded metrics)."""
    out = {"valid_ppl_curve_mean": valid_ppl_curve_mean(record)}
    if "sv_norm_mean" not in values and values.get("singular_values"):
        out.update(spectrum_metrics(values["singular_values"]))
    return out
