"""The figure of a sweep: one metric against the swept value, mean +- std over seeds (the shape of Yu et
al. 2022 Fig. 5, "Hyper-parameter (alpha) sensitivity of AGG": (a) perplexity, (b) Uniq, (c) I(W), one
panel each). A sweep's table (``repdegen.reproduce.results.table_figures.render_sweep_figures``) writes one PNG per metric
with :func:`plot_sweep_metric`.

The points are the rendered table's own numbers (no second summary here), so the figure and ``table.md`` cannot
disagree. The x-axis is logarithmic when the values span a decade or more
(:func:`use_log_x`: e.g. CosReg's gamma 0.1 ... 10), linear otherwise (Yu's alpha 0.01 ... 0.05).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from repdegen.analysis.embedding_figures import _save  # noqa: E402


@dataclass
class SweepSeries:
    """One curve: the mean and std (None = a single run, no error bar) of the metric at each x.
    ``baseline``: (mean, std) of runs of this series without the swept key (e.g. MLE beside AGG's alpha),
    drawn as a horizontal line."""

    label: str
    x: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    std: list[float | None] = field(default_factory=list)
    baseline: tuple[float, float | None] | None = None


def use_log_x(values: Sequence[float]) -> bool:
    """A log axis when every value is positive and the largest is at least 10x the smallest."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return bool(finite) and min(finite) > 0 and max(finite) / min(finite) >= 10


def plot_sweep_metric(series: Sequence[SweepSeries], path, metric_label: str, x_label: str,
                      title: str = "", log_x: bool | None = None, categories: Mapping[float, str] | None = None):
    """``metric_label`` against ``x_label``, one errorbar curve per series (error bars: the std over seeds).
    ``log_x=None`` decides with :func:`use_log_x`. ``categories``: tick labels for a non-numeric swept key
    plotted at positions 0, 1, 2..."""
    fig, ax = plt.subplots(figsize=(5.2, 3.9))
    all_x = [x for s in series for x in s.x]
    for c, s in enumerate(series):
        color = f"C{c % 10}"
        if s.x:
            yerr = None if all(d is None for d in s.std) else [0.0 if d is None or not math.isfinite(d) else d for d in s.std]
            ax.errorbar(s.x, s.mean, yerr=yerr, marker="o", ms=4, capsize=3, lw=1.4, color=color, label=s.label or None,
                        ls="none" if categories else "-")
        if s.baseline is not None:
            m, d = s.baseline
            ax.axhline(m, color=color, ls="--", lw=1, label=f"{s.label} (no {x_label})".strip())
            if d:
                ax.axhspan(m - d, m + d, color=color, alpha=0.12, lw=0)
    if categories:
        ax.set_xticks(list(categories), [categories[k] for k in categories])
        ax.set_xlim(min(categories) - 0.5, max(categories) + 0.5)
    elif log_x if log_x is not None else use_log_x(all_x):
        ax.set_xscale("log")
    ax.set_xlabel(x_label)
    ax.set_ylabel(metric_label)
    ax.grid(True, alpha=0.3)
    if any(s.label for s in series) or any(s.baseline for s in series):
        ax.legend(fontsize=8)
    if title:
        ax.set_title("\n".join(textwrap.wrap(title, 64)), fontsize=9)
    return _save(fig, path)
