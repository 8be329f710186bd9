"""A degeneration report of one embedding matrix W (V x d): the numbers of Gao et al. 2019 (Sec. 1, 3) and Yu et al.
2022 (Sec. 3) for any matrix, with or without the training counts of its rows (``repdegen embeddings`` writes it).

:func:`embedding_report` computes, in float64 and without ever holding a V x V matrix:

* ``isotropy``: I(W) exactly as :func:`repdegen.analysis.metrics.isotropy` defines it (the eigenvectors of W^T W, both
  signs), its projections taken a block of directions at a time, so that a 50,000 x 1,024 matrix needs a few hundred
  MB besides W itself;
* ``mean_cos`` (the formula of :func:`repdegen.analysis.metrics.mean_cosine`, a block of unit rows at a time),
  ``centroid_ratio`` and the spectrum's summaries (:mod:`repdegen.analysis.geometry`); the singular values are the
  square roots of the eigenvalues of W^T W (the same eigen-decomposition, no SVD of W; when the groups split the
  rows, W^T W is the sum of the groups' own);
* the distribution of pairwise cosines from ``sample_pairs`` random pairs i != j (or, with ``all_pairs``, every pair,
  a block of rows at a time: a histogram, never the matrix);
* with frequency groups (:func:`repdegen.analysis.groups.frequency_groups`): each group's I(W) (the eigenvectors of its
  own W_g^T W_g, as :func:`repdegen.analysis.groups.group_isotropy`), its mean cosine and the rare-frequent cosine
  (the sums of :func:`repdegen.analysis.groups.group_cosines`);
* the rows on their top-2 singular directions (the coordinates of
  :func:`repdegen.analysis.embedding_figures.svd_projection`, from the same eigenvectors);
* IsoScore (Rudman et al. 2022, a different measure) when the ``IsoScore`` package is importable.

:func:`write_figures` draws the figures of the report (PNG).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from repdegen.analysis.geometry import centroid_ratio, spectrum_metrics
from repdegen.analysis.groups import group_ids

DIRECTION_BLOCK = 128  # directions projected on at once: V x 128 float64 (51 MB at V = 50,000)
ROW_BLOCK = 8192  # rows normalised at once for the cosine sums
ALL_PAIRS_BLOCK = 1024  # rows of the exact histogram's blocks (1,024 x V cosines at once)
HIST_BINS = np.linspace(-1.0, 1.0, 201)
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
ISOSCORE_MAX_ROWS = 20000


def _logsumexp_both_signs(proj: torch.Tensor) -> list[torch.Tensor]:
    """[logsumexp(proj, 0), logsumexp(-proj, 0)], each shifted by its column's maximum (as torch.logsumexp), with
    one temporary block instead of four."""
    top, bottom = proj.amax(0), proj.amin(0)
    pos = (proj - top).exp_().sum(0).log_() + top
    neg = (bottom - proj).exp_().sum(0).log_() - bottom
    return [pos, neg]


@torch.no_grad()
def isotropy_and_spectrum(w: torch.Tensor, keep_top: int = 0, gram: torch.Tensor | None = None) -> dict:
    """I(W) of the float64 matrix ``w`` (as :func:`repdegen.analysis.metrics.isotropy`: ``eigh(W^T W)``, Z over the
    eigenvectors and their negatives, ``exp(min log Z - max log Z)``), the singular values (descending, from the
    same eigenvalues) and, with ``keep_top`` = k, the rows' coordinates on the top-k eigenvectors (largest first).
    ``gram``: W^T W when the caller has it (the sum of the groups' own when they split the rows)."""
    eigvals, eigvecs = torch.linalg.eigh(w.t() @ w if gram is None else gram)
    log_z = []
    for start in range(0, eigvecs.shape[1], DIRECTION_BLOCK):
        proj = w @ eigvecs[:, start:start + DIRECTION_BLOCK]
        log_z += _logsumexp_both_signs(proj)
    log_z = torch.cat(log_z)
    out = {"isotropy": float(torch.exp(log_z.min() - log_z.max())),
           "singular_values": eigvals.clamp_min(0).sqrt().flip(0).tolist()}
    if keep_top:
        top = eigvecs[:, -keep_top:].flip(1)
        coords = w @ top
        signs = torch.where(coords.mean(0) < 0, -1.0, 1.0).to(coords.dtype)  # svd_projection's sign convention
        out["top_coords"] = (coords * signs).numpy()
    return out


def _unit_rows(w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(w, dim=1)


def _unit_sums(w: torch.Tensor, norms: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(sum of the unit rows ``ids``, sum of their squared entries), a block of rows at a time (no unit copy of W).
    A zero row stays zero: cosine 0 with everything."""
    total, squares = torch.zeros(w.shape[1], dtype=w.dtype), 0.0
    for start in range(0, len(ids), ROW_BLOCK):
        block = ids[start:start + ROW_BLOCK]
        u = w[block] / norms[block].clamp_min(1e-300)[:, None]
        total += u.sum(0)
        squares += float((u * u).sum())
    return total, squares


@torch.no_grad()
def sampled_cosines(w: torch.Tensor, pairs: int, seed: int = 0, rows: torch.Tensor | None = None,
                    cols: torch.Tensor | None = None) -> np.ndarray:
    """Cosines of about ``pairs`` random pairs i != j: every pair between two disjoint random sets of m rows (m =
    sqrt(pairs), at most half the rows), one product of two m x d blocks. ``rows`` (and ``cols``): draw the first
    set from these ids and the second from ``cols`` (default: the same ids; with ``cols`` the sets are drawn from
    each, assumed disjoint). float64, flattened."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(w.shape[0]) if rows is None else torch.as_tensor(rows, dtype=torch.long)
    m = max(1, math.isqrt(max(pairs, 1)))
    if cols is None:
        m = min(m, len(rows) // 2)
        if m < 1:
            return np.zeros(0)
        pick = rows[torch.randperm(len(rows), generator=g)[:2 * m]]
        a, b = pick[:m], pick[m:]
    else:
        cols = torch.as_tensor(cols, dtype=torch.long)
        if not len(rows) or not len(cols):
            return np.zeros(0)
        a = rows[torch.randperm(len(rows), generator=g)[:m]]
        b = cols[torch.randperm(len(cols), generator=g)[:m]]
    return (_unit_rows(w[a]) @ _unit_rows(w[b]).t()).reshape(-1).numpy()


@torch.no_grad()
def all_pair_histogram(w: torch.Tensor) -> dict:
    """Every ordered pair i != j: the histogram of the cosines (``HIST_BINS``), their mean and the fraction positive,
    a block of rows at a time (O(V^2 d) time, O(block x V) memory)."""
    u = _unit_rows(w)
    v = u.shape[0]
    counts = np.zeros(len(HIST_BINS) - 1, dtype=np.int64)
    pos = 0
    for start in range(0, v, ALL_PAIRS_BLOCK):
        block = u[start:start + ALL_PAIRS_BLOCK] @ u.t()
        idx = torch.arange(block.shape[0])
        block[idx, start + idx] = math.nan  # the diagonal
        flat = block.reshape(-1)
        flat = flat[~torch.isnan(flat)]
        pos += int((flat > 0).sum())
        counts += np.histogram(flat.clamp(-1, 1).numpy(), bins=HIST_BINS)[0]
    return {"pairs": v * (v - 1), "frac_positive": pos / max(v * (v - 1), 1), "histogram": counts.tolist()}


def cosine_summary(values: np.ndarray) -> dict:
    if not values.size:
        return {"pairs": 0}
    return {"pairs": int(values.size), "mean": float(values.mean()), "std": float(values.std()),
            "frac_positive": float((values > 0).mean()),
            "quantiles": {f"{q:g}": float(np.quantile(values, q)) for q in QUANTILES},
            "histogram": np.histogram(np.clip(values, -1, 1), bins=HIST_BINS)[0].tolist()}


def isoscore(w: torch.Tensor, seed: int = 0) -> tuple[float | None, str]:
    """(IsoScore, how it was computed) when the ``IsoScore`` package is importable, else (None, why not)."""
    try:
        from IsoScore import IsoScore as iso_module
    except ImportError:
        return None, "not computed: the IsoScore package is not installed (pip install IsoScore)"
    rows = w
    note = "IsoScore package"
    if w.shape[0] > ISOSCORE_MAX_ROWS:
        keep = torch.randperm(w.shape[0], generator=torch.Generator().manual_seed(seed))[:ISOSCORE_MAX_ROWS]
        rows = w[keep]
        note += f", on a random {ISOSCORE_MAX_ROWS:,} rows"
    try:
        value = float(iso_module.IsoScore(rows.numpy().T))  # its point cloud: one column per point
    except Exception as err:  # noqa: BLE001 - a third-party measure; its failure leaves the report whole
        return None, f"not computed: IsoScore failed ({type(err).__name__}: {str(err)[:120]})"
    return value, note


def _finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


@torch.no_grad()
def embedding_report(weight: torch.Tensor, groups: Mapping | None = None, sample_pairs: int = 200_000,
                     all_pairs: bool = False, seed: int = 0, with_isoscore: bool = True) -> dict:
    """The numbers of the report (plain floats, None where undefined), and under ``"_figures"`` what the figures
    need (the projected rows, the sampled cosines per group: arrays, not JSON)."""
    v, d = weight.shape
    w = weight.detach().to("cpu", torch.float64)
    ids_of = {name: group_ids(g, v) for name, g in (groups or {}).items()}
    per: dict = {}
    gram = None
    if ids_of and bool((torch.bincount(torch.cat(list(ids_of.values())), minlength=v) == 1).all()):
        gram = torch.zeros(d, d, dtype=torch.float64)  # the groups split the rows: W^T W = the sum of theirs
    for name, ids in ids_of.items():
        entry = {"size": int(ids.numel()), "isotropy": None, "mean_cos": None, "isotropic_reference": None}
        if ids.numel():
            rows = w[groups[name]] if isinstance(groups[name], slice) else w[ids]  # a slice: a view, no copy
            g_gram = rows.t() @ rows
            if gram is not None:
                gram += g_gram
            entry["isotropic_reference"] = gaussian_reference(len(ids), d, float(g_gram.trace()) / (len(ids) * d))
            entry["isotropy"] = isotropy_and_spectrum(rows, gram=g_gram)["isotropy"]
            del rows
        per[name] = entry
    geo = isotropy_and_spectrum(w, keep_top=2 if d >= 2 else 0, gram=gram)
    sv = geo["singular_values"]
    energy = float(sum(s * s for s in sv)) or math.nan
    norms = w.norm(dim=1)
    total, total_sq = _unit_sums(w, norms, torch.arange(v))
    out: dict = {
        "rows": v, "dim": d,
        "isotropy": geo["isotropy"],
        # metrics.mean_cosine's formula (a zero row counts as cosine 0, as in groups.group_cosines)
        "mean_cos": float((total.dot(total) - total_sq) / (v * (v - 1))) if v > 1 else None,
        "centroid_ratio": _finite(centroid_ratio(w)),
        "row_norm": {"mean": float(norms.mean()), "min": float(norms.min()), "max": float(norms.max())},
        "singular_values": sv,
        "isotropic_reference": gaussian_reference(v, d, energy / (v * d)),
        "sv1_energy_share": _finite(sv[0] ** 2 / energy) if sv else None,
        **{k: _finite(x) for k, x in spectrum_metrics(sv).items()},
    }
    if len(sv) >= 2 and sv[1] > 0:
        out["sv_ratio_1_2"] = sv[0] / sv[1]
    figures: dict = {"coords": geo.get("top_coords"), "cosines": {}}
    sample = sampled_cosines(w, sample_pairs, seed) if v > 1 else np.zeros(0)
    out["cosines"] = {"sampled": True, **cosine_summary(sample)}
    figures["cosines"]["all rows"] = sample
    if all_pairs and v > 1:
        exact = all_pair_histogram(w)
        out["cosines"] = {"sampled": False, "mean": out["mean_cos"], **exact,
                          "sample_quantiles": out["cosines"].get("quantiles")}
        figures["all_pair_histogram"] = np.asarray(exact["histogram"])
    if groups:
        # group_cosines' sums: within, (|s|^2 - sum of squares) / n(n-1); between, s_a . s_b / (n_a n_b)
        sums = {name: _unit_sums(w, norms, ids) for name, ids in ids_of.items()}
        for k, (name, ids) in enumerate(ids_of.items()):
            n = len(ids)
            if n > 1:
                s, sq = sums[name]
                per[name]["mean_cos"] = _finite(float(s.dot(s) - sq) / (n * (n - 1)))
                figures["cosines"][name] = sampled_cosines(w, sample_pairs // 4, seed + 1 + k, rows=ids)
        out["groups"] = per
        if {"rare", "frequent"} <= set(ids_of) and all(len(ids_of[g]) for g in ("rare", "frequent")):
            n = len(ids_of["rare"]) * len(ids_of["frequent"])
            out["cos_rare_frequent"] = _finite(float(sums["rare"][0].dot(sums["frequent"][0])) / n)
            figures["cosines"]["rare-frequent"] = sampled_cosines(w, sample_pairs // 4, seed + 9,
                                                                  rows=ids_of["rare"], cols=ids_of["frequent"])
    out["isoscore"], out["isoscore_note"] = isoscore(w, seed) if with_isoscore else (None, "not computed (turned off)")
    out["_figures"] = figures
    return out


# ---- the figures -------------------------------------------------------------------------------------------------
def figure_cosines(cosines: Mapping[str, np.ndarray], title: str = "", exact_histogram: np.ndarray | None = None):
    """Histograms (densities) of pairwise cosines, one line per set of pairs; ``exact_histogram``: the counts of every
    pair over ``HIST_BINS`` (drawn for all rows instead of their sample)."""
    import matplotlib.pyplot as plt
    from repdegen.analysis.embedding_figures import GROUP_COLORS

    fig, ax = plt.subplots(figsize=(6, 4.2))
    centres = (HIST_BINS[:-1] + HIST_BINS[1:]) / 2
    width = HIST_BINS[1] - HIST_BINS[0]
    for k, (name, values) in enumerate(cosines.items()):
        if name == "all rows" and exact_histogram is not None:
            dens = exact_histogram / max(exact_histogram.sum(), 1) / width
            label = f"all rows (every pair, {int(exact_histogram.sum()):,})"
        elif len(values):
            dens = np.histogram(np.clip(values, -1, 1), bins=HIST_BINS, density=True)[0]
            label = f"{name} ({len(values):,} random pairs)"
        else:
            continue
        color = "black" if name == "all rows" else GROUP_COLORS.get(name, "tab:purple" if "-" in name else f"C{k + 3}")
        ax.plot(centres, dens, color=color, lw=1.8 if name == "all rows" else 1.2, label=label, gid=f"cos|{name}")
    ax.axvline(0, color="0.5", lw=0.8, ls=":")
    ax.set_xlabel("cosine similarity of two rows")
    ax.set_ylabel("density")
    ax.set_xlim(-1, 1)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def figure_group_bars(report: Mapping, title: str = ""):
    """Two panels: I(W) and mean cosine of each frequency group and of all rows (Yu et al. 2022, Tables 1, 2)."""
    import matplotlib.pyplot as plt
    from repdegen.analysis.embedding_figures import GROUP_COLORS

    names = list(report["groups"]) + ["all rows"]
    iso = [report["groups"][n]["isotropy"] for n in names[:-1]] + [report["isotropy"]]
    cos = [report["groups"][n]["mean_cos"] for n in names[:-1]] + [report["mean_cos"]]
    colors = [GROUP_COLORS.get(n, "0.4") for n in names]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, values, label in ((axes[0], iso, "I(W) (1 = isotropic)"), (axes[1], cos, "mean cosine of pairs")):
        shown = [np.nan if x is None else x for x in values]
        bars = ax.bar(names, shown, color=colors)
        for bar, x in zip(bars, values):
            ax.annotate("–" if x is None else f"{x:.3g}", (bar.get_x() + bar.get_width() / 2, bar.get_height()
                        if x is not None and x >= 0 else 0), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(label)
        ax.axhline(0, color="0.5", lw=0.8)
        ax.grid(True, axis="y", alpha=0.3)
    refs = [report["groups"][n].get("isotropic_reference") for n in names[:-1]] + [report.get("isotropic_reference")]
    xs = [k for k, r in enumerate(refs) if r is not None]
    if xs:
        axes[0].scatter(xs, [refs[k] for k in xs], marker="_", s=900, color="black", lw=2, zorder=3,
                        label="isotropic Gaussian of the same size", gid="groups|reference")
        axes[0].legend(fontsize=7, loc="upper left")
    axes[0].set_ylim(0, 1.12)
    known = [x for x in cos if x is not None] or [0.0]
    axes[1].set_ylim(min(-0.1, 1.2 * min(known)), max(0.1, 1.2 * max(known)))
    fig.suptitle(title, fontsize=10)
    return fig


def write_figures(report: Mapping, groups: Mapping | None, out_dir: Path, title: str) -> dict[str, str]:
    """The report's figures in ``out_dir``: {figure: file name}. The projection is drawn from the coordinates the
    report computed (no second decomposition)."""
    import matplotlib.pyplot as plt
    from repdegen.analysis.embedding_figures import Projected, _save, plot_singular_values, plot_svd_projection

    out_dir = Path(out_dir)
    figures = report["_figures"]
    files = {"spectrum": "singular_values.png", "projection": "svd_projection.png", "cosines": "cosines.png"}
    plot_singular_values({title: report["singular_values"]}, out_dir / files["spectrum"],
                         f"{title}: singular values / largest (Gao et al. 2019 Fig. 2(b))", log=True)
    if figures.get("coords") is not None:
        shown = groups if groups else {"all rows (no counts)": slice(0, report["rows"])}
        plot_svd_projection(Projected(figures["coords"]), shown, out_dir / files["projection"],
                            f"{title}: rows on the top-2 singular directions", max_points=20000)
    else:
        files.pop("projection")
    _save(figure_cosines(figures["cosines"], f"{title}: pairwise cosines", figures.get("all_pair_histogram")),
          out_dir / files["cosines"])
    if report.get("groups"):
        files["groups"] = "groups.png"
        _save(figure_group_bars(report, f"{title}: per frequency group (Yu et al. 2022)"), out_dir / files["groups"])
    plt.close("all")
    return files


# ---- the report's text -------------------------------------------------------------------------------------------
def gaussian_reference(v: int, d: int, mean_square: float) -> float | None:
    """I(W) that an i.i.d. Gaussian matrix of v x d entries of mean square s^2 gives, to first order: Z(a) ~ v
    exp(lambda(a) / 2v) with the eigenvalues lambda of W^T W at the Marchenko-Pastur edges v s^2 (1 +- sqrt(d/v))^2,
    so I ~ exp(-2 s^2 sqrt(d/v)) (d <= v; None otherwise; sampling noise makes the real value a little lower)."""
    if d > v or not v or not math.isfinite(mean_square):
        return None
    return math.exp(-2 * mean_square * math.sqrt(d / v))


def _fmt(x, spec: str = ".4g") -> str:
    return "–" if x is None else format(x, spec)


READING = """\
## How to read these numbers

- **I(W)** (Mu & Viswanath 2018, the measure of Wang et al. 2020 and Yu et al. 2022): Z(a) = sum_i exp(w_i . a) over
  the rows, a over the eigenvectors of W^T W and their negatives; I(W) = min Z / max Z, in (0, 1]. **1 = isotropic**
  (the rows spread evenly in every direction); near 0, the rows lean to one side of some direction (a cone).
  I(W) is not scale-free: scaling W by c > 1 lowers it. Compare matrices of similar row norms, or against the
  Gaussian reference above (an isotropic matrix of the same shape and entry size).
- **Mean cosine** of the pairs of rows i != j: about 0 for directions spread around the origin, near 1 when all
  rows point one way. Gao et al. 2019 (Sec. 1, 3) name *representation degeneration* the state where the learned
  word embeddings "degenerate and be distributed into a narrow cone": the cosine of almost every pair of rows is
  positive (the fraction of positive cosines near 1) and the rows' mean is far from the origin (centroid ratio =
  |mean row| / rms row norm near 1; 0 for rows centred on the origin).
- **The spectrum** (Gao et al. 2019 Sec. 3, Fig. 2(b)): singular values divided by the largest. A degenerate matrix has
  one or two dominant singular values and the rest much smaller (sigma1 / sigma2 large; the share of sigma1^2 in the
  total energy high); an isotropic one a flat spectrum.
- **The 2-D projection** (Gao et al. 2019 Fig. 1, Yu et al. 2022 Fig. 1): the rows on the top-2 singular directions,
  uncentred (the origin marked +). Degenerate embeddings sit in a narrow band away from the origin, the rare tokens
  apart from the frequent ones; healthy ones form a cloud around the origin.
- **Per frequency group** (Yu et al. 2022 Sec. 3.1: the 30 % most frequent types, the next 50 %, the 20 % rarest):
  I(W) of each group's own rows and their mean cosine. Yu et al. find that "rare groups degenerate first" (their
  I(W) falls before the others') and then the frequent group's I(W) falls while the **rare-frequent cosine** (the mean
  cosine between a rare and a frequent row) rises (Sec. 3.2): a low rare-group I(W) with the others high is the early
  stage; all low, with rare rows similar to frequent ones, the late stage.
- **IsoScore** (Rudman et al. 2022) is a different measure of isotropy (of the point cloud's covariance, 0 to 1):
  it is not the papers' I(W) and its values are not comparable with it.
"""


def render_markdown(report: Mapping, source: Mapping, counts: Mapping | None, files: Mapping[str, str]) -> str:
    """report.md: where the matrix came from, the numbers, the groups, the figures and how to read them."""
    v, d = report["rows"], report["dim"]
    lines = [f"# Degeneration report: {source['name']}", "",
             f"- Input: `{source['path']}` ({source['kind']}); matrix `{source['key']}`: {source['why']}.",
             f"- Shape: {v:,} rows (types) x {d:,} dimensions, stored as {source['dtype']}; computed in float64."]
    if source.get("others"):
        lines.append(f"- Other 2-D matrices there: {', '.join(f'`{k}`' for k in source['others'][:8])}"
                     + (" ..." if len(source["others"]) > 8 else "") + " (`--key` picks one).")
    if counts:
        lines.append(f"- Counts: {counts['description']} ({counts['total']:,} tokens, {counts['seen']:,} of {v:,} "
                     f"types seen).")
    else:
        lines.append("- Counts: none given, so **no per-group numbers**: the frequency groups need the training count "
                     "of each row (`--counts`).")
    c = report["cosines"]
    frac = c.get("frac_positive")
    how = (f"over {c['pairs']:,} random pairs (two disjoint random sets of rows)" if c.get("sampled")
           else f"over every one of the {c['pairs']:,} pairs")
    ref = report.get("isotropic_reference")
    rows = [("I(W)", _fmt(report["isotropy"]), "1 = isotropic, near 0 = degenerate (a cone)"),
            ("I(W) of an isotropic Gaussian of this shape", _fmt(ref, ".3g") if ref is not None else "–",
             "i.i.d. entries of the same mean square s^2, first order: exp(-2 s^2 sqrt(d/V)), an upper estimate"),
            ("mean cosine (all pairs)", _fmt(report["mean_cos"], ".4f"), "0 = spread around the origin, 1 = one direction"),
            ("fraction of positive cosines", _fmt(frac, ".3f"), how),
            ("centroid ratio", _fmt(report["centroid_ratio"], ".3f"), "‖mean row‖ / rms row norm: 0 centred, 1 all equal"),
            ("sigma1 / sigma2", _fmt(report.get("sv_ratio_1_2"), ".3g"), "a dominant direction when large"),
            ("sigma3 / sigma2", _fmt(report.get("sv_ratio_3_2"), ".3g"), "Gao Sec. 3.1: beyond the first two, much smaller"),
            ("share of sigma1^2 in the energy", _fmt(report.get("sv1_energy_share"), ".3f"), f"1/d = {1 / d:.3g} if flat"),
            ("mean sigma_k / sigma1", _fmt(report.get("sv_norm_mean"), ".3f"), "the area under the normalised spectrum"),
            ("IsoScore", _fmt(report.get("isoscore"), ".4g"), f"a different measure; {report['isoscore_note']}")]
    lines += ["", "## The numbers", "", "| measure | value | reads as |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {e} |" for a, b, e in rows]
    q = c.get("quantiles") or c.get("sample_quantiles")
    if q:
        lines += ["", "Cosines of random pairs, quantiles: " + ", ".join(f"{k}: {x:.3f}" for k, x in q.items()) + "."]
    if report.get("groups"):
        lines += ["", "## Per frequency group", "", "Groups by the counts: the 30 % most frequent types, the next 50 %, "
                  "the 20 % rarest (Yu et al. 2022 Sec. 3.1), as `repdegen.analysis.groups.frequency_groups` cuts them."
                  " The last column is I(W) of an isotropic Gaussian matrix of the group's size and entry size "
                  "(a smaller group measures lower even when isotropic).",
                  "", "| group | types | I(W) | mean cosine | isotropic reference |", "|---|---|---|---|---|"]
        for name, g in report["groups"].items():
            lines.append(f"| {name} | {g['size']:,} | {_fmt(g['isotropy'])} | {_fmt(g['mean_cos'], '.4f')} "
                         f"| {_fmt(g.get('isotropic_reference'), '.3g')} |")
        lines.append(f"| all rows | {v:,} | {_fmt(report['isotropy'])} | {_fmt(report['mean_cos'], '.4f')} "
                     f"| {_fmt(ref, '.3g')} |")
        if "cos_rare_frequent" in report:
            lines += ["", f"Rare-frequent cosine (mean over a rare row and a frequent row): "
                          f"{_fmt(report['cos_rare_frequent'], '.4f')}."]
    if source.get("record"):
        rec = source["record"]
        lines += ["", "## The run's own record", "", f"The run recorded, for `{rec['weights']}`: I(W) "
                  f"{_fmt(rec.get('isotropy'))}, mean cosine {_fmt(rec.get('mean_cos'), '.4f')}"
                  + "".join(f", I(W) {g} {_fmt(rec.get(f'isotropy_{g}'))}" for g in ("frequent", "medium", "rare")
                            if rec.get(f"isotropy_{g}") is not None) + "."]
    captions = {"spectrum": "singular values / largest, log scale (Gao et al. 2019 Fig. 2(b))",
                "projection": "the rows on the top-2 singular directions, coloured by frequency group (Gao et al. 2019 "
                              "Fig. 1, Yu et al. 2022 Fig. 1)",
                "cosines": "the distribution of pairwise cosines (all rows, each group, rare-frequent pairs)",
                "groups": "I(W) and mean cosine per frequency group (Yu et al. 2022 Tables 1, 2)"}
    lines += ["", "## Figures", ""] + [f"- `{f}`: {captions[k]}" for k, f in files.items()]
    lines += ["", READING]
    return "\n".join(lines)
