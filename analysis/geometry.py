"""Geometry of a trained embedding for the papers' findings beyond I(W) (the claims audit's new claims; definitions in
docs/claims_audit/gao2019.md and yu2022b.md, section "New metrics needed"), recorded with each stage's final metrics.

- ``frac_pos_cos``: the fraction of ordered pairs i != j of rows with a positive cosine (Gao Sec. 3.2: "positive
  for almost all cases").
- ``centroid_ratio``: ||mean row|| / sqrt(mean ||row||^2), in [0, 1]: 0 when the rows sit around the origin, 1 when
  all rows are equal (Gao Fig. 1(a)/2(a): the cloud off-centre).
- ``sv_norm_mean``: mean of sigma_k / sigma_1 (the area under Gao Fig. 2(b)'s normalised spectrum); ``sv_ratio_3_2``:
  sigma_3 / sigma_2 (Sec. 3.1: beyond the first two, "much smaller").
- Groups of *what the run trains on* (``counts``: occurrences in the training data the cell uses, not the full
  corpus): unseen U (count 0), and of the seen types, ranked by count, frequent F (first 30 %) and rare R (last
  20 %); specials excluded. A group of fewer than ``MIN_GROUP`` rows makes its metrics NaN.
- ``cos_excess_rare``: the mean pairwise cosine within R minus the mean over all rows (Gao Sec. 4.2: rare rows
  in a local region).
- With the embedding at initialisation W0, drift rows d_i = w_i - w0_i (normalised): ``drift_cos_unseen`` (mean
  pairwise cosine of U's drifts: they move together, Gao Sec. 4.1), ``drift_cos_rare_unseen`` and
  ``drift_cos_frequent_unseen`` (mean cosine between R's (F's) and U's drifts), ``drift_cos_gap_rare_frequent``
  (their difference: rare rows move like unseen ones, more than frequent rows do, Gao Sec. 4.2).
- ``nn_rare_frac``: for each rare row, the share of its 5 nearest rows by cosine (specials and itself excluded)
  that are rare; mean over R (Yu App. E: AGG's rare rows are not biased about frequency). Uses the evaluation
  groups the caller passes.
"""

from __future__ import annotations

import math

import torch

MIN_GROUP = 50
BLOCK = 4096


def _unit(w: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit norm; zero rows dropped."""
    n = w.norm(dim=1)
    keep = n > 0
    return w[keep] / n[keep, None]


def frac_pos_cos(weight: torch.Tensor) -> float:
    """Fraction of ordered pairs (i != j) with a positive cosine, exactly, in blocks of rows."""
    u = _unit(weight.double())
    v = u.shape[0]
    if v < 2:
        return float("nan")
    pos = 0
    for start in range(0, v, BLOCK):
        block = u[start:start + BLOCK] @ u.T
        pos += int((block > 0).sum())
    pos -= int(((u * u).sum(1) > 0).sum())  # the diagonal (cosine 1 with itself)
    return pos / (v * (v - 1))


def centroid_ratio(weight: torch.Tensor) -> float:
    w = weight.double()
    denom = math.sqrt(float((w * w).sum(1).mean()))
    return float(w.mean(0).norm()) / denom if denom > 0 else float("nan")


def spectrum_metrics(singular_values) -> dict[str, float]:
    s = [float(x) for x in singular_values]
    out = {"sv_norm_mean": float("nan"), "sv_ratio_3_2": float("nan")}
    if s and s[0] > 0:
        out["sv_norm_mean"] = sum(x / s[0] for x in s) / len(s)
    if len(s) >= 3 and s[1] > 0:
        out["sv_ratio_3_2"] = s[2] / s[1]
    return out


def training_groups(counts: torch.Tensor, specials: list[int]) -> dict[str, torch.Tensor]:
    """unseen / frequent (first 30 % of the seen types by count) / rare (last 20 %), specials excluded; ties by id."""
    counts = counts.long().cpu()
    ids = torch.arange(counts.numel())
    keep = torch.ones(counts.numel(), dtype=torch.bool)
    keep[list(specials)] = False
    unseen = ids[keep & (counts == 0)]
    seen = ids[keep & (counts > 0)]
    # descending count, ties by ascending id: sort by id first, then a stable sort by -count
    order = torch.sort(-counts[seen], stable=True).indices
    ranked = seen[order]
    n = ranked.numel()
    n_freq, n_rare = int(round(0.3 * n)), int(round(0.2 * n))
    return {"unseen": unseen, "frequent": ranked[:n_freq], "rare": ranked[n - n_rare:] if n_rare else ranked[:0]}


def _mean_pair_cos(u: torch.Tensor, min_rows: int | None = None) -> float:
    """Mean cosine over ordered pairs i != j of unit rows: (||sum||^2 - n) / (n (n - 1))."""
    n = u.shape[0]
    if n < max(MIN_GROUP if min_rows is None else min_rows, 2):
        return float("nan")
    s = u.sum(0)
    return float((s @ s - n) / (n * (n - 1)))


def group_geometry_metrics(weight: torch.Tensor, counts: torch.Tensor, specials: list[int],
                           init_weight: torch.Tensor | None = None) -> dict[str, float]:
    """``cos_excess_rare`` and, with ``init_weight``, the drift cosines, over the groups of what the run trains on
    (the within/between means of :func:`repdegen.analysis.groups.group_cosines`; a group under ``MIN_GROUP`` rows: NaN)."""
    from repdegen.analysis.groups import group_cosines

    w = weight.double().cpu()
    g = training_groups(counts, specials)
    small = {k for k, ids in g.items() if ids.numel() < MIN_GROUP}

    def means(matrix, between):
        out = group_cosines(matrix, g, between=between)
        return {k: (math.nan if small & set(k.split("_")) else v) for k, v in out.items()}

    nan = float("nan")
    rare = means(w, ())["rare"]
    out = {"cos_excess_rare": rare - _mean_pair_cos(_unit(w), 2), "unseen_types": float(g["unseen"].numel())}
    if init_weight is not None:
        d = means(w - init_weight.double().cpu(), (("rare", "unseen"), ("frequent", "unseen")))
        out["drift_cos_unseen"] = d.get("unseen", nan)
        out["drift_cos_rare_unseen"] = d["rare_unseen"]
        out["drift_cos_frequent_unseen"] = d["frequent_unseen"]
        out["drift_cos_gap_rare_frequent"] = out["drift_cos_rare_unseen"] - out["drift_cos_frequent_unseen"]
    return out


def nn_rare_frac(weight: torch.Tensor, rare_ids: torch.Tensor, specials: list[int], k: int = 5) -> float:
    """Mean over rare rows of the share of their k nearest rows by cosine (itself and specials excluded) that are
    rare."""
    rare_ids = rare_ids.long().cpu()
    if rare_ids.numel() < MIN_GROUP:
        return float("nan")
    w = weight.double().cpu()
    n = w.norm(dim=1).clamp_min(1e-12)
    u = w / n[:, None]
    is_rare = torch.zeros(w.shape[0], dtype=torch.bool)
    is_rare[rare_ids] = True
    total = 0.0
    for start in range(0, rare_ids.numel(), BLOCK):
        rows = rare_ids[start:start + BLOCK]
        sim = u[rows] @ u.T
        sim[torch.arange(rows.numel()), rows] = -math.inf
        if specials:
            sim[:, list(specials)] = -math.inf
        nn = sim.topk(k, dim=1).indices
        total += float(is_rare[nn].double().mean(1).sum())
    return total / rare_ids.numel()


def final_geometry(weight: torch.Tensor, singular_values, counts: torch.Tensor | None, specials: list[int],
                   init_weight: torch.Tensor | None = None) -> dict[str, float]:
    """The metrics above for one stage's final weights (``counts``: None skips the group metrics)."""
    w = weight.detach().float()
    out = {"frac_pos_cos": frac_pos_cos(w), "centroid_ratio": centroid_ratio(w), **spectrum_metrics(singular_values)}
    if counts is not None:
        out.update(group_geometry_metrics(w, counts, specials, init_weight))
    return finite_only(out)


def finite_only(metrics: dict) -> dict:
    """The entries that are numbers (a group too small, a spectrum too short: left out, not recorded as NaN, which
    JSON does not define and which compares unequal to itself)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def mean_unseen_drift(weight: torch.Tensor, init_weight: torch.Tensor, counts: torch.Tensor,
                      specials: list[int]) -> torch.Tensor | None:
    """d-bar = the mean over the never-seen rows U of (w_i - w0_i), unnormalised (docs/claims_audit/gao2019.md, section
    4: ``frac_h_neg_drift_unseen``); None when U has fewer than ``MIN_GROUP`` rows."""
    unseen = training_groups(counts, specials)["unseen"]
    if unseen.numel() < MIN_GROUP:
        return None
    return (weight.detach().double().cpu()[unseen] - init_weight.double().cpu()[unseen]).mean(0)
