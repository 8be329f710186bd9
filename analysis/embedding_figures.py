"""Figures of embedding geometry (PNG, matplotlib's Agg backend; no display needed).

* :func:`plot_svd_projection`: the embeddings projected on their top-2 singular directions, coloured by
  frequency group (Gao et al. 2019 Figs 1(a), 2(a); Yu et al. 2022 Figs 1, 3(a, b));
  :func:`plot_svd_projections`: several of them side by side on the same axis limits, as the papers compare
  MLE and their method.
* :func:`plot_singular_values`: singular values normalised so that the largest is 1 (Gao Fig. 2(b),
  Yu Fig. 3(c)).
* :func:`plot_token_frequency`: token frequency (log scale) against frequency rank (Gao Fig. 3).
* :func:`plot_metric_over_training`: a metric per evaluation during training, e.g. I(W) of the rare /
  frequent groups or the rare-frequent cosine (Yu Fig. 2).
* :func:`plot_rare_group_size`: size of AGG's dynamic rare group against training step (Yu Fig. 4).
* Yu Fig. 5 (metrics against AGG's alpha, mean +- std over seeds) is a sweep's plot:
  ``make sweep-alpha`` then ``repdegen.reproduce.runs.sweeps`` (``analysis/sweep_figures.py``).

Every ``plot_*`` function writes ``path`` (parent folders created) and returns it as a ``Path``; the
``figure_*`` functions behind them return the matplotlib ``Figure`` unsaved (tests read the plotted data back).
A row run with several seeds is passed as an :class:`repdegen.analysis.figures.Seeds` of its per-seed values and drawn as
their mean with a min–max band (the conventions of :mod:`repdegen.analysis.figures`).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from repdegen.analysis.figures import (  # noqa: E402
    PART_NAMES,
    PART_STYLES,
    Seeds,  # noqa: F401  (re-exported: the type a caller wraps a row's per-seed values in)
    _part,
    band_note,
    figure_legend,
    mean_band,
    row_colors,
    seeds_of,
    with_seed_counts,
)
from repdegen.analysis.groups import frequency_groups, group_ids  # noqa: E402

# Yu et al. 2022 Figs 1, 3: "Red, green, and blue points represent rare, medium, and frequent groups"
GROUP_COLORS = {"rare": "tab:red", "medium": "tab:green", "frequent": "tab:blue"}


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:  # a figure made with layout="constrained" lays itself out
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


class Projected:
    """Coordinates already on their top-2 singular directions (an (N, 2) array of :func:`svd_projection`, e.g. kept
    with a run record whose weights are gone): passed where a weight matrix is, drawn as they are."""

    def __init__(self, coords) -> None:
        coords = np.asarray(coords, dtype=np.float64)
        if coords.ndim != 2 or coords.shape[1] != 2:
            raise ValueError(f"Projected: expected coordinates of shape (N, 2), got {coords.shape}")
        self.coords = coords


def svd_projection(weight: torch.Tensor | Projected, center: bool = False) -> np.ndarray:
    """(N, 2) coordinates of the rows of ``weight`` on its top-2 right singular vectors, ``W V_2``
    (= ``U_2 S_2``, the rank-2 SVD approximation of Gao et al. 2019 Sec. 3 expressed in its own basis).

    Uncentred by default: Gao et al. "use low-rank approximation (rank = 2) for the learned matrices by
    SVD" of the matrix itself, and their Fig. 1(a) shows the degenerate embeddings as a narrow cone *away
    from the origin*, which centring would hide (the mean is the cone's axis). Yu et al. ("SVD
    projection") say nothing more. ``center=True`` subtracts the mean row first (a PCA plot).
    Each axis's sign (arbitrary in an SVD) is fixed so that the mean coordinate is >= 0.
    A :class:`Projected` is returned as it is (uncentred only: its matrix is gone).
    """
    if isinstance(weight, Projected):
        if center:
            raise ValueError("svd_projection: a Projected matrix cannot be centred (its weights are gone)")
        return weight.coords
    w = weight.detach().cpu().to(torch.float64)
    if center:
        w = w - w.mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(w, full_matrices=False)
    coords = w @ vh[:2].t()
    signs = torch.where(coords.mean(0) < 0, -1.0, 1.0).to(coords.dtype)
    return (coords * signs).numpy()


def _subsample(n: int, max_points: int | None, seed: int) -> np.ndarray:
    """A mask of the rows to draw: all, or a random ``max_points`` of them."""
    keep = np.ones(n, dtype=bool)
    if max_points is not None and max_points < n:
        keep[:] = False
        keep[np.random.default_rng(seed).choice(n, size=max_points, replace=False)] = True
    return keep


def _group_order(groups: Mapping) -> list[str]:
    # frequent first, rare last (on top): the rare group is the one the papers follow
    return sorted(groups, key=lambda g: {"frequent": 0, "medium": 1, "rare": 2}.get(g, 3))


def _group_color(name: str, k: int):
    return GROUP_COLORS.get(name, f"C{k + 3}")


def _scatter_groups(ax, coords: np.ndarray, groups: Mapping, keep: np.ndarray, point_size: float,
                    with_counts: bool = True) -> None:
    n = coords.shape[0]
    for k, name in enumerate(_group_order(groups)):
        ids = group_ids(groups[name], n).numpy()
        ids = ids[keep[ids]]
        ax.scatter(coords[ids, 0], coords[ids, 1], s=point_size, alpha=0.6, lw=0, color=_group_color(name, k),
                   label=f"{name} ({len(ids)})" if with_counts else name, gid=f"svd|{name}")
    ax.plot([0], [0], marker="+", color="black", ms=10, mew=1.5)


def plot_svd_projection(weight: torch.Tensor, counts_or_groups, path, title: str = "", center: bool = False,
                        max_points: int | None = None, seed: int = 0, point_size: float = 2.0) -> Path:
    """Scatter of :func:`svd_projection` with points coloured by frequency group (red rare, green medium,
    blue frequent, as Yu et al. 2022 Figs 1, 3). ``counts_or_groups``: the groups of
    :func:`repdegen.analysis.groups.frequency_groups`, or training counts (then the default 30/50/20% groups).
    ``max_points``: plot a random subset of that many rows (the projection uses every row). Equal axis
    scales, so the angular spread of the cloud is not distorted; the origin is marked. Several matrices side by
    side on the same axes: :func:`plot_svd_projections`."""
    groups = counts_or_groups if isinstance(counts_or_groups, Mapping) else frequency_groups(counts_or_groups)
    coords = svd_projection(weight, center)
    fig, ax = plt.subplots(figsize=(5, 5))
    _scatter_groups(ax, coords, groups, _subsample(coords.shape[0], max_points, seed), point_size)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("singular direction 1")
    ax.set_ylabel("singular direction 2")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, markerscale=4)
    ax.set_title(title + (" (centred)" if center else ""), fontsize=10)
    return _save(fig, path)


def _grid(n: int, ncols: int | None = None) -> tuple[int, int]:
    """(rows, columns) of a grid of ``n`` panels: side by side up to 3, else about square."""
    ncols = ncols or (n if n <= 3 else math.ceil(math.sqrt(n)))
    return math.ceil(n / ncols), ncols


def _square_limits(coords: Sequence[np.ndarray], pad: float = 0.05) -> tuple[tuple[float, float], tuple[float, float]]:
    """(xlim, ylim) of one square window (the same span on both axes) holding every point and the origin."""
    pts = np.concatenate([c for c in coords] + [np.zeros((1, 2))])
    lo, hi = pts.min(0), pts.max(0)
    span = float((hi - lo).max()) * (1 + 2 * pad) or 1.0
    mid = (lo + hi) / 2
    return (mid[0] - span / 2, mid[0] + span / 2), (mid[1] - span / 2, mid[1] + span / 2)


def figure_svd_projections(panels: Mapping[str, tuple], title: str = "", center: bool = False,
                           max_points: int | None = None, seed: int = 0, point_size: float = 2.0,
                           ncols: int | None = None):
    """The figure of :func:`plot_svd_projections`, not saved. Each panel's group scatters carry ``gid``
    "svd|<group>"; ``fig.axes`` are the panels in the order of ``panels`` (empty grid cells removed)."""
    names = list(panels)
    coords, groups, from_counts = [], [], True
    for name in names:
        weight, counts_or_groups = panels[name]
        from_counts &= not isinstance(counts_or_groups, Mapping)
        groups.append(counts_or_groups if isinstance(counts_or_groups, Mapping) else frequency_groups(counts_or_groups))
        coords.append(svd_projection(weight, center))
    nrows, ncols = _grid(len(names), ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.9 * ncols, 3.9 * nrows + 0.9), squeeze=False, sharex=True,
                             sharey=True, layout="constrained")
    xlim, ylim = _square_limits(coords)
    subsampled = False
    for k, ax in enumerate(axes.flat):
        if k >= len(names):
            ax.remove()
            continue
        keep = _subsample(coords[k].shape[0], max_points, seed)
        subsampled |= not keep.all()
        _scatter_groups(ax, coords[k], groups[k], keep, point_size, with_counts=False)
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.set_aspect("equal", adjustable="box")
        ax.grid(True, alpha=0.3)
        ax.set_title("\n".join(textwrap.wrap(names[k], 45)), fontsize=9)
        if k % ncols == 0:
            ax.set_ylabel("singular direction 2")
        if k + ncols >= len(names):  # the lowest panel of its column
            ax.set_xlabel("singular direction 1")
            ax.xaxis.set_tick_params(labelbottom=True)
    shown = list(dict.fromkeys(g for gs in groups for g in _group_order(gs)))
    share = {"frequent": "most frequent 30 %", "medium": "next 50 %", "rare": "least frequent 20 %"}
    handles = [Line2D([], [], ls="", marker="o", ms=5, color=_group_color(g, k)) for k, g in enumerate(shown)]
    labels = [f"{g} ({share[g]} of types)" if from_counts and g in share else g for g in shown]
    figure_legend(fig, handles, labels, title="frequency group (training counts); +: the origin")
    note = [f"a random {max_points:,} rows of each matrix shown"] if subsampled else []
    fig.suptitle("\n".join(textwrap.wrap(title + (" (centred)" if center else ""), width=max(50, 38 * ncols))
                           + note), fontsize=10)
    return fig


def plot_svd_projections(panels: Mapping[str, tuple], path, title: str = "", center: bool = False,
                         max_points: int | None = None, seed: int = 0, point_size: float = 2.0,
                         ncols: int | None = None) -> Path:
    """Several matrices on their own top-2 singular directions (:func:`svd_projection`), one panel each, side by
    side on the same axis limits (a square window holding every point and the origin), as Gao et al. 2019 Fig. 1
    and Yu et al. 2022 Figs 1, 3 compare MLE and their method. ``panels``: {panel title: (weight,
    counts_or_groups)} (as :func:`plot_svd_projection`); points coloured by frequency group, one legend below
    the panels. A grid: side by side up to 3 panels, else about square (``ncols`` to choose)."""
    return _save(figure_svd_projections(panels, title, center, max_points, seed, point_size, ncols), path)


def normalized_singular_values(weight) -> np.ndarray:
    """Singular values of ``weight`` divided by the largest (Gao et al. 2019 Fig. 2(b): "We normalize the
    singular values of each matrix so that the largest one is 1"). ``weight``: the matrix, or its
    singular values already computed (a 1-D sequence, e.g. a run's recorded ``singular_values``)."""
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        s = torch.linalg.svdvals(weight.detach().cpu().to(torch.float64)).numpy()
    else:
        s = np.sort(np.asarray(weight, dtype=np.float64))[::-1]
    return s / s[0] if s.size and s[0] > 0 else s


def figure_singular_values(weights: Mapping, title: str = "", log: bool = False, colors: Mapping | None = None):
    """The figure of :func:`plot_singular_values`, not saved. Each row's mean line carries ``gid``
    "<label>|mean", its band "<label>|band"."""
    colors = colors or row_colors(list(weights))
    fig, ax = plt.subplots(figsize=(6, 4.4))
    handles, counts = [], []
    for label, value in weights.items():
        spectra = [normalized_singular_values(w) for w in seeds_of(value)]
        k = min(s.size for s in spectra)
        stack = np.stack([s[:k] for s in spectra])
        xs = np.arange(1, k + 1)
        handles.append(ax.plot(xs, stack.mean(0), color=colors[label], lw=1.6, gid=f"{label}|mean")[0])
        if len(spectra) > 1:
            ax.fill_between(xs, stack.min(0), stack.max(0), color=colors[label], alpha=0.2, lw=0, gid=f"{label}|band")
        counts.append(len(spectra))
    names = with_seed_counts(list(weights), counts)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("index of the singular value (largest first)")
    ax.set_ylabel("singular value / largest")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(handles, names, fontsize=8, loc="best", title=band_note(counts), title_fontsize=8)
    ax.set_title("\n".join(textwrap.wrap(title, 60)), fontsize=10)
    return fig


def plot_singular_values(weights: Mapping, path, title: str = "", log: bool = False,
                         colors: Mapping | None = None) -> Path:
    """One curve of normalised singular values (largest = 1) against their index per label (Gao et al. 2019
    Fig. 2(b), Yu et al. 2022 Fig. 3(c)). ``weights``: {label: a matrix, or its singular values}, or a
    :class:`repdegen.analysis.figures.Seeds` of them for a row run with several seeds: the mean of the normalised spectra
    (the line) and their min–max (a band). ``colors``: {label: colour} (default: one per label, in order)."""
    return _save(figure_singular_values(weights, title, log, colors), path)


def plot_token_frequency(counts, path, title: str = "") -> Path:
    """Token frequency against rank (Gao et al. 2019 Fig. 3: "the x-axis is the token ranked with respect
    to its frequency in descending order. The y-axis is the logarithmic value of the token frequency").
    ``counts``: training counts (tensor, sequence, or an object with ``.counts``), or {label: counts} for
    one curve each. Counts are sorted descending; zero counts (log undefined) are left out. The y axis is
    the count on a log scale."""
    series = counts if isinstance(counts, Mapping) else {"": counts}
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, c in series.items():
        c = _numpy(c.counts if hasattr(c, "counts") else c).reshape(-1)
        c = np.sort(c)[::-1]
        c = c[c > 0]
        ax.plot(np.arange(1, c.size + 1), c, label=label or None, lw=1.6)
    ax.set_yscale("log")
    ax.set_xlabel("token rank (by training frequency)")
    ax.set_ylabel("frequency (log scale)")
    ax.grid(True, which="both", alpha=0.3)
    if any(series):
        ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def _lookup(record: Mapping, key: str):
    """``record[key]``, or a nested value by a dotted path (``"isotropy.rare"``); None when missing."""
    if key in record:
        return record[key]
    value = record
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _points(history: Sequence[Mapping], key: str, x_key: str) -> dict[str, dict[float, float]]:
    """{part of the run: {x: value}} of one history (records without the metric are skipped)."""
    out: dict[str, dict[float, float]] = {}
    for i, rec in enumerate(history):
        y = _lookup(rec, key)
        if y is None:
            continue
        x = _lookup(rec, x_key)
        part = _part(rec) if "stage" in rec else "train"
        out.setdefault(part, {})[i + 1 if x is None else x] = float(y)
    return out


def figure_metric_over_training(histories: Mapping, key: str | Sequence[str], title: str = "", x_key: str = "step",
                                log: bool = False, colors: Mapping | None = None, labels: Mapping | None = None,
                                x_label: str | None = None, ncols: int | None = None):
    """The figure of :func:`plot_metric_over_training`, not saved: ``fig.axes`` are the panels in the order of the
    keys; a row's mean line carries ``gid`` "<label>|<key>|<part>|mean", its band "...|band"."""
    keys = [key] if isinstance(key, str) else list(key)
    labels = labels or {}
    colors = colors or row_colors(list(histories))
    nrows, ncols = (1, 1) if len(keys) == 1 else _grid(len(keys), ncols or 2)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, 3.4 * nrows + (0.4 if len(keys) == 1 else 0.9)),
                             squeeze=False, layout="constrained")
    handles: dict[str, object] = {}
    counts: dict[str, int] = {}
    parts: set[str] = set()
    for j, ax in enumerate(axes.flat):
        if j >= len(keys):
            ax.remove()
            continue
        k = keys[j]
        for label, value in histories.items():
            per_seed = [_points(h, k, x_key) for h in seeds_of(value)]
            for part, style in PART_STYLES:
                points = [p.get(part, {}) for p in per_seed]
                if not any(points):
                    continue
                parts.add(part)
                xs, mean, lo, hi, n = mean_band(points)
                line = ax.plot(xs, mean, style, marker="." if xs.size <= 50 else None, color=colors[label], lw=1.6,
                               gid=f"{label}|{k}|{part}|mean")[0]
                handles.setdefault(label, line)
                counts[label] = max(counts.get(label, 0), int(n.max()))
                if n.max() > 1:
                    ax.fill_between(xs, lo, hi, color=colors[label], alpha=0.2, lw=0, gid=f"{label}|{k}|{part}|band")
        if log:
            ax.set_yscale("log")
        ax.set_xlabel(x_label or x_key)
        ax.set_ylabel(labels.get(k, k))
        ax.grid(True, alpha=0.3)
    names = with_seed_counts(list(handles), [counts[n] for n in handles])
    entries = list(handles.values())
    for part, style in PART_STYLES[1:]:
        if part in parts:
            entries.append(Line2D([], [], color="0.3", ls=style, lw=1.4))
            names.append(PART_NAMES[part])
    note = band_note(list(counts.values()))
    if len(keys) == 1 and entries:
        axes[0, 0].legend(entries, names, fontsize=8, loc="best", title=note, title_fontsize=8)
    else:
        figure_legend(fig, entries, names, title=note)
    fig.suptitle("\n".join(textwrap.wrap(title, width=max(50, 45 * ncols))), fontsize=10)
    return fig


def plot_metric_over_training(histories: Mapping, key: str | Sequence[str], path, title: str = "",
                              x_key: str = "step", log: bool = False, colors: Mapping | None = None,
                              labels: Mapping | None = None, x_label: str | None = None,
                              ncols: int | None = None) -> Path:
    """A metric per evaluation record, one curve per label (Yu et al. 2022 Fig. 2).

    ``histories``: {label: [record, ...]}, or {label: :class:`repdegen.analysis.figures.Seeds` of such lists} for a row
    run with several seeds (drawn as their mean and min–max band, matched by x); ``key``: the metric's key in a
    record (a dotted path reaches into nested dicts, e.g. ``"isotropy.rare"``), or several keys for one panel
    each, in a grid of ``ncols`` columns (default 2: four keys make 2 x 2). x = ``record[x_key]`` when present,
    else the record's 1-based position. Records without the metric are skipped; records with a ``stage`` are
    drawn as :func:`repdegen.analysis.figures.plot_validation_curves` draws them (re-training dotted, finetuning dashed).
    ``labels``: {key: axis label} (default: the key); ``x_label``: the x axis's (default: ``x_key``);
    ``colors``: {label: colour} (default: one per label, in order). One legend: inside a single panel where
    the data leaves most room, below a grid."""
    return _save(figure_metric_over_training(histories, key, title, x_key, log, colors, labels, x_label, ncols), path)


def plot_rare_group_size(steps: Sequence[float], sizes: Sequence[float], path,
                         title: str = "Size of the rare token group") -> Path:
    """Size of AGG's dynamic rare group against the training step (Yu et al. 2022 Fig. 4)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(list(steps), list(sizes), lw=1.2)
    ax.set_xlabel("training step")
    ax.set_ylabel("rare group size (tokens)")
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)
