"""Figures of embedding geometry (PNG, matplotlib's Agg backend; no display needed).

* :func:`plot_svd_projection`: the embeddings projected on their top-2 singular directions, coloured by
  frequency group (Gao et al. 2019 Figs 1(a), 2(a); Yu et al. 2022 Figs 1, 3(a, b)).
* :func:`plot_singular_values`: singular values normalised so that the largest is 1 (Gao Fig. 2(b),
  Yu Fig. 3(c)).
* :func:`plot_token_frequency`: token frequency (log scale) against frequency rank (Gao Fig. 3).
* :func:`plot_metric_over_training`: a metric per evaluation during training, e.g. I(W) of the rare /
  frequent groups or the rare-frequent cosine (Yu Fig. 2).
* :func:`plot_rare_group_size`: size of AGG's dynamic rare group against training step (Yu Fig. 4).
* Yu Fig. 5 (metrics against AGG's alpha, mean +- std over seeds) is a sweep's plot:
  ``make sweep-alpha`` then ``reproduce.runs.sweeps`` (``analysis/sweep_figures.py``).

Every function writes ``path`` (parent folders created) and returns it as a ``Path``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from analysis.groups import frequency_groups, group_ids  # noqa: E402

# Yu et al. 2022 Figs 1, 3: "Red, green, and blue points represent rare, medium, and frequent groups"
GROUP_COLORS = {"rare": "tab:red", "medium": "tab:green", "frequent": "tab:blue"}


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def svd_projection(weight: torch.Tensor, center: bool = False) -> np.ndarray:
    """(N, 2) coordinates of the rows of ``weight`` on its top-2 right singular vectors, ``W V_2``
    (= ``U_2 S_2``, the rank-2 SVD approximation of Gao et al. 2019 Sec. 3 expressed in its own basis).

    Uncentred by default: Gao et al. "use low-rank approximation (rank = 2) for the learned matrices by
    SVD" of the matrix itself, and their Fig. 1(a) shows the degenerate embeddings as a narrow cone *away
    from the origin*, which centring would hide (the mean is the cone's axis). Yu et al. ("SVD
    projection") say nothing more. ``center=True`` subtracts the mean row first (a PCA plot).
    Each axis's sign (arbitrary in an SVD) is fixed so that the mean coordinate is >= 0.
    """
    w = weight.detach().cpu().to(torch.float64)
    if center:
        w = w - w.mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(w, full_matrices=False)
    coords = w @ vh[:2].t()
    signs = torch.where(coords.mean(0) < 0, -1.0, 1.0).to(coords.dtype)
    return (coords * signs).numpy()


def plot_svd_projection(weight: torch.Tensor, counts_or_groups, path, title: str = "", center: bool = False,
                        max_points: int | None = None, seed: int = 0, point_size: float = 2.0) -> Path:
    """Scatter of :func:`svd_projection` with points coloured by frequency group (red rare, green medium,
    blue frequent, as Yu et al. 2022 Figs 1, 3). ``counts_or_groups``: the groups of
    :func:`analysis.groups.frequency_groups`, or training counts (then the default 30/50/20% groups).
    ``max_points``: plot a random subset of that many rows (the projection uses every row). Equal axis
    scales, so the angular spread of the cloud is not distorted; the origin is marked."""
    groups = counts_or_groups if isinstance(counts_or_groups, Mapping) else frequency_groups(counts_or_groups)
    coords = svd_projection(weight, center)
    n = coords.shape[0]
    keep = np.ones(n, dtype=bool)
    if max_points is not None and max_points < n:
        keep[:] = False
        keep[np.random.default_rng(seed).choice(n, size=max_points, replace=False)] = True
    fig, ax = plt.subplots(figsize=(5, 5))
    # frequent first, rare last (on top): the rare group is the one the papers follow
    order = sorted(groups, key=lambda g: {"frequent": 0, "medium": 1, "rare": 2}.get(g, 3))
    for k, name in enumerate(order):
        ids = group_ids(groups[name], n).numpy()
        ids = ids[keep[ids]]
        ax.scatter(coords[ids, 0], coords[ids, 1], s=point_size, alpha=0.6, lw=0,
                   color=GROUP_COLORS.get(name, f"C{k + 3}"), label=f"{name} ({len(ids)})")
    ax.plot([0], [0], marker="+", color="black", ms=10, mew=1.5)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("singular direction 1")
    ax.set_ylabel("singular direction 2")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, markerscale=4)
    ax.set_title(title + (" (centred)" if center else ""), fontsize=10)
    return _save(fig, path)


def normalized_singular_values(weight) -> np.ndarray:
    """Singular values of ``weight`` divided by the largest (Gao et al. 2019 Fig. 2(b): "We normalize the
    singular values of each matrix so that the largest one is 1"). ``weight``: the matrix, or its
    singular values already computed (a 1-D sequence, e.g. a run's recorded ``singular_values``)."""
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        s = torch.linalg.svdvals(weight.detach().cpu().to(torch.float64)).numpy()
    else:
        s = np.sort(np.asarray(weight, dtype=np.float64))[::-1]
    return s / s[0] if s.size and s[0] > 0 else s


def plot_singular_values(weights: Mapping[str, torch.Tensor], path, title: str = "", log: bool = False) -> Path:
    """One curve of normalised singular values (largest = 1) against their index per label."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, w in weights.items():
        s = normalized_singular_values(w)
        ax.plot(np.arange(1, s.size + 1), s, label=label, lw=1.6)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("index")
    ax.set_ylabel("normalized singular value")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


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


def plot_metric_over_training(histories: Mapping[str, Sequence[Mapping]], key: str | Sequence[str], path,
                              title: str = "", x_key: str = "step", log: bool = False) -> Path:
    """A metric per evaluation record, one curve per label (Yu et al. 2022 Fig. 2).

    ``histories``: {label: [record, ...]}; ``key``: the metric's key in a record (a dotted path reaches
    into nested dicts, e.g. ``"isotropy.rare"``), or several keys for one panel each. x = ``record[x_key]``
    when present, else the record's 1-based position. Records without the metric are skipped."""
    keys = [key] if isinstance(key, str) else list(key)
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 4), squeeze=False)
    for ax, k in zip(axes[0], keys):
        for c, (label, history) in enumerate(histories.items()):
            pts = []
            for i, rec in enumerate(history):
                y = _lookup(rec, k)
                if y is None:
                    continue
                x = _lookup(rec, x_key)
                pts.append((i + 1 if x is None else x, float(y)))
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker=".", color=f"C{c % 10}", label=label, lw=1.6)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel(x_key)
        ax.set_ylabel(k)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


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
