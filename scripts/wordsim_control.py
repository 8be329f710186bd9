"""Positive control of the word-similarity pipeline (issue 23 item 6): an embedding built from the same corpus the
lite LMs train on must reach a real correlation through ``repdegen.analysis.wordsim.evaluate_wordsim``, the code Yu et al.
Table 6's cells use, and a random embedding must not.

    REPDEGEN_DATA_DIR=../shared/data python scripts/wordsim_control.py [--out results/sanity]

The control (Levy, Goldberg & Dagan 2015, "Improving distributional similarity with lessons learned from word
embeddings", their PPMI-SVD recipe): WikiText-2's training split, lowercased, the ``--vocab`` most frequent words;
symmetric co-occurrence counts in a window of ``--window`` words; PPMI with context-distribution smoothing 0.75;
a rank-``--dim`` SVD, rows U·Σ^0.5 (eigenvalue weighting 0.5). The negative control: a Gaussian embedding of the same
shape (seed 0).

Expectation, fixed before the first run (2026-11-25): with ~2M training words (Levy et al. report ρ ≈ 0.7 on WS353 and
MEN from 1.5B words, and far less is expected from 2M), the PPMI-SVD rows reach **ρ×100 ≥ 25 on MEN and on WS353**,
and the random rows **|ρ×100| < 10** on both. A miss of either says the pipeline (lookup, cosine, Spearman), not the
LMs, is what makes lite's word similarity small. RG65 (65 pairs) and RW (rare words, mostly out of a 20k vocabulary)
are reported, not judged.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from repdegen.analysis.wordsim import evaluate_wordsim, load_wordsim_datasets

THRESHOLD, RANDOM_BOUND, JUDGED = 25.0, 10.0, ("MEN", "WS353")


class WordVocab:
    """What ``evaluate_wordsim`` needs of a word-level vocabulary: ``stoi``."""

    def __init__(self, words: list[str]):
        self.stoi = {w: i for i, w in enumerate(words)}


def ppmi_svd(ids: np.ndarray, size: int, window: int, dim: int, smoothing: float = 0.75) -> torch.Tensor:
    """Rows U·Σ^0.5 of a rank-``dim`` SVD of the PPMI matrix of ``ids`` (tokens >= size are out of vocabulary)."""
    keys = []
    for off in range(1, window + 1):
        a, b = ids[:-off], ids[off:]
        keep = (a < size) & (b < size)
        a, b = a[keep], b[keep]
        keys += [a * size + b, b * size + a]  # symmetric
    uniq, counts = np.unique(np.concatenate(keys), return_counts=True)
    rows, cols, c = uniq // size, uniq % size, counts.astype(np.float64)
    row_sum = np.bincount(rows, weights=c, minlength=size)
    col_sum = np.bincount(cols, weights=c, minlength=size) ** smoothing
    # log(P(w, c) / (P(w) P_a(c))) with P_a(c) = count(c)^0.75 / sum: the total count cancels
    pmi = np.log(c * col_sum.sum() / (row_sum[rows] * col_sum[cols]))
    keep = pmi > 0
    mat = torch.sparse_coo_tensor(np.vstack([rows[keep], cols[keep]]), pmi[keep], (size, size)).coalesce()
    torch.manual_seed(0)
    u, s, _ = torch.svd_lowrank(mat, q=dim, niter=6)
    return (u * s.sqrt()).float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=20000)
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--dim", type=int, default=300)
    ap.add_argument("--out", default="results/sanity")
    args = ap.parse_args()
    data = Path(os.environ.get("REPDEGEN_DATA_DIR", "../shared/data")) / "wikitext-2" / "train.txt"
    if not data.is_file():
        raise SystemExit(f"wordsim_control: {data} not found; set REPDEGEN_DATA_DIR to the folder that holds wikitext-2/")
    start = time.time()
    tokens = data.read_text().lower().split()
    words = [w for w, _ in Counter(tokens).most_common(args.vocab)]
    index = {w: i for i, w in enumerate(words)}
    ids = np.fromiter((index.get(t, args.vocab) for t in tokens), dtype=np.int64, count=len(tokens))
    emb = ppmi_svd(ids, args.vocab, args.window, args.dim)
    vocab = WordVocab(words)
    sets = load_wordsim_datasets()
    control = evaluate_wordsim(emb, vocab, sets)
    torch.manual_seed(0)
    random = evaluate_wordsim(torch.randn_like(emb), vocab, sets)
    judged = {n: {"ppmi_svd": control[n]["spearman"], "random": random[n]["spearman"],
                  "holds": control[n]["spearman"] >= THRESHOLD and abs(random[n]["spearman"]) < RANDOM_BOUND}
              for n in JUDGED if n in control}
    report = {"corpus": str(data), "tokens": len(tokens), "vocab": args.vocab, "window": args.window, "dim": args.dim,
              "threshold": THRESHOLD, "random_bound": RANDOM_BOUND, "ppmi_svd": control, "random": random,
              "judged": judged, "holds": all(j["holds"] for j in judged.values()) and len(judged) == len(JUDGED),
              "seconds": round(time.time() - start, 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "wordsim_control.json").write_text(json.dumps(report, indent=2) + "\n")
    for name in control:
        c, r = control[name], random[name]
        print(f"{name:6s} PPMI-SVD rho x 100 {c['spearman']:6.1f} ({c['pairs']}/{c['total']} pairs)"
              f" | random {r['spearman']:6.1f}")
    print(f"wordsim_control: {'holds' if report['holds'] else 'DOES NOT HOLD'} (MEN and WS353 >= {THRESHOLD:g}, random "
          f"within ±{RANDOM_BOUND:g}); {out / 'wordsim_control.json'} ({report['seconds']} s)")


if __name__ == "__main__":
    main()
