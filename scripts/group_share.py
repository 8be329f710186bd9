"""Each frequency group's share of a table's test positions, and how a row's change of total test PPL splits into the
groups' parts (log PPL_total = sum_g share_g * log PPL_g); the paper's shares implied by its own group PPLs and
totals of two rows (three equations: the two totals and the shares summing to one). results/NOTES.md, yu2022_t1.

    python scripts/group_share.py --table yu2022_t1 --base MLE --row Freeze
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from repdegen.analysis.groups import frequency_groups  # noqa: E402
from repdegen.core.loaders import load_cell_yaml, load_cells_json, load_run_record  # noqa: E402
from repdegen.data.corpus import load_corpus  # noqa: E402

GROUPS = ("frequent", "medium", "rare")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", required=True)
    ap.add_argument("--base", required=True, help="the baseline row's label")
    ap.add_argument("--row", required=True, help="the compared row's label")
    ap.add_argument("--scale", default="lite")
    args = ap.parse_args(argv)
    out = ROOT / "results" / "tables" / args.table / args.scale
    cells = load_cells_json(out / "cells.json")["cells"]
    first = next(c for c in cells if c["label"] == args.base)
    cfg = load_cell_yaml(ROOT / "outputs" / "runs" / first["config_hash"] / "cell.yaml")
    corpus = load_corpus(cfg.dataset, ROOT / "outputs" / "cache", verbose=False)
    groups = frequency_groups(corpus.vocab, cutoffs=cfg.trainer.analysis.get("group_cutoffs"), n_specials=4)
    gid = torch.zeros(len(corpus.vocab), dtype=torch.long)
    for k, name in enumerate(GROUPS):
        gid[groups[name]] = k
    share = torch.bincount(gid[corpus.test[1:]], minlength=3).double()
    share = (share / share.sum()).tolist()
    print("share of the test positions:", {g: round(s, 4) for g, s in zip(GROUPS, share)})

    def mean_row(label: str, key: str) -> float:
        vals = []
        for c in cells:
            if c["label"] == label:
                r = load_run_record(ROOT / "outputs" / "runs" / c["config_hash"] / "result.json")
                vals.append(r["metrics"]["final"][key])
        return sum(vals) / len(vals)

    import yaml

    ours, paper = {}, {}
    rows = {r["label"]: r for r in yaml.safe_load((ROOT / "conf" / "table" / f"{args.table}.yaml").read_text())["rows"]}
    for label in (args.base, args.row):
        ours[label] = [mean_row(label, f"ppl_{g}") for g in GROUPS] + [mean_row(label, "test_ppl")]
        if label in rows:
            paper[label] = [(rows[label].get("paper") or {}).get(k) for k in (*(f"ppl_{g}" for g in GROUPS), "test_ppl")]
    for label, v in ours.items():
        est = math.exp(sum(s * math.log(p) for s, p in zip(share, v[:3])))
        print(f"{label}: exp(sum share_g log PPL_g) = {est:.1f}; test PPL {v[3]:.1f}")
    parts = [s * math.log(b / a) for s, a, b in zip(share, ours[args.base][:3], ours[args.row][:3])]
    print("change of log total PPL by group:", {g: round(p, 4) for g, p in zip(GROUPS, parts)},
          f"sum {sum(parts):+.4f} (x{math.exp(sum(parts)):.3f})")
    if len(paper) == 2 and all(None not in v for v in paper.values()):
        a = np.array([[math.log(x) for x in paper[args.base][:3]], [math.log(x) for x in paper[args.row][:3]], [1, 1, 1]])
        b = np.array([math.log(paper[args.base][3]), math.log(paper[args.row][3]), 1.0])
        print("paper's implied shares:", dict(zip(GROUPS, np.linalg.solve(a, b).round(4).tolist())))


if __name__ == "__main__":
    main()
