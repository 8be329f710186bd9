"""Figures rendered from run histories (PNG, matplotlib's Agg backend: no display needed), and the conventions the
figures of a table share (:mod:`repdegen.analysis.embedding_figures` uses them too):

* a table row is one colour in every figure (:func:`row_colors`, in the table's row order);
* a row run with several seeds is drawn as the mean over its seeds (the line) and their min–max (a band,
  :data:`BAND`), never one line per seed; values of the seeds are matched by their x (epoch, update, index);
* legends sit outside the data (below the panels) or, on a single panel, where matplotlib finds the least data.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import LogFormatter, MaxNLocator  # noqa: E402

BAND = "min–max"  # what the band around a mean over seeds spans (with 2-3 seeds an sd says little)
# the parts of a run and how their epochs are drawn: the first training session solid, a re-training session
# (trainer.retrain_sessions: Inan et al. 2017, footnote 5) dotted, finetuning dashed
PART_STYLES = (("train", "-"), ("retrain", ":"), ("finetune", "--"))
PART_NAMES = {"train": "training", "retrain": "re-training session", "finetune": "finetuning"}


class Seeds(list):
    """The values of one row over its seeds (one history, matrix or spectrum per seed): a plotting function draws
    their mean and a band instead of a single value."""


def seeds_of(value) -> list:
    """A row's values per seed: the items of a :class:`Seeds`, else the value itself as the only seed."""
    return list(value) if isinstance(value, Seeds) else [value]


def row_colors(keys: Sequence[Hashable]) -> dict:
    """{row key: colour}, one colour per row in the given order (tab10, tab20 beyond ten rows)."""
    keys = list(dict.fromkeys(keys))
    cmap = plt.get_cmap("tab10" if len(keys) <= 10 else "tab20")
    return {k: cmap(i % cmap.N) for i, k in enumerate(keys)}


def row_name(group: str | None, label: str, with_group: bool = True) -> str:
    """How a figure names a row: "group / label" (``with_group`` and the row has a group), else the label."""
    return f"{group} / {label}" if group and with_group else label


def mean_band(per_seed: Sequence[Mapping[float, float]]):
    """(xs, mean, min, max, count) over the seeds' {x: y}, at every x any seed has (the mean of the seeds that
    have it); non-finite values are left out."""
    xs = sorted({x for points in per_seed for x, y in points.items() if _finite(y)})
    vals = [[points[x] for points in per_seed if x in points and _finite(points[x])] for x in xs]
    return (np.asarray(xs, dtype=float), np.array([np.mean(v) for v in vals]), np.array([min(v) for v in vals]),
            np.array([max(v) for v in vals]), np.array([len(v) for v in vals]))


def _finite(y) -> bool:
    return isinstance(y, (int, float, np.floating, np.integer)) and math.isfinite(y)


def band_note(counts: Sequence[int]) -> str | None:
    """What a line and its band are, for a legend entry: None when every row has one seed."""
    counts = [n for n in counts if n]
    if not counts or max(counts) < 2:
        return None
    n = f"{counts[0]} seeds" if len(set(counts)) == 1 else "its seeds"
    return f"line: mean of {n}; band: their {BAND}"


def with_seed_counts(names: Sequence[str], counts: Sequence[int]) -> list[str]:
    """Names with "(n seeds)" when the rows have different numbers of seeds (else the band note says it once)."""
    if len({n for n in counts if n}) <= 1:
        return list(names)
    return [f"{name} ({n} seed{'s' if n != 1 else ''})" for name, n in zip(names, counts)]


LEGEND_ROW_INCHES = 0.19  # one line of an 8-point legend


def figure_legend(fig: Figure, handles: list, labels: list[str], title: str | None = None) -> None:
    """One legend for the whole figure, below its panels (the figure uses the constrained layout), in as many
    columns as fit its width; the figure grows by the legend's height, so many entries do not squeeze the panels."""
    if not handles:
        return
    longest = max(len(t) for t in labels)
    ncol = max(1, min(len(labels), int(fig.get_figwidth() / (0.06 * longest + 0.5))))
    rows = -(-len(labels) // ncol) + (1 if title else 0)
    fig.set_figheight(fig.get_figheight() + LEGEND_ROW_INCHES * rows)
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=8, title=title, title_fontsize=8,
               frameon=False)


def _part(record: dict) -> str:
    """Which part of a run an epoch record belongs to: train (the first session), retrain (a later one), finetune."""
    if record.get("stage") == "train":
        return "retrain" if record.get("session", 1) > 1 else "train"
    return str(record.get("stage"))


# the paper's validation PPL of a row, drawn across its panel in the row's colour
TARGET_STYLE = (0, (1, 2))
TARGET_NAME = "thin dotted line across: the paper's validation PPL"


def figure_validation_curves(series: list[tuple[str, str | None, list[dict]]], title: str,
                             show_train: bool = False, targets: dict | None = None) -> Figure | None:
    """The figure of :func:`plot_validation_curves`, not saved (None when no series has a history). Each row's
    artists carry ``gid`` "<group>|<label>|<part>|valid" (the mean line), "...|band" (the min–max band),
    "...|train" (the mean training PPL) and "<group>|<label>|paper" (its ``targets`` line)."""
    colors = row_colors([(group, label) for label, group, _ in series])  # as every figure of the table colours them
    series = [s for s in series if s[2]]
    if not series:
        return None
    rows: dict[tuple[str | None, str], list[list[dict]]] = {}
    for label, group, history in series:
        rows.setdefault((group, label), []).append(history)
    groups = list(dict.fromkeys(g for g, _ in rows))
    with_group = len(groups) > 1
    fig, axes = plt.subplots(1, len(groups), figsize=(5.4 * len(groups), 4.3), squeeze=False, layout="constrained")
    parts = {_part(h) for histories in rows.values() for hist in histories for h in hist}
    handles, names, counts = [], [], []
    for ax, group in zip(axes[0], groups):
        for (g, label), histories in rows.items():
            if g != group:
                continue
            color = colors[(g, label)]
            tag = f"{g}|{label}"
            for part, style in PART_STYLES:
                valid = [{i + 1: h["valid_ppl"] for i, h in enumerate(hist) if _part(h) == part} for hist in histories]
                if any(valid):
                    xs, mean, lo, hi, n = mean_band(valid)
                    ax.plot(xs, mean, style, marker=".", color=color, lw=1.6, gid=f"{tag}|{part}|valid")
                    if n.max() > 1:
                        ax.fill_between(xs, lo, hi, color=color, alpha=0.2, lw=0, gid=f"{tag}|{part}|band")
                train = [{i + 1: h["train_ppl"] for i, h in enumerate(hist)
                          if _part(h) == part and _finite(h.get("train_ppl"))} for hist in histories]
                if show_train and any(train):  # the training PPL, faint: the gap to validation shows overfitting
                    xs, mean, _, _, _ = mean_band(train)
                    ax.plot(xs, mean, style, color=color, alpha=0.35, lw=1.0, gid=f"{tag}|{part}|train")
            target = (targets or {}).get((g, label))
            if target is not None and _finite(target):
                ax.axhline(float(target), color=color, ls=TARGET_STYLE, lw=1.0, alpha=0.9, gid=f"{tag}|paper")
            handles.append(Line2D([], [], color=color, marker=".", lw=1.6))
            names.append(row_name(g, label, with_group))
            counts.append(len(histories))
        ax.set_yscale("log")
        # perplexities as plain numbers (200, 300, 400), not 2 x 10^2
        ax.yaxis.set_major_formatter(LogFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation PPL (faint: training)" if show_train else "validation perplexity")
        if group:
            ax.set_title(group, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    names = with_seed_counts(names, counts)
    for part, style in PART_STYLES[1:]:
        if part in parts:
            handles.append(Line2D([], [], color="0.3", ls=style, lw=1.4))
            names.append(PART_NAMES[part])
    if show_train:
        handles.append(Line2D([], [], color="0.3", alpha=0.35, lw=1.0))
        names.append("faint: training PPL")
    if any(str(a.get_gid()).endswith("|paper") for ax in axes[0] for a in ax.lines):
        handles.append(Line2D([], [], color="0.3", ls=TARGET_STYLE, lw=1.0))
        names.append(TARGET_NAME)
    figure_legend(fig, handles, names, title=band_note(counts))
    fig.suptitle("\n".join(textwrap.wrap(title, width=max(50, int(70 * len(groups))))), fontsize=10)
    return fig


def plot_validation_curves(series: list[tuple[str, str | None, list[dict]]], path: Path, title: str,
                           show_train: bool = False, targets: dict | None = None) -> Path | None:
    """Validation PPL against epoch, one colour per row and one panel per group (cf. Inan et al. 2017, Fig. 2).

    ``series``: (label, group, history) with history the per-epoch records of a run. Series with the same
    (group, label) are the seeds of one row: drawn as their mean (the line) and min–max (a band), matched by epoch
    (the mean at an epoch is over the seeds that reached it). The epochs of a finetuning stage continue the axis
    after the training stage, drawn dashed, and so do those of a re-training session (``trainer.retrain_sessions``:
    Inan et al. 2017, footnote 5), drawn dotted. ``show_train``: the training PPL too, faint, in the same colour
    and style. ``targets``: {(group, label): the paper's validation PPL}, each drawn as a thin dotted line across
    its row's panel in the row's colour (the table at paper scale: where a run is heading against its target). One
    legend, below the panels.
    """
    fig = figure_validation_curves(series, title, show_train, targets)
    if fig is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
