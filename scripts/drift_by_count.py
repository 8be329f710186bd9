"""How a row's drift from initialisation lines up with the never-seen rows' common drift, by how often the row's
type occurs in what the cell trained on (a diagnosis for Gao et al. 2019 Sec. 4.2's claim "rare rows move like
never-seen rows"; issue 23, gao2019_t1 at lite).

For each cell given (a run directory of the ledger holding ``result.json``, ``init_embedding.pt`` and the weights
its final metrics read, ``best.pt`` by default; the training counts are recounted from the corpus slice the run
trained on, loaded as the run loaded it, so set ``REPDEGEN_DATA_DIR`` as the run had it): the unit drifts
d_i = (w_i - w0_i) / |w_i - w0_i|, the never-seen rows' mean unit drift s_U, and per count bucket the mean of
d_i . s_U, which is the mean cosine between the bucket's drifts and the never-seen rows' drifts (the definition of
``drift_cos_rare_unseen`` in analysis/geometry.py, with the bucket in place of the rare group). The rare group's
value is recomputed the same way and printed beside the one the cell recorded, as a check of this script.

It also compares two measures of "off-centre" on the final rows (a diagnosis for the CosReg claim of the same table):
the ratio the table's claim reads, ``centroid_ratio`` = |mean w_i| / sqrt(mean |w_i|^2) of the raw rows, and the
centroid of the unit rows, |mean w_i / |w_i||, the quantity Gao et al.'s R(W) = |mean w^_i|^2 - 1/N penalises; each
over every row, the never-seen rows and the seen rows, with the mean row norm of each group.

It also prints T / V (training tokens an epoch over the vocabulary size), the count at which, at initialisation
(probability ~1/V everywhere), an epoch's push on a row through the softmax, ~(T / V) mean(h), equals its pull as a
target, k mean(h at its occurrences): a point of comparison, not where the cosine must cross 0 (the never-seen
types' probabilities fall as training goes on, and a tied row also moves when its type is an input).

    python scripts/drift_by_count.py outputs/runs/<hash> [outputs/runs/<hash> ...] [--weights best.pt] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repdegen.analysis.geometry import centroid_ratio, training_groups  # noqa: E402
from repdegen.core.files import atomic_write_json  # noqa: E402

BUCKETS = [(0, 0), (1, 1), (2, 2), (3, 3), (4, 5), (6, 9), (10, 19), (20, 49), (50, 99), (100, 999), (1000, None)]


def _load(path: Path, what: str):
    if not path.is_file():
        sys.exit(f"drift_by_count: no {what} at {path}: give the run directory of a finished cell of the ledger "
                 f"(outputs/runs/<hash>), whose final metrics have run")
    return torch.load(path, map_location="cpu", weights_only=False)


def _embedding(state: dict, rows: int, key: str | None) -> torch.Tensor:
    model = state.get("model", state)
    if key is not None:
        if key not in model:
            sys.exit(f"drift_by_count: no parameter {key!r} in the weights; 2-D ones: "
                     f"{[k for k, v in model.items() if getattr(v, 'dim', lambda: 0)() == 2]}")
        return model[key]
    cands = [k for k, v in model.items() if getattr(v, "dim", lambda: 0)() == 2 and v.shape[0] == rows]
    if len(cands) != 1:
        sys.exit(f"drift_by_count: {len(cands)} parameters with {rows} rows ({cands}); name one with --key")
    return model[cands[0]]


def training_counts(run_dir: Path) -> tuple[torch.Tensor, list[int]]:
    """Occurrences of each type in what the run trained on and the ids outside every group: the run's own task
    (``train_counts``, ``special_ids``: what its final metrics used), built from its recorded config and corpus."""
    from omegaconf import OmegaConf
    from repdegen.models import build_model
    from repdegen.reproduce.engine.tasks import make_task
    from repdegen.reproduce.runs.execute import load_any_corpus
    from repdegen.reproduce.runs.trained import read_record

    cfg = OmegaConf.create(read_record(run_dir)["config"])
    corpus = load_any_corpus(cfg.dataset, cfg.paths.cache_dir, verbose=False)
    model = build_model(cfg.model, len(corpus.vocab), cfg.model.tie_weights)
    task = make_task(cfg, corpus, model, torch.device("cpu"))
    return task.train_counts(), task.special_ids()


def analyse(run_dir: Path, weights: str, key: str | None, counts: torch.Tensor, specials: list[int]) -> dict:
    counts = counts.long()
    init = _load(run_dir / "init_embedding.pt", "initial embedding (init_embedding.pt)").double()
    w = _embedding(_load(run_dir / weights, f"weights ({weights})"), counts.numel(), key).double()
    drift = w - init
    norm = drift.norm(dim=1)
    unit = torch.where(norm[:, None] > 0, drift / norm.clamp_min(1e-300)[:, None], torch.zeros_like(drift))
    keep = torch.ones(counts.numel(), dtype=torch.bool)
    keep[specials] = False
    groups = training_groups(counts, specials)
    n_u = groups["unseen"].numel()
    if n_u < 2:
        sys.exit(f"drift_by_count: {run_dir} trained on a slice where {n_u} types never occur, so there is no "
                 f"never-seen drift to compare with (a run on the whole split: use a lite cell)")
    s_u = unit[groups["unseen"]].mean(0)
    # the unseen group's own mean pairwise cosine, over i != j: (n^2 |s|^2 - n) / (n (n - 1))
    within_u = float((n_u * n_u * (s_u @ s_u) - n_u) / (n_u * (n_u - 1)))
    cos_to_u = unit @ s_u
    along_u = drift @ (s_u / s_u.norm())  # each row's drift along the never-seen rows' common direction
    rows = []
    for lo, hi in BUCKETS:
        sel = keep & (counts >= lo) & (counts <= (hi if hi is not None else counts.max()))
        n = int(sel.sum())
        if lo == 0:
            value = within_u
        else:
            value = float(cos_to_u[sel].mean()) if n else math.nan
        rows.append({"count": f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi is not None else f">={lo}"),
                     "types": n, "mean_cos_to_unseen_drift": value,
                     "mean_drift_norm": float(norm[sel].mean()) if n else math.nan,
                     "mean_drift_along_unseen": float(along_u[sel].mean()) if n else math.nan})
    rare = groups["rare"]
    seen = torch.nonzero(keep & (counts > 0)).flatten()
    result_file = run_dir / "result.json"
    recorded_final = {}
    if result_file.is_file():
        recorded_final = json.loads(result_file.read_text()).get("metrics", {}).get("final", {})
    recorded = recorded_final.get("drift_cos_rare_unseen", math.nan)
    tokens = int(counts.sum())
    return {"run": run_dir.name, "weights": weights, "train_tokens": tokens, "vocab": counts.numel(),
            "balance_count_T_over_V": tokens / counts.numel(),
            "rare_group_counts": [int(counts[rare].min()), int(counts[rare].max())] if rare.numel() else None,
            "rare_group_size": int(rare.numel()), "unseen_types": n_u,
            "drift_cos_rare_unseen_recomputed": float(cos_to_u[rare].mean()) if rare.numel() else math.nan,
            "drift_cos_rare_unseen_recorded": recorded, "buckets": rows,
            "centroids": centroids(w, {"all": torch.arange(counts.numel()), "unseen": groups["unseen"], "seen": seen}),
            "centroid_ratio_recorded": recorded_final.get("centroid_ratio", math.nan),
            "cos_mean_unseen_vs_seen": float(torch.nn.functional.cosine_similarity(
                w[groups["unseen"]].mean(0), w[seen].mean(0), dim=0)) if seen.numel() else math.nan}


def centroids(w: torch.Tensor, groups: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Per group of rows: the raw rows' ``centroid_ratio`` (what the claims read), the unit rows' centroid
    |mean w_i / |w_i|| (what CosReg penalises), and the mean row norm."""
    out = {}
    for name, ids in groups.items():
        rows = w[ids].double()
        norms = rows.norm(dim=1)
        unit = rows[norms > 0] / norms[norms > 0, None]
        out[name] = {"rows": int(ids.numel()), "centroid_ratio_raw": centroid_ratio(rows) if ids.numel() else math.nan,
                     "centroid_unit": float(unit.mean(0).norm()) if unit.numel() else math.nan,
                     "mean_row_norm": float(norms.mean()) if ids.numel() else math.nan}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories of finished cells (outputs/runs/<hash>)")
    ap.add_argument("--weights", default="best.pt", help="the weights file in each run directory (default best.pt)")
    ap.add_argument("--key", default=None, help="the embedding's parameter name (default: the one 2-D parameter "
                                                 "with a row per type)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    results = [analyse(r, a.weights, a.key, *training_counts(r)) for r in a.runs]
    for r in results:
        print(f"## {r['run']} ({r['weights']}): T = {r['train_tokens']:,} tokens, V = {r['vocab']:,}, "
              f"T/V = {r['balance_count_T_over_V']:.2f}; rare group = counts {r['rare_group_counts']} "
              f"({r['rare_group_size']} types); drift_cos_rare_unseen {r['drift_cos_rare_unseen_recomputed']:+.4f} "
              f"(recorded {r['drift_cos_rare_unseen_recorded']:+.4f})")
        print("| count in training | types | mean cos to the never-seen drifts | mean drift norm | mean drift along "
              "the never-seen direction |")
        print("|---|---|---|---|---|")
        for b in r["buckets"]:
            print(f"| {b['count']} | {b['types']:,} | {b['mean_cos_to_unseen_drift']:+.4f} | "
                  f"{b['mean_drift_norm']:.4f} | {b['mean_drift_along_unseen']:+.4f} |")
        print(f"centroids (recorded centroid_ratio {r['centroid_ratio_recorded']:.4f}; cosine between the never-seen "
              f"and the seen rows' means {r['cos_mean_unseen_vs_seen']:+.4f}):")
        print("| rows | n | centroid ratio, raw rows | centroid of the unit rows | mean row norm |")
        print("|---|---|---|---|---|")
        for name, c in r["centroids"].items():
            print(f"| {name} | {c['rows']:,} | {c['centroid_ratio_raw']:.4f} | {c['centroid_unit']:.4f} | "
                  f"{c['mean_row_norm']:.4f} |")
    if a.out is not None:
        atomic_write_json(a.out, results, parents=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
